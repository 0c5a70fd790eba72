"""Other libraries' methods behind the rag-gates interfaces, to compare with and to use.

- :class:`PolygraphGate` (:mod:`rag_gates.peers.lm_polygraph`): any LM-Polygraph
  uncertainty estimator as a gate over the same :class:`~rag_gates.lm.hf.HFWhiteBoxLM`
  (``pip install "rag-gates[polygraph]"``).

Importing this package imports none of them: each is loaded when its adapter is built.

Example:
    >>> from rag_gates.peers import PolygraphGate
    >>> gate = PolygraphGate(lm, "Perplexity", threshold=1.5)        # doctest: +SKIP
"""

from __future__ import annotations

from rag_gates.peers.lm_polygraph import (
    ATTENTION_STATS,
    PolygraphGate,
    polygraph_estimator,
    register_polygraph_gate,
)

__all__ = ["ATTENTION_STATS", "PolygraphGate", "polygraph_estimator", "register_polygraph_gate"]
