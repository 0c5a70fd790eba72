"""The watching certificate (issue 59, item 2): WatchedGate's e-process, its alarm on real
PopQA records with and without a drift, its state file across processes, fail-closed shadow
checks, and ``rag-gates audit``.

The drift tests replay the committed records of ``rag-gates calibrate`` on the shipped sample
(benchmarks/results/calibrate/sample-300: each question's answer-logprob score and the
embedded SmolLM2's two replies): a label-free certificate on the occupation questions, served
on occupation questions (no drift) and on place-of-birth questions (drift). The model there is
the recorded replies (:class:`RecordedReplies`); the watch, the gate wrapper, the spec and the
test are the real ones. The tiny random-weight model drives the end-to-end path.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import multiprocessing
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from rag_gates.calibration import (
    CalibrationRecord,
    ModelIdentity,
    calibrate,
    load_gate,
    parse_same_answer,
    read_records,
    register_gate,
)
from rag_gates.calibration.bounds import WSR_TRUNCATION, wsr_log_capital
from rag_gates.calibration.watch import (
    WatchedGate,
    WatchTest,
    capital_path,
    disagreement_baseline,
    replay,
)
from rag_gates.gate import BaseGate
from rag_gates.types import GateDecision, Generation, Passage

ROOT = Path(__file__).resolve().parents[2]
RECORDS = ROOT / "benchmarks" / "results" / "calibrate" / "sample-300" / "work" / "records.jsonl"
GATE = "recorded-answer-logprob"


# --- the e-process ------------------------------------------------------------------------

def _by_hand(x: list[float], epsilon: float, alpha: float, horizon: int | None = None
             ) -> list[float]:
    """log K_t written out from Waudby-Smith & Ramdas (hedged capital, predictable plug-in,
    one-sided) for H0: mean <= epsilon, independently of the module's code."""
    out, log_k, total, squares, var = [], 0.0, 0.0, 0.0, 0.25
    for t, value in enumerate(x, start=1):
        scale = t * math.log(1 + t) if horizon is None else horizon
        lam = min(math.sqrt(2 * math.log(1 / alpha) / (var * scale)),
                  WSR_TRUNCATION / epsilon)
        log_k += math.log(1 + lam * (value - epsilon))
        out.append(log_k)
        total += value
        mean = (0.5 + total) / (t + 1)
        squares += (value - mean) ** 2
        var = (0.25 + squares) / (t + 1)
    return out


SEQUENCE = [float(c) for c in "0001000000100000000011010000000000100000000110100000001"]


def test_the_e_process_matches_a_recomputation_on_a_fixed_sequence() -> None:
    expected = _by_hand(SEQUENCE, 0.05, 0.1)
    assert np.allclose(capital_path(SEQUENCE, 0.05, 0.1), expected, rtol=0, atol=1e-12)
    test = WatchTest(epsilon=0.05, alpha=0.1)
    steps = []
    for value in SEQUENCE:
        test.update(value)
        steps.append(test.log_capital)
    assert np.allclose(steps, expected, rtol=0, atol=1e-12)
    assert test.max_log_capital == pytest.approx(max(0.0, *expected))
    assert test.crossed == (max(expected) >= math.log(10))
    # 13 ones in 55 (0.24 against 0.05): the capital must have crossed 1/alpha.
    assert test.crossed and test.e_value == pytest.approx(math.exp(expected[-1]))


def test_with_a_fixed_horizon_it_is_the_calibration_bound_betting_the_other_way() -> None:
    x = np.array(SEQUENCE)
    path = capital_path(x, 0.05, 0.1, horizon=x.size)
    assert np.allclose(path, _by_hand(SEQUENCE, 0.05, 0.1, horizon=x.size))
    assert max(0.0, float(path.max())) == pytest.approx(
        float(wsr_log_capital(1.0 - x, 1.0 - 0.05, 0.1)), abs=1e-12)


def test_false_alarms_at_the_boundary_of_h0_stay_below_alpha() -> None:
    rng = np.random.default_rng(7)
    x = (rng.random((2000, 1500)) < 0.05).astype(float)   # mean exactly epsilon: worst case
    fired = (capital_path(x, 0.05, 0.1) >= math.log(10)).any(axis=1)
    assert fired.mean() <= 0.1
    y = (rng.random((500, 1500)) < 0.15).astype(float)    # three times epsilon
    assert (capital_path(y, 0.05, 0.1) >= math.log(10)).any(axis=1).mean() > 0.95


