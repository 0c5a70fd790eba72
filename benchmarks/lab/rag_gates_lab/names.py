"""The names ``rag-gates bench`` and ``eval-gate`` accept, checked before any model loads.

A run that names a gate, method, dataset or retriever that does not exist should fail in
well under a second with the valid names, not after the model has loaded and answered every
question. The registered names come from the entry points' *names* (no plugin is imported:
importing them pulls in torch and the frameworks, about 10 s); a method's option is checked
by its own model-free ``validate_option``: for the methods shipped with rag-gates, from
:data:`rag_gates_lab.plugins.options.METHOD_OPTIONS` without importing their plugins (so
``cbdr@2`` is refused before torch loads); a third-party method's plugin is imported to ask it.
Gate names and expressions are checked by :mod:`rag_gates_lab.gate_names` (re-exported here),
which the options' own ``deeprag-gate@GATE`` check uses too.

Example:
    >>> check_dataset("popqa")
    >>> check_gate_names("quco&cbdr")
    >>> check_methods(["no-rag", "selective@first-token-prob"])
    >>> check_dataset("nosuch")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: unknown dataset 'nosuch'; valid names: 2wiki, hotpotqa, popqa, pubmedqa, ...
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib.metadata import entry_points

from rag_gates_lab.gate_names import (
    BUILTIN_GATE_NAMES,
    check_gate_names,
    gate_names,
    registered_names,
    unknown_name,
)
from rag_gates_lab.plugins.options import METHOD_OPTIONS

__all__ = ["BUILTIN_GATE_NAMES", "BUILTIN_METHOD_NAMES", "RETRIEVER_NAMES", "check_dataset",
           "check_gate_names", "check_methods", "check_retriever", "dataset_names",
           "gate_names", "method_names", "names_help"]

# The built-in names, kept here so that listing them imports no method or model code
# (tests/unit/test_cli_fail_fast.py checks them against BUILTIN_METHODS; the gates' are in
# rag_gates_lab.gate_names).
BUILTIN_METHOD_NAMES = ("fs-rag", "no-rag", "selective", "single")
RETRIEVER_NAMES = ("bm25", "dense")
_TESTBED = "testbed:DIR"


def method_names() -> list[str]:
    """Every method name: the built-ins and those registered under ``rag_gates.methods``."""
    return sorted({*BUILTIN_METHOD_NAMES, *registered_names("rag_gates.methods")})


def dataset_names() -> list[str]:
    """The benchmark datasets, then the testbed form (``testbed:DIR``, docs/testbed.md)."""
    from rag_gates_lab.datasets import DATASETS

    return [*sorted(DATASETS), _TESTBED]


def check_dataset(name: str) -> None:
    """Raise ValueError (with the valid names) unless ``name`` is a dataset ``load_dataset``
    reads; a testbed name must point at a built testbed."""
    from rag_gates_lab.datasets import DATASETS
    from rag_gates_lab.testbed.dataset import is_testbed, testbed_dir

    if is_testbed(name):
        testbed_dir(name)  # raises when the directory holds no testbed
    elif name not in DATASETS:
        raise unknown_name("dataset", name, dataset_names())


def check_retriever(name: str) -> None:
    """Raise ValueError unless ``name`` is a benchmark retriever (``bm25``, ``dense``)."""
    if name not in RETRIEVER_NAMES:
        raise unknown_name("retriever", name, RETRIEVER_NAMES)


def check_methods(names: Iterable[str]) -> None:
    """Raise ValueError unless every name is a registered method, with an ``@OPTION`` only
    where the method takes one and that its ``validate_option`` accepts (``selective@GATE``:
    every gate of the expression registered). No shipped plugin is imported (their options
    are :data:`~rag_gates_lab.plugins.options.METHOD_OPTIONS`'s); a third-party method's is,
    to ask its ``validate_option``."""
    from rag_gates.methods import check_method_option, split_method_name

    known = method_names()
    given = list(names)
    if not given:
        raise ValueError(f"no method given; valid names: {', '.join(known)}")
    for name in given:  # every name first: a typo fails before any plugin is imported
        base, _ = split_method_name(name)
        if base not in known:
            raise unknown_name("method", name, known)
    for name in given:
        base, option = split_method_name(name)
        if base == "selective":
            if not option:
                raise ValueError("selective needs a gate: selective@GATE, e.g. "
                                 "selective@first-token-prob or selective@quco&cbdr")
            check_gate_names(option)
        elif base in _shipped_plugin_methods():
            validate = METHOD_OPTIONS.get(base)
            check_method_option(base, option, accepts=validate is not None, validate=validate)
        elif option is not None or base not in BUILTIN_METHOD_NAMES:
            from rag_gates.methods import available_method, check_method_name

            check_method_name(name, {base: available_method(base)})


def _shipped_plugin_methods() -> set[str]:
    """The methods registered by rag-gates' own plugins (read from the entry points' values,
    importing nothing)."""
    return {ep.name for ep in entry_points(group="rag_gates.methods")
            if ep.value.startswith("rag_gates_lab.plugins.")}


def names_help(kind: str) -> str:
    """The valid names of ``kind`` ('gate', 'method', 'dataset') for a ``--help`` text."""
    if kind == "gate":
        return (f"One of: {', '.join(gate_names())}; NAME:THRESHOLD sets its threshold; "
                "combine with & (all retrieve), | (any retrieves), parentheses, "
                "cascade(CHEAP,EXPENSIVE,LO,HI) or weighted(FILE from fit-weighted), e.g. "
                "'quco&cbdr'.")
    if kind == "method":
        return (f"Comma-separated, from: {', '.join(method_names())}. NAME@OPTION where a "
                "method takes one (cbdr@0.9, srrag@0.2); selective@GATE takes any --gate "
                "expression of eval-gate (selective@first-token-prob).")
    if kind == "dataset":
        return f"One of: {', '.join(dataset_names())} (a built testbed, docs/testbed.md)."
    raise ValueError(f"no names of kind {kind!r}: use 'gate', 'method' or 'dataset'")
