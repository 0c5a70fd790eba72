"""rag-gates: decide when a RAG application should retrieve and which retrieved text to trust.

``import rag_gates`` is light: it never imports torch, transformers, llama_index or langchain.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from rag_gates.errors import (
    ContextLengthError,
    ModelNotFoundError,
    RagGatesError,
    WhiteBoxRequiredError,
)
from rag_gates.types import (
    ChatMessage,
    GateDecision,
    Generation,
    Passage,
    TokenLogprob,
    TopLogprob,
    Trace,
    TraceEvent,
    TraceRecorder,
)

try:
    __version__ = version("rag-gates")
except PackageNotFoundError:  # running from a source tree without installing
    __version__ = "0.0.0+unknown"

__all__ = [
    "ChatMessage",
    "ContextLengthError",
    "GateDecision",
    "Generation",
    "ModelNotFoundError",
    "Passage",
    "RagGatesError",
    "TokenLogprob",
    "TopLogprob",
    "Trace",
    "TraceEvent",
    "TraceRecorder",
    "WhiteBoxRequiredError",
    "__version__",
]
