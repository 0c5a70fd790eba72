"""Gate composition: AllOf, AnyOf, Cascade, Weighted and the gate-expression grammar.

The sub-gates are small real gates on the query's words (the composites are under test);
the composites also run over the confidence gates of a tiny model."""

from __future__ import annotations

import asyncio
import json
import math

import pytest

from rag_gates.gate import (
    UNDECIDED_SCORE,
    AllOf,
    AnyOf,
    BaseGate,
    Cascade,
    Weighted,
    decision_margin,
    parse_gate_expression,
)
from rag_gates.types import GateDecision


class Words(BaseGate):
    """Score = number of words; counts its calls and batch sizes."""

    def __init__(self, threshold: float, name: str = "words") -> None:
        super().__init__(threshold)
        self.name = name
        self.calls: list[str] = []
        self.batches: list[int] = []

    def score(self, query, **signals):
        self.calls.append(query)
        return float(len(query.split())), {"words": len(query.split())}

    def decide_batch(self, queries, **signals):
        self.batches.append(len(queries))
        return super().decide_batch(queries, **signals)


class Broken(BaseGate):
    name = "broken"

    def score(self, query, **signals):
        return float("nan"), {}


SHORT, LONG = "Who wrote Hamlet?", "Which river flows through the capital city of Hungary?"


def test_all_of_retrieves_only_when_every_gate_does_and_stops_at_the_first_no():
    few, many = Words(2, "few"), Words(5, "many")  # SHORT has 3 words, LONG 9
    gate = AllOf(few, many)
    d = gate.decide(SHORT)
    assert d.retrieve is False and d.threshold == 0.0
    assert d.evidence["consulted"] == 2 and d.evidence["skipped"] == []
    assert [s["gate"] for s in d.evidence["decisions"]] == ["few", "many"]
    assert d.score == pytest.approx(3 - 5)  # the smallest margin
    assert AllOf(few, many).decide(LONG).retrieve is True
    # The first "no" settles it: the second gate is never asked.
    many.calls.clear()
    d = AllOf(many, few).decide(SHORT)
    assert d.retrieve is False and many.calls == [SHORT] and few.calls.count(SHORT) == 1
    assert d.evidence["consulted"] == 1 and d.evidence["skipped"] == ["few"]
    assert "not consulted: few" in d.reason


def test_any_of_retrieves_when_one_gate_does_and_stops_at_the_first_yes():
    few, many = Words(2, "few"), Words(5, "many")
    d = AnyOf(few, many).decide(SHORT)
    assert d.retrieve is True and d.evidence["consulted"] == 1
    assert many.calls == []
    d = AnyOf(many, Words(10, "lots")).decide(LONG)
    assert d.retrieve is True and d.score == pytest.approx(9 - 5)
    assert AnyOf(many, Words(10)).decide(SHORT).retrieve is False


def test_without_short_circuit_every_gate_is_consulted():
    few, many = Words(2, "few"), Words(5, "many")
    d = AnyOf(few, many, short_circuit=False).decide(SHORT)
    assert d.evidence["consulted"] == 2 and many.calls == [SHORT]
    assert d.score == pytest.approx(max(3 - 2, 3 - 5))


def test_a_sub_gate_that_cannot_decide_makes_the_composite_retrieve_and_says_which():
    for gate in (AllOf(Broken(0.5), Words(100)), AllOf(Words(1), Broken(0.5)),
                 AnyOf(Words(100), Broken(0.5)), Cascade(Broken(0.5), Words(100), (0, 1)),
                 Weighted([Words(100), Broken(0.5)], [1.0, 1.0], -50.0)):
        d = gate.decide(SHORT)
        assert d.retrieve is True and d.score == UNDECIDED_SCORE, gate.name
        assert d.evidence["undecided_gate"] == "broken"
        assert "broken could not decide" in d.reason
        json.loads(d.model_dump_json())  # still valid JSON


