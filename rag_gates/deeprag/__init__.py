"""DeepRAG: step-by-step decomposition with a retrieve-or-answer decision per subquery
(papers/deeprag.txt; spec card methods/deeprag.md).

* :class:`Trajectory` / :class:`Step`: the typed trajectory, rendered to and parsed from the
  card's text format (``Follow up:`` / ``Let's search the question in Wikipedia.`` /
  ``Intermediate answer:`` / ``So the final answer is:``);
* :class:`DeepRAG`: the agent loop over any TextLM and retriever, sync and async, with the
  decision modes ``generate``, ``likelihood``, ``always``, ``never`` and ``gate``;
* :mod:`rag_gates.deeprag.search`: Algorithm 1, the fewest-retrieval trajectory that reaches
  the gold answer (training data), and :mod:`rag_gates.deeprag.export`: SFT and DPO records.

Nothing here imports torch: text-only modes work with any API model.
"""

from __future__ import annotations

from rag_gates.deeprag.agent import DecisionMode, DeepRAG, DeepRAGConfig, DeepRAGResult
from rag_gates.deeprag.gates import ConstantGate, MarkerGate, MarkerLikelihoodGate
from rag_gates.deeprag.trajectory import (
    DEMONSTRATION,
    INSTRUCTION,
    DeepRAGPrompt,
    MalformedStep,
    Step,
    Trajectory,
)

__all__ = [
    "DEMONSTRATION",
    "INSTRUCTION",
    "ConstantGate",
    "DecisionMode",
    "DeepRAG",
    "DeepRAGConfig",
    "DeepRAGPrompt",
    "DeepRAGResult",
    "MalformedStep",
    "MarkerGate",
    "MarkerLikelihoodGate",
    "Step",
    "Trajectory",
]
