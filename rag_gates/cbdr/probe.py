"""The CBDR confidence probe: an MLP on one hidden state that predicts "the model answers this
question right", trained on the model's own greedy answers.

``Conf(q) = softmax(probe(h))[1]`` where ``h`` is the hidden state at one layer (default: the
middle one, ``hidden_states[(num_layers + 1) // 2]``) and one position (default: the last
prompt token, after the chat template's generation prompt) of the probe's QA prompt.

A probe is saved as ``probe.safetensors`` (weights, plus the feature mean/std it standardises
with) and ``probe.json`` (:class:`ProbeConfig`: model id, layer, position, prompts, training
record). Loading it against a different model raises :class:`ProbeMismatchError`.

Example:
    >>> from rag_gates.cbdr import ConfidenceProbe
    >>> probe = ConfidenceProbe.load("probes/smollm2", lm=lm)   # refuses another model
    >>> probe.confidence(lm, ["Who wrote Hamlet?"])
    [0.93]
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError

from rag_gates._files import parse_json, read_bytes, read_json
from rag_gates._io import write_bytes_atomic, write_text_atomic
from rag_gates._optional import require
from rag_gates.cbdr.prompts import ProbePrompts
from rag_gates.errors import ArtifactError, ArtifactFileError, ProbeMismatchError
from rag_gates.lm.base import require_white_box

require("torch", "hf")
require("sklearn", "hf")
require("safetensors", "hf")
import torch  # noqa: E402
from safetensors.torch import load as safetensors_load  # noqa: E402
from safetensors.torch import save  # noqa: E402
from sklearn.metrics import roc_auc_score  # noqa: E402

__all__ = ["DEFAULT_BETA", "ConfidenceProbe", "ProbeCalibration", "ProbeConfig", "ProbeTraining",
           "default_layer", "train_probe"]

#: The beta of a probe that carries no calibration (the gate retrieves when Conf(q) <= beta).
DEFAULT_BETA = 0.5

FORMAT_VERSION = 1
CONFIG_FILE = "probe.json"
WEIGHTS_FILE = "probe.safetensors"
MAX_CONFIG_BYTES = 1024 * 1024
"""probe.json is under a kilobyte; a larger file is not one."""
MAX_WEIGHTS_BYTES = 1024 * 1024 * 1024
"""probe.safetensors: an MLP over one layer's hidden state, megabytes even for a 70B model."""
#: The weights file's metadata key holding a copy of the probe's config (the pair's check).
CONFIG_METADATA = "probe_config"


def default_layer(lm: Any) -> int:
    """The card's middle layer: ``hidden_states[len // 2]`` with embeddings at index 0."""
    return (int(lm.num_layers) + 1) // 2


class ProbeCalibration(BaseModel):
    """The beta calibrated for a probe, kept with it so every gate built on the probe uses the
    same one (unless given another).

    Example:
        >>> ProbeCalibration(beta=0.442, made_with="python benchmarks/cbdr_threshold.py ...").beta
        0.442
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    beta: float = Field(..., ge=0.0, le=1.0, description=(
        "Skip retrieval when Conf(q) > beta: the gates' default for this probe."))
    made_with: str = Field("", description="The command (and rows) it was calibrated with.")
    expected: dict[str, float] = Field(default_factory=dict, description=(
        "What the calibration rows showed at this beta (accuracy, retrieval_rate)."))


class ProbeConfig(BaseModel):
    """Everything needed to use a probe correctly, saved beside its weights."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    format_version: int = FORMAT_VERSION
    model_id: str = Field(..., description="The model the probe reads; others are refused.")
    hidden_size: int = Field(..., ge=1)
    num_layers: int = Field(..., ge=1)
    layer: int = Field(..., ge=0, description="Hidden-state index (0 = embeddings).")
    position: int = Field(-1, description="Prompt position (-1 = last token).")
    prompts: ProbePrompts = Field(default_factory=ProbePrompts)
    hidden_dims: tuple[int, ...] = Field((512, 64, 32), description="MLP hidden widths.")
    dropout: float = Field(0.5, ge=0.0, lt=1.0)
    label_max_new_tokens: int = Field(
        64, ge=1, description="Token budget of the greedy answers the labels came from.")
    trained_on: dict[str, JsonValue] = Field(default_factory=dict)
    metrics: dict[str, JsonValue] = Field(default_factory=dict)
    calibration: ProbeCalibration | None = Field(
        None, description="The calibrated beta (None: not calibrated, DEFAULT_BETA).")


