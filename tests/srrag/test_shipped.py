"""The shipped SR-RAG policy labels: the file itself, damage refused, another model refused,
and the in-memory datastore keyed by the model that loads it (tiny model)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rag_gates.errors import ArtifactError
from rag_gates.srrag.policy import PolicyEntry, PolicyMismatchError
from rag_gates.srrag.shipped import (
    DEFAULT_POLICY_LABELS,
    POLICY_ENV,
    load_default_policy,
    read_policy_labels,
    write_policy_labels,
)

ENTRIES = [
    PolicyEntry(id="popqa-727", dataset="popqa", source="retrieval",
                question="In what city was Robley Dunglison Evans born?"),
    PolicyEntry(id="popqa-728", dataset="popqa", source="parametric",
                question="In what city was Ingvild Bryn born?"),
    PolicyEntry(id="popqa-735", dataset="popqa", source="retrieval",
                question="In what city was Mick Flynn born?"),
]


@pytest.fixture(autouse=True)
def _own_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The key cache these loads write stays in the test's folder, not the user's."""
    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path / "home"))


def test_the_shipped_file_is_smollm2s_training_labels() -> None:
    header, entries = read_policy_labels()
    assert header.model_id == "SmolLM2-135M-Instruct"
    assert len(entries) == header.questions > 0
    assert {e.source for e in entries} <= {"retrieval", "parametric"}
    assert len({(e.dataset, e.id) for e in entries}) == len(entries)  # no question twice
    if header.tau is not None:
        assert 0 <= header.tau <= 1 and 0 <= header.calibration["agreement"] <= 1
    # Its own k, below the number of labels: else every vote is the whole datastore and p_D
    # is the same number for every question.
    assert header.k is not None and 1 <= header.k < header.questions
    # Training rows only: none of the PopQA slice the examples and benchmarks evaluate.
    import json
    sample = Path(__file__).resolve().parents[2] / "examples" / "data" / "popqa_dev_sample.jsonl"
    evaluated = {json.loads(line)["question"] for line in sample.read_text().splitlines()}
    assert not evaluated & {e.question for e in entries}


def test_round_trip(tmp_path: Path) -> None:
    path = write_policy_labels(tmp_path / "p.jsonl", ENTRIES, "m", "cmd", tau=0.3,
                               calibration={"agreement": 0.7})
    header, entries = read_policy_labels(path)
    assert entries == ENTRIES
    assert (header.model_id, header.made_with, header.tau) == ("m", "cmd", 0.3)


@pytest.mark.parametrize("damage, message", [
    (lambda lines: lines[:-1], "promises 3 questions, the file holds 2"),
    (lambda lines: [*lines[:2], lines[2].replace('"parametric"', '"wikipedia"'), lines[3]],
     ":3: not a labelled question"),
    (lambda lines: [*lines[:3], lines[3][:20]], ":4 .*not a labelled question"),
    (lambda lines: lines[1:], "not a policy-labels header"),
])
def test_a_damaged_file_is_refused(tmp_path: Path, damage: Any, message: str) -> None:
    path = write_policy_labels(tmp_path / "p.jsonl", ENTRIES, "m")
    path.write_text("\n".join(damage(path.read_text().splitlines())) + "\n")
    with pytest.raises(ArtifactError, match=message):
        read_policy_labels(path)


def test_labels_of_another_model_are_refused(tiny: Any, monkeypatch: Any) -> None:
    monkeypatch.delenv(POLICY_ENV, raising=False)
    with pytest.raises(PolicyMismatchError, match="holds 'SmolLM2-135M-Instruct''s source labels"):
        load_default_policy(tiny, labels=DEFAULT_POLICY_LABELS)


def test_loaded_policy_is_keyed_by_the_loading_model(tiny: Any, tmp_path: Path,
                                                     monkeypatch: Any) -> None:
    monkeypatch.delenv(POLICY_ENV, raising=False)
    path = write_policy_labels(tmp_path / "p.jsonl", ENTRIES, tiny.model_id)
    policy = load_default_policy(tiny, k=2, labels=path)
    assert len(policy) == 3 and policy.k == 2
    vote = policy.vote_question("In what city was Ingvild Bryn born?")
    assert vote.neighbours[0].id == "popqa-728"
    assert vote.neighbours[0].similarity == pytest.approx(1.0, abs=1e-4)


def test_the_environment_points_at_a_built_datastore(tiny: Any, tmp_path: Path,
                                                     monkeypatch: Any) -> None:
    from rag_gates.srrag.policy import HiddenStateKeys, SourcePolicy

    built = SourcePolicy.open(HiddenStateKeys(tiny), path=tmp_path / "built", k=2)
    built.add_questions(ENTRIES[:2])
    built.close()
    monkeypatch.setenv(POLICY_ENV, str(tmp_path / "built"))
    policy = load_default_policy(tiny, k=2)
    assert len(policy) == 2 and policy.read_only
    # A read-only copy: the folder is free for its writer (and any other process) at once.
    SourcePolicy.open(HiddenStateKeys(tiny), path=tmp_path / "built", create=False).close()
    policy.close()


def test_explicit_labels_win_over_the_environment(tiny: Any, tmp_path: Path,
                                                  monkeypatch: Any) -> None:
    monkeypatch.setenv(POLICY_ENV, str(tmp_path / "no-such-datastore"))
    path = write_policy_labels(tmp_path / "p.jsonl", ENTRIES, tiny.model_id, k=2)
    policy = load_default_policy(tiny, labels=path)
    assert len(policy) == 3 and policy.k == 2  # the file's own k


def test_a_file_that_is_not_text_is_refused(tmp_path: Path) -> None:
    path = write_policy_labels(tmp_path / "p.jsonl", ENTRIES, "m")
    path.write_bytes(path.read_bytes()[:40] + b"\xff\xfe" + path.read_bytes()[40:])
    with pytest.raises(ArtifactError, match="not UTF-8"):
        read_policy_labels(path)
