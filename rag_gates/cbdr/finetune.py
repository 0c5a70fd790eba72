"""Fine-tune a cross-encoder reranker on CBDR preferences (InfoNCE), without the LLM at use.

Training rows come from the records :func:`~rag_gates.cbdr.preferences.build_preferences`
writes: each positive of a record is paired with that record's hard negatives (``num_negatives``
of them, a seeded sample when it has more, repeated when it has fewer; drawn once per
training run). The training is sentence-transformers' own: ``CrossEncoderTrainer`` with its
``MultipleNegativesRankingLoss`` for cross-encoders (InfoNCE: softmax over the scaled sigmoid
scores of one positive against its hard negatives plus a few in-batch ones), AdamW with a
linear warm-up over the first 10% of the steps then linear decay, gradients clipped at 1, and
the ``NO_DUPLICATES`` batch sampler: a batch never holds a text twice, so two rows of one
question (the same query) never share a batch and another positive of the question is never
used as its negative.

The model is written with the ``CrossEncoder``'s own ``save`` (safetensors, no pickle) plus
``rag_gates_reranker.json`` (:class:`RerankerTraining`: base, data, hyper-parameters, loss
curve, time). It loads with ``CrossEncoder(str(out))`` and
``rag_gates.cbdr.CrossEncoderReranker(out)``.

The default base is the embedded all-MiniLM-L6-v2 (a bi-encoder: it gets a fresh one-logit
classification head, which the preferences train). Any local cross-encoder or BERT-like
checkpoint works the same way (e.g. a bge-reranker directory, as in the paper). Needs
``pip install "rag-gates[train]"`` (sentence-transformers and ``datasets``).

Example:
    >>> from rag_gates.cbdr.finetune import train_reranker
    >>> result = train_reranker(Path("prefs.jsonl"), Path("rerankers/smollm2-cbdr"))
    >>> result.final_loss, result.seconds
    >>> CrossEncoderReranker("rerankers/smollm2-cbdr").rerank(question, passages, top_n=3)
"""

from __future__ import annotations

import logging
import math
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from rag_gates._io import file_sha256, write_text_atomic
from rag_gates._optional import require
from rag_gates.cbdr.preferences import PreferenceRecord, read_preferences

__all__ = ["METADATA_FILE", "RerankerTraining", "TrainingRow", "columns", "load_cross_encoder",
           "resolve_base", "train_reranker", "training_rows"]

logger = logging.getLogger(__name__)

METADATA_FILE = "rag_gates_reranker.json"
LOSS_NAME = "sentence_transformers.cross_encoder.losses.MultipleNegativesRankingLoss"
_WARMUP = 0.1
_MAX_GRAD_NORM = 1.0


class TrainingRow(BaseModel):
    """One InfoNCE row: a query, one positive and its hard negatives."""

    model_config = ConfigDict(frozen=True)

    record: int = Field(..., description="Index of the source record (its question).")
    query: str
    positive: str
    negatives: list[str]


class RerankerTraining(BaseModel):
    """How a reranker was trained; saved as ``rag_gates_reranker.json`` beside the model."""

    model_config = ConfigDict(frozen=True)

    base: str = Field(..., description="The checkpoint training started from.")
    preferences: str = Field(..., description="The preference file trained on.")
    preferences_sha256: str
    out: str
    records: int = Field(..., ge=0, description="Records with a positive and a negative.")
    records_skipped: int = Field(0, ge=0, description="Records without a positive or negative.")
    rows: int = Field(..., ge=0, description="(query, positive, negatives) rows per epoch.")
    epochs: int
    steps: int
    batch_size: int
    num_negatives: int = Field(..., description="Hard negatives per row.")
    lr: float
    weight_decay: float
    warmup_steps: int
    max_grad_norm: float = _MAX_GRAD_NORM
    max_length: int
    seed: int
    loss: str = LOSS_NAME
    loss_config: dict[str, JsonValue] = Field(default_factory=dict)
    epoch_loss: list[float] = Field(default_factory=list, description="Mean loss per epoch.")
    final_loss: float = Field(..., description="Mean training loss of the last epoch.")
    seconds: float


def training_rows(records: Sequence[PreferenceRecord], num_negatives: int,
                  rng: random.Random | None = None) -> list[TrainingRow]:
    """One row per positive of each record with both positives and negatives.

    Each row gets ``num_negatives`` of the record's negatives: a random sample (``rng``) when
    it has more, all of them repeated in turn when it has fewer, the first ones without
    ``rng``.
    """
    if num_negatives < 1:
        raise ValueError(f"num_negatives must be >= 1, got {num_negatives}")
    rows: list[TrainingRow] = []
    for index, record in enumerate(records):
        if not record.pos or not record.neg:
            continue
        for positive in record.pos:
            negs = list(record.neg)
            if rng is not None:
                rng.shuffle(negs)
            chosen = [negs[i % len(negs)] for i in range(num_negatives)]
            rows.append(TrainingRow(record=index, query=record.query, positive=positive,
                                    negatives=chosen))
    return rows


