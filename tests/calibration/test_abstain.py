"""Certified abstention (``calibrate --abstain``, issue 59 item 1): the three-way policy's two
risks held at delta by Monte-Carlo on a synthetic population, the thresholds against a
brute-force reference computed with exact integer binomial tails, the spec's third outcome
served by ``load_gate``, and the command end to end on the tiny model."""

from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rag_gates.calibration import (
    CalibrationRecord,
    GateSpec,
    ModelIdentity,
    calibrate_abstention,
    load_gate,
    read_records,
    write_records,
)
from rag_gates.calibration.abstain import CLOSED_SHARES, PASSAGE_SCORE, policy_outcomes
from rag_gates.errors import CalibrationError

ROOT = Path(__file__).resolve().parents[2]
MODEL = ModelIdentity(name="test-model", fingerprint="f" * 64)


def population(n: int, seed: int) -> dict[str, np.ndarray]:
    """A gate score ``s1`` that predicts a wrong closed-book answer, a with-passages score
    ``s2`` that predicts a wrong answer with retrieval, and retrieval that mostly helps."""
    rng = np.random.default_rng(seed)
    s1, s2 = rng.random(n), rng.random(n)
    closed_right = rng.random(n) < 0.9 * (1 - s1) ** 2
    retrieved_right = closed_right | (rng.random(n) < 0.85 * (1 - s2))
    # A few questions retrieval misleads.
    misled = rng.random(n) < 0.03
    retrieved_right = np.where(misled, False, retrieved_right)
    return {"s1": s1, "s2": s2, "closed": closed_right, "retrieved": retrieved_right}


def records_of(pop: dict[str, np.ndarray], rows: np.ndarray) -> list[CalibrationRecord]:
    return [CalibrationRecord(
        id=f"q{i}", question=f"Question {i}?", closed_book_correct=bool(pop["closed"][i]),
        retrieved_correct=bool(pop["retrieved"][i]), scores={"good": float(pop["s1"][i])},
        retrieved_scores={PASSAGE_SCORE: float(pop["s2"][i])}) for i in rows]


def true_risks(pop: dict[str, np.ndarray], t1: float | None, t2: float | None
               ) -> tuple[float, float]:
    """The population's accuracy drop from skipping and its share answered wrongly."""
    skipped = (pop["s1"] < t1) if t1 is not None else np.zeros(pop["s1"].size, bool)
    drop = float(np.mean(skipped * (pop["retrieved"].astype(int) - pop["closed"].astype(int))))
    answered = (pop["s2"] < t2) if t2 is not None else np.zeros(pop["s2"].size, bool)
    wrong = (skipped & ~pop["closed"]) | (~skipped & answered & ~pop["retrieved"])
    return drop, float(np.mean(wrong))


def test_both_risks_hold_at_delta_over_monte_carlo_draws() -> None:
    pop = population(40_000, seed=1)
    epsilon, alpha, delta, n, draws = 0.05, 0.25, 0.1, 300, 300
    rng = np.random.default_rng(2)
    violations = skip = abstained = 0.0
    for d in range(draws):
        rows = rng.choice(pop["s1"].size, size=n, replace=False)
        report = calibrate_abstention(records_of(pop, rows), max_loss=epsilon,
                                      max_error=alpha, delta=delta, bound="binomial",
                                      model=MODEL, retriever="synthetic", seed=d)
        row = report.row("good")
        drop, error = true_risks(pop, row.threshold, row.abstain.threshold)
        violations += drop > epsilon or error > alpha
        skip += row.observed_skip_rate / draws
        abstained += row.abstain.abstain_rate.observed / draws
    # At most delta, with three Monte-Carlo standard errors of slack.
    assert violations / draws <= delta + 3 * math.sqrt(delta * (1 - delta) / draws)
    # And the policy is not the trivial one (retrieve and abstain on everything).
    assert skip > 0.05 and abstained < 0.8