def test_cascade_asks_the_expensive_gate_only_inside_the_band():
    cheap, expensive = Words(4, "cheap"), Words(2, "expensive")
    gate = Cascade(cheap, expensive, band=(3, 5))
    inside = gate.decide(SHORT)  # 3 words: in the band, expensive (threshold 2) retrieves
    assert inside.evidence["expensive_called"] is True and inside.retrieve is True
    assert inside.score == pytest.approx(3 - 2)
    assert "expensive decided" in inside.reason
    outside = gate.decide(LONG)  # 9 words: cheap decides alone
    assert outside.evidence["expensive_called"] is False and outside.evidence["expensive"] is None
    assert outside.retrieve is True and expensive.calls == [SHORT]
    # Batched: the expensive gate sees only the in-band queries, in one batch.
    expensive.batches.clear()
    decisions = gate.decide_batch([LONG, SHORT, "Why?", SHORT])
    assert expensive.batches == [2]
    assert [d.evidence["expensive_called"] for d in decisions] == [False, True, False, True]
    assert decisions[2].retrieve is False  # one word, below the band: cheap says no


def test_batched_votes_decide_like_one_at_a_time_and_skip_settled_queries():
    queries = [SHORT, LONG, "Why?", LONG]
    one = [AllOf(Words(2), Words(5)).decide(q) for q in queries]
    first, second = Words(2, "first"), Words(5, "second")
    batched = AllOf(first, second).decide_batch(queries)
    assert [d.retrieve for d in batched] == [d.retrieve for d in one] == [False, True, False, True]
    assert [d.score for d in batched] == [d.score for d in one]
    assert first.batches == [4] and second.batches == [3]  # "Why?" was settled by the first


def test_weighted_is_a_logistic_combination_and_round_trips():
    a, b = Words(3, "a"), Words(5, "b")
    gate = Weighted([a, b], weights=[0.5, -0.25], bias=0.1, center=[2.0, 1.0],
                    scale=[2.0, 4.0], threshold=0.6)
    d = gate.decide(LONG)  # 9 words
    z = 0.1 + 0.5 * (9 - 2) / 2 - 0.25 * (9 - 1) / 4
    assert d.score == pytest.approx(1 / (1 + math.exp(-z)))
    assert d.evidence["logit"] == pytest.approx(z)
    assert d.retrieve is (d.score >= 0.6)
    again = Weighted.from_json(json.loads(json.dumps(gate.to_json())), [a, b])
    assert again.decide(LONG).score == d.score
    with pytest.raises(ValueError, match="fitted for gates"):
        Weighted.from_json(gate.to_json(), [b, a])
    with pytest.raises(ValueError, match="2 finite numbers"):
        Weighted([a, b], weights=[1.0])
    with pytest.raises(ValueError, match="scale must be positive"):
        Weighted([a], weights=[1.0], scale=[0.0])


def test_weighted_terms_that_overflow_to_opposite_infinities_retrieve():
    """Two finite scores whose weighted terms reach +inf and -inf: the logit is NaN; before,
    that read as probability 0 and the gate skipped."""
    gate = Weighted([Words(3, "a"), Words(5, "b")], weights=[1e308, -1e308], threshold=0.5)
    d = gate.decide(LONG)
    assert d.retrieve is True and d.score == UNDECIDED_SCORE
    assert d.evidence["logit"] == "nan" and "its combined score is nan" in d.reason
    json.loads(d.model_dump_json())


def test_composites_refuse_what_is_not_a_gate_or_a_band():
    with pytest.raises(TypeError, match="argument 1 is a str, not a gate"):
        AllOf(Words(1), "quco")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="at least 2 gates"):
        AnyOf(Words(1))
    with pytest.raises(ValueError, match="lo <= hi"):
        Cascade(Words(1), Words(2), band=(0.8, 0.2))


def test_async_decisions_equal_sync_and_nesting_works():
    gate = AllOf(AnyOf(Words(20, "x"), Words(2, "y")), Cascade(Words(4, "c"), Words(8, "e"),
                                                                 (3, 10)))
    for q in (SHORT, LONG):
        sync, async_ = gate.decide(q), asyncio.run(gate.adecide(q))
        assert (sync.retrieve, sync.score) == (async_.retrieve, async_.score)
        assert _timeless(sync.evidence) == _timeless(async_.evidence)
    assert gate.name == "((x|y)&cascade(c,e,3,10))"


