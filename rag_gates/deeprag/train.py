"""DeepRAG training with TRL: SFT on the synthesized trajectories (imitation, stage I), then
DPO on the step-wise decision pairs (chain of calibration, stage II).

Input: the records of :mod:`rag_gates.deeprag.export` (``export_sft``: pre-tokenised
``input_ids`` / ``labels`` with the passages masked; ``export_dpo``: ``prompt`` / ``chosen`` /
``rejected``), made with the tokenizer of the model trained here. Output: a normal Hugging
Face model directory (weights and tokenizer) that ``HFWhiteBoxLM.from_pretrained`` and
``rag-gates bench --model DIR`` load, plus ``deeprag.json`` (the prompt the model is to be
run with: the bench reads it) and ``training.json`` (settings, seconds, the loss at every
step). The defaults take the authors' learning rates and schedule (their
``scripts/training/stage1.sh`` / ``stage2.sh``): SFT lr 1e-5, 1 epoch, cosine, warmup 0.1; DPO
beta 0.4, lr 5e-7. Not theirs (docs/fidelity.md rows D11, D12): their DPO runs 8 epochs (1
here: ``epochs=8`` for theirs) and both stages accumulate gradients (4 and 2; 1 here:
``grad_accum``).

The model is trained in place (``lm.model``): load a fresh one for each run.

Example:
    >>> lm = load_lm("default")                                         # doctest: +SKIP
    >>> train_sft(lm, "sft.jsonl", "models/deeprag-sft")                # doctest: +SKIP
    >>> sft = load_lm("models/deeprag-sft")                             # doctest: +SKIP
    >>> train_dpo(sft, "dpo.jsonl", "models/deeprag-sft-dpo")           # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from rag_gates._files import iter_jsonl
from rag_gates._io import write_text_atomic
from rag_gates._optional import require
from rag_gates.deeprag.trajectory import DeepRAGPrompt
from rag_gates.errors import ArtifactError, ArtifactFileError

__all__ = ["PROMPT_FILE", "TRAINING_FILE", "Training", "prompt_view", "read_training_records",
           "train_dpo", "train_sft"]

logger = logging.getLogger(__name__)

#: The prompt a trained model is to be run with (the bench reads it).
PROMPT_FILE = "deeprag.json"
TRAINING_FILE = "training.json"


class Training(BaseModel):
    """What a training run did: settings, records, steps, seconds and the loss per step."""

    model_config = ConfigDict(frozen=True)

    stage: Literal["sft", "dpo"]
    base_model: str
    records: int = Field(..., ge=0)
    steps: int = Field(..., ge=0)
    seconds: float = Field(..., ge=0.0)
    settings: dict[str, Any]
    losses: list[tuple[int, float]] = Field(..., description="(step, training loss).")
    out: str


#: The keys every record of a stage has, and the export option that writes them.
_STAGES: dict[str, tuple[frozenset[str], str]] = {
    "sft": (frozenset({"input_ids", "labels"}), "--sft"),
    "dpo": (frozenset({"prompt", "chosen", "rejected"}), "--dpo"),
}


def read_training_records(path: str | Path, stage: Literal["sft", "dpo"]
                          ) -> list[dict[str, Any]]:
    """The records of ``rag-gates deeprag export --sft`` or ``--dpo`` for ``stage``. A file
    that is missing, empty, not UTF-8, or has a line that is not a JSON object with the
    stage's keys raises (``FileNotFoundError``, ``ArtifactError``: a ValueError) naming the
    file and the line. The CLI reads them before it loads the model.

    Example:
        >>> rows = read_training_records("sft.jsonl", "sft")      # doctest: +SKIP
        >>> sorted(rows[0])
        ['input_ids', 'labels']
    """
    keys, how = _STAGES[stage]
    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"{file} not found; write it with: rag-gates deeprag export "
                                f"--rows ROWS {how} {file}")
    hint = (f"--data takes the {how} file of rag-gates deeprag export, --rows the rows of "
            "rag-gates deeprag synthesize")
    rows = []
    for number, row in iter_jsonl(file, fix=hint, error=ArtifactFileError):
        if not keys <= set(row):
            raise ArtifactFileError(f"{file}:{number} lacks {sorted(keys - set(row))}; {hint}",
                                    path=file, line=number)
        rows.append(row)
    if not rows:
        raise ArtifactError(f"{file} has no records: the synthesis found no trajectories to "
                            "train on; synthesize more questions")
    return rows


def _prompt_file_text(prompt: DeepRAGPrompt) -> str:
    return json.dumps({"prompt": prompt.model_dump()}, indent=2)


def prompt_view(model: str | Path, out: str | Path, prompt: DeepRAGPrompt | None = None
                ) -> Path:
    """A directory that is ``model`` run with ``prompt``: a symlink to each of the model's
    files and a ``deeprag.json`` holding the prompt, which ``rag-gates bench`` reads for
    every DeepRAG method (:func:`rag_gates_lab.plugins.deeprag.bench_prompt`). No weights
    are copied; the view is rewritten in place when run again.

    ``prompt`` defaults to the paper's instruction without the demonstration: the prompt a
    DeepRAG-trained model carries, and the one the testbed's decomposition practice
    (``skill_decomposition``) trains, so a testbed model is run in the prompt it practised
    rather than the bench's one-shot prompt for untrained models.

    Example:
        >>> view = prompt_view("~/.cache/rag-gates/testbeds/tb13/model",
        ...                    "~/.cache/rag-gates/testbeds/tb13/model-deeprag-paper-prompt")
        ... # doctest: +SKIP
        >>> # rag-gates bench --model <view> --methods deeprag ...
    """
    source = Path(model).expanduser().resolve()
    if not (source / "config.json").is_file():
        raise FileNotFoundError(f"{source} is not a model directory (no config.json); pass "
                                "the directory a transformers model was saved to")
    target = Path(out).expanduser()
    if target.resolve() == source:
        raise ValueError(f"the view {target} is the model directory itself; choose another "
                         "--out")
    target.mkdir(parents=True, exist_ok=True)
    owned = [f.name for f in target.iterdir() if not f.is_symlink() and f.name != PROMPT_FILE]
    if owned:
        raise ValueError(f"{target} holds files of its own ({', '.join(sorted(owned)[:3])}): "
                         "a view holds only symlinks and deeprag.json; choose an empty or "
                         "new directory")
    for link in [f for f in target.iterdir() if f.is_symlink()]:
        link.unlink()
    for f in source.iterdir():
        if f.name != PROMPT_FILE:  # the view's prompt replaces the model's own
            (target / f.name).symlink_to(f)
    write_text_atomic(target / PROMPT_FILE, _prompt_file_text(prompt or DeepRAGPrompt()))
    return target


def _trainable(lm: Any) -> Any:
    model = getattr(lm, "model", None)
    if model is None or getattr(lm, "tokenizer", None) is None:
        raise TypeError(f"training needs a local transformers model (HFWhiteBoxLM: .model and "
                        f".tokenizer), got {type(lm).__name__}; load one with "
                        "rag_gates.lm.load_lm('default' | PATH)")
    # A model loaded from GGUF keeps a quantizer that refuses save_pretrained; its weights
    # are already dequantized to float32.
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model


def _common(out: Path, lr: float, epochs: float, max_steps: int, batch_size: int,
            grad_accum: int, seed: int) -> dict[str, Any]:
    return {"output_dir": str(out), "learning_rate": lr, "num_train_epochs": epochs,
            "max_steps": max_steps, "per_device_train_batch_size": batch_size,
            "gradient_accumulation_steps": grad_accum, "lr_scheduler_type": "cosine",
            "warmup_steps": 0.1, "logging_steps": 1, "save_strategy": "no",
            "report_to": [], "seed": seed, "use_cpu": True, "disable_tqdm": False}


def _finish(trainer: Any, lm: Any, out: Path, stage: Literal["sft", "dpo"], records: int,
            settings: dict[str, Any], prompt: DeepRAGPrompt, start: float) -> Training:
    out.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        trainer.model.save_pretrained(build)
        lm.tokenizer.save_pretrained(build)
        (build / PROMPT_FILE).write_text(_prompt_file_text(prompt))
        losses = [(int(e["step"]), float(e["loss"])) for e in trainer.state.log_history
                  if "loss" in e]
        training = Training(stage=stage, base_model=str(lm.model_id), records=records,
                            steps=int(trainer.state.global_step),
                            seconds=time.perf_counter() - start, settings=settings,
                            losses=losses, out=str(out))
        write_text_atomic(build / TRAINING_FILE, training.model_dump_json(indent=2))
        if out.exists():
            shutil.rmtree(out)
        build.rename(out)  # a finished directory, or the old one: never half of one
    finally:
        if build.exists():
            shutil.rmtree(build, ignore_errors=True)
    return training


def train_sft(lm: Any, records: str | Path, out: str | Path, *, lr: float = 1e-5,
              epochs: float = 1.0, max_steps: int = -1, batch_size: int = 1,
              grad_accum: int = 1, seed: int = 0, prompt: DeepRAGPrompt | None = None
              ) -> Training:
    """Supervised fine-tuning on ``export_sft`` records (passages already masked)."""
    require("trl", "trl")
    datasets = require("datasets", "train")
    from trl import SFTConfig, SFTTrainer

    rows = read_training_records(records, "sft")
    model = _trainable(lm)
    start = time.perf_counter()
    settings = {"lr": lr, "epochs": epochs, "max_steps": max_steps, "batch_size": batch_size,
                "grad_accum": grad_accum, "seed": seed}
    with tempfile.TemporaryDirectory() as scratch:
        config = SFTConfig(**_common(Path(scratch), lr, epochs, max_steps, batch_size,
                                     grad_accum, seed), max_length=None)
        data = datasets.Dataset.from_list([{"input_ids": r["input_ids"],
                                            "labels": r["labels"]} for r in rows])
        trainer = SFTTrainer(model=model, args=config, train_dataset=data,
                             processing_class=lm.tokenizer)
        trainer.train()
    return _finish(trainer, lm, Path(out), "sft", len(rows), settings,
                   prompt or DeepRAGPrompt(), start)


def train_dpo(lm: Any, pairs: str | Path, out: str | Path, *, beta: float = 0.4,
              lr: float = 5e-7, epochs: float = 1.0, max_steps: int = -1, batch_size: int = 1,
              grad_accum: int = 1, seed: int = 0, prompt: DeepRAGPrompt | None = None
              ) -> Training:
    """DPO on ``export_dpo`` pairs: the path's decision marker over the other, after the
    same history. No length limit, so the decision tokens at the end are never cut."""
    require("trl", "trl")
    datasets = require("datasets", "train")
    from trl import DPOConfig, DPOTrainer

    rows = read_training_records(pairs, "dpo")
    model = _trainable(lm)
    start = time.perf_counter()
    settings = {"beta": beta, "lr": lr, "epochs": epochs, "max_steps": max_steps,
                "batch_size": batch_size, "grad_accum": grad_accum, "seed": seed}
    with tempfile.TemporaryDirectory() as scratch:
        config = DPOConfig(**_common(Path(scratch), lr, epochs, max_steps, batch_size,
                                     grad_accum, seed), beta=beta, max_length=None)
        data = datasets.Dataset.from_list([{k: r[k] for k in ("prompt", "chosen", "rejected")}
                                           for r in rows])
        trainer = DPOTrainer(model=model, args=config, train_dataset=data,
                             processing_class=lm.tokenizer)
        trainer.train()
    return _finish(trainer, lm, Path(out), "dpo", len(rows), settings,
                   prompt or DeepRAGPrompt(), start)