def _mlp(d: int, hidden_dims: Sequence[int], dropout: float) -> torch.nn.Sequential:
    layers: list[torch.nn.Module] = []
    width = d
    for h in hidden_dims:
        layers += [torch.nn.Linear(width, h), torch.nn.ReLU(), torch.nn.Dropout(dropout)]
        width = h
    layers.append(torch.nn.Linear(width, 2))
    return torch.nn.Sequential(*layers)


class ConfidenceProbe:
    """A trained probe and its configuration; reads ``Conf`` from a model's hidden state."""

    def __init__(self, config: ProbeConfig, module: torch.nn.Sequential | None = None,
                 mean: torch.Tensor | None = None, std: torch.Tensor | None = None) -> None:
        self.config = config
        d = config.hidden_size
        self.module = module if module is not None else _mlp(d, config.hidden_dims,
                                                             config.dropout)
        self.module.eval()
        # The MLP runs in float32: statistics saved in another precision (float64 from numpy,
        # say) are read as float32 here, or the first decision fails on a dtype mismatch.
        self.mean = (mean if mean is not None else torch.zeros(d)).to(torch.float32)
        self.std = (std if std is not None else torch.ones(d)).to(torch.float32)

    # ------------------------------------------------------------------ identity
    @property
    def layer(self) -> int:
        return self.config.layer

    @property
    def prompts(self) -> ProbePrompts:
        return self.config.prompts

    @property
    def beta(self) -> float:
        """The beta calibrated for this probe (its ``probe.json``), else :data:`DEFAULT_BETA`:
        what a gate on this probe uses unless given one."""
        calibration = self.config.calibration
        return DEFAULT_BETA if calibration is None else calibration.beta

    def check_compatible(self, lm: Any) -> None:
        """Raise :class:`ProbeMismatchError` unless ``lm`` is the model the probe was trained on
        (and :class:`WhiteBoxRequiredError` first for a model without hidden states, such as a
        served one: no probe could be read there, whatever model it was trained on)."""
        require_white_box(lm, "the CBDR probe", instead="QuCoGate (text only) to decide, and "
                          "CrossEncoderReranker to rerank")
        model_id = getattr(lm, "model_id", None)
        if model_id != self.config.model_id:
            raise ProbeMismatchError(
                f"this probe was trained on model {self.config.model_id!r}, not {model_id!r}; "
                "its confidence would be meaningless on another model's hidden states. Train "
                "one for this model: rag-gates cbdr train-probe --model ... --out DIR")
        size = getattr(lm, "hidden_size", None)
        if size != self.config.hidden_size:
            raise ProbeMismatchError(
                f"probe expects hidden size {self.config.hidden_size}, the model has {size}")

    # ------------------------------------------------------------------ inference
    def confidence_from_hidden(self, hidden: torch.Tensor) -> torch.Tensor:
        """``softmax(probe(h))[1]`` for hidden states ``[n, d]`` (or ``[d]``)."""
        if hidden.ndim == 1:
            hidden = hidden[None]
        if hidden.shape[-1] != self.config.hidden_size:
            raise ProbeMismatchError(f"hidden states have size {hidden.shape[-1]}, the probe "
                                     f"expects {self.config.hidden_size}")
        with torch.inference_mode():
            x = (hidden.float() - self.mean) / self.std
            return torch.softmax(self.module(x), dim=-1)[:, 1]

    def features(self, lm: Any, prompts: Sequence[str], *, batch_size: int = 8,
                 truncation: str = "error") -> torch.Tensor:
        """Hidden states ``[len(prompts), d]`` at the probe's layer and position."""
        lm = require_white_box(lm, "the CBDR probe")
        self.check_compatible(lm)
        if not prompts:
            return torch.empty(0, self.config.hidden_size)
        h = lm.hidden_states(list(prompts), [self.layer], position=self.config.position,
                             batch_size=batch_size, truncation=truncation)
        return h[:, 0]

    def confidence(self, lm: Any, questions: Sequence[str], *, batch_size: int = 8
                   ) -> list[float]:
        """``Conf(q)`` for each question, through the probe's QA prompt."""
        feats = self.features(lm, [self.prompts.qa(q) for q in questions],
                              batch_size=batch_size)
        return [float(c) for c in self.confidence_from_hidden(feats)] if len(feats) else []

    # ------------------------------------------------------------------ persistence
    def save(self, directory: str | Path) -> Path:
        """Write ``probe.safetensors`` and ``probe.json`` into ``directory`` (created).

        Each file is replaced atomically through a temporary file of this call's own, so
        processes saving at once never rename each other's half-written file. The weights
        carry a copy of the config: a reader that meets one save's weights beside another's
        ``probe.json`` (between the two renames) is refused by :meth:`load`, never given
        weights read with the wrong config."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        tensors = {f"mlp.{k}": v.detach().contiguous().cpu()
                   for k, v in self.module.state_dict().items()}
        tensors["feature_mean"] = self.mean.contiguous()
        tensors["feature_std"] = self.std.contiguous()
        config = self.config.model_dump_json(indent=2)
        write_bytes_atomic(out / WEIGHTS_FILE, save(tensors, metadata={
            "model_id": self.config.model_id, CONFIG_METADATA: config}))
        write_text_atomic(out / CONFIG_FILE, config)
        return out

    @classmethod
    def load(cls, directory: str | Path, *, lm: Any = None) -> ConfidenceProbe:
        """Load a saved probe; with ``lm``, refuse it unless it was trained on that model."""
        path = Path(directory)
        config_path, weights_path = path / CONFIG_FILE, path / WEIGHTS_FILE
        if not config_path.is_file() or not weights_path.is_file():
            raise FileNotFoundError(
                f"{path} is not a probe directory (needs {CONFIG_FILE} and {WEIGHTS_FILE}); "
                "train one with: rag-gates cbdr train-probe --out DIR")
        retrain = "retrain it with: rag-gates cbdr train-probe --out DIR"
        raw = read_json(config_path, max_bytes=MAX_CONFIG_BYTES, max_depth=16, expect=dict,
                        fix=f"it is not a valid probe config; restore it or {retrain}",
                        error=ArtifactFileError)
        try:
            config = ProbeConfig.model_validate(raw)
        except ValueError as exc:
            raise ArtifactFileError(f"{config_path} is not a valid probe config: {exc}; "
                                    f"restore it or {retrain}", path=config_path) from exc
        if config.format_version != FORMAT_VERSION:
            raise ArtifactError(f"{config_path}: probe format {config.format_version}, this "
                                f"version of rag-gates reads {FORMAT_VERSION}; {retrain}")
        fix = ("it cannot be read: the file is truncated or not a safetensors file; restore "
               f"it or {retrain}")
        metadata, tensors = _read_safetensors(weights_path, fix)
        # Probes saved before the weights carried their config have no copy to compare.
        paired = metadata.get(CONFIG_METADATA)
        if paired is not None:
            try:
                paired_config = ProbeConfig.model_validate(parse_json(
                    paired, weights_path, max_depth=16, expect=dict, fix=fix,
                    error=ArtifactFileError))
            except ValidationError as exc:
                raise ArtifactFileError(f"{weights_path}: the probe config it carries is not "
                                        f"one ({exc.errors()[0]['msg']}); {fix}",
                                        path=weights_path) from None
        if paired is not None and paired_config != config:
            raise ArtifactError(
                f"{weights_path} was saved with another {CONFIG_FILE} than the one beside it "
                "(two saves into this directory at once, or a file copied from another probe); "
                f"load it again once the save has finished, or {retrain}")
        _check_tensors(tensors, config.hidden_size, f"{weights_path}", retrain)
        module = _mlp(config.hidden_size, config.hidden_dims, config.dropout)
        state = {k[len("mlp."):]: v for k, v in tensors.items() if k.startswith("mlp.")}
        try:
            module.load_state_dict(state)
        except RuntimeError as exc:
            raise ArtifactError(f"{weights_path} does not match {config_path}: {exc}; "
                                f"{retrain}") from exc
        probe = cls(config, module, tensors["feature_mean"], tensors["feature_std"])
        if lm is not None:
            probe.check_compatible(lm)
        return probe


def _read_safetensors(path: Path, fix: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The metadata and tensors of a safetensors file, read once through the bounded reader;
    a file that is too large, truncated, or not safetensors raises
    :class:`~rag_gates.errors.ArtifactFileError` naming it."""
    data = read_bytes(path, max_bytes=MAX_WEIGHTS_BYTES, fix=fix, error=ArtifactFileError)

    def bad(problem: str) -> ArtifactFileError:
        return ArtifactFileError(f"{path}: {problem}; {fix}", path=path)

    # The format: an 8-byte little-endian header length, the JSON header, then the data.
    if len(data) < 8:
        raise bad(f"{len(data)} bytes, shorter than a safetensors header")
    size = int.from_bytes(data[:8], "little")
    if size > len(data) - 8:
        raise bad(f"its header claims {size:,} bytes, the file holds {len(data) - 8:,} after "
                  "the length")
    header = parse_json(data[8:8 + size], path, max_depth=8, expect=dict, fix=fix,
                        error=ArtifactFileError)
    metadata = header.get("__metadata__") or {}
    if not isinstance(metadata, dict) or not all(
            isinstance(v, str) for v in metadata.values()):
        raise bad("its __metadata__ is not an object of strings")
    try:
        tensors = safetensors_load(data)
    except Exception as exc:  # safetensors raises its own error type, with no path
        raise bad(str(exc)) from exc
    return metadata, tensors


