"""CBDR: the model's hidden state as confidence (papers/cbdr-knowledge-probing.txt).

* :class:`ConfidenceProbe`: an MLP on one hidden state predicting "the model answers this
  right"; trained with ``rag-gates cbdr train-probe`` and saved as safetensors + JSON;
* :class:`CBDRGate`: skip retrieval when ``Conf(q) > beta``, continuing the answer from the
  probe's own forward pass;
* :class:`ConfidenceGainReranker`: order passages by ``Conf(q + c) - Conf(q)``;
  :class:`CrossEncoderReranker`: the same job by a cross-encoder fine-tuned on those
  preferences (``rag-gates cbdr build-preferences`` / ``train-reranker``), without the LLM;
* :class:`CBDRPipeline`: gate, retrieve, rerank, answer.

White-box: the probe reads hidden states, so a text-only model is refused at construction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rag_gates._optional import lazy_attributes

if TYPE_CHECKING:  # pragma: no cover
    from rag_gates.cbdr.gate import CBDRGate, ProbedQuestion
    from rag_gates.cbdr.pipeline import CBDRPipeline
    from rag_gates.cbdr.probe import ConfidenceProbe, ProbeConfig, ProbeTraining, train_probe
    from rag_gates.cbdr.prompts import ProbePrompts
    from rag_gates.cbdr.rerank import ConfidenceGainReranker, CrossEncoderReranker
    from rag_gates.cbdr.shipped import DEFAULT_PROBE_DIR, load_default_probe

# Lazy: ``rag-gates --help`` imports the CLI (the lab's cbdr commands) and must not pull in
# torch.
_WHERE = {
    "CBDRGate": "gate", "ProbedQuestion": "gate", "CBDRPipeline": "pipeline",
    "ConfidenceProbe": "probe", "ProbeConfig": "probe", "ProbeTraining": "probe",
    "train_probe": "probe", "ProbePrompts": "prompts", "ConfidenceGainReranker": "rerank",
    "CrossEncoderReranker": "rerank", "DEFAULT_PROBE_DIR": "shipped",
    "load_default_probe": "shipped",
}

__getattr__ = lazy_attributes(__name__, _WHERE)

__all__ = [
    "DEFAULT_PROBE_DIR",
    "CBDRGate",
    "CBDRPipeline",
    "ConfidenceGainReranker",
    "ConfidenceProbe",
    "CrossEncoderReranker",
    "ProbeConfig",
    "ProbePrompts",
    "ProbeTraining",
    "ProbedQuestion",
    "load_default_probe",
    "train_probe",
]
