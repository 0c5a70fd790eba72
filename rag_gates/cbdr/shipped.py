"""The probe shipped for the embedded SmolLM2-135M-Instruct, and how to find a user's own.

It was trained with (rows 500 on, held apart from the questions every benchmark uses)::

    rag-gates cbdr train-probe --dataset popqa --dataset hotpotqa --offset 500 \\
        --prompt-style rag-gates --label-max-new-tokens 32 --out rag_gates/cbdr/probes/smollm2

For any other model, train one and point ``RAG_GATES_CBDR_PROBE`` (or the ``probe=``
arguments) at its directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from rag_gates.cbdr.probe import ConfidenceProbe

__all__ = ["DEFAULT_PROBE_DIR", "PROBE_ENV", "load_default_probe"]

DEFAULT_PROBE_DIR = Path(__file__).resolve().parent / "probes" / "smollm2"
PROBE_ENV = "RAG_GATES_CBDR_PROBE"


def load_default_probe(lm: Any) -> ConfidenceProbe:
    """``$RAG_GATES_CBDR_PROBE`` if set, else the shipped SmolLM2 probe; refused (with what
    to do) when it was trained on another model than ``lm``."""
    directory = os.environ.get(PROBE_ENV) or DEFAULT_PROBE_DIR
    return ConfidenceProbe.load(directory, lm=lm)
