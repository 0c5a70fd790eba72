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

def __getattr__(name: str) -> object:
    """``rag_gates.load_gate`` and ``rag_gates.GateSpec`` without importing the calibration
    package (numpy) on ``import rag_gates``."""
    if name in ("load_gate", "GateSpec"):
        from rag_gates import calibration

        return getattr(calibration, name)
    raise AttributeError(f"module 'rag_gates' has no attribute {name!r}")


__all__ = [
    "ChatMessage",
    "ContextLengthError",
    "GateDecision",
    "GateSpec",
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
    "load_gate",
]
