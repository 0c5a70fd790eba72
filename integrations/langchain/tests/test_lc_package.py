"""Packaging promises: the public API is what __all__ says, and importing stays light."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys

import langchain_rag_gates

MODULES = [
    "chat_models",
    "deeprag",
    "documents",
    "document_compressors",
    "language_models",
    "quco",
    "retrievers",
    "runnables",
    "srrag",
    "tokrag",
    "tools",
]


def test_dunder_all_matches_public_names() -> None:
    exported = set(langchain_rag_gates.__all__)
    public = {n for n in dir(langchain_rag_gates) if not n.startswith("_")}
    for name in exported:
        assert hasattr(langchain_rag_gates, name), f"{name} is in __all__ but missing"
    # Every public class/function the package defines is exported, and nothing else is.
    own = {
        n
        for n in public
        if callable(getattr(langchain_rag_gates, n))
        and getattr(getattr(langchain_rag_gates, n), "__module__", "").startswith(
            "langchain_rag_gates"
        )
    }
    # (constants such as CHOICES_KEY are exported beside the classes they key)
    constants = {n for n in exported if not callable(getattr(langchain_rag_gates, n))}
    assert own == exported - constants
    assert all(isinstance(getattr(langchain_rag_gates, n), str) for n in constants)
    # Each submodule's own __all__ lists what it defines publicly, and the package
    # re-exports all of it.
    for module_name in MODULES:
        module = importlib.import_module(f"langchain_rag_gates.{module_name}")
        defined = {
            n
            for n, obj in vars(module).items()
            # (pydantic registers parametrised generics such as "RunnableSerializable[Any,
            # Any]" in the module that subclasses them: not identifiers, not our names)
            if not n.startswith("_")
            and n.isidentifier()
            and (inspect.isclass(obj) or inspect.isfunction(obj))
            and obj.__module__ == module.__name__
        }
        listed = set(module.__all__)
        assert all(hasattr(module, n) for n in listed), module_name
        callables = {n for n in listed if callable(getattr(module, n))}
        assert defined == callables, (module_name, defined ^ callables)
        assert listed <= exported, (module_name, listed - exported)


def test_version_is_the_distribution_version() -> None:
    assert langchain_rag_gates.__version__ == "0.1.0"


def test_import_does_not_load_torch() -> None:
    code = "import sys, langchain_rag_gates; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