def _binom_cdf(k: int, n: int, p: float) -> Fraction:
    q = Fraction(p)
    return sum((Fraction(math.comb(n, i)) * q ** i * (1 - q) ** (n - i)
                for i in range(k + 1)), Fraction(0))


def _max_count(n: int, rate: float, level: float) -> int:
    """Largest count whose binomial lower tail is at most ``level`` (-1: none)."""
    best = -1
    for k in range(n + 1):
        if _binom_cdf(k, n, rate) <= Fraction(level):
            best = k
        else:
            break
    return best


def _sequence_cut(scores: np.ndarray, event: np.ndarray, kmax: int) -> int:
    """Distinct scores: take the lowest k while the running event count stays <= kmax."""
    count, cut = 0, 0
    if kmax < 0:
        return 0
    for i in np.argsort(scores):
        count += int(event[i])
        if count > kmax:
            break
        cut += 1
    return cut


def test_thresholds_match_a_brute_force_reference() -> None:
    pop = population(60, seed=7)
    records = records_of(pop, np.arange(60))
    epsilon, alpha, delta = 0.15, 0.35, 0.2
    row = calibrate_abstention(records, max_loss=epsilon, max_error=alpha, delta=delta,
                               bound="binomial", model=MODEL, retriever="r").row("good")
    n = 60
    harm = pop["retrieved"] & ~pop["closed"]
    skip_cut = _sequence_cut(pop["s1"], harm, _max_count(n, epsilon, delta / 2))
    level = delta / (4 * len(CLOSED_SHARES))
    best: tuple[tuple[int, int], float | None, float | None] | None = None
    s1_sorted, s2_sorted = np.sort(pop["s1"]), np.sort(pop["s2"])
    for share in CLOSED_SHARES:
        cut_a = _sequence_cut(pop["s1"], ~pop["closed"], _max_count(n, share * alpha, level))
        cut_b = _sequence_cut(pop["s2"], ~pop["retrieved"],
                              _max_count(n, (1 - share) * alpha, level))
        cut1 = min(skip_cut, cut_a)
        t1 = float(s1_sorted[cut1]) if cut1 else None
        t2 = float(s2_sorted[cut_b]) if cut_b else None
        skipped = (pop["s1"] < t1) if t1 is not None else np.zeros(n, bool)
        passes = (pop["s2"] < t2) if t2 is not None else np.zeros(n, bool)
        key = (cut1, -int((~skipped & ~passes).sum()))
        if best is None or key > best[0]:
            best = (key, t1, t2)
    assert best is not None
    assert (row.threshold, row.abstain.threshold) == (best[1], best[2])
    # The reference is not vacuous here: something is skipped and something answered.
    assert best[1] is not None and best[2] is not None


def test_policy_outcomes_fail_closed_on_unscored_questions() -> None:
    s1 = np.array([0.1, math.nan, 0.9, 0.2])
    s2 = np.array([0.1, 0.1, math.nan, 0.9])
    out = policy_outcomes(s1, s2, 0.5, 0.5, np.array([True, True, True, False]),
                          np.array([True, False, True, True]))
    assert out["skipped"].tolist() == [True, False, False, True]
    # Unscored gate: retrieved; unscored passage score: abstained.
    assert out["answered_retrieved"].tolist() == [False, True, False, False]
    assert out["abstained"].tolist() == [False, False, True, False]
    assert out["wrong"].tolist() == [False, True, False, True]


def test_refuses_unlabelled_and_old_records() -> None:
    pop = population(60, seed=3)
    records = records_of(pop, np.arange(60))
    old = [r.model_copy(update={"retrieved_scores": {}}) for r in records]
    with pytest.raises(CalibrationError, match="no with-passages score"):
        calibrate_abstention(old, max_error=0.3, model=MODEL, retriever="r")
    agreement = [records[0].model_copy(update={"labels": "agreement", "judge": "exact"}),
                 *records[1:]]
    with pytest.raises(CalibrationError, match="needs gold answers"):
        calibrate_abstention(agreement, max_error=0.3, model=MODEL, retriever="r")
    for bad in (0.0, 1.0, float("nan"), True):
        with pytest.raises(CalibrationError, match="max_error"):
            calibrate_abstention(records, max_error=bad, model=MODEL, retriever="r")


