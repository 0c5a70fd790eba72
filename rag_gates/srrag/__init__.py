"""SR-RAG: route each question to retrieval or to the model's own verbalized knowledge
(papers/sr-rag.txt, spec card methods/srrag.md).

* :class:`Verbalizer`: the GenRead prompt; the model's background document as a parametric
  :class:`~rag_gates.types.Passage` (``metadata["source"] = "parametric"``);
* source labelling (:func:`collect_labels`, ``rag-gates srrag label``): which source makes
  the gold answer more likely, per training question;
* :class:`SourcePolicy`: the kNN policy datastore in Qdrant (key: the hidden state of the
  last question token at a middle layer; ``p_D = votes / k``; ``rag-gates srrag
  build-policy``);
* :class:`SelfRoutingGate`: retrieve when ``p_M * p_D >= tau`` (or one factor alone);
* :class:`SRRAGPipeline`: retrieve and answer, or verbalize and answer;
* :func:`load_default_policy`: the policy shipped for the embedded model (its own labels;
  their keys cached on disk after the first load, :mod:`rag_gates.srrag.key_cache`);
* :class:`SKRGate`: the SKR baseline (kNN over MiniLM question embeddings, same labels);
* the two-stage training data (:func:`export_stage1`, :func:`export_stage2_dpo`, ``rag-gates
  srrag export``): SFT and DPO records for TRL from the labels.

White-box: routing reads the next-token distribution and hidden states, and labelling
scores the gold answer; the verbalizer and the pipeline's answer step take any TextLM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rag_gates._optional import lazy_attributes

if TYPE_CHECKING:  # pragma: no cover
    from rag_gates.srrag.export import (
        ExportCounts,
        ExportFormat,
        export_stage1,
        export_stage2_dpo,
    )
    from rag_gates.srrag.gate import DEFAULT_TAU, SelfRoutingGate
    from rag_gates.srrag.labels import (
        ContextScore,
        LabelConfig,
        SourceLabel,
        collect_labels,
        label_question,
        preferred_source,
        read_labels,
    )
    from rag_gates.srrag.pipeline import SRRAGPipeline
    from rag_gates.srrag.policy import (
        EmbeddingKeys,
        HiddenStateKeys,
        PolicyEntry,
        PolicyKeyError,
        PolicyMismatchError,
        PolicyReadOnlyError,
        PolicyStoreError,
        PolicyVote,
        SourcePolicy,
        default_policy_path,
    )
    from rag_gates.srrag.routing import RouteFeatures, RoutingPrompt, route_features
    from rag_gates.srrag.shipped import load_default_policy
    from rag_gates.srrag.skr import SKRGate
    from rag_gates.srrag.verbalizer import (
        GENREAD_PROMPT,
        PARAMETRIC,
        Verbalizer,
        VerbalizerConfig,
        retrieve_instead,
        says_nothing,
    )

# Lazy: ``rag-gates --help`` imports the CLI (rag_gates_lab.commands.srrag) and must not pull in
# torch or qdrant_client.
_WHERE = {
    "GENREAD_PROMPT": "verbalizer", "PARAMETRIC": "verbalizer", "Verbalizer": "verbalizer",
    "VerbalizerConfig": "verbalizer", "retrieve_instead": "verbalizer",
    "says_nothing": "verbalizer", "ContextScore": "labels", "LabelConfig": "labels",
    "SourceLabel": "labels", "collect_labels": "labels", "label_question": "labels",
    "preferred_source": "labels", "read_labels": "labels", "EmbeddingKeys": "policy",
    "HiddenStateKeys": "policy", "PolicyEntry": "policy", "PolicyKeyError": "policy",
    "PolicyMismatchError": "policy", "PolicyReadOnlyError": "policy",
    "PolicyStoreError": "policy", "PolicyVote": "policy", "SourcePolicy": "policy",
    "default_policy_path": "policy", "RouteFeatures": "routing", "RoutingPrompt": "routing",
    "route_features": "routing", "DEFAULT_TAU": "gate", "SelfRoutingGate": "gate",
    "SRRAGPipeline": "pipeline", "SKRGate": "skr", "ExportCounts": "export",
    "ExportFormat": "export", "export_stage1": "export", "export_stage2_dpo": "export",
    "load_default_policy": "shipped",
}

__getattr__ = lazy_attributes(__name__, _WHERE)

__all__ = [
    "DEFAULT_TAU",
    "GENREAD_PROMPT",
    "PARAMETRIC",
    "ContextScore",
    "EmbeddingKeys",
    "ExportCounts",
    "ExportFormat",
    "HiddenStateKeys",
    "LabelConfig",
    "PolicyEntry",
    "PolicyKeyError",
    "PolicyMismatchError",
    "PolicyReadOnlyError",
    "PolicyStoreError",
    "PolicyVote",
    "RouteFeatures",
    "RoutingPrompt",
    "SKRGate",
    "SRRAGPipeline",
    "SelfRoutingGate",
    "SourceLabel",
    "SourcePolicy",
    "Verbalizer",
    "VerbalizerConfig",
    "collect_labels",
    "default_policy_path",
    "export_stage1",
    "export_stage2_dpo",
    "label_question",
    "load_default_policy",
    "preferred_source",
    "read_labels",
    "retrieve_instead",
    "route_features",
    "says_nothing",
]