def _timeless(value):
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if k != "latency_ms"}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


def test_decision_margin_agrees_with_the_decision():
    strict = GateDecision(gate="g", retrieve=False, score=0.5, threshold=0.5, reason="r")
    assert decision_margin(strict) < 0  # a '>' gate at its threshold does not retrieve
    eq = GateDecision(gate="g", retrieve=True, score=0.5, threshold=0.5, reason="r")
    assert decision_margin(eq) == 0.0


def _resolver(made: list[tuple[str, float | None]]):
    def resolve(name: str, threshold: float | None):
        if name not in {"quco", "cbdr", "answer-logprob", "first-token-prob"}:
            raise ValueError(f"unknown gate {name!r}")
        made.append((name, threshold))
        return Words(threshold if threshold is not None else 4.0, name)

    return resolve


def test_expressions_build_the_composites_with_precedence_and_thresholds():
    made: list[tuple[str, float | None]] = []
    gate = parse_gate_expression("quco & cbdr:0.3 | answer-logprob:-1.5", _resolver(made))
    assert isinstance(gate, AnyOf) and isinstance(gate.gates[0], AllOf)  # '&' binds tighter
    assert made == [("quco", None), ("cbdr", 0.3), ("answer-logprob", -1.5)]
    gate = parse_gate_expression("cascade(quco,(cbdr|first-token-prob),0.2,0.8)",
                                 _resolver([]))
    assert isinstance(gate, Cascade) and gate.band == (0.2, 0.8)
    assert isinstance(gate.gates[1], AnyOf)
    single = parse_gate_expression("quco:7", _resolver([]))
    assert isinstance(single, Words) and single.threshold == 7.0


@pytest.mark.parametrize(("text", "message"), [
    ("quco&", "expected a gate name or '\\(' at its end"),
    ("quco&&cbdr", "expected a gate name or '\\(' at '&'"),
    ("(quco|cbdr", "expected '\\)' at its end"),
    ("quco cbdr", "expected '&', '\\|' or the end at 'cbdr'"),
    ("cascade(quco,cbdr,0.8)", "expected ',' at '\\)'"),
    ("cascade(quco,cbdr,high,0.8)", "expected a number at 'high'"),
    ("cascade(quco,cbdr,0.8,0.2)", "band 0.8..0.2 is empty"),
    ("quco:abc", "threshold 'abc', not a number"),
    ("quco:nan", "must be finite"),
    ("", "empty gate expression"),
])
def test_malformed_expressions_say_where_and_show_the_grammar(text, message):
    with pytest.raises(ValueError, match=message) as info:
        parse_gate_expression(text, _resolver([]))
    if message.startswith("expected"):  # a syntax error shows the grammar
        assert "cascade(" in str(info.value)


def test_weighted_file_expression(tmp_path):
    a, b = Words(3, "quco"), Words(5, "cbdr")
    file = tmp_path / "w.json"
    file.write_text(json.dumps({**Weighted([a, b], [1.0, 2.0], -3.0).to_json(),
                                "gate_thresholds": [3.0, 5.0]}))
    made: list[tuple[str, float | None]] = []
    gate = parse_gate_expression(f"weighted({file})&first-token-prob", _resolver(made))
    assert made == [("quco", 3.0), ("cbdr", 5.0), ("first-token-prob", None)]
    assert isinstance(gate, AllOf) and isinstance(gate.gates[0], Weighted)
    with pytest.raises(FileNotFoundError, match="rag-gates fit-weighted"):
        parse_gate_expression(f"weighted({tmp_path / 'missing.json'})", _resolver([]))


def test_composites_over_a_models_confidence_gates():
    from rag_gates.confidence import AnswerLogprobGate, FirstTokenProbGate
    from rag_gates.testing import tiny_lm

    lm = tiny_lm()
    first, mean = FirstTokenProbGate(lm), AnswerLogprobGate(lm)
    for gate in (AllOf(first, mean), AnyOf(first, mean), Cascade(first, mean, (-1e9, 1e9))):
        d = gate.decide(SHORT)
        subs = d.evidence.get("decisions") or [d.evidence["cheap"], d.evidence["expensive"]]
        alone = [first.decide(SHORT), mean.decide(SHORT)]
        for sub, ref in zip(subs, alone, strict=False):
            assert sub is not None and sub["score"] == pytest.approx(ref.score)
        assert d.retrieve is {"AllOf": all, "AnyOf": any}.get(
            type(gate).__name__, lambda xs: list(xs)[-1])(r.retrieve for r in alone[:len(subs)])