def columns(batch: Sequence[TrainingRow]) -> list[list[str]]:
    """The loss's inputs: ``[anchors, positives, negatives_1, ..., negatives_n]``."""
    n = len(batch[0].negatives)
    return ([[r.query for r in batch], [r.positive for r in batch]]
            + [[r.negatives[j] for r in batch] for j in range(n)])


def _loss_log(progress: Callable[[int, int, float], None] | None) -> Any:
    """A trainer callback that reads each step's logged loss: it feeds ``progress`` (a running
    mean), keeps the mean per epoch (``.epoch_loss``) and stops on a non-finite loss."""
    require("transformers", "hf")
    from transformers import TrainerCallback

    class LossLog(TrainerCallback):
        def __init__(self) -> None:
            self.epoch_loss: list[float] = []
            self._current: list[float] = []
            self._running = 0.0

        def on_log(self, args: Any, state: Any, control: Any,
                   logs: dict[str, float] | None = None, **kwargs: Any) -> None:
            if not logs or "loss" not in logs:
                return  # the end-of-training summary, not a step
            value = float(logs["loss"])
            if not math.isfinite(value):
                raise ValueError(f"the loss became {value} at step {state.global_step}; lower "
                                 "--lr and train again")
            self._current.append(value)
            self._running = value if state.global_step == 1 else (
                0.9 * self._running + 0.1 * value)
            if progress is not None:
                progress(state.global_step, max(state.max_steps, state.global_step),
                         self._running)

        def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self._current:
                self.epoch_loss.append(sum(self._current) / len(self._current))
            self._current = []

    return LossLog()


def resolve_base(base: str | Path | None) -> str:
    """What to load for ``base``: None = the embedded all-MiniLM-L6-v2 directory (extracted
    from its wheel on first use), a local directory (checked), or a hub id (HF cache only)."""
    if base is None:
        from rag_gates.lm.defaults import default_embedder_path

        return str(default_embedder_path())
    path = Path(base).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"{path} is not a transformers model directory (no config.json); pass a "
                "cross-encoder or BERT-like checkpoint directory, or leave --base unset for "
                "the embedded all-MiniLM-L6-v2")
        return str(path)
    return str(base)  # a hub id: only the local HF cache is used


def load_cross_encoder(base: str, *, max_length: int, num_labels: int | None = 1) -> Any:
    """A sentence-transformers ``CrossEncoder`` from a local directory (or the HF cache),
    offline; a checkpoint without a one-logit head gets a fresh one."""
    require("sentence_transformers", "hf")
    from sentence_transformers import CrossEncoder

    try:
        return CrossEncoder(base, num_labels=num_labels, max_length=max_length,
                            local_files_only=True)
    except OSError as exc:
        raise FileNotFoundError(
            f"could not load {base!r} as a cross-encoder offline ({exc}); pass a local model "
            "directory with --base (rag-gates never downloads models)") from exc


def _check_out(out: Path) -> None:
    if out.exists() and (not out.is_dir() or (any(out.iterdir())
                                              and not (out / METADATA_FILE).is_file())):
        raise ValueError(f"{out} exists and is not a rag-gates reranker directory; choose "
                         "another --out (a previous reranker there would be replaced)")


def _publish(build: Path, out: Path) -> None:
    """Replace ``out`` by ``build`` (a directory on the same disk) in as few steps as possible."""
    if out.exists():
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
        build.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        build.rename(out)


