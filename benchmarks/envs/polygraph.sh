#!/usr/bin/env bash
# The benchmark environment for LM-Polygraph (issue 57): a venv of its own with lm-polygraph
# 0.7.0, rag-gates (editable, this checkout) and the same torch as .venv (constraints.txt pins
# torch==2.13.0, the CPU build on local disk: a resolver that wanted another torch would fail
# here instead of fetching a CUDA build of several GB).
#
#   bash benchmarks/envs/polygraph.sh            # builds /work/polyvenv from scratch
#   POLYVENV=/some/dir bash benchmarks/envs/polygraph.sh
#
# Then: $POLYVENV/bin/python -m pytest tests/unit/test_polygraph_gate.py
#       $POLYVENV/bin/python benchmarks/polygraph_gates.py --help
# lm-polygraph's requirements resolve beside .venv's pins (pip install --dry-run, 0.7.0): it is
# kept apart because it adds ~60 packages (fschat, spacy, bitsandbytes, bert-score, ...) that
# rag-gates does not need.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
POLYVENV="${POLYVENV:-/work/polyvenv}"
PYTHON="${PYTHON:-$(command -v python3.11 || command -v python3)}"

rm -rf "$POLYVENV"
"$PYTHON" -m venv "$POLYVENV"
PIP=("$POLYVENV/bin/python" -m pip install --quiet --disable-pip-version-check
     -c "$ROOT/constraints.txt")
# torch first, alone: the pinned CPU build, so nothing after it can pick another.
"${PIP[@]}" "torch==2.13.0"
"${PIP[@]}" "lm-polygraph==0.7.0"
# rag-gates with the white-box model extra (transformers, ...) and the test tools.
"${PIP[@]}" -e "$ROOT[hf,dev]"
"$POLYVENV/bin/python" - <<'PY'
import importlib.metadata as md
import torch
assert torch.__version__.startswith("2.13.0"), torch.__version__
print("torch", torch.__version__, "| lm-polygraph", md.version("lm-polygraph"),
      "| transformers", md.version("transformers"))
PY
# The embedded models (SmolLM2, MiniLM) live in $RAG_GATES_HOME, shared with .venv.
"$POLYVENV/bin/rag-gates" models install
