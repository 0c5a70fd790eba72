"""``p-true`` / ``p-true-sampling`` (rag_gates.p_true): P(True), Kadavath et al. 2022, in
LM-Polygraph's prompt format, on a tiny random-weight Llama whose tokenizer holds ``True`` as
one token.

The score is checked against a reference computed here without the gate (the prompt typed
out, the chat template applied by the tokenizer, one plain transformers forward pass) and,
where lm-polygraph is installed (``bash benchmarks/envs/polygraph.sh`` builds a venv with it;
run ``/work/polyvenv/bin/python -m pytest``), against LM-Polygraph's own PTrue and its
SamplingPromptCalculator; those tests skip without it.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any, cast

import pytest

from rag_gates.errors import ServerReplyError, WhiteBoxRequiredError
from rag_gates.gate import UNDECIDED_SCORE, Gate, is_undecided
from rag_gates.lm.base import Capabilities, ContinuationScore
from rag_gates.types import Generation

QUESTIONS = ["Who wrote Hamlet?", "What is the capital of France?",
             "Who directed the film Ed Wood?"]
#: The QA prompt, typed out (rag_gates.prompts.qa_prompt's default instruction).
QA = "Answer the question in a few words.\nQuestion: {}"


@pytest.fixture(scope="module")
def lm() -> Any:
    """The tiny Llama with ``True`` added to its tokenizer as one token (P(True) reads one)."""
    from rag_gates.testing import tiny_lm

    return tiny_lm(seed=1, extra_tokens=("True",), max_context=1024)  # room for samples


def reference(lm: Any, question: str, answer: str, samples: Sequence[str] | None = None, *,
              chat: bool = True, join: str = ", ") -> float:
    """-log p("True") computed without the gate: the P(True) prompt typed out here (Kadavath
    et al.'s format in LM-Polygraph's text), one user message through the tokenizer's chat
    template with the generation prompt, a plain forward pass, log_softmax at the last
    position."""
    import torch

    q = QA.format(question)
    if samples is None:
        text = (f"Question: {q}\n Possible answer:{answer}\n Is the possible answer:\n"
                " (A) True\n (B) False\n The possible answer is:")
    else:
        text = (f"Question: {q}\n Here are some ideas that were brainstormed: "
                f"{join.join(samples)}\n Possible answer:{answer}\n Is the possible answer:\n"
                " (A) True\n (B) False\n The possible answer is:")
    tok = lm.tokenizer
    if chat:
        rendered = tok.apply_chat_template([{"role": "user", "content": text}],
                                           add_generation_prompt=True, tokenize=False)
        ids = tok(rendered, add_special_tokens=False, return_tensors="pt")["input_ids"]
    else:
        ids = tok(text, add_special_tokens=True, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = lm.model(input_ids=ids).logits[0, -1].float()
    true_id = tok.convert_tokens_to_ids("True")
    return -float(torch.log_softmax(logits, dim=-1)[true_id])


def drawn_samples(d: Any) -> list[str] | None:
    """The samples a decision's evidence holds (None: none were drawn)."""
    samples = d.evidence.get("samples")
    assert samples is None or (isinstance(samples, list)
                               and all(isinstance(x, str) for x in samples))
    return cast(list[str] | None, samples)


# ------------------------------------------------------------------ the score, by hand
@pytest.mark.parametrize("samples", [0, 3])
def test_the_score_is_minus_log_p_true_after_the_typed_out_prompt(lm: Any, samples: int
                                                                  ) -> None:
    from rag_gates.p_true import PTrueGate

    gate = PTrueGate(lm, threshold=1.0, samples=samples, max_new_tokens=8)
    assert isinstance(gate, Gate)
    assert gate.name == ("p-true-sampling" if samples else "p-true")
    for question in QUESTIONS:
        d = gate.decide(question)
        answer = d.evidence["closed_book_answer"]
        assert isinstance(answer, str) and answer
        assert answer == lm.generate(QA.format(question), max_new_tokens=8).text
        drawn = drawn_samples(d)
        if samples:
            assert isinstance(drawn, list) and len(drawn) == samples and all(drawn)
        else:
            assert drawn is None
        want = reference(lm, question, answer, drawn)
        assert d.score == pytest.approx(want, rel=1e-5, abs=1e-6)
        assert d.evidence["p_true"] == pytest.approx(math.exp(-want), rel=1e-5)
        assert d.gate == gate.name and not is_undecided(d)
        # The reference discriminates: a wrong answer slot, or samples joined otherwise,
        # give another number.
        assert abs(reference(lm, question, answer + "x", drawn) - d.score) > 1e-4
        if samples:
            assert abs(reference(lm, question, answer, drawn, join="; ") - d.score) > 1e-4
            assert abs(reference(lm, question, answer, None) - d.score) > 1e-4


