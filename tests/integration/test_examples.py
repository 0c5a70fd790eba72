"""The example scripts run as written, on the embedded model."""

from __future__ import annotations

import json
import re
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


def run_example(script: str, timeout: int) -> str:
    out = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True,
                         text=True, timeout=timeout)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


@pytest.mark.parametrize("script", ["llama_index_deeprag.py", "langchain_deeprag.py"])
def test_deeprag_example_runs(script: str) -> None:
    """DeepRAG takes its steps through the framework's retriever and model: each step
    printed with its decision (score and reason), a retrieval for each retrieve decision,
    then the answer and the trajectory in DeepRAG's format."""
    stdout = run_example(script, timeout=420)
    steps = re.findall(r"^step (\d+): Follow up: \S", stdout, re.M)
    decisions = re.findall(r"^  decision: (retrieve|answer from memory)  "
                           r"score=(undecided|-?\d[\d.e+-]*)  \((.+)\)$", stdout, re.M)
    assert steps and steps[0] == "1"
    assert len(decisions) == len(steps)  # every step has its decision line
    assert all(reason for _, _, reason in decisions)
    retrieved = [d for d, _, _ in decisions if d == "retrieve"]
    assert stdout.count("retrieved ") == len(retrieved)  # passages shown for each retrieval
    assert stdout.count("  intermediate answer: ") == len(steps)
    assert re.search(r"^answer: \S", stdout, re.M)
    assert re.search(r"^stop: (answered|step_cap|malformed)", stdout, re.M)
    assert "\nQuestion: " in stdout and "\nSo the final answer is: " in stdout
    if script.startswith("langchain"):  # the async run, decided by the markers' likelihood
        assert "== ainvoke, mode='likelihood'" in stdout
        assert "log p(retrieve marker) - log p(direct marker)" in stdout \
            or "deeprag-likelihood could not decide" in stdout
        assert len(re.findall(r"^answer: \S", stdout, re.M)) == 2


@pytest.mark.parametrize("script", ["llama_index_srrag.py", "langchain_srrag.py"])
def test_srrag_example_runs(script: str) -> None:
    """SR-RAG routes through the framework's own retriever with the toy kNN policy: each of
    the three questions gets a route with p_M, p_D, the reason and its neighbours, and an
    answer; the textbook question is verbalized (its neighbours all prefer the model's
    memory) and the long-tail one retrieved."""
    stdout = run_example(script, timeout=420)
    assert "policy: 12 labelled questions, k=3, tau=0.1" in stdout
    routes = re.findall(r"^  route: (retrieve|verbalize) .*p_M=(0\.\d{3})  p_D=(\d\.\d{3})  "
                        r"score=(\d\.\d{3})  tau=0\.1$", stdout, re.M)
    assert len(routes) == stdout.count("\nQ: ") == 3
    for route, p_m, p_d, score in routes:
        assert abs(float(p_m) * float(p_d) - float(score)) < 2e-3  # the product rule
        assert (route == "retrieve") == (float(score) >= 0.1)
    assert stdout.count("  reason: srrag: p_M ") == 3
    assert len(re.findall(r"^    neighbour 0\.\d{3} (retrieval |parametric) \S", stdout,
                          re.M)) == 9
    blocks = stdout.split("\nQ: ")[1:]
    assert blocks[0].startswith("Were Scott Derrickson") and "route: retrieve" in blocks[0]
    assert "sources: [" in blocks[0]
    assert blocks[1].startswith("What is the capital of France?")
    assert "route: verbalize" in blocks[1] and "source: parametric (" in blocks[1]
    assert len(re.findall(r"^  answer: \S", stdout, re.M)) == 3


@pytest.mark.parametrize("script", sorted(p.name for p in EXAMPLES.glob("*.py")))
def test_examples_use_public_imports_only(script: str) -> None:
    """The examples are a user's path: no benchmark harness (rag_gates_lab), no private
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
            assert not module.startswith("rag_gates_lab"), (script, module)
            assert not any(part.startswith("_") for part in module.split(".")), (script, module)
            public = getattr(importlib.import_module(module), "__all__", None)
            if module.startswith(("rag_gates", "langchain_rag_gates")) or ".rag_gates" in module:
                assert public is not None, f"{script}: {module} declares no __all__"
                assert set(names) <= set(public), (script, module, set(names) - set(public))


def _served_decisions(stdout: str) -> tuple[str, list[dict[str, object]]]:
    """The spec line, then each served question's JSON object, of a calibrated example."""
    head, _, rest = stdout.partition("\n")
    decoder, pos, found = json.JSONDecoder(), 0, []
    while (start := rest.find("{", pos)) != -1:
        obj, pos = decoder.raw_decode(rest, start)
        found.append(obj)
    return head, found


def test_the_calibrated_examples_serve_the_committed_spec_alike_in_both_frameworks() -> None:
    """Both load examples/data/calibration_gate.json and serve five questions the calibration
    never used: each decision is the certified threshold applied to the gate's score, with
    the reason saying so, and LlamaIndex and LangChain decide every question alike."""
    spec = json.loads((EXAMPLES / "data" / "calibration_gate.json").read_text())
    served = {}
    for script in ("llama_index_calibrated.py", "langchain_calibrated.py"):
        head, rows = _served_decisions(run_example(script, timeout=600))
        assert head.startswith(f"calibration_gate.json: {spec['gate']} at threshold "
                               f"{spec['threshold']}, epsilon {spec['epsilon']}")
        assert len(rows) == 5
        for row in rows:
            m = re.match(rf"{re.escape(spec['gate'])} score (-?\d[\d.e+-]*) (>=|<) certified "
                         r"threshold (-?\d[\d.e+-]*) \(certified: accuracy drop <= ",
                         str(row["reason"]))
            assert m, row["reason"]
            assert abs(float(m[3]) - spec["threshold"]) < 1e-4
            assert row["retrieve"] == (m[2] == ">=")
            assert str(row["answer"]).strip()
        served[script] = [(r["question"], r["retrieve"], r["reason"]) for r in rows]
    assert served["llama_index_calibrated.py"] == served["langchain_calibrated.py"]
