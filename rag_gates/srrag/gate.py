"""The SR-RAG router as a gate: retrieve when ``p_M(retrieve) * p_D(retrieve) >= tau``.

- ``p_M``: the model's own preference, the share of the retrieval word's first token against
  the parametric word's under the routing instruction (:mod:`rag_gates.srrag.routing`);
- ``p_D``: the kNN policy, ``votes / k`` of the labelled questions nearest to this one in the
  :class:`~rag_gates.srrag.policy.SourcePolicy` datastore.

One forward pass of the routing prompt gives both ``p_M`` and the datastore key. ``mode``
chooses the score: ``"product"`` (SR-RAG, the paper's rule, tau 0.1-0.2), ``"model"``
(``p_M`` alone: SR-RAG without the kNN policy) or ``"policy"`` (``p_D`` alone). The score is
a probability of needing retrieval, higher = more need, and the gate retrieves at
``score >= tau``.

Fail closed: an empty datastore, a failed lookup, a key or vote that is not finite (a model
with a NaN weight gives NaN keys, whose "nearest" neighbours are arbitrary) or a non-finite
``p_M`` gives no number, so the gate retrieves and says why. A datastore with fewer than
``k`` questions votes with what it has, and the evidence says so.

Example:
    >>> policy = SourcePolicy.open(HiddenStateKeys(lm), path="~/.cache/rag-gates/srrag/policy")
    >>> gate = SelfRoutingGate(lm, policy)   # the policy's calibrated tau, else DEFAULT_TAU
    >>> d = gate.decide("Who wrote Hamlet?")
    >>> d.retrieve, d.evidence["p_model"], d.evidence["p_datastore"]
    (False, 0.41, 0.2)
    >>> d.evidence["votes_retrieval"], d.evidence["votes_parametric"]
    (6, 24)
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import JsonValue

from rag_gates.gate import BaseGate
from rag_gates.lm.base import require_white_box
from rag_gates.srrag.policy import (
    HiddenStateKeys,
    PolicyKeyError,
    PolicyStoreError,
    PolicyVote,
    SourcePolicy,
)
from rag_gates.srrag.routing import (
    RouteFeatures,
    RoutingPrompt,
    default_layer,
    question_keys,
    route_features,
)

__all__ = ["DEFAULT_TAU", "NEIGHBOURS_SHOWN", "RoutingMode", "SelfRoutingGate"]

RoutingMode = Literal["product", "model", "policy"]
#: The paper's threshold for Llama-2 (0.2 for the other models); calibrate per model.
DEFAULT_TAU = 0.1
#: Nearest neighbours listed in a decision's evidence (all k vote).
NEIGHBOURS_SHOWN = 5
_NAMES = {"product": "srrag", "model": "srrag-no-knn", "policy": "srrag-knn-only"}


class SelfRoutingGate(BaseGate):
    """Retrieve when ``p_M * p_D >= tau`` (or one factor alone, by ``mode``).

    Args:
        lm: the white-box model that answers (its routing distribution is ``p_M``).
        policy: the kNN datastore (needed unless ``mode="model"``). When its keys are this
            model's hidden states, they come from the routing pass itself.
        tau: the threshold; None (the default): the one calibrated with the policy
            (``policy.tau``, e.g. the shipped policy's, in ``"product"`` mode), else
            :data:`DEFAULT_TAU`. :attr:`tau_source` says which.
        mode: ``"product"``, ``"model"`` or ``"policy"``.
        prompt, layer: the routing prompt and key layer when there is no policy to take them
            from (default: :class:`RoutingPrompt` and the middle layer).
    """

    threshold_range = (0.0, 1.0)  # a probability (or a product of two)

    def __init__(self, lm: Any, policy: SourcePolicy | None = None, tau: float | None = None,
                 *, mode: RoutingMode = "product", prompt: RoutingPrompt | None = None,
                 layer: int | None = None) -> None:
        if mode not in _NAMES:
            raise ValueError(f"mode must be one of {sorted(_NAMES)}, got {mode!r}")
        if policy is not None and not isinstance(policy, SourcePolicy):
            raise TypeError(
                f"policy must be a SourcePolicy (SourcePolicy.open_existing(lm, path=...) or "
                f"load_default_policy(lm)), got {type(policy).__name__}; a threshold goes in "
                "as tau=")
        # The calibration is of p_M * p_D: the other modes' scores are other numbers.
        calibrated = getattr(policy, "tau", None) if mode == "product" else None
        self.tau_source = ("given" if tau is not None else
                           "calibrated with the policy" if calibrated is not None else
                           "DEFAULT_TAU (the paper's, not calibrated for this model)")
        super().__init__(threshold=tau if tau is not None else
                         calibrated if calibrated is not None else DEFAULT_TAU)
        if mode != "model" and policy is None:
            raise ValueError(f"mode {mode!r} needs the kNN policy datastore (a SourcePolicy; "
                             "build one with rag-gates srrag build-policy), or use mode='model'")
        self.lm: Any = require_white_box(lm, "SelfRoutingGate")
        self.policy = policy if mode != "model" else None
        self.mode = mode
        self.name = _NAMES[mode]
        keys = policy.key_function if policy is not None else None
        # The routing pass yields the key only when the datastore is keyed by this model.
        self._shared_key = isinstance(keys, HiddenStateKeys) and \
            keys.lm.model_id == self.lm.model_id
        if isinstance(keys, HiddenStateKeys) and self._shared_key:
            self.prompt, self.layer = keys.prompt, keys.layer
        else:
            self.prompt = prompt or RoutingPrompt()
            self.layer = default_layer(self.lm) if layer is None else layer
        if policy is not None and isinstance(keys, HiddenStateKeys) and not self._shared_key:
            raise ValueError(f"the datastore is keyed by {keys.lm.model_id!r}'s hidden states, "
                             f"not {self.lm.model_id!r}'s: open it with this model's keys")

    @property
    def tau(self) -> float:
        return self.threshold

    def features(self, query: str
                 ) -> tuple[RouteFeatures, PolicyVote | None, tuple[str, str] | None]:
        """The routing pass and the datastore vote, or why there is none: ``("lookup_error",
        message)`` (Qdrant failed) or ``("vote_error", message)`` (the key or the
        neighbours' similarities are not finite).

        ``mode="policy"`` reads no ``p_M`` (NaN in the features): the key alone takes the
        pass up to the key layer only, about half of SmolLM2's."""
        if self.mode == "policy":  # another key (e.g. MiniLM) is the datastore's to compute
            key = question_keys(self.lm, [query], self.prompt, self.layer)[0] \
                if self._shared_key else None
            features = RouteFeatures(key=key, p_model=math.nan, option_mass=math.nan,
                                     one_pass=True, key_position=-1)
        else:
            features = route_features(self.lm, query, self.prompt, self.layer)
        if self.policy is None:
            return features, None, None
        try:
            vote = self.policy.vote(features.key) if self._shared_key \
                else self.policy.vote_question(query)
        except PolicyStoreError as exc:
            return features, None, ("lookup_error", str(exc))
        except PolicyKeyError as exc:
            return features, None, ("vote_error", str(exc))
        return features, vote, None

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        features, vote, error = self.features(query)
        evidence: dict[str, JsonValue] = {"mode": self.mode, "layer": self.layer}
        if self.mode != "policy":
            evidence.update(p_model=features.p_model, option_mass=features.option_mass,
                            one_pass=features.one_pass)
        p_data: float | None = None
        if self.policy is not None:
            evidence["k"] = self.policy.k
            if error is not None:
                evidence[error[0]] = error[1]
            elif vote is not None:
                p_data = vote.p_retrieve
                evidence.update(_vote_evidence(vote))
        if self.mode == "model":
            return features.p_model, evidence
        if p_data is None:  # failed lookup, broken key, empty datastore: undecided
            return math.nan, evidence
        if self.mode == "policy":
            return p_data, evidence
        return features.p_model * p_data, evidence

    def reason(self, score: float, retrieve: bool, evidence: dict[str, JsonValue]) -> str:
        verb = "retrieve" if retrieve else "verbalize own knowledge"
        relation = ">=" if retrieve else "<"
        parts = []
        if self.mode != "policy":
            parts.append(f"p_M {_num(evidence.get('p_model'))}")
        if self.mode != "model":
            parts.append(f"p_D {_num(evidence.get('p_datastore'))} "
                         f"({evidence.get('votes_retrieval')}/{evidence.get('found')} "
                         "neighbours prefer retrieval)")
        said = " x ".join(parts)
        return f"{self.name}: {said} = {score:.3g} {relation} tau {self.threshold:.3g}: {verb}"

    def undecided(self, score: float, evidence: dict[str, JsonValue]) -> str:
        if "lookup_error" in evidence:
            return f"the datastore lookup failed: {evidence['lookup_error']}"
        if "vote_error" in evidence:
            return f"no kNN vote: {evidence['vote_error']}"
        if evidence.get("found") == 0:
            return "the kNN datastore is empty (build it with rag-gates srrag build-policy)"
        return (f"p_M is {evidence.get('p_model')!r}: the model put no probability on either "
                "routing word")


def _num(value: JsonValue) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def _vote_evidence(vote: PolicyVote) -> dict[str, JsonValue]:
    evidence: dict[str, JsonValue] = {
        "p_datastore": vote.p_retrieve, "found": vote.found,
        "votes_retrieval": vote.retrieval, "votes_parametric": vote.parametric,
        "neighbours": [n.model_dump(mode="json") for n in vote.neighbours[:NEIGHBOURS_SHOWN]]}
    if vote.found < vote.k:
        evidence["datastore_note"] = (
            f"the datastore holds {vote.found} labelled question(s), fewer than k={vote.k}: "
            f"p_D is the share of those {vote.found}")
    return evidence
