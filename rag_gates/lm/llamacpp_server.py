"""Start llama.cpp's OpenAI-compatible server (llama-cpp-python) on 127.0.0.1 for a GGUF file,
by default the embedded SmolLM2: for tests, benchmarks and trying a served model locally.

``pip install "llama-cpp-python[server]"`` builds llama.cpp from source (about 16 CPU-minutes
here; pip caches the wheel). ``--logits_all true`` is needed for log-probabilities.

Example:
    >>> with llamacpp_server() as url:                                    # doctest: +SKIP
    ...     lm = OpenAICompatibleLM(url)
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from rag_gates._optional import require
from rag_gates.errors import ServerUnavailableError

__all__ = ["child_server", "free_port", "llamacpp_server"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> Callable[[], None] | None:
    """On Linux, a function for ``preexec_fn`` that asks the kernel to send the child SIGTERM
    when the thread that started it dies: a parent killed by a signal runs no ``finally``, and
    the server would be left behind holding its port, memory and a core. None elsewhere."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved here, not after fork
    except (OSError, AttributeError):
        return None
    pr_set_pdeathsig = 1

    def preexec() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM)

    return preexec


@contextmanager
def child_server(command: Sequence[str], url: str, *, startup_timeout: float = 120.0,
                 log: str | os.PathLike[str] | None = None,
                 env: Mapping[str, str] | None = None) -> Iterator[str]:
    """Run an HTTP server ``command`` in a child process, wait until ``GET {url}/models``
    answers 200, yield ``url``, and stop the child when the block ends (terminate, then kill
    after 20 s; on Linux the child also gets SIGTERM if this process dies without cleaning
    up). Output goes to ``log`` (default: a temporary file, deleted when the block ends); its
    end is quoted in the error when the child exits or does not answer in
    ``startup_timeout`` seconds."""
    httpx = require("httpx", "api")
    if log:
        log_path, own_log = Path(log), False
    else:  # the child writes through its own handle: close this one, delete the file after
        fd, name = tempfile.mkstemp(prefix="rag-gates-server-", suffix=".log")
        os.close(fd)
        log_path, own_log = Path(name), True
    with log_path.open("wb") as out:
        proc = subprocess.Popen(list(command), stdout=out, stderr=subprocess.STDOUT,
                                env=dict(env) if env is not None else None,
                                preexec_fn=_die_with_parent())
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise ServerUnavailableError(
                    f"the server {' '.join(command[:4])} ... "
                    + (f"exited ({proc.returncode})" if proc.returncode is not None else
                       f"did not answer in {startup_timeout:.0f} s") + f"; its log: {tail}")
            try:
                if httpx.get(f"{url}/models", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if own_log:
            log_path.unlink(missing_ok=True)


@contextmanager
def llamacpp_server(gguf: str | os.PathLike[str] | None = None, *, port: int | None = None,
                    threads: int = 1, n_ctx: int = 2048, startup_timeout: float = 120.0,
                    log: str | os.PathLike[str] | None = None) -> Iterator[str]:
    """Run ``python -m llama_cpp.server`` on 127.0.0.1 and yield its ``/v1`` URL; the server
    is stopped when the block ends. ``threads`` bounds its CPU use; its output goes to
    ``log`` (see :func:`child_server`)."""
    if importlib.util.find_spec("llama_cpp") is None:
        raise ImportError('the llama.cpp server is not installed: pip install '
                          '"llama-cpp-python[server]"')
    if gguf is None:
        from rag_gates.lm.defaults import default_gguf_path

        gguf = default_gguf_path()
    port = port or free_port()
    command = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host",
               "127.0.0.1", "--port", str(port), "--logits_all", "true", "--n_ctx", str(n_ctx),
               "--n_threads", str(threads), "--n_threads_batch", str(threads)]
    with child_server(command, f"http://127.0.0.1:{port}/v1", startup_timeout=startup_timeout,
                      log=log, env={**os.environ, "OMP_NUM_THREADS": str(threads)}) as url:
        yield url