# --- real records, replayed ---------------------------------------------------------------

class RecordedReplies:
    """The embedded model's recorded replies: the closed-book reply for the closed-book
    prompt, the reply with retrieval for a prompt with context (a stand-in for the model,
    not for the watch)."""

    model_id = "SmolLM2-135M-Instruct (recorded replies)"

    def __init__(self, records: list[CalibrationRecord]) -> None:
        self.by_question = {r.question: r for r in records}
        self.calls = 0

    def generate(self, prompt: str, *, max_new_tokens: int = 128, **_: Any) -> Generation:
        self.calls += 1
        record = self.by_question[prompt.rsplit("Question: ", 1)[1]]
        text = record.retrieved_answer if "Context:" in prompt else record.closed_book_answer
        return Generation(text=text or "", finish_reason="eos")


class RecordedScore(BaseGate):
    """The answer-logprob score the committed run recorded for each question."""

    name = GATE

    def __init__(self, scores: dict[str, float], threshold: float) -> None:
        super().__init__(threshold)
        self.scores = scores

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, Any]]:
        return self.scores[query], {}


def _watch(decision: GateDecision) -> Any:
    return decision.evidence["watch"]


def _occupation(r: CalibrationRecord) -> bool:
    return " born" not in r.question


@pytest.fixture(scope="module")
def recorded() -> dict[str, Any]:
    records = read_records(RECORDS)
    scores = {r.question: float(r.scores["answer-logprob"] or 0.0) for r in records}
    register_gate(GATE, lambda ctx, threshold: RecordedScore(scores, threshold or 0.0),
                  replace=True)
    lm = RecordedReplies(records)
    judge = parse_same_answer("f1:0.5")
    occupation = [CalibrationRecord.from_agreement(
        id=r.id, question=r.question, closed_book_answer=r.closed_book_answer or "",
        retrieved_answer=r.retrieved_answer or "", judge=judge,
        scores={GATE: r.scores["answer-logprob"]}) for r in records if _occupation(r)]
    report = calibrate(occupation, max_loss=0.05, delta=0.1, bound="exact",
                       model=ModelIdentity.of(lm), retriever="recorded (test)", gates=[GATE],
                       composite=False)
    spec = report.spec_for(GATE)
    assert spec.certified and spec.labels == "none" and spec.judge == "f1:0.5", spec.note
    return {"records": records, "lm": lm, "spec": spec,
            "occupation": [r.question for r in records if _occupation(r)],
            "birth": [r.question for r in records if not _occupation(r)]}


def _passages(question: str) -> list[str]:
    return [f"A passage about: {question}"]


def _watched(recorded: dict[str, Any], **options: Any) -> WatchedGate:
    gate = load_gate(recorded["spec"], lm=recorded["lm"])
    return WatchedGate(gate, lm=recorded["lm"], retriever=_passages, **options)


def test_the_alarm_fires_under_a_drift_and_stays_silent_without(recorded: dict[str, Any],
                                                                 caplog: Any) -> None:
    rng = random.Random(0)
    calm = _watched(recorded, shadow_share=1.0, seed=1)
    for _ in range(4):  # the occupation questions four times over: 444 questions
        for q in rng.sample(recorded["occupation"], len(recorded["occupation"])):
            calm.decide(q)
    quiet = calm.status()
    assert quiet.questions == 444 and quiet.sampled == 444 and not quiet.alarm
    assert quiet.observed_rate is not None and quiet.observed_rate <= 0.05

    alarms: list[Any] = []
    drifted = _watched(recorded, shadow_share=1.0, seed=1, on_alarm=alarms.append)
    with caplog.at_level(logging.WARNING, logger="rag_gates.calibration.watch"):
        decisions = [drifted.decide(q) for q in rng.sample(recorded["birth"],
                                                           len(recorded["birth"]))]
    status = drifted.status()
    assert status.alarm and status.alarm_after is not None and status.alarm_after < 60
    assert len(alarms) == 1 and alarms[0].alarm                      # the callback, once
    assert sum("ALARM" in r.getMessage() for r in caplog.records) == 1  # one warning
    fired = next(i for i, d in enumerate(decisions) if _watch(d)["alarm"])
    assert fired == status.alarm_after - 1
    assert all(_watch(d)["alarm"] for d in decisions[fired:])  # latched
    skipped = [d for d in decisions if not d.retrieve]
    assert skipped and all(_watch(d)["shadowed"] for d in skipped)
    assert status.shadowed == len(skipped) and status.generations == 2 * len(skipped)


