"""child_server: the start/wait/stop of a local model server, on tiny stand-in servers."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from rag_gates.errors import ServerUnavailableError
from rag_gates.lm.llamacpp_server import child_server, free_port

SERVES_MODELS = """
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_GET(self):
        body = b'{"data": [{"id": "m"}]}' if self.path == "/v1/models" else b"{}"
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def test_waits_for_the_server_and_stops_it(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    with child_server([sys.executable, "-c", SERVES_MODELS, str(port)], url,
                      startup_timeout=30, log=tmp_path / "log") as got:
        assert got == url
        assert httpx.get(f"{url}/models").json()["data"][0]["id"] == "m"
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/models", timeout=2)


def test_a_child_that_exits_is_an_error_with_its_log(tmp_path: Path) -> None:
    command = [sys.executable, "-c", "print('no model file here'); raise SystemExit(3)"]
    with pytest.raises(ServerUnavailableError, match=r"exited \(3\).*no model file here"), \
            child_server(command, f"http://127.0.0.1:{free_port()}/v1", log=tmp_path / "log"):
        pass


CRASHES_ON_REQUEST = SERVES_MODELS.replace(
    "    def do_GET(self):\n",
    "    def do_GET(self):\n"
    "        if self.path == '/v1/crash':\n"
    "            import os, resource, signal\n"
    "            resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file left behind\n"
    "            print('about to fault', flush=True)\n"
    "            os.kill(os.getpid(), signal.SIGSEGV)\n"
    "        if self.path == '/v1/quit':\n"
    "            import os\n"
    "            os._exit(3)\n")


def _wait_until_refused(url: str, why: str) -> None:
    """Return once the server's port refuses connections, as its clients see it."""
    import time

    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            httpx.get(f"{url}/models", timeout=1)
        except httpx.TransportError:
            return
        time.sleep(0.1)
    pytest.fail(f"the server outlived {why}")


def _crash(url: str) -> None:
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{url}/crash", timeout=10)
    _wait_until_refused(url, "its fault")


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_server_that_dies_in_use_is_named_at_the_blocks_end(tmp_path: Path) -> None:
    """Its clients see only refused connections; the block's end says how it died."""
    port = free_port()
    with pytest.raises(ServerUnavailableError,
                       match=r"(?s)killed by SIGSEGV while in use.*about to fault"), \
            child_server([sys.executable, "-c", CRASHES_ON_REQUEST, str(port)],
                         f"http://127.0.0.1:{port}/v1", startup_timeout=30,
                         log=tmp_path / "log") as url:
        _crash(url)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_a_clients_error_after_the_death_is_chained_to_it() -> None:
    port = free_port()
    with pytest.raises(ServerUnavailableError,
                       match=r"(?s)SIGSEGV while in use\. Rebuild it\. Its log: .*about to fault"
                       ) as caught, \
            child_server([sys.executable, "-c", CRASHES_ON_REQUEST, str(port)],
                         f"http://127.0.0.1:{port}/v1", startup_timeout=30,
                         crash_hint="Rebuild it.") as url:
        _crash(url)
        httpx.get(f"{url}/models", timeout=2)  # refused: the server is gone
    assert isinstance(caught.value.__cause__, httpx.TransportError)


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_an_exit_that_is_no_fault_gets_no_crash_hint() -> None:
    port = free_port()
    with pytest.raises(ServerUnavailableError, match=r"exited \(3\) while in use\. Its log") \
            as caught, child_server([sys.executable, "-c", CRASHES_ON_REQUEST, str(port)],
                                    f"http://127.0.0.1:{port}/v1", startup_timeout=30,
                                    crash_hint="Rebuild it.") as url:
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{url}/quit", timeout=10)
        _wait_until_refused(url, "its exit")
    assert "Rebuild it." not in str(caught.value)


def test_the_blocks_own_error_stands_while_the_server_lives() -> None:
    port = free_port()
    with pytest.raises(KeyError, match="not the server's fault") as caught, \
            child_server([sys.executable, "-c", SERVES_MODELS, str(port)],
                         f"http://127.0.0.1:{port}/v1", startup_timeout=30):
        raise KeyError("not the server's fault")
    assert caught.value.__cause__ is None


def test_the_native_build_hint_names_the_installed_version(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.metadata

    from rag_gates.lm.llamacpp_server import native_build_hint

    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.3.36")
    assert "-DGGML_NATIVE=OFF" in native_build_hint()
    assert "'llama-cpp-python==0.3.36'" in native_build_hint()

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    assert "'llama-cpp-python'" in native_build_hint()


def test_the_default_log_is_deleted_and_no_descriptor_is_left_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A long-lived process starting servers again and again leaks neither a file in the
    temporary folder nor an open descriptor per server."""
    import os

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)  # re-read TMPDIR
    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    port = free_port()
    for _ in range(2):
        with child_server([sys.executable, "-c", SERVES_MODELS, str(port)],
                          f"http://127.0.0.1:{port}/v1", startup_timeout=30):
            assert [p.name for p in tmp_path.glob("rag-gates-server-*.log")]
    assert not list(tmp_path.glob("rag-gates-server-*.log"))
    if fds is not None:
        assert len(os.listdir("/proc/self/fd")) <= fds


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_server_dies_with_a_parent_killed_without_cleanup(tmp_path: Path) -> None:
    """A parent killed by SIGKILL runs no ``finally``; the kernel still stops its server."""
    import signal
    import subprocess

    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    parent = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time\n"
         "from rag_gates.lm.llamacpp_server import child_server\n"
         f"with child_server([sys.executable, '-c', {SERVES_MODELS!r}, '{port}'], '{url}', "
         "startup_timeout=30):\n"
         "    print('ready', flush=True)\n"
         "    time.sleep(120)\n"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "ready"
        assert httpx.get(f"{url}/models", timeout=2).status_code == 200
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        _wait_until_refused(url, "its killed parent")
    finally:
        parent.kill()