def _check_tensors(tensors: dict[str, torch.Tensor], hidden_size: int, where: str,
                   retrain: str) -> None:
    """Refuse what would make every confidence NaN: missing or misshapen feature statistics,
    non-finite values, a zero or negative spread."""
    for name in ("feature_mean", "feature_std"):
        if name not in tensors:
            raise ArtifactError(f"{where} has no {name!r} tensor: it is incomplete or not a "
                                f"rag-gates probe; {retrain}")
        if tuple(tensors[name].shape) != (hidden_size,):
            raise ArtifactError(f"{where}: {name} has shape {tuple(tensors[name].shape)}, the "
                                f"probe config says ({hidden_size},); {retrain}")
        if not tensors[name].is_floating_point():  # other float precisions: read as float32
            raise ArtifactError(f"{where}: {name} has dtype {tensors[name].dtype}, not a "
                                f"floating-point type; {retrain}")
    for name, tensor in tensors.items():
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            bad = int((~torch.isfinite(tensor)).sum())
            raise ArtifactError(f"{where}: {name} is not finite ({bad} NaN/inf values); the "
                                f"probe would decide on NaN. {retrain}")
    if not bool((tensors["feature_std"] > 0).all()):
        bad = int((tensors["feature_std"] <= 0).sum())
        raise ArtifactError(f"{where}: feature_std is zero or negative in {bad} dimensions "
                            f"(degenerate statistics make confidence NaN); {retrain}")


