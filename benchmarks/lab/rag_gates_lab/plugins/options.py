"""The ``@OPTION`` of every method shipped in :mod:`rag_gates_lab.plugins`, checked without
importing the plugins.

A plugin module imports its method (CBDR's probe, Tok-RAG's decoder: torch, seconds), so a
run that gives an option out of range (``cbdr@2``) would be refused only after that import.
:data:`METHOD_OPTIONS` maps each shipped method that takes an option to its parser; the
plugins register these same callables as their factories' ``validate_option`` (and use them
to read the option when the method is built), and
:func:`rag_gates_lab.names.check_methods` calls them before anything else loads.
``SHIPPED_GATE_RANGES`` (the shipped gates' score scales) lives in
:mod:`rag_gates_lab.gate_names` and is re-exported here. A shipped
method not in the table takes no option. Third-party plugins are still asked themselves.

Example:
    >>> parse_beta("0.9"), parse_tau(None), parse_tokrag_option("authors-3")
    (0.9, None, ('authors-qa', 3))
    >>> METHOD_OPTIONS["cbdr"]("2")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ValueError: cbdr@2: the option is beta, a number in [0, 1]...
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Literal

from rag_gates.corpus.paragraphs import QA_PARAGRAPHS_TAU_ENTITY
from rag_gates_lab.gate_names import SHIPPED_GATE_RANGES, check_gate_names
from rag_gates_lab.plugins import number_option, unit_interval_option

__all__ = ["BENCH_TAU_ENTITY", "KNN_ONLY_TAU", "METHOD_OPTIONS", "SHIPPED_GATE_RANGES",
           "parse_alpha", "parse_beta", "parse_deeprag_rule", "parse_knn_only_tau", "parse_tau",
           "parse_tau_entity", "parse_threshold", "parse_tokrag_option", "validate_gate"]

#: QuCo's tau_entity for the dataset-paragraph index (calibrated on PopQA; see
#: rag_gates_lab.plugins.quco).
BENCH_TAU_ENTITY = QA_PARAGRAPHS_TAU_ENTITY
#: SR-RAG's ``p_D`` alone: retrieve when the neighbours' majority prefers retrieval.
KNN_ONLY_TAU = 0.5

_TOKRAG_OPTIONS = ("a fusion layer (an integer >= 1), 'paper', 'authors' or "
                   "'authors-LAYER' (LAYER an integer >= 0)")


def parse_beta(option: str | None, method: str = "cbdr") -> float | None:
    """The beta of ``cbdr@BETA`` / ``cbdr-ce@BETA``; None without an option (the probe's
    calibrated beta, read when the probe loads)."""
    return None if option is None else unit_interval_option(option, method, "beta", math.nan)


def parse_tau_entity(option: str | None, method: str = "quco") -> float:
    """The ``tau_entity`` of ``quco@TAU_ENTITY`` (default :data:`BENCH_TAU_ENTITY`): a count
    >= 0, else a ValueError that says what the option is.

    Example:
        >>> parse_tau_entity("20"), parse_tau_entity(None)
        (20.0, 82.0)
    """
    return number_option(option, method, "tau_entity (an entity count)", BENCH_TAU_ENTITY,
                         low=0.0)


def parse_tau(option: str | None, method: str = "srrag") -> float | None:
    """The tau of ``srrag@TAU``, a number in [0, 1]; None without an option (the gate's
    default: the policy's calibrated tau, else the plugin's ``BENCH_TAU``)."""
    return None if option is None else unit_interval_option(option, method, "tau", math.nan)


def parse_knn_only_tau(option: str | None) -> float:
    # Default: the neighbours' majority, as the srrag-knn-only gate.
    return unit_interval_option(option, "srrag-knn-only", "tau", KNN_ONLY_TAU)


def parse_tokrag_option(option: str | None) -> tuple[str | None, int | None]:
    """(judge, layer) of ``tokrag@OPTION``: None for the config's default."""
    if option is None:
        return None, None
    if option == "paper":
        return "paper", None
    if option == "authors":
        return "authors-qa", None
    judge, minimum, text = "paper", 1, option
    if option.startswith("authors-"):
        judge, minimum, text = "authors-qa", 0, option.removeprefix("authors-")
    if not text.isdigit() or int(text) < minimum:
        raise ValueError(f"tokrag@{option}: the option is {_TOKRAG_OPTIONS}")
    return judge, int(text)


def parse_alpha(option: str | None) -> float | None:
    """The weight of ``cad@ALPHA``, a finite number >= 0; None without an option (the
    decoder's default, the CAD paper's 0.5)."""
    return None if option is None else number_option(
        option, "cad", "alpha (0 = standard RAG)", math.nan, low=0.0)


def parse_threshold(option: str | None) -> float:
    """The ``T`` of ``deeprag-likelihood@T`` (default 0: the likelier marker wins)."""
    return number_option(option, "deeprag-likelihood",
                         "a log-probability margin (e.g. 0 or -1.5)", 0.0)


def parse_deeprag_rule(option: str | None) -> Literal["fail_closed", "authors"]:
    """The marker rule of ``deeprag@RULE``: ``authors`` (the authors' reading: only a
    follow-up ending in "Let" retrieves) or ``fail-closed`` (the default: a subquery with no
    decision marker retrieves)."""
    if option is None or option == "fail-closed":
        return "fail_closed"
    if option == "authors":
        return "authors"
    raise ValueError(f"deeprag@{option}: the option is the marker rule, 'authors' (the "
                     "authors' reading, the reproduction setting) or 'fail-closed' (the "
                     "default)")


def validate_gate(option: str | None) -> None:
    """``deeprag-gate@GATE`` needs a gate; its expression is checked without a model."""
    from rag_gates.methods import SelectiveRetrievalMethod

    if not option:
        raise ValueError("deeprag-gate needs a gate: deeprag-gate@GATE, e.g. deeprag-gate@quco "
                         "or deeprag-gate@cbdr:0.4")
    check_gate_names(option)  # every gate registered (names only: no plugin imported)
    SelectiveRetrievalMethod.validate_option(option)


METHOD_OPTIONS: dict[str, Callable[[str | None], object]] = {
    "cbdr": parse_beta,
    "cbdr-ce": partial(parse_beta, method="cbdr-ce"),
    "quco": parse_tau_entity,
    "quco-no-precheck": partial(parse_tau_entity, method="quco-no-precheck"),
    "quco-no-runtime": partial(parse_tau_entity, method="quco-no-runtime"),
    "srrag": parse_tau,
    "srrag-no-knn": partial(parse_tau, method="srrag-no-knn"),
    "srrag-knn-only": parse_knn_only_tau,
    "tokrag": parse_tokrag_option,
    "cad": parse_alpha,
    "deeprag": parse_deeprag_rule,
    "deeprag-likelihood": parse_threshold,
    "deeprag-gate": validate_gate,
}
"""Each shipped method that takes an ``@OPTION``, and the model-free callable that parses
it (a ValueError saying what the option is, for a bad one)."""
