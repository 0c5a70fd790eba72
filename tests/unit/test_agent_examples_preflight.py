"""The agent examples say in one line what to install or start, and exit 2, when what they
need is missing: checked before any framework, model or index loads (issue 31, item 5)."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SCRIPTS = ["langchain_agent_verify.py", "llama_index_agent_verify.py"]


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def _run(script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, script, *args], cwd=EXAMPLES, capture_output=True,
                          text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"},
                          check=False)


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, (done.stdout[-1000:], done.stderr[-2000:])
    assert "Traceback" not in done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("error: ")]
    assert len(errors) == 1, lines
    return errors[0]


@pytest.mark.skipif(_installed("llama_cpp.server"),
                    reason="llama.cpp's server is installed: the example would start it")
@pytest.mark.parametrize("script", SCRIPTS)
def test_without_llama_cpp_the_example_says_what_to_install(script: str) -> None:
    line = _one_error_line(_run(script))
    assert 'pip install "llama-cpp-python[server]"' in line
    assert "--base-url" in line


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_base_url_nobody_answers_at_is_refused_first(script: str) -> None:
    with socket.socket() as sock:  # a free port: nothing listens there
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    line = _one_error_line(_run(script, "--base-url", url))
    assert f"no server answers at {url}" in line
    assert "llama_cpp_tool_server.py --port 8080" in line


def test_a_missing_client_package_is_named_with_its_install_line(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    from llama_cpp_tool_server import check_ready

    with pytest.raises(SystemExit) as exit_:
        check_ready(["--base-url", "http://127.0.0.1:9/v1"],
                    {"no_such_client.sub": 'pip install "no-such-client"'})
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == (
        'error: no_such_client.sub is not installed: pip install "no-such-client"')