# --- Bounds of the grammar and of weights files (issue 32, item 8) ---------------------------


def test_nesting_deeper_than_the_limit_is_a_clear_error_not_a_recursion_error():
    from rag_gates.gate import MAX_EXPRESSION_DEPTH

    ok = "(" * MAX_EXPRESSION_DEPTH + "quco" + ")" * MAX_EXPRESSION_DEPTH
    assert isinstance(parse_gate_expression(ok, _resolver([])), Words)
    for text in ("(" * 400 + "quco" + ")" * 400,
                 "cascade(" * 40 + "quco" + ",quco,0,1)" * 40,
                 "(" * 4000):
        with pytest.raises(ValueError, match=f"nested deeper than {MAX_EXPRESSION_DEPTH}"):
            parse_gate_expression(text, _resolver([]))


def test_an_expression_with_too_many_terms_is_refused_before_any_gate_is_built():
    from rag_gates.gate import MAX_EXPRESSION_TERMS

    made: list[tuple[str, float | None]] = []
    parse_gate_expression("|".join(["quco"] * MAX_EXPRESSION_TERMS), _resolver(made))
    assert len(made) == MAX_EXPRESSION_TERMS
    made.clear()
    with pytest.raises(ValueError, match=f"limit of {MAX_EXPRESSION_TERMS} gates"):
        parse_gate_expression("|".join(["quco"] * (MAX_EXPRESSION_TERMS + 1)), _resolver(made))
    with pytest.raises(ValueError, match="limit of"):  # the 5,000-term OR
        parse_gate_expression("|".join(["q"] * 5000), _resolver(made))
    assert made == []  # refused before a gate (perhaps a model) was built
    with pytest.raises(ValueError, match="characters"):
        parse_gate_expression("q" * 100_000, _resolver(made))


def test_malformed_weights_files_are_typed_errors_naming_the_file(tmp_path):
    from rag_gates.errors import ArtifactError, WeightsFileError

    cases = {
        "list.json": ("[1, 2, 3]", "a JSON object"),
        "deep.json": ("[" * 100_000 + "]" * 100_000, "nested deeper"),
        "notjson.json": ("{gates: quco}", "not JSON"),
        "nogates.json": (json.dumps({"weights": [1.0]}), "gates"),
        "gatesnotlist.json": (json.dumps({"gates": "quco", "weights": [1.0]}), "gates"),
        "short.json": (json.dumps({"gates": ["quco", "cbdr"], "weights": [1.0], "bias": 0}),
                       "weights"),
        "thresholds.json": (json.dumps({"gates": ["quco", "cbdr"], "weights": [1.0, 2.0],
                                        "bias": 0, "gate_thresholds": [0.5]}),
                            "gate_thresholds"),
        "threshold7.json": (json.dumps({"gates": ["quco", "cbdr"], "weights": [1.0, 2.0],
                                        "bias": 0, "threshold": 7}), r"\[0, 1\]"),
        "bias.json": (json.dumps({"gates": ["quco"], "weights": [1.0], "bias": "high"}),
                      "bias"),
    }
    for name, (text, message) in cases.items():
        file = tmp_path / name
        file.write_text(text)
        with pytest.raises(WeightsFileError, match=message) as info:
            parse_gate_expression(f"weighted({file})", _resolver([]))
        assert str(file) in str(info.value) and isinstance(info.value, ArtifactError), name
    big = tmp_path / "big.json"
    big.write_text(" " * (2 * 1024 * 1024) + "{}")
    with pytest.raises(WeightsFileError, match="larger than"):
        parse_gate_expression(f"weighted({big})", _resolver([]))


def test_weighted_refuses_a_threshold_outside_its_probability_range():
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        Weighted([Words(3, "quco")], [1.0], threshold=7)
