"""The source policy shipped for the embedded SmolLM2-135M-Instruct, and how to find a user's own.

The package carries the *labels* (question, preferred source), not the keys: the keys are the
model's own hidden states, computed for the model that loads the policy (one forward pass per
question: minutes for the shipped file on a CPU), so the datastore always matches the model
that asks. They are cached under ``$RAG_GATES_HOME/srrag/key-cache`` keyed by the weights'
fingerprint, the labelled questions and the key function (:mod:`rag_gates.srrag.key_cache`), so a
later load with the same model and file, in any process, skips the model. The labels
come from ``rag-gates srrag label`` on training rows (offset 500, held apart from the
questions every benchmark uses; the header's ``made_with`` names the command and how many
rows); ``benchmarks/srrag_ship_policy.py`` writes the file from a labels JSONL, with the
``k`` and ``tau`` it calibrates on them.

For any other model, label and build a datastore (``rag-gates srrag label``, ``rag-gates
srrag build-policy``) and point ``RAG_GATES_SRRAG_POLICY`` at it (a local directory or an
``http(s)://`` Qdrant URL).

Example:
    >>> lm = load_default_lm()
    >>> policy = load_default_policy(lm)          # the shipped labels, keyed by lm, in memory
    >>> gate = SelfRoutingGate(lm, policy)
    >>> gate.decide("In what city was Ingvild Bryn born?").reason  # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from rag_gates._files import parse_json, read_text
from rag_gates._io import write_text_atomic
from rag_gates.errors import ArtifactError, ArtifactFileError
from rag_gates.srrag.policy import DEFAULT_K, PolicyEntry, PolicyMismatchError, SourcePolicy

__all__ = ["DEFAULT_POLICY_LABELS", "POLICY_ENV", "ShippedLabelsHeader", "load_default_policy",
           "read_policy_labels", "write_policy_labels"]

DEFAULT_POLICY_LABELS = Path(__file__).resolve().parent / "policies" / "smollm2.jsonl"
POLICY_ENV = "RAG_GATES_SRRAG_POLICY"
_KIND = "srrag-policy-labels"


class ShippedLabelsHeader(BaseModel):
    """The first line of a policy-labels file: whose labels they are and how they were made."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str = Field(_KIND, description="Always 'srrag-policy-labels'.")
    model_id: str = Field(..., description="The model whose likelihoods chose each source.")
    questions: int = Field(..., ge=0, description="Labelled questions that follow.")
    made_with: str = Field("", description="The command that wrote the labels.")
    k: int | None = Field(None, ge=1, description=(
        "Neighbours that vote: the paper's 30, fewer for a small file (None: DEFAULT_K)."))
    tau: float | None = Field(None, ge=0.0, le=1.0, description=(
        "The threshold calibrated on these questions themselves, leave-one-out (each voted "
        "on by the others): the one whose routes agree most with the labels. None: not "
        "calibrated (use DEFAULT_TAU)."))
    calibration: dict[str, float] = Field(default_factory=dict, description=(
        "How the calibrated tau did on the labelled questions: agreement with the labels, "
        "share routed to retrieval, share labelled retrieval (the agreement of always "
        "retrieving)."))


