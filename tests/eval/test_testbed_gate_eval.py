"""eval-gate on a testbed: its decisions resume after an interruption (tiny model, plumbing)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from rag_gates._io import append_locked
from rag_gates.errors import FileInUseError, ModelNotFoundError
from rag_gates.registry import gate_needs_lm
from rag_gates.testing import save_tiny_lm, tiny_lm
from rag_gates_lab.gate_eval import GateEvalConfig, evaluate_gate
from rag_gates_lab.runner import ConfigMismatchError


@pytest.fixture(scope="module")
def testbed(tmp_path_factory):
    from rag_gates_lab.testbed.build import TestbedConfig, write_plan

    base = save_tiny_lm(tmp_path_factory.mktemp("base"))
    out = tmp_path_factory.mktemp("testbed")
    write_plan(TestbedConfig(base_model=str(base), n_facts=40, ladder=[0, 2],
                             general_paragraphs=5), out)
    return out


class _Stop(Exception):
    pass


def test_gate_decisions_resume_after_an_interruption(testbed, tmp_path):
    lm = tiny_lm(max_context=4096)
    config = GateEvalConfig(gate="first-token-prob", dataset=f"testbed:{testbed}", n=8,
                            max_new_tokens=4, k=1, labels_dir=str(tmp_path / "labels"),
                            create_labels=True,
                            threads=1)
    out = tmp_path / "eval"

    def stop_at_three(stage: str, done: int, total: int) -> None:
        if stage.startswith("gate") and done == 3:
            raise _Stop

    with pytest.raises(_Stop):
        evaluate_gate(config, out, lm=lm, progress=stop_at_three)
    first = (out / "decisions.jsonl").read_text().splitlines()
    assert len(first) == 3
    # A line cut short by the interruption is dropped and redone.
    (out / "decisions.jsonl").write_text("\n".join(first) + "\n" + first[2][:20])
    report = evaluate_gate(config, out, lm=lm)
    lines = (out / "decisions.jsonl").read_text().splitlines()
    assert len(lines) == 8 == report.questions
    assert lines[:3] == first  # finished decisions are kept, not recomputed
    assert len({json.loads(line)["id"] for line in lines}) == 8
    # A second eval-gate on the same --out (another process, mid-run) is refused untouched.
    with append_locked(out / "decisions.jsonl"), \
            pytest.raises(FileInUseError, match="another process"):
        evaluate_gate(config, out, lm=lm)
    assert (out / "decisions.jsonl").read_text().splitlines() == lines
    # Threads are not part of the identity; another gate or question set is refused.
    evaluate_gate(config.model_copy(update={"threads": 2}), out, lm=lm)
    with pytest.raises(ConfigMismatchError, match="another gate evaluation"):
        evaluate_gate(config.model_copy(update={"gate": "answer-logprob"}), out, lm=lm)


def test_label_cache_of_a_testbed_is_one_directory(testbed, tmp_path, monkeypatch):
    from rag_gates_lab.gate_eval import label_run_dir

    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path))
    config = GateEvalConfig(gate="first-token-prob", dataset=f"testbed:{testbed}")
    # The dataset name holds a path: it must not nest directories inside the cache.
    assert label_run_dir(config, "abc").parent == tmp_path / "eval-cache" / "default"


def test_a_text_only_gate_with_finished_labels_loads_no_model(testbed, tmp_path):
    """QuCo's gate reads the question and the corpus counts only: re-scoring it against
    finished labels (a committed testbed run whose model is not on this machine) must not
    load the model; a gate that reads the model, or labels still to answer, still does."""
    absent = str(tmp_path / "model-not-here")
    labels = tmp_path / "labels"
    config = GateEvalConfig(gate="first-token-prob", dataset=f"testbed:{testbed}", n=8,
                            max_new_tokens=4, k=1, model=absent, labels_dir=str(labels),
                            create_labels=True, threads=1)
    evaluate_gate(config, tmp_path / "ftp", lm=tiny_lm(max_context=4096))  # the labels
    quco = config.model_copy(update={"gate": "quco"})
    report = evaluate_gate(quco, tmp_path / "quco")  # no lm given, none on disk
    assert report.questions == 8
    rows = [json.loads(line) for line in (tmp_path / "quco" / "decisions.jsonl").open()]
    assert all(row["gate"] == "quco" and row["evidence"]["entities"] for row in rows)
    # Labels still to answer: the model is needed, and its absence is said.
    with pytest.raises(ModelNotFoundError):
        evaluate_gate(quco.model_copy(update={"labels_dir": str(tmp_path / "new-labels")}),
                      tmp_path / "quco-new")
    # A gate that reads the model, alone or in an expression: loaded, and refused when absent.
    assert not gate_needs_lm("quco")
    assert gate_needs_lm("quco&first-token-prob:0.4") and gate_needs_lm("cbdr")
    with pytest.raises(ModelNotFoundError):
        evaluate_gate(config, tmp_path / "ftp-again")
