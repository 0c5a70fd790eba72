"""Fixtures for the LlamaIndex adapter: a tiny random-weight Llama (offline, sub-second)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_li() -> Any:
    """One shared HFWhiteBoxLM; tests only read from it."""
    from rag_gates.testing import tiny_lm

    return tiny_lm(seed=0)
