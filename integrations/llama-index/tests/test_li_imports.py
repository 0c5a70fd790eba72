"""The namespace packages coexist with llama-index-core, from any working directory."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from rag_gates.testing import check_exports

CHECK = """
import sys
import llama_index.llms.rag_gates as llms
import llama_index.retrievers.rag_gates as retrievers
import llama_index.core
from llama_index.core.llms import CustomLLM, MockLLM
from llama_index.core.schema import TextNode
import llama_index
assert not hasattr(llama_index, "__file__") or llama_index.__file__ is None, "not a namespace"
assert issubclass(llms.RagGatesLLM, CustomLLM)
assert callable(llms.as_text_lm) and callable(retrievers.node_to_passage)
"""

# torch loads with the first model, not on import (llama-index-core itself does not import it).
NO_TORCH = """
import sys
import llama_index.core.llms
if "torch" in sys.modules:
    sys.exit(0)  # llama-index-core imports torch itself: nothing to check
import llama_index.llms.rag_gates
import llama_index.retrievers.rag_gates
assert "torch" not in sys.modules, "importing the adapter imported torch"
"""


def test_imports_from_outside_the_repo(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", CHECK], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def test_core_first_then_adapter(tmp_path: Path) -> None:
    code = "import llama_index.core.llms\nimport llama_index.llms.rag_gates\n" + CHECK
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


def test_import_does_not_load_torch(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", NO_TORCH], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("package", [
    "llama_index.llms.rag_gates", "llama_index.postprocessor.rag_gates",
    "llama_index.query_engine.rag_gates", "llama_index.response_synthesizers.rag_gates",
    "llama_index.retrievers.rag_gates", "llama_index.tools.rag_gates",
])
def test_each_subpackage_all_is_what_it_imports_and_every_name_resolves(package: str) -> None:
    check_exports(package)