def train_reranker(
    preferences: Path,
    out: Path,
    *,
    base: str | Path | None = None,
    epochs: int = 1,
    lr: float = 6e-5,
    weight_decay: float = 0.01,
    batch_size: int = 8,
    num_negatives: int = 4,
    max_length: int = 256,
    seed: int = 0,
    progress: Callable[[int, int, float], None] | None = None,
) -> RerankerTraining:
    """Fine-tune a cross-encoder on a preference file with InfoNCE and save it to ``out``.

    Args:
        preferences: JSONL written by ``build_preferences`` / ``rag-gates cbdr
            build-preferences``.
        out: directory for the model (a previous reranker there is replaced).
        base: local checkpoint to start from; None = the embedded all-MiniLM-L6-v2.
        epochs: passes over the rows (each row keeps its hard negatives).
        lr: AdamW peak learning rate (linear warm-up over 10% of the steps, then decay).
        weight_decay: AdamW weight decay (not applied to biases and LayerNorm weights).
        batch_size: rows per step (no text twice in one batch, so no question twice).
        num_negatives: hard negatives per row (the record's, repeated if it has fewer).
        max_length: tokens per (query, passage) pair.
        seed: seeds the new head, negative sampling, the batch order and dropout.
        progress: called as ``progress(step, total_steps, running_loss)`` after each step.

    Returns:
        :class:`RerankerTraining`, also written to ``out / "rag_gates_reranker.json"``.

    Example:
        >>> training = train_reranker(Path("prefs.jsonl"), Path("rerankers/cbdr"), epochs=1)
        >>> print(f"final loss {training.final_loss:.3f} in {training.seconds:.0f} s")
    """
    require("torch", "hf")
    require("sentence_transformers", "hf")
    datasets = require("datasets", "train")
    import torch
    from sentence_transformers.base.sampler import BatchSamplers
    from sentence_transformers.cross_encoder import (
        CrossEncoderTrainer,
        CrossEncoderTrainingArguments,
    )
    from sentence_transformers.cross_encoder.losses import MultipleNegativesRankingLoss

    for name, count in (("epochs", epochs), ("batch_size", batch_size),
                        ("num_negatives", num_negatives), ("max_length", max_length)):
        if count < 1:
            raise ValueError(f"{name} must be >= 1, got {count}")
    if not lr > 0 or weight_decay < 0:
        raise ValueError(f"lr must be > 0 and weight_decay >= 0, got {lr} and {weight_decay}")
    start = time.perf_counter()
    preferences, out = Path(preferences), Path(out)
    records = read_preferences(preferences)
    usable = sum(1 for r in records if r.pos and r.neg)
    if usable == 0:
        raise ValueError(
            f"{preferences} holds no record with both a positive and a negative passage "
            f"({len(records)} records); build more with rag-gates cbdr build-preferences")
    _check_out(out)
    base_name = resolve_base(base)
    rows = training_rows(records, num_negatives, random.Random(seed))
    # Column order is the loss's input order: anchor, positive, then the hard negatives.
    train_data = datasets.Dataset.from_dict(
        dict(zip(["query", "positive", *(f"negative_{j + 1}" for j in range(num_negatives))],
                 columns(rows), strict=True)))
    torch.manual_seed(seed)  # the new head's initial weights
    model = load_cross_encoder(base_name, max_length=max_length)
    loss_fn = MultipleNegativesRankingLoss(model)
    out.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{out.name}.trainer.", dir=out.parent))
    args = CrossEncoderTrainingArguments(
        output_dir=str(scratch), num_train_epochs=epochs, per_device_train_batch_size=batch_size,
        learning_rate=lr, weight_decay=weight_decay, warmup_steps=_WARMUP,
        lr_scheduler_type="linear", max_grad_norm=_MAX_GRAD_NORM, seed=seed, data_seed=seed,
        batch_sampler=BatchSamplers.NO_DUPLICATES, logging_steps=1,
        logging_nan_inf_filter=False,  # a diverging loss stops training (below), not hidden
        save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0,
        dataloader_pin_memory=False)
    losses = _loss_log(progress)
    trainer = CrossEncoderTrainer(model=model, args=args, train_dataset=train_data,
                                  loss=loss_fn, callbacks=[losses])
    try:
        trainer.train()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    for epoch, value in enumerate(losses.epoch_loss, start=1):
        logger.info("epoch %d: mean InfoNCE loss %.4f", epoch, value)
    step = trainer.state.global_step
    warmup = args.get_warmup_steps(trainer.state.max_steps)
    model.eval()
    training = RerankerTraining(
        base=base_name, preferences=str(preferences.resolve()),
        preferences_sha256=file_sha256(preferences), out=str(out), records=usable,
        records_skipped=len(records) - usable, rows=len(rows), epochs=epochs, steps=step,
        batch_size=batch_size, num_negatives=num_negatives, lr=lr, weight_decay=weight_decay,
        warmup_steps=warmup, max_length=max_length, seed=seed,
        loss_config={k: v for k, v in loss_fn.get_config_dict().items()},
        epoch_loss=losses.epoch_loss, final_loss=losses.epoch_loss[-1],
        seconds=time.perf_counter() - start)
    build = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        build.chmod(0o755)  # mkdtemp makes it private; the model directory is not secret
        model.save(str(build), safe_serialization=True)
        write_text_atomic(build / METADATA_FILE, training.model_dump_json(indent=2))
        _publish(build, out)
    finally:
        if build.exists():
            shutil.rmtree(build, ignore_errors=True)
    return training
