"""SR-RAG: route each question to retrieval or to the model's own verbalized knowledge
(papers/sr-rag.txt, spec card methods/srrag.md).

* :class:`Verbalizer`: the GenRead prompt; the model's background document as a parametric
  :class:`~rag_gates.types.Passage`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from rag_gates.srrag.verbalizer import (
        GENREAD_PROMPT,
        PARAMETRIC,
        Verbalizer,
        VerbalizerConfig,
    )

# Lazy: ``rag-gates --help`` imports the CLI (rag_gates.commands.srrag) and must not pull in
# torch or qdrant_client.
_WHERE = {
    "GENREAD_PROMPT": "verbalizer", "PARAMETRIC": "verbalizer", "Verbalizer": "verbalizer",
    "VerbalizerConfig": "verbalizer",
}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"rag_gates.srrag.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'rag_gates.srrag' has no attribute {name!r}")


__all__ = [
    "GENREAD_PROMPT",
    "PARAMETRIC",
    "Verbalizer",
    "VerbalizerConfig",
]
