"""Import optional dependencies with an error that names the extra to install."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

__all__ = ["EXTRAS", "lazy_attributes", "require"]

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


def lazy_attributes(package: str, where: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` (PEP 562) that imports ``name`` from
    ``package.<where[name]>`` when it is first used, so importing the package stays light
    (no torch for ``rag-gates --help``); any other name is an AttributeError.

    Example:
        >>> __getattr__ = lazy_attributes("rag_gates.tokrag", {"TokRAGDecoder": "decoder"})
    """
    def __getattr__(name: str) -> Any:
        if name in where:
            return getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