class ProbeTraining(BaseModel):
    """How training went: the dev AUROC of every epoch and the one kept."""

    model_config = ConfigDict(frozen=True)

    best_epoch: int
    best_dev_auroc: float
    dev_auroc: list[float]
    train_loss: list[float]
    train_examples: int
    dev_examples: int
    train_positive_rate: float
    seconds: float


def train_probe(
    config: ProbeConfig,
    train_x: torch.Tensor,
    train_y: Sequence[int],
    dev_x: torch.Tensor,
    dev_y: Sequence[int],
    *,
    epochs: int = 30,
    lr: float = 5e-5,
    batch_size: int = 32,
    standardize: bool = True,
    seed: int = 0,
    progress: Callable[[int, int, float], None] | None = None,
) -> tuple[ConfidenceProbe, ProbeTraining]:
    """Train the MLP with class-balanced cross-entropy on logits (Adam), keeping the epoch
    with the best dev AUROC.

    ``standardize`` scales features by the training mean/std (stored with the probe): the
    middle-layer states of small models have a few huge dimensions that otherwise dominate.
    """
    labels = [int(y) for y in train_y]
    dev_labels = [int(y) for y in dev_y]
    if len(labels) != len(train_x) or len(dev_labels) != len(dev_x):
        raise ValueError("features and labels differ in length")
    for name, ys in (("training", labels), ("dev", dev_labels)):
        if set(ys) != {0, 1}:
            raise ValueError(
                f"the {name} labels must contain both classes (right and wrong answers); got "
                f"{sorted(set(ys))}. Use more questions, or a dataset the model sometimes "
                "answers right.")
    if epochs < 1 or batch_size < 1 or lr <= 0:
        raise ValueError("epochs and batch_size must be >= 1 and lr > 0")
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    x = train_x.float()
    mean = x.mean(0) if standardize else torch.zeros(x.shape[1])
    std = x.std(0).clamp(min=1e-6) if standardize else torch.ones(x.shape[1])
    probe = ConfidenceProbe(config, mean=mean, std=std)
    module = probe.module
    y = torch.tensor(labels)
    positives = int(y.sum())
    # Class-balanced: each class contributes half of the loss.
    weights = torch.tensor([len(y) / (2.0 * (len(y) - positives)), len(y) / (2.0 * positives)])
    loss_fn = torch.nn.CrossEntropyLoss(weight=weights)
    optimizer = torch.optim.Adam(module.parameters(), lr=lr)
    xs = (x - mean) / std
    best: tuple[float, int, dict[str, torch.Tensor]] = (-math.inf, -1, {})
    dev_curve: list[float] = []
    losses: list[float] = []
    for epoch in range(epochs):
        module.train()
        order = torch.randperm(len(y), generator=gen)
        total = 0.0
        for lo in range(0, len(y), batch_size):
            idx = order[lo: lo + batch_size]
            optimizer.zero_grad()
            loss = loss_fn(module(xs[idx]), y[idx])
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(idx)
        losses.append(total / len(y))
        module.eval()
        dev_scores = [float(c) for c in probe.confidence_from_hidden(dev_x)]
        # Conf predicts "right"; AUROC of Conf for the positive label.
        value = float(roc_auc_score(dev_labels, dev_scores))
        dev_curve.append(value)
        if value > best[0]:
            best = (value, epoch, {k: v.clone() for k, v in module.state_dict().items()})
        if progress is not None:
            progress(epoch + 1, epochs, value)
    module.load_state_dict(best[2])
    module.eval()
    training = ProbeTraining(
        best_epoch=best[1] + 1, best_dev_auroc=best[0], dev_auroc=dev_curve, train_loss=losses,
        train_examples=len(y), dev_examples=len(dev_labels),
        train_positive_rate=positives / len(y), seconds=time.perf_counter() - start)
    probe.config = config.model_copy(update={"metrics": {
        **config.metrics, "dev_auroc": training.best_dev_auroc,
        "best_epoch": training.best_epoch, "train_examples": training.train_examples,
        "dev_examples": training.dev_examples,
        "train_positive_rate": training.train_positive_rate,
        "train_seconds": round(training.seconds, 2)}})
    return probe, training