def test_a_model_without_chat_template_sees_the_prompt_as_text(lm: Any) -> None:
    from rag_gates.lm.hf import HFWhiteBoxLM
    from rag_gates.p_true import PTrueGate

    plain = HFWhiteBoxLM(lm.model, lm.tokenizer, model_id="tiny-plain", chat_template=False)
    d = PTrueGate(plain, samples=2, max_new_tokens=6).decide(QUESTIONS[0])
    samples = drawn_samples(d)
    assert samples is not None
    want = reference(plain, QUESTIONS[0], str(d.evidence["closed_book_answer"]), samples,
                     chat=False)
    assert d.score == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_sampling_is_seeded_and_the_threshold_decides(lm: Any) -> None:
    from rag_gates.p_true import PTrueGate

    gate = PTrueGate(lm, samples=3, max_new_tokens=6, seed=5)
    d = gate.decide(QUESTIONS[1])
    again = gate.decide(QUESTIONS[1])  # seeded: the same samples, the same score
    assert (again.score, again.evidence["samples"]) == (d.score, d.evidence["samples"])
    other = PTrueGate(lm, samples=3, max_new_tokens=6, seed=6).decide(QUESTIONS[1])
    assert other.evidence["samples"] != d.evidence["samples"]
    at = PTrueGate(lm, threshold=d.score, samples=3, max_new_tokens=6, seed=5)
    above = PTrueGate(lm, threshold=math.nextafter(d.score, math.inf), samples=3,
                      max_new_tokens=6, seed=5)
    assert at.decide(QUESTIONS[1]).retrieve is True
    skip = above.decide(QUESTIONS[1])
    assert skip.retrieve is False and "answer without retrieval" in skip.reason
    assert "-log p(True)" in skip.reason
    assert asyncio.run(above.adecide(QUESTIONS[1])).score == d.score
    assert [x.score for x in above.decide_batch([QUESTIONS[1]] * 2)] == [d.score, d.score]


def test_a_skip_replies_with_the_closed_book_answer(lm: Any) -> None:
    from rag_gates.answer_once import find_closed_book_answer
    from rag_gates.p_true import PTrueGate

    d = PTrueGate(lm, threshold=1e9, max_new_tokens=8).decide(QUESTIONS[0])
    assert d.retrieve is False
    found = find_closed_book_answer(d)
    assert found is not None and found.text == d.evidence["closed_book_answer"]
    assert found.max_new_tokens == 8 and found.prompt == QA.format(QUESTIONS[0])


# ------------------------------------------------------------------ against LM-Polygraph
#: lm-polygraph reads the logits from transformers' ``generate`` (its cached forward pass),
#: not from one plain forward pass: float32 rounding of this random model's large logits
#: moves the value by up to ~2e-5 relative (the token ids are the same; a changed prompt
#: moves it by far more).
GENERATE_NOISE = 1e-4


@pytest.fixture(scope="module")
def polygraph() -> Any:
    return pytest.importorskip("lm_polygraph")


def test_p_true_is_lm_polygraphs_ptrue(polygraph: Any, lm: Any) -> None:
    from rag_gates.p_true import PTrueGate
    from rag_gates.peers import PolygraphGate

    theirs = PolygraphGate(lm, "PTrue", threshold=1.0, max_new_tokens=8)
    ours = PTrueGate(lm, threshold=1.0, max_new_tokens=8)
    for question in QUESTIONS:
        want, got = theirs.decide(question), ours.decide(question)
        assert got.evidence["closed_book_answer"] == want.evidence["greedy_answer"]
        assert got.score == pytest.approx(want.score, rel=GENERATE_NOISE)


