"""Fixtures: a tiny random-weight Llama (sub-second, offline, deterministic), in memory and on
disk, and a ChatRagGates over it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_rag_gates import ChatRagGates


@pytest.fixture(scope="session")
def tiny() -> Any:
    from rag_gates.testing import tiny_lm

    return tiny_lm(seed=0)


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rag_gates.testing import save_tiny_lm

    return save_tiny_lm(tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture
def chat(tiny: Any) -> ChatRagGates:
    return ChatRagGates(lm=tiny, max_tokens=12)