def test_false_alarms_on_undrifted_real_traffic_stay_below_delta(recorded: dict[str, Any]
                                                                 ) -> None:
    """Monte-Carlo over 400 streams of 2,000 occupation questions drawn with replacement,
    through the test the watch runs: the alarm rate must be at most delta."""
    spec = recorded["spec"]
    judge = parse_same_answer("f1:0.5")
    x = np.array([float(r.scores["answer-logprob"] is not None
                        and r.scores["answer-logprob"] < spec.threshold
                        and not judge(r.closed_book_answer or "", r.retrieved_answer or ""))
                  for r in recorded["records"] if _occupation(r)])
    draws = np.random.default_rng(3).integers(0, x.size, size=(400, 2000))
    fired = (capital_path(x[draws], spec.epsilon, spec.delta) >= math.log(1 / spec.delta)
             ).any(axis=1)
    assert fired.mean() <= spec.delta


def test_decisions_are_the_inner_gates_and_a_failing_check_changes_none(
        recorded: dict[str, Any], caplog: Any) -> None:
    def broken(question: str) -> list[Passage]:
        raise ConnectionError("the vector store is down")

    inner = load_gate(recorded["spec"], lm=recorded["lm"])
    watched = WatchedGate(load_gate(recorded["spec"], lm=recorded["lm"]), lm=recorded["lm"],
                          retriever=broken, shadow_share=1.0, seed=0)
    questions = recorded["birth"][:40]
    with caplog.at_level(logging.WARNING, logger="rag_gates.calibration.watch"):
        got = [watched.decide(q) for q in questions]
    for q, d in zip(questions, got, strict=True):
        plain = inner.decide(q)
        watch: Any = d.evidence.pop("watch")
        assert d.model_dump(exclude={"latency_ms"}) == plain.model_dump(exclude={"latency_ms"})
        assert watch["sampled"] and not watch["shadowed"]
        assert ("error" in watch) == (not plain.retrieve)
        assert plain.retrieve or "ConnectionError: the vector store is down" in watch["error"]
    skips = sum(not d.retrieve for d in got)
    status = watched.status()
    assert skips > 0 and status.errors == skips and status.sampled == 40 - skips
    assert status.disagreements == 0 and not status.alarm
    assert "the shadow check failed" in caplog.text


