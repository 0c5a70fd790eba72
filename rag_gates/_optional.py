"""Import optional dependencies with an error that names the extra to install."""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXTRAS", "require"]

# Every extra an error message may name; a test checks each exists in pyproject.toml.
EXTRAS = frozenset({"hf", "corpus", "qdrant", "spacy", "train", "trl", "eval", "api", "all", "dev",
                    "polygraph"})


def require(module: str, extra: str) -> ModuleType:
    """Import ``module`` or raise ImportError telling which rag-gates extra provides it."""
    if extra not in EXTRAS:
        raise ValueError(f"unknown extra {extra!r}; known extras: {sorted(EXTRAS)}")
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ImportError(
            f"{module!r} is needed here but is not installed: "
            f'pip install "rag-gates[{extra}]"'
        ) from exc
