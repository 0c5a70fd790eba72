"""The llama.cpp server fixture: llama-cpp-python's OpenAI-compatible server on 127.0.0.1
with the embedded SmolLM2 GGUF. These tests run only under ``-m server`` (``make
test-server``, which installs ``llama-cpp-python[server]``); the default run skips them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "server: starts llama.cpp's server (make test-server)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    selected = "server" in (config.getoption("markexpr") or "")
    skip = pytest.mark.skip(reason="starts a llama.cpp server: run `make test-server`")
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.server)
            if not selected:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The server's ``/v1`` URL (one thread; RAG_GATES_SERVER_THREADS to change), stopped at
    the end of the session."""
    pytest.importorskip("llama_cpp.server", reason="pip install 'llama-cpp-python[server]'")
    from rag_gates.lm.llamacpp_server import llamacpp_server

    log = tmp_path_factory.mktemp("llama-server") / "server.log"
    threads = int(os.environ.get("RAG_GATES_SERVER_THREADS", "1"))
    with llamacpp_server(threads=threads, log=log) as url:
        yield url
