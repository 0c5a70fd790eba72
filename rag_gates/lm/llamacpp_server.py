"""Start llama.cpp's OpenAI-compatible server (llama-cpp-python) on 127.0.0.1 for a GGUF file,
by default the embedded SmolLM2: for tests, benchmarks and trying a served model locally.

``pip install "llama-cpp-python[server]"`` builds llama.cpp from source (about 16 CPU-minutes
here). ``--logits_all true`` is needed for log-probabilities. By default llama.cpp is compiled
for the CPU it builds on; on a virtual CPU that lists AMX, that build faults at its first
completion: ``make test-server`` builds a portable one (see :func:`native_build_hint`); pip's
wheel cache would hand back a native wheel built earlier, whatever ``CMAKE_ARGS`` says.

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

__all__ = ["child_server", "free_port", "llamacpp_server", "native_build_hint"]

#: Signals of a native fault, for which :func:`child_server` adds its ``crash_hint``.
FAULT_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGILL, signal.SIGBUS})


def native_build_hint() -> str:
    """What to do when llama.cpp's server faults: rebuild the installed version portably."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        pin = f"=={version('llama-cpp-python')}"
    except PackageNotFoundError:
        pin = ""
    return ("A llama.cpp compiled for this CPU (pip's default, GGML_NATIVE) can fault on a "
            "virtual CPU that lists AMX; build a portable one: CMAKE_ARGS=-DGGML_NATIVE=OFF "
            f"pip install --no-cache-dir --force-reinstall --no-deps 'llama-cpp-python{pin}' "
            "(make test-server does).")


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
                 env: Mapping[str, str] | None = None, crash_hint: str = "") -> Iterator[str]:
    """Run an HTTP server ``command`` in a child process, wait until ``GET {url}/models``
    answers 200, yield ``url``, and stop the child when the block ends (terminate, then kill
    after 20 s; on Linux the child also gets SIGTERM if this process dies without cleaning
    up). Output goes to ``log`` (default: a temporary file, deleted when the block ends); its
    end is quoted in the error when the child exits or does not answer in
    ``startup_timeout`` seconds, and in the :class:`ServerUnavailableError` raised at the
    block's end if the child died while in use (chained to the block's own error, if any);
    ``crash_hint`` is added to that error when a fault signal (SIGSEGV, SIGILL, SIGBUS) killed
    the child."""
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
    name = f"the server {' '.join(command[:4])} ..."
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ServerUnavailableError(
                    f"{name} " + (_exit_status(proc.returncode) if proc.returncode is not None
                                  else f"did not answer in {startup_timeout:.0f} s")
                    + f"; its log: {_log_tail(log_path)}")
            try:
                if httpx.get(f"{url}/models", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        try:
            yield url
        except Exception as exc:
            # A server that crashed while in use (a native fault, the OOM killer) shows up
            # to its clients only as refused connections: name the death as their cause. Its
            # socket closes before it can be reaped, so wait a moment for the exit status.
            try:
                returncode: int | None = proc.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                returncode = None  # alive: the block's own error stands
            if returncode is None:
                raise
            raise _died_in_use(name, returncode, log_path, crash_hint) from exc
        if proc.poll() is not None:
            raise _died_in_use(name, proc.returncode, log_path, crash_hint)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if own_log:
            log_path.unlink(missing_ok=True)


def _died_in_use(name: str, returncode: int, log_path: Path,
                 crash_hint: str) -> ServerUnavailableError:
    fault = returncode < 0 and -returncode in FAULT_SIGNALS  # Signals are ints
    hint = f" {crash_hint}" if crash_hint and fault else ""
    return ServerUnavailableError(f"{name} {_exit_status(returncode)} while in use.{hint} "
                                  f"Its log: {_log_tail(log_path)}")


def _exit_status(returncode: int) -> str:
    """``exited (3)``, or ``was killed by SIGSEGV`` for a negative return code."""
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited ({returncode})"


def _log_tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-2000:]
    except OSError as exc:
        return f"(unreadable: {exc})"


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
                      log=log, env={**os.environ, "OMP_NUM_THREADS": str(threads)},
                      crash_hint=native_build_hint()) as url:
        yield url
