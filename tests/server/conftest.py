"""The served engines under test, each on 127.0.0.1 with the embedded SmolLM2:

- ``llamacpp``: llama-cpp-python's OpenAI-compatible server with the GGUF (one request at a
  time; ``make test-server`` installs ``llama-cpp-python[server]``);
- ``vllm``: vLLM's CPU build (a batching engine) with the converted safetensors, from its own
  environment (``bash benchmarks/envs/vllm.sh``) named by ``RAG_GATES_VLLM_PYTHON``
  (``make test-server-vllm``).

These tests run only under ``-m server``; the default run skips them. A test that takes the
``engine`` fixture runs once per engine (``-k vllm`` or ``-k llamacpp`` picks one); an engine
that is not set up skips with the reason (vLLM: RAG_GATES_VLLM_PYTHON unset)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ENGINES = ("llamacpp", "vllm")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "server: starts a model server (make test-server)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    selected = "server" in (config.getoption("markexpr") or "")
    skip = pytest.mark.skip(reason="starts a model server: run `make test-server`")
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


@pytest.fixture(scope="session")
def vllm_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """vLLM's ``/v1`` URL, stopped at the end of the session; skips when
    ``RAG_GATES_VLLM_PYTHON`` is unset, fails when it names no file. Started eager (no
    compiling); the wait for it is RAG_GATES_VLLM_STARTUP_S (default 900 s)."""
    from rag_gates.lm.vllm_server import VLLM_PYTHON_ENV, vllm_python, vllm_server

    python = vllm_python()
    if python is None:
        given = os.environ.get(VLLM_PYTHON_ENV)
        if given:  # asked for and missing: a broken set-up, not an absent one
            pytest.fail(f"{VLLM_PYTHON_ENV}={given} does not exist: build it with "
                        "`bash benchmarks/envs/vllm.sh` (VLLMVENV=DIR for another place)")
        pytest.skip(f"vLLM is not set up: `bash benchmarks/envs/vllm.sh`, then "
                    f"{VLLM_PYTHON_ENV}=/work/vllmvenv/bin/python (make test-server-vllm)")
    log = tmp_path_factory.mktemp("vllm-server") / "server.log"
    timeout = float(os.environ.get("RAG_GATES_VLLM_STARTUP_S", "900"))
    # --enforce-eager: starts in about 50 s instead of 80-145 s (compiling), with the same
    # numbers for this model (rag_gates.lm.vllm_server's note). nobind: vLLM's default pins
    # its engine to core 0, where another vLLM on the machine (a benchmark) would starve it.
    with vllm_server(python, log=log, startup_timeout=timeout, eager=True,
                     cpu_bind="nobind") as url:
        yield url


@pytest.fixture(scope="session", params=ENGINES)
def engine(request: pytest.FixtureRequest) -> tuple[str, str]:
    """``(name, /v1 URL)`` of each engine in turn."""
    name: str = request.param
    url: str = request.getfixturevalue({"llamacpp": "llama_server",
                                        "vllm": "vllm_server_url"}[name])
    return name, url