def test_old_record_lines_are_written_back_unchanged(tmp_path: Path) -> None:
    line = json.dumps({"id": "q1", "question": "Q?", "closed_book_correct": True,
                       "retrieved_correct": False, "scores": {"g": 0.5},
                       "closed_book_answer": None, "retrieved_answer": None,
                       "labels": "gold", "judge": None}, separators=(",", ":"))
    (tmp_path / "r.jsonl").write_text(line + "\n")
    records = read_records(tmp_path / "r.jsonl")
    assert records[0].retrieved_scores == {}
    write_records(records, tmp_path / "back.jsonl")
    assert (tmp_path / "back.jsonl").read_text() == line + "\n"


def test_the_spec_round_trips_and_serves_the_third_outcome(tmp_path: Path) -> None:
    pop = population(300, seed=5)
    report = calibrate_abstention(records_of(pop, np.arange(300)), max_loss=0.05,
                                  max_error=0.25, model=MODEL, retriever="r")
    spec = report.best
    assert spec.abstain is not None and spec.abstain.threshold is not None
    path = spec.save(tmp_path / "gate.json")
    assert GateSpec.load(path) == spec
    # Editing the abstention threshold breaks the checksum.
    data = json.loads(path.read_text())
    data["abstain"]["threshold"] = 0.99
    (tmp_path / "edited.json").write_text(json.dumps(data))
    with pytest.raises(CalibrationError, match="checksum"):
        GateSpec.load(tmp_path / "edited.json")

    from rag_gates.calibration.load import CertifiedGate

    gate = CertifiedGate(None, spec)
    t2 = spec.abstain.threshold
    answer = gate.after_retrieval(t2 / 2, answer="Paris")
    assert not answer.abstain and "answer from the passages" in answer.reason
    assert answer.evidence["answer"] == "Paris"
    assert gate.after_retrieval(t2).abstain  # at the threshold: abstain
    broken = gate.after_retrieval(math.nan, error="server sent +inf")
    assert broken.abstain and "fail closed" in broken.reason and "+inf" in broken.reason
    assert gate.after_retrieval(None).abstain
    # The plain spec never abstains.
    plain = CertifiedGate(None, spec.model_copy(update={"abstain": None}))
    assert not plain.abstains and not plain.after_retrieval(50.0).abstain
    # A spec whose test certified no answer after retrieval abstains on every retrieval.
    none = CertifiedGate(None, spec.model_copy(update={
        "abstain": spec.abstain.model_copy(update={"threshold": None})}))
    assert none.after_retrieval(0.0).abstain


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``rag-gates calibrate --abstain`` on 40 sample questions with the tiny model (right
    closed book on every other one by construction of the gold answers)."""
    from typer.testing import CliRunner

    from rag_gates.answers import normalize_answer
    from rag_gates.cli import app
    from rag_gates.lm import load_lm
    from rag_gates.methods import MethodContext, make_method
    from rag_gates.testing import save_tiny_lm

    where = tmp_path_factory.mktemp("abstain")
    tiny = save_tiny_lm(where / "tiny")
    lm = load_lm(str(tiny))
    sample = ROOT / "examples" / "data" / "calibration_questions.jsonl"
    corpus_src = ROOT / "examples" / "data" / "calibration_corpus.jsonl"
    closed = make_method("no-rag", MethodContext(lm=lm, max_new_tokens=4))
    rows = []
    for i, q in enumerate(json.loads(line) for line in sample.read_text().splitlines()[:40]):
        words = normalize_answer(closed.answer(q["question"]).answer).split()
        gold = words[0] if i % 2 == 0 and words else "zzqqxx"
        rows.append({"id": q["id"], "question": q["question"], "answers": [gold]})
    data = where / "q.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    corpus = where / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"title": p["title"], "text": p["text"][:60]}) + "\n"
                              for p in map(json.loads, corpus_src.read_text().splitlines()[:300])))
    out = where / "gate.json"
    result = CliRunner().invoke(app, [
        "calibrate", "--data", str(data), "--corpus", str(corpus), "--out", str(out),
        "--k", "1", "--model", str(tiny), "--gates", "answer-logprob",
        "--max-new-tokens", "4", "--max-loss", "0.2", "--abstain", "0.6"])
    refused = CliRunner().invoke(app, [
        "calibrate", "--data", str(data), "--corpus", str(corpus), "--out", str(out),
        "--abstain", "0.3", "--by-group"])
    return {"lm": lm, "out": out, "result": result, "refused": refused, "corpus": corpus,
            "records": read_records(where / "gate-work" / "records.jsonl")}


def test_the_cli_records_the_with_passages_score_and_writes_a_three_way_spec(
        tiny_run: dict[str, Any]) -> None:
    from rag_gates.confidence import answer_with_passages
    from rag_gates.retrieval.bm25 import BM25Retriever

    result = tiny_run["result"]
    assert result.exit_code == 0, result.output
    assert "three-way" in " ".join(result.output.split())
    records = tiny_run["records"]
    assert all(PASSAGE_SCORE in r.retrieved_scores for r in records)
    spec = GateSpec.load(tiny_run["out"])
    assert spec.abstain is not None and spec.abstain.max_error == 0.6
    # The recorded score is what serving computes for the same question and passages.
    from rag_gates.commands.calibrate import read_corpus

    retriever = BM25Retriever.from_passages(read_corpus(tiny_run["corpus"]))
    record = records[0]
    served = answer_with_passages(tiny_run["lm"], record.question,
                                  retriever.retrieve(record.question, 1), max_new_tokens=4)
    assert served.answer == record.retrieved_answer
    assert served.score == pytest.approx(record.retrieved_scores[PASSAGE_SCORE], abs=1e-5)
    gate = load_gate(tiny_run["out"], lm=tiny_run["lm"])
    assert gate.abstains
    decision = gate.after_retrieval(served.score, answer=served.answer)
    expected = spec.abstain.threshold is None or served.score >= spec.abstain.threshold
    assert decision.abstain is expected


def test_the_cli_refuses_abstain_with_by_group_before_loading(
        tiny_run: dict[str, Any]) -> None:
    refused = tiny_run["refused"]
    assert refused.exit_code == 2
    assert "--abstain certifies one policy" in " ".join(refused.output.split())


def test_the_calibration_page_abstention_snippet_runs(tiny: Any, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib
    import io
    import re

    from rag_gates.confidence import AnswerLogprobGate
    from rag_gates.types import Passage

    text = (ROOT / "docs" / "calibration.md").read_text(encoding="utf-8")
    match = re.search(r"<!-- run by tests/calibration/test_abstain.py -->\n```python\n(.*?)```",
                      text, re.S)
    assert match, "the tested abstention snippet is marked in docs/calibration.md"
    gate = AnswerLogprobGate(tiny, max_new_tokens=32)
    pop = population(120, seed=11)
    questions = [f"Who wrote the book number {i}?" for i in range(120)]
    scores = [gate.decide(q).score for q in questions]
    records = [CalibrationRecord(
        id=str(i), question=q, closed_book_correct=bool(pop["closed"][i]),
        retrieved_correct=bool(pop["retrieved"][i]), scores={"answer-logprob": s},
        retrieved_scores={PASSAGE_SCORE: float(pop["s2"][i]) * 20})
        for i, (q, s) in enumerate(zip(questions, scores, strict=True))]
    write_records(records, tmp_path / "records.jsonl")
    monkeypatch.chdir(tmp_path)
    passages = [Passage(id="a", title="Hamlet", text="Hamlet is a play by Shakespeare.")]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(match.group(1), "docs/calibration.md", "exec"),
             {"lm": tiny, "passages": passages})
    assert GateSpec.load(tmp_path / "gate.json").abstain is not None
    printed = out.getvalue()
    assert "abstention threshold" in printed or "no answer after retrieval" in printed