def test_state_is_shared_by_two_processes(recorded: dict[str, Any], tmp_path: Path) -> None:
    state = tmp_path / "watch.json"
    spec_file = recorded["spec"].save(tmp_path / "gate.json")
    ctx = multiprocessing.get_context("spawn")
    questions = recorded["birth"][:120]
    workers = [ctx.Process(target=_worker, args=(str(spec_file), str(state), seed, questions))
               for seed in (1, 2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
        assert w.exitcode == 0
    data = json.loads(state.read_text())
    assert data["questions"] == 240 and data["sampled"] + data["errors"] == 240
    assert data["test"]["n"] == data["sampled"] == 240   # no update lost
    skipped = sum(recorded["lm"].by_question[q].scores["answer-logprob"]
                  < recorded["spec"].threshold for q in questions)
    assert data["skipped"] == data["shadowed"] == 2 * skipped
    # A third process continues the same test.
    later = _watched(recorded, shadow_share=1.0, state=state, seed=3)
    later.decide(questions[0])
    after = later.status()
    assert after.questions == 241 and after.sampled == 241 and after.state_file == str(state)


def _worker(spec_file: str, state: str, seed: int, questions: list[str]) -> None:
    records = read_records(RECORDS)
    scores = {r.question: float(r.scores["answer-logprob"] or 0.0) for r in records}
    register_gate(GATE, lambda ctx, threshold: RecordedScore(scores, threshold or 0.0),
                  replace=True)
    lm = RecordedReplies(records)
    gate = WatchedGate(load_gate(spec_file, lm=lm), lm=lm, retriever=_passages,
                       shadow_share=1.0, state=state, seed=seed)
    for q in questions:
        gate.decide(q)
    gate.flush()


def test_a_state_file_of_another_watch_is_refused(recorded: dict[str, Any],
                                                  tmp_path: Path) -> None:
    state = tmp_path / "watch.json"
    _watched(recorded, shadow_share=0.5, state=state).decide(recorded["birth"][0])
    with pytest.raises(ValueError, match=r"another setting: judge 'f1:0.5' \(here 'exact'\)"):
        _watched(recorded, shadow_share=0.5, state=state, judge="exact")
    state.write_text("{not json")
    with pytest.raises(ValueError, match="delete it to start the test over"):
        _watched(recorded, shadow_share=0.5, state=state)


def test_the_shadow_share_is_a_seeded_coin(recorded: dict[str, Any]) -> None:
    questions = recorded["occupation"] * 9
    first = _watched(recorded, shadow_share=0.1, seed=5)
    second = _watched(recorded, shadow_share=0.1, seed=5)
    one = [_watch(first.decide(q))["sampled"] for q in questions]
    two = [_watch(second.decide(q))["sampled"] for q in questions]
    assert one == two
    assert 0.07 < sum(one) / len(one) < 0.13            # 999 draws at 0.1
    status = first.status()
    assert status.questions == len(questions) and status.sampled == sum(one)


def test_adecide_watches_as_decide(recorded: dict[str, Any]) -> None:
    questions = recorded["birth"][:30]
    sync = _watched(recorded, shadow_share=1.0, seed=4)
    async_gate = _watched(recorded, shadow_share=1.0, seed=4)

    async def run() -> list[Any]:
        return [await async_gate.adecide(q) for q in questions]

    got = asyncio.run(run())
    want = [sync.decide(q) for q in questions]
    assert [_watch(d) for d in got] == [_watch(d) for d in want]
    assert async_gate.status().e_value == sync.status().e_value


@pytest.mark.parametrize(("options", "message"), [
    ({"shadow_share": 0.0}, "shadow_share must be a number in \\(0, 1\\]"),
    ({"shadow_share": 5}, "e.g. 0.05 for 5%"),
    ({"shadow_share": True}, "shadow_share"),
    ({"shadow_share": 0.1, "alarm_delta": 1.0}, "alarm_delta must be a number in \\(0, 1\\)"),
    ({"shadow_share": 0.1, "epsilon": -0.1}, "epsilon must be"),
    ({"shadow_share": 0.1, "judge": "fuzzy"}, "exact \\| f1:CUT"),
    ({"shadow_share": 0.1, "seed": -1}, "seed must be an int >= 0"),
    ({"shadow_share": 0.1, "k": 0}, "calibrate's --k"),
    ({"shadow_share": 0.1, "max_new_tokens": 0}, "--max-new-tokens"),
])
def test_arguments_are_checked_with_what_to_do(recorded: dict[str, Any], options: Any,
                                               message: str) -> None:
    with pytest.raises(ValueError, match=message):
        _watched(recorded, **options)


def test_what_cannot_be_watched_is_refused(recorded: dict[str, Any]) -> None:
    gate = load_gate(recorded["spec"], lm=recorded["lm"])
    with pytest.raises(TypeError, match="CertifiedGate load_gate returns"):
        WatchedGate(gate.inner, lm=recorded["lm"], retriever=_passages,  # type: ignore[arg-type]
                    shadow_share=0.1)
    with pytest.raises(ValueError, match="lm= must be the model that answers"):
        WatchedGate(gate, lm=None, retriever=_passages, shadow_share=0.1)
    with pytest.raises(TypeError, match="callable question -> passages"):
        WatchedGate(gate, lm=recorded["lm"], retriever="bm25", shadow_share=0.1)
    none = load_gate(recorded["spec"].model_copy(update={"threshold": None,
                                                         "certified": False}).sealed(),
                     lm=recorded["lm"])
    with pytest.raises(ValueError, match="no skip is there to watch"):
        WatchedGate(none, lm=recorded["lm"], retriever=_passages, shadow_share=0.1)


def test_the_disagreement_baseline_of_a_labelled_certificate(recorded: dict[str, Any]) -> None:
    records = [r.model_copy(update={"scores": {GATE: r.scores["answer-logprob"]}})
               for r in recorded["records"] if _occupation(r)]
    spec = calibrate(records, max_loss=0.05, delta=0.1, model=ModelIdentity.of(recorded["lm"]),
                     retriever="recorded (test)", gates=[GATE], composite=False).spec_for(GATE)
    assert spec.certified and spec.labels == "gold"
    same = parse_same_answer("exact")
    skipped_differ = sum(r.scores[GATE] is not None and r.scores[GATE] < spec.threshold
                         and not same(r.closed_book_answer or "", r.retrieved_answer or "")
                         for r in records)
    base = disagreement_baseline(records, spec)
    assert base == pytest.approx(skipped_differ / len(records)
                                 + math.sqrt(math.log(10) / (2 * len(records))))
    with pytest.raises(ValueError, match="no 'answer-logprob-missing' score"):
        disagreement_baseline(recorded["records"], spec.model_copy(update={
            "gate": "answer-logprob-missing"}))


# --- the tiny model, end to end -----------------------------------------------------------

def test_end_to_end_on_the_tiny_model_reuses_the_gates_answer(tiny: Any,
                                                              tmp_path: Path) -> None:
    from rag_gates.retrieval import BM25Retriever
    from rag_gates.testing import tiny_gate_spec

    path = tiny_gate_spec(tiny, tmp_path / "gate.json")
    bm25 = BM25Retriever.from_passages([Passage(id=f"p{i}", text=f"Company {i} was founded by "
                                                f"person {i}.") for i in range(10)])
    gate = WatchedGate(load_gate(path, lm=tiny), lm=tiny, retriever=bm25, shadow_share=1.0,
                       state=tmp_path / "watch.json", seed=0)
    decisions = [gate.decide(f"Who founded the company number {i}?") for i in range(12)]
    shadowed = [d for d in decisions if _watch(d)["shadowed"]]
    assert shadowed, "the spec skips some of these questions"
    for d in shadowed:
        watch = _watch(d)
        assert watch["reused"] is True                  # answer-logprob generated it
        assert watch["closed_book_answer"] == d.evidence["closed_book_answer"]
        assert watch["same"] == parse_same_answer("exact")(watch["closed_book_answer"],
                                                           watch["retrieved_answer"])
        assert len(watch["passages"]) == 3
    status = gate.status()
    assert status.retrievals == len(shadowed) and status.generations == len(shadowed)
    assert status.questions == 12 and status.sampled == 12


def test_the_docs_snippet_runs(tiny: Any, tmp_path: Path, monkeypatch: Any) -> None:
    import io
    import re

    from rag_gates.retrieval import BM25Retriever
    from rag_gates.testing import tiny_gate_spec

    text = (ROOT / "docs" / "calibration.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- run by tests/calibration/test_watch.py -->\n```python\n(.*?)```",
                      text, re.S)
    assert match, "the watch snippet is marked in docs/calibration.md"
    monkeypatch.chdir(tmp_path)
    tiny_gate_spec(tiny, "gate.json")
    bm25 = BM25Retriever.from_passages([Passage(id=f"p{i}", text=f"Company {i} was founded by "
                                                f"person {i}.") for i in range(5)])
    log = io.StringIO()
    namespace = {"lm": tiny, "bm25": bm25, "worker_id": 0, "page_someone": print, "log": log,
                 "question": "Who founded the company number 3?"}
    exec(compile(match.group(1), "docs/calibration.md", "exec"), namespace)
    logged = json.loads(log.getvalue())
    assert "watch" in logged["evidence"] and (tmp_path / "gate.watch.json").is_file()


# --- rag-gates audit ----------------------------------------------------------------------

def test_audit_replays_a_log_to_the_live_status(recorded: dict[str, Any],
                                                tmp_path: Path) -> None:
    from rag_gates.cli import app

    runner = CliRunner()
    drifted = _watched(recorded, shadow_share=0.5, seed=2)
    log = tmp_path / "decisions.jsonl"
    with log.open("w") as handle:
        for q in recorded["birth"]:
            handle.write(drifted.decide(q).model_dump_json() + "\n")
    live = drifted.status()
    assert live.alarm
    result = runner.invoke(app, ["audit", str(log), "--json"])
    assert result.exit_code == 1, result.output
    audited = json.loads(result.output)
    for key in ("questions", "skipped", "sampled", "shadowed", "disagreements", "e_value",
                "max_e_value", "alarm", "alarm_after"):
        assert audited[key] == pytest.approx(getattr(live, key)), key
    table = runner.invoke(app, ["audit", str(log)], env={"COLUMNS": "160"})
    assert table.exit_code == 1 and "ALARM" in table.output

    calm = _watched(recorded, shadow_share=0.5, seed=2)
    quiet = tmp_path / "quiet.jsonl"
    quiet.write_text("".join(calm.decide(q).model_dump_json() + "\n"
                             for q in recorded["occupation"]))
    assert runner.invoke(app, ["audit", str(quiet)]).exit_code == 0
    # The exact judge calls more replies different than the logged f1:0.5: more evidence.
    strict = runner.invoke(app, ["audit", str(quiet), "--judge", "exact", "--json"])
    assert json.loads(strict.output)["disagreements"] >= calm.status().disagreements


def test_audit_refuses_what_is_not_a_decision_log(recorded: dict[str, Any],
                                                  tmp_path: Path) -> None:
    from rag_gates.cli import app

    runner = CliRunner()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"retrieve": true, "evidence": {}}\n[1, 2]\n{"retrieve": false}\n')
    result = runner.invoke(app, ["audit", str(bad)], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "bad.jsonl:2 is not a decision" in result.output
    plain = tmp_path / "plain.jsonl"
    plain.write_text('{"retrieve": true, "evidence": {}}\n')
    result = runner.invoke(app, ["audit", str(plain)], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "no decision carries evidence['watch']" in result.output
    assert runner.invoke(app, ["audit", str(tmp_path / "missing.jsonl")]).exit_code == 2
    gate = _watched(recorded, shadow_share=1.0, seed=0)
    other = recorded["spec"].model_copy(update={"epsilon": 0.1}).sealed()
    second = WatchedGate(load_gate(other, lm=recorded["lm"]), lm=recorded["lm"],
                         retriever=_passages, shadow_share=1.0, seed=0)
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(gate.decide(recorded["birth"][0]).model_dump_json() + "\n"
                     + second.decide(recorded["birth"][0]).model_dump_json() + "\n")
    result = runner.invoke(app, ["audit", str(mixed)], env={"COLUMNS": "200"})
    assert result.exit_code == 2 and "mixes decisions of 2 specs" in result.output
    state = replay([json.loads(line) for line in mixed.read_text().splitlines()])
    assert state.questions == 2


def test_a_per_group_spec_is_watched_and_has_a_baseline(recorded: dict[str, Any]) -> None:
    records = [r.model_copy(update={"scores": {GATE: r.scores["answer-logprob"]},
                                    "group": "occupation" if _occupation(r) else "birth"})
               for r in recorded["records"]]
    spec = calibrate(records, max_loss=0.1, delta=0.1, model=ModelIdentity.of(recorded["lm"]),
                     retriever="recorded (test)", gates=[GATE], by_group=True).spec_for(GATE)
    thresholds = {g.group: g.threshold for g in spec.groups or ()}
    assert spec.threshold is None and all(t is not None for t in thresholds.values())
    gate = WatchedGate(load_gate(spec, lm=recorded["lm"]), lm=recorded["lm"],
                       retriever=_passages, shadow_share=1.0, seed=0)
    for r in records[:60]:
        d = gate.decide(r.question, group=r.group)
        spec_seen: Any = d.evidence["spec"]
        assert spec_seen["group"] == r.group                 # group= reaches the spec
        assert d.retrieve == (r.scores[GATE] >= thresholds[str(r.group)])
    assert gate.status().shadowed == sum(r.scores[GATE] < thresholds[str(r.group)]
                                         for r in records[:60])
    same = parse_same_answer("exact")
    hits = sum(r.scores[GATE] < thresholds[str(r.group)]
               and not same(r.closed_book_answer or "", r.retrieved_answer or "")
               for r in records)
    assert disagreement_baseline(records, spec) == pytest.approx(
        hits / len(records) + math.sqrt(math.log(10) / (2 * len(records))))