@pytest.mark.parametrize("samples", [0, 4])
def test_lm_polygraphs_prompt_calculators_give_our_score(polygraph: Any, lm: Any,
                                                         samples: int) -> None:
    """LM-Polygraph's PromptCalculator / SamplingPromptCalculator, called with our gate's
    greedy answer and samples as their dependencies, on the model wrapped as our adapter
    wraps it (the QA prompt's text as the input, the chat template applied)."""
    from lm_polygraph import WhiteboxModel
    from lm_polygraph.stat_calculators.prompt import PromptCalculator, SamplingPromptCalculator
    from lm_polygraph.utils.generation_parameters import GenerationParameters

    from rag_gates.p_true import PTrueGate
    from rag_gates.peers import PolygraphGate

    model = WhiteboxModel(lm.model, lm.tokenizer, model_path="tiny", model_type="CausalLM",
                          generation_parameters=GenerationParameters(max_new_tokens=8),
                          instruct=True)
    calculator = SamplingPromptCalculator() if samples else PromptCalculator()
    stat = "p_true_sampling" if samples else "p_true"
    gate = PTrueGate(lm, samples=samples, max_new_tokens=8)
    adapter = PolygraphGate(lm, "PTrue", threshold=1.0, max_new_tokens=8)
    for question in QUESTIONS:
        d = gate.decide(question)
        q = adapter.prompt_text(question)  # what our adapter gives lm-polygraph
        deps: dict[str, Any] = {"input_texts": [q],
                                "greedy_texts": [d.evidence["closed_book_answer"]]}
        if samples:
            drawn = drawn_samples(d)
            assert drawn is not None and all(drawn)  # lm-polygraph drops an empty sample
            deps["sample_texts"] = [drawn]
        out = calculator(deps, [q], model, max_new_tokens=8)
        assert d.score == pytest.approx(-float(out[stat][0]), rel=GENERATE_NOISE)


# ------------------------------------------------------------------ fail closed
class FakeServer:
    """A served model as the gate sees one (stands in for OpenAICompatibleLM): text replies,
    ``sample``, a probed ``score`` capability and the ``score`` reply it is given."""

    model_id = "fake-server"
    supports_logprobs = True

    def __init__(self, *, logprobs: Sequence[float] = (-0.4,), fail: str | None = None,
                 unavailable: str | None = None) -> None:
        self.capabilities = Capabilities(logprobs=True, top_logprobs=20, next_token="top-k",
                                         score=True)
        self.logprobs, self.fail, self.unavailable = list(logprobs), fail, unavailable
        self.scored: list[str] = []

    def generate(self, prompt: Any, **kwargs: Any) -> Generation:
        if self.fail == "generate":
            raise ServerReplyError("the reply has no 'choices' (got {'detail': 'bad gateway'})")
        return Generation(text="Shakespeare", finish_reason="eos", completion_tokens=2)

    def sample(self, prompt: Any, n: int, **kwargs: Any) -> list[Generation]:
        return [Generation(text=t, finish_reason="eos") for t in ["Marlowe", "", "Kyd"][:n]]

    def score_unavailable(self, prompt: Any) -> str | None:
        return self.unavailable

    def score(self, prompt: Any, continuations: Sequence[str]) -> list[ContinuationScore]:
        if self.unavailable is not None:  # as OpenAICompatibleLM.score refuses the form
            raise WhiteBoxRequiredError(f"{self.unavailable}. Use an HFWhiteBoxLM")
        self.scored.append(prompt)
        if self.fail == "score":
            raise ServerReplyError("the echo has no 'logprobs'")
        return [ContinuationScore(text="True", token_ids=[], tokens=["T", "rue"][
            :len(self.logprobs)], logprobs=self.logprobs)]


