"""Model access. ``HFWhiteBoxLM`` and ``StreamGroup`` load torch on first use, not on import."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rag_gates.lm.base import (
    BaseTextLM,
    ContinuationScore,
    FormattedPrompt,
    Prompt,
    TextLM,
    WhiteBoxLM,
    require_white_box,
)
from rag_gates.lm.defaults import (
    default_embedder_path,
    load_default_embedder,
    load_default_lm,
    load_default_tokenizer,
    load_lm,
    rag_gates_home,
)

if TYPE_CHECKING:  # pragma: no cover
    from rag_gates.lm.hf import HFWhiteBoxLM, StreamGroup

__all__ = [
    "BaseTextLM",
    "ContinuationScore",
    "FormattedPrompt",
    "HFWhiteBoxLM",
    "Prompt",
    "StreamGroup",
    "TextLM",
    "WhiteBoxLM",
    "default_embedder_path",
    "load_default_embedder",
    "load_default_lm",
    "load_default_tokenizer",
    "load_lm",
    "rag_gates_home",
    "require_white_box",
]


def __getattr__(name: str) -> Any:
    if name in ("HFWhiteBoxLM", "StreamGroup"):
        from rag_gates.lm import hf

        return getattr(hf, name)
    raise AttributeError(f"module 'rag_gates.lm' has no attribute {name!r}")
