"""SR-RAG and its peers in ``rag-gates bench`` and ``rag-gates eval-gate`` (entry points).

Methods:

- ``srrag`` / ``srrag@TAU``: route by ``p_M * p_D >= tau`` (default: the datastore's
  calibrated tau when it carries one, else :data:`BENCH_TAU`);
  retrieve top-k and answer, or verbalize (GenRead, 150 tokens) and answer from that;
- ``srrag-no-knn@TAU``: the same with ``p_M`` alone (no datastore);
- ``srrag-knn-only@TAU``: the same with ``p_D`` alone (the datastore's vote);
- ``genread``: always verbalize, then answer;
- ``skr``: FlashRAG's SKR judger (a prior-corrected kNN vote over MiniLM question
  embeddings, the same labels) deciding between ``single`` and closed book;
- ``selective@GATE`` (built in) takes the gates below too, e.g. ``selective@srrag:0.1``;
  the issue's selective-retrieval baseline is ``selective@cbdr``.

Gates (for ``eval-gate``; score = the probability of needing retrieval): ``srrag``
(``p_M * p_D``), ``srrag-no-knn`` (``p_M``), ``srrag-knn-only`` (``p_D``), ``skr``.

Datastores (built with ``rag-gates srrag build-policy``): the SR-RAG one at
``$RAG_GATES_SRRAG_POLICY`` (a local directory or an ``http(s)://`` Qdrant URL; default
``$RAG_GATES_HOME/srrag/policy``), the SKR one at ``$RAG_GATES_SRRAG_SKR_POLICY`` (default
``.../srrag/skr-policy``); collection ``srrag-policy`` (``$RAG_GATES_SRRAG_COLLECTION``).
Both are opened read-only (a private in-memory copy of a local directory), so any number of
bench and eval-gate processes use them at once.
:data:`BENCH_TAU` is the paper's tau for Llama-2, not calibrated for the embedded model:
calibrate it with ``rag-gates eval-gate --gate srrag``.
"""

from __future__ import annotations

import atexit
import os
from typing import Any, Literal

from rag_gates.methods import MethodContext, SelectiveRetrievalMethod, need_retriever
from rag_gates.srrag.gate import DEFAULT_TAU, RoutingMode, SelfRoutingGate
from rag_gates.srrag.pipeline import SRRAGPipeline
from rag_gates.srrag.policy import (
    DEFAULT_COLLECTION,
    EmbeddingKeys,
    SourcePolicy,
    default_policy_path,
)
from rag_gates.srrag.shipped import POLICY_ENV
from rag_gates.srrag.skr import SKRGate
from rag_gates.srrag.verbalizer import Verbalizer
from rag_gates_lab.plugins.options import (
    KNN_ONLY_TAU,
    METHOD_OPTIONS,
    parse_knn_only_tau,
    parse_tau,
)

__all__ = ["BENCH_TAU", "COLLECTION_ENV", "KNN_ONLY_TAU", "POLICY_ENV", "SKR_POLICY_ENV",
           "genread_method", "parse_tau", "skr_gate", "skr_method", "srrag_gate",
           "srrag_knn_only_gate", "srrag_knn_only_method", "srrag_method", "srrag_no_knn_gate",
           "srrag_no_knn_method"]

#: The paper's tau (Llama-2-7B); not yet calibrated for the embedded model.
BENCH_TAU = DEFAULT_TAU
SKR_POLICY_ENV = "RAG_GATES_SRRAG_SKR_POLICY"
COLLECTION_ENV = "RAG_GATES_SRRAG_COLLECTION"

# One client per datastore location and collection in a process: a run may build several
# methods over the same datastore, which share one read-only copy of a local directory.
_CLIENTS: dict[tuple[str, str], Any] = {}
# The methods of one run share a verbalizer: the bench answers a question with every method
# before the next question, so genread and each srrag@TAU share one greedy verbalization
# (identical by construction; its time still counts for each, see Trace.reused_ms). Only the
# latest model's is kept, so an earlier model is not held alive.
_SHARED: list[Verbalizer] = []
VERBALIZATIONS_KEPT = 8


@atexit.register
def _close_clients() -> None:
    # Closed here rather than by the clients' own __del__, which fails at interpreter exit.
    for client in _CLIENTS.values():
        client.close()
    _CLIENTS.clear()


def _client(env: str, keys: Literal["hidden", "embedding"]) -> tuple[Any, str, str]:
    where = os.environ.get(env) or str(default_policy_path(keys))
    collection = os.environ.get(COLLECTION_ENV, DEFAULT_COLLECTION)
    if (where, collection) not in _CLIENTS:
        url = where if where.startswith(("http://", "https://")) else None
        _CLIENTS[where, collection] = SourcePolicy.connect(None if url else where, url,
                                                           read_only=True, collection=collection)
    return _CLIENTS[where, collection], where, collection