def _undecided(d: Any, words: str) -> None:
    assert d.retrieve is True and d.score == UNDECIDED_SCORE and is_undecided(d)
    assert words in d.reason and d.evidence["raw_score"] == "nan"
    assert "could not decide" in d.reason


def test_a_served_model_is_scored_through_its_reply() -> None:
    from rag_gates.p_true import PTrueGate

    server = FakeServer(logprobs=[-0.25])
    d = PTrueGate(server, samples=3).decide(QUESTIONS[0])
    assert d.score == 0.25 and d.evidence["p_true"] == pytest.approx(math.exp(-0.25))
    assert d.evidence["samples"] == ["Marlowe", "", "Kyd"]
    # The sample with no text is left out, as lm-polygraph drops a sample with no tokens.
    assert "brainstormed: Marlowe, Kyd\n Possible answer:Shakespeare\n" in server.scored[0]
    assert server.scored[0] == d.evidence["p_true_prompt"]


@pytest.mark.parametrize(("server", "words"), [
    (FakeServer(fail="generate"), "ServerReplyError: the reply has no 'choices'"),
    (FakeServer(fail="score"), "ServerReplyError: the echo has no 'logprobs'"),
    (FakeServer(logprobs=[-0.1, -0.2]), "scored 'True' as 2 tokens"),
    (FakeServer(logprobs=[0.5]), "0.5 is above 0.0"),
    (FakeServer(logprobs=[math.nan]), "nan is not finite"),
], ids=["unreadable-reply", "unreadable-echo", "true-split", "not-a-logprob", "nan"])
def test_what_cannot_be_read_leaves_the_gate_undecided(server: FakeServer, words: str) -> None:
    from rag_gates.p_true import PTrueGate

    gate = PTrueGate(server, samples=2)
    _undecided(gate.decide(QUESTIONS[0]), words)
    _undecided(asyncio.run(gate.adecide(QUESTIONS[0])), words)


def test_a_model_that_cannot_score_the_prompt_now_is_undecided() -> None:
    from rag_gates.p_true import PTrueGate

    server = FakeServer()
    gate = PTrueGate(server)
    server.unavailable = "score() on chat prompts is not available from http://x/v1"
    _undecided(gate.decide(QUESTIONS[0]), "the model cannot score the prompt")
    assert server.scored == []


def test_a_nan_model_fails_closed() -> None:
    import torch

    from rag_gates.p_true import PTrueGate
    from rag_gates.testing import tiny_lm

    broken = tiny_lm(seed=0, extra_tokens=("True",))
    with torch.no_grad():
        broken.model.model.norm.weight.fill_(float("nan"))
    _undecided(PTrueGate(broken, max_new_tokens=3).decide(QUESTIONS[0]), "nan is not finite")


# ------------------------------------------------------------------ construction
@pytest.mark.parametrize(("kwargs", "message"), [
    ({"samples": -1}, r"samples is a count in \[0, 64\]"),
    ({"samples": 65}, r"samples is a count in \[0, 64\]"),
    ({"samples": True}, "samples is a count"),
    ({"samples": 2, "temperature": 0}, "temperature must be > 0"),
    ({"temperature": math.nan}, "temperature must be > 0"),
    ({"seed": "1"}, "seed must be an integer or None"),
    ({"max_new_tokens": 0}, "max_new_tokens must be an integer >= 1"),
    ({"threshold": -0.1}, "a number >= 0"),
    ({"dataset": "PubMedQA"}, "did you mean 'pubmedqa'"),
])
def test_arguments_are_checked_with_what_to_do(lm: Any, kwargs: dict[str, Any],
                                               message: str) -> None:
    from rag_gates.p_true import PTrueGate

    with pytest.raises(ValueError, match=message):
        PTrueGate(lm, **kwargs)


