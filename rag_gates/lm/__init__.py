"""Model access. ``HFWhiteBoxLM`` and ``StreamGroup`` load torch on first use, not on import."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rag_gates.lm.base import (
    BaseTextLM,
    Capabilities,
    ContinuationScore,
    FormattedPrompt,
    Prompt,
    TextLM,
    WhiteBoxLM,
    capabilities_of,
    require_capabilities,
    require_white_box,
)
from rag_gates.lm.defaults import (
    default_embedder_path,
    default_gguf_path,
    load_default_embedder,
    load_default_lm,
    load_default_tokenizer,
    load_lm,
    load_off_event_loop,
    rag_gates_home,
)
from rag_gates.lm.openai_compat import OpenAICompatibleLM, OpenAIConfig

if TYPE_CHECKING:  # pragma: no cover
    from rag_gates.lm.hf import HFWhiteBoxLM
    from rag_gates.lm.streams import StreamGroup

__all__ = [
    "BaseTextLM",
    "Capabilities",
    "ContinuationScore",
    "FormattedPrompt",
    "HFWhiteBoxLM",
    "OpenAICompatibleLM",
    "OpenAIConfig",
    "Prompt",
    "StreamGroup",
    "TextLM",
    "WhiteBoxLM",
    "capabilities_of",
    "default_embedder_path",
    "default_gguf_path",
    "load_default_embedder",
    "load_default_lm",
    "load_default_tokenizer",
    "load_lm",
    "load_off_event_loop",
    "rag_gates_home",
    "require_capabilities",
    "require_white_box",
]


def __getattr__(name: str) -> Any:
    if name in ("HFWhiteBoxLM", "StreamGroup"):
        from rag_gates.lm import hf

        return getattr(hf, name)
    raise AttributeError(f"module 'rag_gates.lm' has no attribute {name!r}")