def _policy(lm: Any) -> SourcePolicy:
    client, where, collection = _client(POLICY_ENV, "hidden")
    # path= only names the datastore in messages: the client is the read-only copy.
    return SourcePolicy.open_existing(lm, client=client, path=where, collection=collection)


def _skr_policy() -> SourcePolicy:
    client, where, collection = _client(SKR_POLICY_ENV, "embedding")
    return SourcePolicy.open(EmbeddingKeys(), client=client, path=where, collection=collection,
                             read_only=True)


def _gate(ctx: MethodContext, tau: float | None, mode: RoutingMode) -> SelfRoutingGate:
    policy = None if mode == "model" else _policy(ctx.lm)
    return SelfRoutingGate(ctx.lm, policy, tau, mode=mode)


def _name(base: str, ctx: MethodContext) -> str:
    return base if ctx.option is None else f"{base}@{ctx.option}"


def _verbalizer(lm: Any) -> Verbalizer:
    if not _SHARED or _SHARED[0].lm is not lm:
        _SHARED[:] = [Verbalizer(lm, reuse=VERBALIZATIONS_KEPT)]
    return _SHARED[0]


def _pipeline(ctx: MethodContext, name: str, gate: Any) -> SRRAGPipeline:
    retriever = need_retriever(ctx, name) if gate is not None else ctx.retriever
    return SRRAGPipeline(ctx.lm, retriever, gate, verbalizer=_verbalizer(ctx.lm), k=ctx.k,
                         max_new_tokens=ctx.max_new_tokens, dataset=ctx.dataset, name=name)


def srrag_method(ctx: MethodContext) -> SRRAGPipeline:
    """SR-RAG: ``p_M * p_D >= tau`` routes to retrieval, else verbalize and answer."""
    return _pipeline(ctx, _name("srrag", ctx), _gate(ctx, parse_tau(ctx.option), "product"))


def srrag_knn_only_method(ctx: MethodContext) -> SRRAGPipeline:
    """SR-RAG with the kNN policy alone: ``p_D >= tau``."""
    return _pipeline(ctx, _name("srrag-knn-only", ctx),
                     _gate(ctx, parse_knn_only_tau(ctx.option), "policy"))


def srrag_no_knn_method(ctx: MethodContext) -> SRRAGPipeline:
    """SR-RAG without the kNN policy: ``p_M >= tau``."""
    return _pipeline(ctx, _name("srrag-no-knn", ctx),
                     _gate(ctx, parse_tau(ctx.option, "srrag-no-knn"), "model"))


def genread_method(ctx: MethodContext) -> SRRAGPipeline:
    """GenRead: always verbalize, then answer from the verbalization."""
    return _pipeline(ctx, "genread", None)


def skr_method(ctx: MethodContext) -> SelectiveRetrievalMethod:
    """SKR: the SKR gate decides between ``single`` and closed book (``selective@skr``)."""
    method = SelectiveRetrievalMethod(ctx.model_copy(update={"option": "skr"}))
    method.name = "skr"
    return method


srrag_method.accepts_option = True  # type: ignore[attr-defined]
srrag_no_knn_method.accepts_option = True  # type: ignore[attr-defined]
srrag_knn_only_method.accepts_option = True  # type: ignore[attr-defined]
# Checked before any model is loaded, and before this module is imported (options.py).
srrag_method.validate_option = METHOD_OPTIONS["srrag"]  # type: ignore[attr-defined]
srrag_no_knn_method.validate_option = METHOD_OPTIONS["srrag-no-knn"]  # type: ignore[attr-defined]
srrag_knn_only_method.validate_option = METHOD_OPTIONS["srrag-knn-only"]  # type: ignore[attr-defined]


def srrag_gate(ctx: MethodContext, threshold: float | None = None) -> SelfRoutingGate:
    """``p_M * p_D`` at tau ``threshold`` (None: the policy's calibrated tau, else
    :data:`BENCH_TAU`)."""
    return _gate(ctx, threshold, "product")


def srrag_no_knn_gate(ctx: MethodContext, threshold: float | None = None) -> SelfRoutingGate:
    """``p_M`` alone."""
    return _gate(ctx, BENCH_TAU if threshold is None else threshold, "model")


def srrag_knn_only_gate(ctx: MethodContext, threshold: float | None = None
                        ) -> SelfRoutingGate:
    """``p_D`` alone (default threshold 0.5: the majority of the neighbours)."""
    return _gate(ctx, KNN_ONLY_TAU if threshold is None else threshold, "policy")


def skr_gate(ctx: MethodContext, threshold: float | None = None) -> SKRGate:
    """The SKR judger over the MiniLM datastore (default threshold 0.5: its own rule)."""
    return SKRGate(_skr_policy(), 0.5 if threshold is None else threshold)


for _factory in (srrag_gate, srrag_no_knn_gate, srrag_knn_only_gate):
    _factory.threshold_range = SelfRoutingGate.threshold_range  # type: ignore[attr-defined]
skr_gate.threshold_range = SKRGate.threshold_range  # type: ignore[attr-defined]