def test_a_model_it_cannot_use_is_refused_when_built() -> None:
    from rag_gates.p_true import PTrueGate
    from rag_gates.testing import tiny_lm

    with pytest.raises(ValueError, match=r"splits it into 4 tokens.*answer-logprob"):
        PTrueGate(tiny_lm())  # the default tiny tokenizer has no token 'True'
    with pytest.raises(WhiteBoxRequiredError, match="chat endpoint echoes no prompt"):
        PTrueGate(FakeServer(unavailable="score() on chat prompts is not available from "
                                         "http://x/v1: the chat endpoint echoes no prompt"))

    class TextOnly:
        model_id = "text-only"
        supports_logprobs = True

    with pytest.raises(WhiteBoxRequiredError, match=r"needs score.*sample-agreement"):
        PTrueGate(TextOnly(), samples=10)


# ------------------------------------------------------------------ registry and calibrate
def test_the_registry_builds_both_names_and_composites(lm: Any) -> None:
    from rag_gates.gate import AnyOf
    from rag_gates.registry import (
        GateContext,
        check_gate_expression,
        gate_needs_lm,
        make_gate,
    )

    ctx = GateContext(lm=lm, max_new_tokens=6)
    plain: Any = make_gate("p-true", ctx)
    assert (plain.name, plain.samples, plain.threshold) == ("p-true", 0, math.log(2.0))
    sampling: Any = make_gate("p-true-sampling:2.5", ctx)
    assert (sampling.name, sampling.samples, sampling.threshold) == ("p-true-sampling", 10, 2.5)
    assert sampling.max_new_tokens == 6
    fixed: Any = make_gate("p-true-sampling", GateContext(lm=lm, options={
        "p_true_samples": 3, "p_true_temperature": 0.5, "p_true_seed": 9,
        "samples": 7, "sample_temperature": 0.7}))  # sample-agreement's: not p-true's
    assert (fixed.samples, fixed.temperature, fixed.seed) == (3, 0.5, 9)
    # High thresholds: p-true skips, so the composite asks answer-logprob too.
    either = make_gate("p-true:1000|answer-logprob:99", ctx)
    assert isinstance(either, AnyOf)
    d = either.decide(QUESTIONS[0])
    assert d.retrieve is False
    subs: Any = d.evidence["decisions"]
    assert {sub["gate"] for sub in subs} == {"p-true", "answer-logprob"}
    assert gate_needs_lm("p-true") and gate_needs_lm("quco|p-true-sampling")
    check_gate_expression("p-true-sampling:100")
    with pytest.raises(ValueError, match="a number >= 0"):
        check_gate_expression("p-true:-1")


def test_calibrate_asks_for_p_true_sampling_by_name_in_process(lm: Any) -> None:
    from rag_gates.commands.calibrate import applicable_gates, fixed_draws

    built, skipped = applicable_gates(lm, None, {"max_new_tokens": 4})
    assert "p-true-sampling" not in built
    assert skipped["p-true-sampling"] == ("draws 10 sampled answers a question from an "
                                          "in-process model; ask for it with --gates")
    built, _ = applicable_gates(lm, ["p-true-sampling", "p-true"],
                                {"max_new_tokens": 4, "p_true_samples": 2})
    assert (built["p-true-sampling"].samples, built["p-true"].samples) == (2, 0)
    assert fixed_draws(built) == {"p_true_samples": 2, "p_true_temperature": 1.0,
                                  "p_true_seed": 0}


def test_calibrate_tries_p_true_sampling_on_a_served_model_where_it_can_score() -> None:
    from rag_gates.commands.calibrate import applicable_gates

    built, skipped = applicable_gates(FakeServer(), None, {"max_new_tokens": 4})
    assert built["p-true-sampling"].samples == 10 and "p-true-sampling" not in skipped
    why = "score() on chat prompts is not available from http://x/v1: the chat endpoint"
    built, skipped = applicable_gates(FakeServer(unavailable=why + " echoes no prompt; pass "
                                                 "chat_template="), None, {})
    assert "p-true-sampling" not in built
    assert skipped["p-true-sampling"].endswith(why + " echoes no prompt")
    with pytest.raises(ValueError, match=r"--gates p-true-sampling: .*echoes no prompt"):
        applicable_gates(FakeServer(unavailable=why + " echoes no prompt"),
                         ["p-true-sampling"], {})
