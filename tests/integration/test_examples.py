"""The example scripts run as written, on the embedded model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("script", ["white_box_basics.py", "frameworks_llm.py"])
def test_example_runs(script: str) -> None:
    out = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Paris" in out.stdout or "Hamlet" in out.stdout


@pytest.mark.parametrize("script", ["llama_index_quco.py", "langchain_quco.py"])
def test_quco_example_runs(script: str) -> None:
    """QuCo's gate decides both ways on the example questions, with its evidence."""
    out = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "decision: retrieve=True" in out.stdout
    assert "decision: retrieve=False" in out.stdout
    assert "'Scott Derrickson'" in out.stdout  # the counted entities are printed


@pytest.mark.parametrize("script", ["llama_index_cbdr.py", "langchain_cbdr.py"])
def test_cbdr_example_runs(script: str) -> None:
    """The CBDR gate decides on each question with the shipped probe's confidence, and every
    question gets an answer (reranked paragraphs with Inc when the gate retrieves)."""
    out = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("decision: retrieve=") == 2
    assert out.stdout.count("confidence=") == 2
    assert out.stdout.count("answer:") == 2
    if "decision: retrieve=True" in out.stdout:
        assert "Inc=" in out.stdout


@pytest.mark.parametrize("script", ["llama_index_tokrag.py", "langchain_tokrag.py"])
def test_tokrag_example_runs(script: str) -> None:
    """Tok-RAG answers through the framework's own retriever, with a record per token."""
    out = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "answer:" in out.stdout and "tokens: " in out.stdout
    assert "disagreements: " in out.stdout or "steps not taken as agreed: " in out.stdout
    assert "streaming" in out.stdout or "streamed:" in out.stdout


@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_examples_use_public_imports_only(script: str) -> None:
    """The examples are a user's path: no benchmark harness (rag_gates.eval), no private
    module (a name starting with '_'), and only what the imported module exports."""
    import ast
    import importlib

    tree = ast.parse((EXAMPLES / script).read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [(node.module, [a.name for a in node.names])]
        elif isinstance(node, ast.Import):
            modules = [(a.name, []) for a in node.names]
        else:
            continue
        for module, names in modules:
            if not module.startswith(("rag_gates", "langchain_rag_gates", "llama_index")):
                continue
            assert not module.startswith("rag_gates.eval"), (script, module)
            assert not any(part.startswith("_") for part in module.split(".")), (script, module)
            public = getattr(importlib.import_module(module), "__all__", None)
            if module.startswith(("rag_gates", "langchain_rag_gates")) or ".rag_gates" in module:
                assert public is not None, f"{script}: {module} declares no __all__"
                assert set(names) <= set(public), (script, module, set(names) - set(public))