def write_policy_labels(path: str | Path, entries: Sequence[PolicyEntry], model_id: str,
                        made_with: str = "", tau: float | None = None,
                        calibration: dict[str, float] | None = None,
                        k: int | None = None) -> Path:
    """Write ``entries`` (one labelled question a line) under a header naming ``model_id``
    (and the calibrated ``tau``, see :class:`ShippedLabelsHeader`)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    header = ShippedLabelsHeader(model_id=model_id, questions=len(entries), made_with=made_with,
                                 tau=tau, calibration=calibration or {}, k=k)
    lines = [header.model_dump_json()] + [e.model_dump_json() for e in entries]
    # Atomic: the reader refuses a cut file, and this one ships inside the package.
    write_text_atomic(out, "\n".join(lines) + "\n")
    return out


def read_policy_labels(path: str | Path = DEFAULT_POLICY_LABELS,
                       ) -> tuple[ShippedLabelsHeader, list[PolicyEntry]]:
    """The header and entries of a policy-labels file.

    Raises:
        ArtifactError: the file is not one, a line does not parse, or it holds another number
            of questions than its header says (a cut or edited file would move the votes).
    """
    where = Path(path)
    fix = "restore or rewrite the file"
    numbered = [(number, line) for number, line in enumerate(
        read_text(where, fix=fix, error=ArtifactFileError).splitlines(), start=1)
        if line.strip()]
    try:
        header = ShippedLabelsHeader.model_validate(parse_json(
            numbered[0][1], where, line=numbered[0][0], fix=fix, error=ArtifactFileError)
            ) if numbered else None
    except ValidationError as exc:
        raise ArtifactFileError(f"{where}: the first line is not a policy-labels header "
                                f"({exc.errors()[0]['msg']})", path=where, line=1) from exc
    if header is None or header.kind != _KIND:
        raise ArtifactError(f"{where} is not an SR-RAG policy-labels file (its first line "
                            f"must be a {_KIND!r} header); write one with write_policy_labels")
    entries = list(_entries(where, numbered[1:]))
    if len(entries) != header.questions:
        raise ArtifactError(f"{where}: the header promises {header.questions} questions, the "
                            f"file holds {len(entries)}; restore or rewrite the file")
    return header, entries


def _entries(where: Path, lines: Iterable[tuple[int, str]]) -> Iterable[PolicyEntry]:
    for number, line in lines:
        row = parse_json(line, where, line=number, expect=dict,
                         fix="not a labelled question; restore or rewrite the file",
                         error=ArtifactFileError)
        try:
            yield PolicyEntry.model_validate(row)
        except ValidationError as exc:
            raise ArtifactFileError(f"{where}:{number}: not a labelled question "
                                    f"({type(exc).__name__}: {str(exc).splitlines()[0]})",
                                    path=where, line=number) from exc


def load_default_policy(lm: Any, *, k: int | None = None,
                        labels: str | Path | None = None,
                        cache_keys: bool | None = None) -> SourcePolicy:
    """A labels file (``labels``) keyed by ``lm``'s hidden states in an in-memory datastore;
    with no ``labels``, ``$RAG_GATES_SRRAG_POLICY`` (a built datastore: a directory, opened
    read-only so any number of processes share it, or a Qdrant URL) if set, else the
    shipped file. ``k``: the file's own (see :class:`ShippedLabelsHeader`) unless given. The
    policy carries the file's calibrated tau (``policy.tau``; None with another ``k``), which
    a :class:`SelfRoutingGate` over it uses unless given one.

    The labels' keys are read from the key cache when it holds them for this model's weights
    and these questions, else computed and cached (:mod:`rag_gates.srrag.key_cache`);
    ``cache_keys=False`` (or ``$RAG_GATES_SRRAG_KEY_CACHE=0``) always computes them.

    Example:
        >>> policy = load_default_policy(lm)          # minutes the first time   # doctest: +SKIP
        >>> policy = load_default_policy(lm)          # then the cached keys     # doctest: +SKIP

    Raises:
        PolicyMismatchError: the labels were made with another model than ``lm`` (its own
            likelihoods chose each source, so they say nothing about another model).
        ArtifactError: the labels file is damaged.
    """
    where = os.environ.get(POLICY_ENV) if labels is None else None
    if where:
        remote = where.startswith(("http://", "https://"))
        return SourcePolicy.open_existing(lm, path=None if remote else where,
                                          url=where if remote else None, k=k or DEFAULT_K)
    from rag_gates.srrag.key_cache import policy_keys
    from rag_gates.srrag.policy import HiddenStateKeys

    labels = DEFAULT_POLICY_LABELS if labels is None else labels
    header, entries = read_policy_labels(labels)
    if header.model_id != lm.model_id:
        raise PolicyMismatchError(
            f"{labels} holds {header.model_id!r}'s source labels, not {lm.model_id!r}'s: label "
            "your model's own questions (rag-gates srrag label), build a datastore (rag-gates "
            f"srrag build-policy) and set {POLICY_ENV} to it")
    keys = HiddenStateKeys(lm)
    policy = SourcePolicy.open(keys, path=":memory:", k=k or header.k or DEFAULT_K)
    if entries:
        policy.add(entries, policy_keys(keys, [e.question for e in entries],
                                         cache_keys=cache_keys))
    # The tau was calibrated with the file's own k: another k votes differently.
    policy.tau = header.tau if k is None or k == header.k else None
    return policy
