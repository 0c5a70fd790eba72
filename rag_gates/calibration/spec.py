"""The gate spec file: a certified threshold with everything its guarantee depends on.

A :class:`GateSpec` is written as JSON (``spec.save("gate.json")``) with a SHA-256 checksum
over every other field, so a file that was truncated or edited by hand is refused when read
(:class:`~rag_gates.errors.CalibrationError`) instead of serving a threshold nobody
certified. It records the model it was calibrated for (:class:`ModelIdentity`: a name and a
fingerprint of the weights or of the endpoint); :func:`rag_gates.calibration.load_gate`
refuses it for another model.

Example:
    >>> spec = GateSpec.load("gate.json")                              # doctest: +SKIP
    >>> spec.threshold, spec.epsilon, spec.delta, spec.assumption      # doctest: +SKIP
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import math
import platform
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rag_gates._files import read_json
from rag_gates._io import write_text_atomic
from rag_gates.errors import CalibrationError, SpecFileError

__all__ = ["ASSUMPTION", "SPEC_FORMAT", "AbstainCertificate", "CascadeFit", "GateSpec",
           "GroupCertificate",
           "ModelIdentity", "RateInterval", "WeightedFit", "package_versions"]

SPEC_FORMAT = "rag-gates/gate-spec/1"
MAX_SPEC_BYTES = 4 * 1024 * 1024
"""A spec file is a few kilobytes; anything past this is not one."""
MAX_SPEC_DEPTH = 16
"""A spec nests 4 levels (a cascade's fits); options may add a few."""

ASSUMPTION = (
    "The guarantee assumes that the calibration questions and the questions the gate will "
    "serve are exchangeable (drawn from the same distribution), answered by the same model "
    "with the same retriever and corpus; it bounds the accuracy drop against always "
    "retrieving, averaged over that distribution, not on any single question.")
"""The sentence every spec carries: what the guarantee assumes."""


class ModelIdentity(BaseModel):
    """Which model a spec was calibrated for: a readable name and a fingerprint (of the
    weights for a local model, of the endpoint and model name for a served one).

    Example:
        >>> ModelIdentity(name="openai:http://h/v1#m", fingerprint="0f3a").matches(
        ...     ModelIdentity(name="renamed", fingerprint="0f3a"))
        True
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(..., description="The model's id (path, hub id, or endpoint#model).")
    fingerprint: str = Field(..., min_length=1,
                             description="SHA-256 (hex) identifying the weights or endpoint.")
    kind: Literal["weights", "endpoint", "name"] = Field(
        "name", description="What the fingerprint covers.")

    def matches(self, other: ModelIdentity) -> bool:
        """Same fingerprint (the name may differ: a model moved to another directory is
        the same model)."""
        return self.fingerprint == other.fingerprint

    @classmethod
    def of(cls, lm: Any) -> ModelIdentity:
        """The identity of a loaded model: for a model with torch weights
        (``HFWhiteBoxLM``) a SHA-256 over every tensor's name, shape, dtype and up to 4,096
        evenly spaced values (milliseconds, and any fine-tuning step changes it); for a served
        model (``OpenAICompatibleLM``) the endpoint and model name, and the client's chat
        template's SHA-256 when it has one; otherwise the model id.
        """
        name = str(getattr(lm, "model_id", None) or type(lm).__name__)
        model = _reachable_weights(lm)
        if model is not None:
            return cls(name=name, fingerprint=_weights_fingerprint(model), kind="weights")
        base_url = getattr(lm, "base_url", None)
        if base_url is not None:
            served = getattr(lm, "model_name", None)
            if served is None and hasattr(lm, "_resolve_model") and hasattr(lm, "_call"):
                # The server names its model (GET /models) on the first request; ask now so
                # the identity does not depend on whether a request was made yet.
                served = lm._call(lm._resolve_model())
            key = f"{base_url}#{served or '?'}"
            # A chat template renders the prompts the gates score (p-true's): a spec made
            # with one must not load silently under another or none. Without one the key
            # is what it was, so specs made before templates were recorded still load.
            template = getattr(getattr(lm, "config", None), "chat_template", None)
            if isinstance(template, str) and template:
                key += f"#chat-template:{_sha(template)}"
            return cls(name=name, fingerprint=_sha(key), kind="endpoint")
        return cls(name=name, fingerprint=_sha(name), kind="name")


#: Where a wrapper keeps the model it wraps: rag-gates' own (``model``), a framework adapter
#: over a framework model (``model`` / ``llm``), and that model over transformers
#: (LangChain's ``HuggingFacePipeline.pipeline.model``, LlamaIndex's ``HuggingFaceLLM._model``).
_WRAPPED = ("model", "llm", "pipeline", "_model")


def _reachable_weights(lm: Any, depth: int = 3) -> Any:
    """The torch module whose weights ``lm`` answers with, found through the attributes a
    wrapper keeps it under (at most ``depth`` steps), or None. Two framework models of the
    same class over other weights must not share an identity (a class name is none)."""
    seen: set[int] = set()
    frontier = [lm]
    for _ in range(depth + 1):
        deeper = []
        for obj in frontier:
            if obj is None or isinstance(obj, str | int | float) or id(obj) in seen:
                continue
            seen.add(id(obj))
            if callable(getattr(obj, "state_dict", None)) and hasattr(obj, "parameters"):
                return obj
            for attr in _WRAPPED:
                try:
                    deeper.append(getattr(obj, attr, None))
                except Exception:  # a property that cannot answer: nothing reachable there
                    continue
        frontier = deeper
    return None


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _weights_fingerprint(model: Any, samples: int = 4096) -> str:
    import torch

    digest = hashlib.sha256()
    with torch.no_grad():
        for key, tensor in sorted(model.state_dict().items()):
            flat = tensor.detach().reshape(-1)
            digest.update(f"{key}|{tuple(tensor.shape)}|{tensor.dtype}|".encode())
            if flat.numel() == 0:
                continue
            step = max(1, flat.numel() // samples)
            picked = flat[::step][:samples].to(torch.float32).cpu().numpy()
            digest.update(picked.tobytes())
    return digest.hexdigest()


class RateInterval(BaseModel):
    """A proportion measured on the certification rows, with its Clopper-Pearson interval
    (two-sided, confidence ``1 - delta``) for the population."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    observed: float = Field(..., ge=0.0, le=1.0)
    lower: float = Field(..., ge=0.0, le=1.0)
    upper: float = Field(..., ge=0.0, le=1.0)

    def complement(self) -> RateInterval:
        """The interval of the other outcome's share (a skip rate's retrieval rate)."""
        return RateInterval(observed=1.0 - self.observed, lower=1.0 - self.upper,
                            upper=1.0 - self.lower)


class WeightedFit(BaseModel):
    """A fitted :class:`~rag_gates.gate.Weighted` composite (its sub-gates by name)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    gates: list[str] = Field(..., min_length=1)
    weights: list[float]
    bias: float
    center: list[float]
    scale: list[float]
    label: str = Field("closed-book wrong",
                       description="What the logistic regression predicted.")
    fit_rows: int = Field(..., ge=0, description="Rows the weights were fitted on; the "
                          "threshold was certified on the others.")


class CascadeFit(BaseModel):
    """A fitted :class:`~rag_gates.gate.Cascade` composite: each of its two gates on a
    one-gate logistic scale (the probability that the closed-book answer is wrong, fitted
    on the fitting rows), the cheap gate deciding unless its probability lies in ``band``,
    where the expensive gate decides. Its score is the deciding probability minus
    ``inner_threshold`` (the Cascade's margin); the certified threshold is on that score.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    cheap: WeightedFit
    expensive: WeightedFit
    band: list[float] = Field(..., min_length=2, max_length=2,
                              description="[lo, hi] on the cheap gate's probability.")
    inner_threshold: float = Field(0.5, gt=0.0, lt=1.0,
                                   description="Both sub-gates' threshold (the margin's zero).")
    fit_rows: int = Field(..., ge=0, description="Rows the pair, order, band and scales were "
                          "chosen on; the threshold was certified on the others.")
    expensive_share: float = Field(..., ge=0.0, le=1.0, description="Share of the fitting "
                                   "rows on which the expensive gate was asked.")
    chosen_by: str = Field("", description="How the pair and band were chosen.")

    @model_validator(mode="after")
    def _check(self) -> CascadeFit:
        if len(self.cheap.gates) != 1 or len(self.expensive.gates) != 1:
            raise ValueError("a cascade's cheap and expensive fits hold one gate each")
        if not (math.isfinite(self.band[0]) and math.isfinite(self.band[1])
                and self.band[0] <= self.band[1]):
            raise ValueError(f"cascade band must be finite lo <= hi, got {self.band}")
        return self


class GroupCertificate(BaseModel):
    """One group's certificate in a per-group spec (``calibrate(by_group=True)``): the
    threshold certified on that group's questions alone, at the group's share of the spec's
    delta. ``threshold`` None: none certified there (too few questions, or the test did not
    pass): that group always retrieves, and ``note`` says why."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    group: str = Field(..., min_length=1, description="The group's name, as --data gives it.")
    threshold: float | None = Field(..., description="Skip retrieval when score < threshold; "
                                    "None = always retrieve for this group.")
    n: int = Field(..., ge=1, description="Certification questions of this group.")
    delta: float = Field(..., ge=0.0, lt=1.0, description="This group's share of the spec's "
                         "delta (0: not tested, too few questions to certify anything).")
    unscored: int = Field(0, ge=0, description="Questions of the group the gate could not "
                          "score (retrieved: fail closed).")
    auroc: float | None = Field(None, description="AUROC for 'closed-book answer wrong' on "
                                "the group's questions.")
    skip_rate: RateInterval = Field(..., description="Share of the group's questions that "
                                    "skip retrieval, with its Clopper-Pearson interval at "
                                    "confidence 1 - delta (this group's share).")
    observed_drop: float = Field(..., description="Accuracy drop against always retrieving "
                                 "on the group's questions.")
    note: str = Field("", description="The guarantee for this group, or why none.")

    @property
    def certified(self) -> bool:
        return self.threshold is not None


class AbstainCertificate(BaseModel):
    """The third outcome of a three-way spec (``calibrate(abstain=ALPHA)``): after retrieval,
    answer only when the with-passages score is below ``threshold``, else abstain ("I don't
    know"). Certified together with the spec's skip threshold: with probability at least
    ``1 - delta`` over the draw of the calibration questions, skipping costs at most the
    spec's epsilon against always retrieving **and** the share of all questions that get a
    wrong answer (closed book or with passages) is at most ``max_error``
    (:mod:`rag_gates.calibration.abstain` states how).

    ``threshold`` None: no answer after retrieval passed the test: every retrieved question
    is abstained on (the only policy known to keep the error bound)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    score: str = Field(..., min_length=1, description="The with-passages score (higher = "
                       "less reliable): 'answer-logprob' is -mean log p of the answer "
                       "generated from the passages.")
    threshold: float | None = Field(..., description="Answer after retrieval when the score "
                                    "is below it; None = abstain after every retrieval.")
    max_error: float = Field(..., gt=0.0, lt=1.0, description="alpha: the bound on the share "
                             "of questions answered wrongly.")
    closed_share: float = Field(..., gt=0.0, lt=1.0, description="The part of max_error "
                                "given to skipped questions answered wrongly; the rest goes "
                                "to retrieved ones.")
    abstain_rate: RateInterval = Field(..., description="Share of questions abstained on.")
    observed_error: float = Field(..., ge=0.0, le=1.0, description="Share of the "
                                  "calibration questions answered wrongly by the policy.")
    observed_answered_error: float | None = Field(None, ge=0.0, le=1.0, description="Share of "
                                                  "the answered questions answered wrongly.")
    unscored: int = Field(0, ge=0, description="Questions whose with-passages score could "
                          "not be computed (abstained on: fail closed).")
    note: str = Field("", description="The guarantee in one sentence.")


def package_versions() -> dict[str, str]:
    """rag-gates, numpy and Python versions, as recorded in a spec."""
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for dist in ("rag-gates", "numpy", "transformers", "torch"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            continue
    return out


class GateSpec(BaseModel):
    """A certified gate: what to build, at which threshold, and the guarantee.

    ``threshold`` is None when no threshold was certified: the gate then always retrieves
    (``certified`` is False and ``note`` says so). The guarantee: with probability at least
    ``1 - delta`` over the draw of the ``n`` certification questions, the accuracy drop
    against always retrieving is at most ``epsilon`` on the population they came from
    (:data:`ASSUMPTION`).

    Example:
        >>> spec.save("gate.json"); GateSpec.load("gate.json") == spec   # doctest: +SKIP
        True
    """

    # Every float finite at construction (a NaN threshold compares false both ways: a gate
    # that never skips, or never retrieves), not only when the spec is saved.
    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    format: Literal["rag-gates/gate-spec/1"] = "rag-gates/gate-spec/1"
    gate: str = Field(..., min_length=1, description="Gate name or expression (a composite's "
                      "name when ``composite`` is set).")
    composite: WeightedFit | None = Field(None, description="A fitted Weighted composite.")
    cascade: CascadeFit | None = Field(None, description="A fitted Cascade composite.")
    options: dict[str, Any] = Field(default_factory=dict,
                                    description="Keyword options of the gate's factory "
                                                "(e.g. the prompt's dataset).")
    threshold: float | None = Field(..., description="Skip retrieval when score < threshold; "
                                    "None = no threshold certified: always retrieve.")
    certified: bool
    epsilon: float = Field(..., gt=0.0, lt=1.0, description="The bound on the accuracy drop.")
    delta: float = Field(..., gt=0.0, lt=1.0, description="The probability it may fail.")
    family: int = Field(1, ge=1, description="Gates certified together, each at "
                        "delta / family, so the guarantee holds for this one picked from them.")
    bound: Literal["exact", "exact-random", "wsr", "binomial"]
    n: int = Field(..., ge=1, description="Certification questions.")
    unscored: int = Field(0, ge=0, description="Certification questions the gate could not "
                          "score (counted as retrieved: fail closed).")
    auroc: float | None = Field(None, description="AUROC of the score for 'closed-book "
                                "answer wrong' on the certification rows.")
    skip_rate: RateInterval = Field(..., description="Share of questions that skip retrieval.")
    retrieval_rate: RateInterval
    observed_drop: float = Field(..., description="Accuracy drop against always retrieving "
                                 "on the certification rows (negative = a gain).")
    model: ModelIdentity
    retriever: str = Field(..., description="The retriever and corpus the labels used.")
    versions: dict[str, str] = Field(default_factory=dict)
    created: str = Field(..., description="UTC date and time (ISO 8601).")
    assumption: str = ASSUMPTION
    note: str = Field("", description="One human sentence: the guarantee, or why none.")
    labels: Literal["gold", "none", "mixed"] = Field(
        "gold", description="What the certification questions were labelled by: their gold "
        "answers; none (certified without labels: the share of skipped questions whose two "
        "replies differ, an upper bound on the accuracy drop, judged by ``judge``); or mixed "
        "(gold answers where the data had them).")
    judge: str | None = Field(None, description="The same-answer judge of the unlabelled "
                              "questions (exact, f1:CUT); None with gold labels.")
    groups: list[GroupCertificate] | None = Field(
        None, description="Per-group certificates (calibrate(by_group=True)): one threshold "
        "per group, each certified on that group's questions at its share of delta; "
        "``threshold`` is then None, and a group not listed (or no group) always retrieves. "
        "None: one threshold for every question.")
    abstain: AbstainCertificate | None = Field(
        None, description="The certified abstention after retrieval (calibrate(abstain="
        "ALPHA)); None: the spec answers every retrieved question.")
    population: str | None = Field(
        None, min_length=1, max_length=2000,
        description="The population the calibration questions were drawn from, and how "
        "(the guarantee holds for questions drawn like them): rag-gates calibrate "
        "--population, or GateSpec.with_population. None: not stated.")
    checksum: str = Field("", description="SHA-256 over the canonical JSON of every other "
                          "field; written by save().")

    @model_validator(mode="after")
    def _finite_options(self) -> GateSpec:
        where = _non_finite(self.options, "options")
        if where is not None:
            raise ValueError(f"{where} is not a finite number: a spec holds finite numbers "
                             "only")
        if self.groups is not None:
            _check_groups(self)
            if self.abstain is not None:
                raise ValueError("a spec is either per group or three-way (abstain), not "
                                 "both: calibrate them apart")
        return self

    def group(self, name: str) -> GroupCertificate | None:
        """The certificate of group ``name`` (None: the spec has not seen that group, or is
        not per group)."""
        for certificate in self.groups or ():
            if certificate.group == name:
                return certificate
        return None

    def payload_checksum(self) -> str:
        """The checksum this spec's content should carry."""
        # A spec without a cascade, or certified on gold labels, hashes as it did before
        # those fields existed.
        skip = {"checksum"} | ({"cascade"} if self.cascade is None else set()) | (
            {"labels", "judge"} if self.labels == "gold" and self.judge is None else set()) | (
            {"groups"} if self.groups is None else set()) | (
            {"abstain"} if self.abstain is None else set()) | (
            {"population"} if self.population is None else set())
        body = self.model_dump(mode="json", exclude=skip)
        text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
        return _sha(text)

    def with_population(self, population: str) -> GateSpec:
        """This spec, sealed, stating the population its questions were drawn from (what the
        guarantee is about: questions drawn like them).

        Example:
            >>> spec.with_population("PopQA dev rows with a gold paragraph; a seeded "
            ...                      "uniform draw of 300").save("gate.json")  # doctest: +SKIP
        """
        if not isinstance(population, str) or not population.strip():
            raise ValueError("population must be a non-empty sentence: where the calibration "
                             "questions came from and how they were drawn")
        return self.model_copy(update={"population": population.strip()}).sealed()

    def sealed(self) -> GateSpec:
        """This spec with its checksum filled in."""
        return self.model_copy(update={"checksum": self.payload_checksum()})

    def save(self, path: str | Path) -> Path:
        """Write the spec as JSON (atomically), checksum included; returns the path."""
        out = Path(path).expanduser()
        out.parent.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out, json.dumps(self.save_json(), indent=2, allow_nan=False) + "\n")
        return out

    @classmethod
    def load(cls, path: str | Path) -> GateSpec:
        """Read a spec written by :meth:`save`; a file that is missing, truncated, not a spec,
        or whose checksum does not match its content raises
        :class:`~rag_gates.errors.CalibrationError`."""
        file = Path(path).expanduser()
        if file.is_dir():
            raise CalibrationError(f"{file} is a directory; pass the gate spec file in it "
                                   "(rag-gates calibrate --out FILE.json writes one)")
        if not file.is_file():
            raise CalibrationError(f"{file}: no such gate spec; write one with "
                                   f"rag-gates calibrate --out {file}")
        data = read_json(file, max_bytes=MAX_SPEC_BYTES, max_depth=MAX_SPEC_DEPTH,
                         error=SpecFileError,
                         fix="the file is truncated or damaged; recalibrate with rag-gates "
                             "calibrate")
        return cls.from_json_dict(data, source=str(file))

    @classmethod
    def from_json_dict(cls, data: Any, *, source: str = "<spec>") -> GateSpec:
        """Validate a spec's JSON object and its checksum (see :meth:`load`)."""
        if not isinstance(data, dict) or data.get("format") != SPEC_FORMAT:
            raise CalibrationError(f"{source} is not a rag-gates gate spec (expected "
                                   f"format {SPEC_FORMAT!r}); write one with rag-gates "
                                   "calibrate")
        try:
            spec = cls.model_validate(data)
        except ValidationError as error:
            raise CalibrationError(f"{source} is not a complete gate spec: {error}") from None
        if not spec.checksum:
            raise CalibrationError(f"{source} carries no checksum: it was not written by "
                                   "GateSpec.save; recalibrate")
        if spec.checksum != spec.payload_checksum():
            raise CalibrationError(
                f"{source}: checksum mismatch: the file was edited by hand or damaged after "
                "it was written, so its threshold is no longer the certified one; recalibrate "
                "(rag-gates calibrate) instead of editing the threshold")
        if spec.threshold is not None and not math.isfinite(spec.threshold):
            raise CalibrationError(f"{source}: threshold {spec.threshold!r} is not finite")
        return spec

    def save_json(self) -> dict[str, Any]:
        """The sealed spec as the JSON object :meth:`save` writes (a spec with one
        threshold for every question has no ``groups`` key, as before groups existed)."""
        absent = {name for name in ("groups", "abstain", "population")
                  if getattr(self, name) is None}
        return self.sealed().model_dump(mode="json", exclude=absent or None)

    def summary(self, name: str | None = None) -> dict[str, Any]:
        """What every decision's ``evidence["spec"]`` names: the spec and its guarantee."""
        summary = {"name": name or self.gate, "epsilon": self.epsilon, "delta": self.delta,
                   "bound": self.bound, "n": self.n, "threshold": self.threshold,
                   "certified": self.certified}
        if self.labels != "gold":
            summary.update(labels=self.labels, judge=self.judge)
        if self.groups is not None:
            summary["groups"] = len(self.groups)
        if self.population is not None:
            summary["population"] = self.population
        if self.abstain is not None:
            summary.update(abstain_threshold=self.abstain.threshold,
                           max_error=self.abstain.max_error)
        return summary


def _check_groups(spec: GateSpec) -> None:
    """A per-group spec says one thing: every group's threshold is its own certificate, the
    shares of delta add up to at most delta, and nothing else decides."""
    groups = spec.groups or []
    if not groups:
        raise ValueError("groups is empty: a per-group spec lists at least one group")
    names = [g.group for g in groups]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"group {dup!r} appears twice in groups")
    if spec.threshold is not None:
        raise ValueError("a per-group spec has no threshold of its own (threshold must be "
                         "null): each group's is in groups")
    if spec.composite is not None or spec.cascade is not None:
        raise ValueError("a per-group spec certifies one gate, not a composite")
    if spec.certified != any(g.certified for g in groups):
        raise ValueError("certified must say whether any group has a certified threshold")
    if sum(g.n for g in groups) != spec.n:
        raise ValueError(f"the groups' questions add up to {sum(g.n for g in groups)}, "
                         f"not n = {spec.n}")
    spent = sum(g.delta for g in groups) * spec.family
    if spent > spec.delta * (1 + 1e-9):
        raise ValueError(f"the groups' shares of delta ({spent:g} over {spec.family} gates) "
                         f"exceed delta {spec.delta:g}")
    untested = [g.group for g in groups if g.certified and g.delta <= 0]
    if untested:
        raise ValueError(f"group {untested[0]!r} has a threshold but no share of delta")


def _non_finite(value: Any, where: str) -> str | None:
    """The place (``options['a'][0]``) of the first non-finite float in ``value``."""
    if isinstance(value, float):
        return None if math.isfinite(value) else where
    items: Any = (value.items() if isinstance(value, dict)
                  else enumerate(value) if isinstance(value, list | tuple) else ())
    for key, item in items:
        found = _non_finite(item, f"{where}[{key!r}]")
        if found is not None:
            return found
    return None


def utc_now() -> str:
    """The current UTC time, ISO 8601 to the second."""
    return _dt.datetime.now(_dt.UTC).replace(microsecond=0).isoformat()
