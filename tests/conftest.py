"""Shared fixtures: a tiny random-weight Llama (unit tests) and the embedded SmolLM2."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny() -> Any:
    from rag_gates.testing import tiny_lm

    return tiny_lm(seed=0)


@pytest.fixture(scope="session")
def smol() -> Any:
    from rag_gates.lm import load_default_lm

    return load_default_lm()
