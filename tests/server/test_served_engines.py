"""OpenAICompatibleLM against two serving engines running the embedded SmolLM2, each compared
with HFWhiteBoxLM on the same weights: llama.cpp's server (llama-cpp-python, the Q4_1 GGUF,
one request at a time) and vLLM's CPU build (the converted float32 safetensors, a batching
engine). Each ``served`` test runs once per engine (``-k vllm`` / ``-k llamacpp``).

Tolerance, llama.cpp: transformers dequantises the Q4_1 GGUF to float32, so both hold the same
weight values; llama.cpp multiplies with quantised activations (8-bit blocks against the 4-bit
weights), which moves a log-probability, and by how much depends on the CPU kernels the build
compiled (one build passed where another, on a CI machine, did not). Measured over 50 HotpotQA
prompts (benchmarks/results/served_lm.json): likely tokens (generated, or scored where the
model would write them) differ by a median of 0.017-0.019 nats, p95 0.13-0.15, max 0.33;
the tail moves more: the top-5 next tokens by a median of 0.073 (max 0.45), a gold answer the
model finds unlikely by a median of 0.049 (p95 0.30, max 0.84). So likely tokens must stay
within TOLERANCE's median / max and tail tokens within its tail_median / tail_max; a
misaligned reading (the shift llama-cpp-python has on raw prompts) moves them by nats, far
past either. Greedy texts may part only where the in-process model had a near tie (the served
token within the max tolerance of its top token).

Tolerance, vLLM: it serves the float32 copy transformers reads, so only the order of float
operations differs: differences of about 1e-5 nats (VLLM_MEDIAN_TOL / VLLM_MAX_TOL).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rag_gates.confidence import AnswerLogprobGate, FirstTokenLogprobGate, FirstTokenProbGate
from rag_gates.deeprag.gates import MarkerLikelihoodGate
from rag_gates.errors import (
    ContextLengthError,
    ServerRequestError,
    WhiteBoxRequiredError,
)
from rag_gates.lm.openai_compat import PROBE_RAW, OpenAICompatibleLM
from rag_gates.types import Trace
from rag_gates_lab.runner import BenchConfig, read_records, run_bench

pytestmark = pytest.mark.server

# vLLM against HFWhiteBoxLM, both float32 on the same weights: these tests measured a median
# difference of 2e-6 nats and a max of 1.3e-5 (likely and tail tokens alike).
VLLM_MEDIAN_TOL = 1e-4
VLLM_MAX_TOL = 1e-3


@dataclass(frozen=True)
class Tolerance:
    """Largest differences from HFWhiteBoxLM, in nats: median and max for likely tokens, for
    tail tokens (top-k alternatives, continuations the model would not write)."""

    median: float
    max: float
    tail_median: float
    tail_max: float


TOLERANCE = {"llamacpp": Tolerance(0.05, 0.5, 0.15, 1.0),
             "vllm": Tolerance(VLLM_MEDIAN_TOL, VLLM_MAX_TOL, VLLM_MEDIAN_TOL, VLLM_MAX_TOL)}
#: What the probe finds: llama-cpp-python's echo is shifted by one on raw prompts
#: (abetlen/llama-cpp-python#1983); vLLM's completions echo is aligned on both.
PROBED = {"llamacpp": {"raw": "shifted", "chat": "aligned"},
          "vllm": {"raw": "aligned", "chat": "aligned"}}
QUESTIONS = [
    "What is the capital of France?",
    "Who wrote Hamlet?",
    "What is the largest planet in the solar system?",
    "How many legs does a spider have?",
    "What language is spoken in Brazil?",
    "Who painted the Mona Lisa?",
]
CALIBRATION = Path(__file__).resolve().parents[2] / "examples" / "data" / \
    "calibration_questions.jsonl"


@pytest.fixture(scope="module")
def served(engine: tuple[str, str], smol: Any) -> Iterator[OpenAICompatibleLM]:
    with OpenAICompatibleLM(engine[1], chat_template=smol.tokenizer.chat_template) as lm:
        yield lm


@pytest.fixture(scope="module")
def tol(engine: tuple[str, str]) -> Tolerance:
    return TOLERANCE[engine[0]]


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _check_close(diffs: list[float], median_tol: float, max_tol: float) -> None:
    assert diffs
    diffs = sorted(diffs)
    print(f"differences from HF: median {diffs[len(diffs) // 2]:.2e}, max {diffs[-1]:.2e} "
          f"({len(diffs)} values)")
    assert diffs[len(diffs) // 2] <= median_tol, diffs
    assert diffs[-1] <= max_tol, diffs


def test_probe_finds_each_engines_prompt_logprob_alignment(
        engine: tuple[str, str], served: OpenAICompatibleLM) -> None:
    assert served.alignment == PROBED[engine[0]], served.capabilities.notes
    assert served.capabilities.offered() == ["text", "logprobs", "score", "next_token"]


def test_greedy_generation_and_logprobs_agree_with_hf(served: OpenAICompatibleLM, smol: Any,
                                                      tol: Tolerance) -> None:
    same_text, diffs = 0, []
    for q in QUESTIONS:
        mine = served.generate(q, max_new_tokens=8, logprobs=0)
        ref = smol.generate(q, max_new_tokens=8, logprobs=5)
        a, b = mine.logprobs or [], ref.logprobs or []
        n = _common_prefix([t.token for t in a], [t.token for t in b])
        same_text += mine.text == ref.text
        diffs += [abs(x.logprob - y.logprob) for x, y in zip(a[:n], b[:n], strict=True)]
        if n < min(len(a), len(b)):  # they parted: only at a near tie of the in-process model
            alternatives = {t.token: t.logprob for t in b[n].top_logprobs}
            assert a[n].token in alternatives, (q, n, a[n].token, alternatives)
            assert b[n].logprob - alternatives[a[n].token] <= tol.max, (q, n, alternatives)
    _check_close(diffs, tol.median, tol.max)
    print(f"identical greedy texts: {same_text}/{len(QUESTIONS)}")


def test_score_agrees_with_hf_on_chat_prompts(engine: tuple[str, str],
                                              served: OpenAICompatibleLM, smol: Any,
                                              tol: Tolerance) -> None:
    q = "What is the capital of France?"
    continuations = ["Paris", "The capital of France is Paris.", "London is the capital."]
    mine = served.score(q, continuations)
    ref = smol.score(q, continuations)
    diffs = []
    for m, r in zip(mine, ref, strict=True):
        assert m.tokens == r.tokens
        diffs += [abs(x - y) for x, y in zip(m.logprobs, r.logprobs, strict=True)]
    # "London is the capital." is a continuation the model would not write: tail tolerance.
    _check_close(diffs, tol.median, tol.tail_max)
    # The ranking a likelihood gate reads is the same.
    assert [s.total for s in mine].index(max(s.total for s in mine)) == \
        [s.total for s in ref].index(max(s.total for s in ref))


def test_raw_prompt_score_agrees_with_hf(engine: tuple[str, str], smol: Any,
                                         tol: Tolerance) -> None:
    """Raw prompts: read shift-corrected from llama-cpp-python's echo, as is from vLLM's."""
    with OpenAICompatibleLM(engine[1], chat=False) as raw:
        assert raw.alignment == {"raw": PROBED[engine[0]]["raw"]}
        [mine] = raw.score(PROBE_RAW, [" Paris"])
    [ref] = smol.score(PROBE_RAW, [" Paris"], chat_template=False)
    assert mine.tokens == ref.tokens == [" Paris"]
    _check_close([abs(mine.logprobs[0] - ref.logprobs[0])], tol.median, tol.max)


def test_next_token_distribution_agrees_with_hf(served: OpenAICompatibleLM, smol: Any,
                                                tol: Tolerance) -> None:
    q = "Who wrote Hamlet?"
    mine = served.top_next_tokens(q, k=5)
    ref = smol.top_next_tokens(q, k=5)
    theirs = {t.token: t.logprob for t in ref}
    assert set(theirs) & {t.token for t in mine} and len(set(theirs) & {t.token for t in mine}
                                                          ) >= 4
    _check_close([abs(t.logprob - theirs[t.token]) for t in mine if t.token in theirs],
                 tol.tail_median, tol.tail_max)


def test_stream_and_async(served: OpenAICompatibleLM) -> None:
    # llama.cpp's greedy text can differ between two identical requests (its prompt cache
    # changes the arithmetic, and near ties flip), so each reply is checked on its own.
    q = "Name three colours."
    stream = served.stream(q, max_new_tokens=12, stop=["\n"])
    pieces: list[str] = []
    while True:
        try:
            pieces.append(next(stream))
        except StopIteration as done:
            result = done.value
            break
    assert len(pieces) > 1 and "".join(pieces) == result.text and "\n" not in result.text
    early = served.stream(q, max_new_tokens=64)
    next(early)
    early.close()  # closes the connection; the server is free for the next request

    async def three() -> list[str]:
        gens = await asyncio.gather(*(served.agenerate(q, max_new_tokens=12, stop=["\n"])
                                      for _ in range(3)))
        return [g.text for g in gens]

    texts = asyncio.run(three())
    assert len(texts) == 3 and all(t and "\n" not in t for t in texts)


def test_methods_take_or_refuse_a_served_model(served: OpenAICompatibleLM) -> None:
    with pytest.raises(WhiteBoxRequiredError, match="AnswerLogprobGate"):
        FirstTokenProbGate(served)
    decision = AnswerLogprobGate(served, max_new_tokens=4).decide("Who wrote Hamlet?")
    assert decision.evidence["tokens"] == 4
    gate = MarkerLikelihoodGate(served)
    assert gate.method == "score"  # the probe passed for chat prompts
    d = gate.decide("Who directed Jaws?", prompt=[
        {"role": "user", "content": "Answer step by step.\nQuestion: Who directed Jaws?"},
        {"role": "assistant", "content": "Follow up: Who directed Jaws?\n"}])
    assert d.evidence["method"] == "score" and "undecided" not in d.evidence, d.reason


def test_quco_and_deeprag_likelihood_run_end_to_end_from_the_bench(
        engine: tuple[str, str], tmp_path: Any) -> None:
    """The issue's bar for serving: QuCo-RAG and DeepRAG in likelihood mode, each from one
    ``rag-gates bench --model openai:URL --chat-template default`` run, answer real HotpotQA
    questions through the server, two at a time; DeepRAG's markers are scored by the
    server's echo, and the run directory records the server, not a key."""
    slices = Path(__file__).resolve().parents[2] / "examples" / "data"
    config = BenchConfig(dataset="hotpotqa", methods=["quco", "deeprag-likelihood"], n=2,
                         max_new_tokens=12, data_path=str(slices),
                         model=f"openai:{engine[1]}", concurrency=2,
                         chat_template="default")
    summary = run_bench(config, tmp_path / "run")
    records = read_records(tmp_path / "run")
    assert len(records) == 4 and all(r.prediction.strip() for r in records)
    assert summary["quco"]["questions"] == summary["deeprag-likelihood"]["questions"] == 2
    decisions = [d for r in records if r.method == "deeprag-likelihood"
                 for d in Trace.model_validate(r.trace).decisions()]
    # A step the model wrote unreadably is decided by the fail-closed unreadable-step gate
    # (retrieve), not scored; every other decision is the likelihood gate's, by echo.
    scored = [d for d in decisions if d.gate == "deeprag-likelihood"]
    assert scored, "no subquery reached the likelihood gate"
    assert all(d.evidence["method"] == "score" and math.isfinite(d.score) for d in scored)
    assert all(d.gate == "deeprag-unreadable-step" and d.retrieve
               for d in decisions if d not in scored)
    stored = json.loads((tmp_path / "run" / "config.json").read_text())
    assert stored["served"]["endpoint"] == engine[1]
    assert stored["served"]["chat_template"] is True
    assert "score" in stored["served"]["capabilities"]


def test_refusals_are_named(engine: tuple[str, str], served: OpenAICompatibleLM) -> None:
    """What the server refuses reaches the caller as the error that says what to do, not as
    a retry or a reply read wrongly."""
    with pytest.raises(ContextLengthError, match="too long"):
        served.generate("word " * 3000, max_new_tokens=4)
    with pytest.raises(ValueError, match=r"must be 0\.\.20"):  # refused before sending
        served.generate("Who wrote Hamlet?", max_new_tokens=2, logprobs=21)
    if engine[0] == "vllm":  # llama-cpp-python serves its one model under any name
        with OpenAICompatibleLM(engine[1], model="no-such-model", probe=False) as lm, \
                pytest.raises(ServerRequestError, match="404"):
            lm.generate("Who wrote Hamlet?", max_new_tokens=2)


def _calibration_questions(n: int) -> list[str]:
    lines = CALIBRATION.read_text(encoding="utf-8").splitlines()[:n]
    return [json.loads(line)["question"] for line in lines]


def test_served_gates_decide_as_the_white_box_ones(served: OpenAICompatibleLM, smol: Any,
                                                   tol: Tolerance) -> None:
    """On the shipped calibration questions, first-token-logprob through the server reads
    first-token-prob's score (from the logits in process), and answer-logprob through the
    server reads answer-logprob in process (where the two greedy answers are the same text);
    at a threshold among the in-process scores (their median), the served gate decides as
    the in-process one wherever their scores are not closer to it than they are to each
    other, and both decisions occur."""
    questions = _calibration_questions(12)
    gates = [(FirstTokenLogprobGate(served, max_new_tokens=8), FirstTokenProbGate(smol)),
             (AnswerLogprobGate(served, max_new_tokens=8),
              AnswerLogprobGate(smol, max_new_tokens=8))]
    for mine_gate, ref_gate in gates:
        pairs = [(mine_gate.decide(q), ref_gate.decide(q)) for q in questions]
        if isinstance(ref_gate, AnswerLogprobGate):  # a different answer has another score
            texts = [(m.evidence["closed_book_answer"], r.evidence["closed_book_answer"])
                     for m, r in pairs]
            pairs = [(m, r) for m, r in pairs if m.evidence["closed_book_answer"]
                     == r.evidence["closed_book_answer"]]
            assert len(pairs) >= len(questions) // 2, texts
        else:  # a skip answers with the closed-book reply the served gate generated
            assert all(isinstance(m.evidence["closed_book_answer"], str)
                       and m.evidence["first_token"] for m, _ in pairs)
        # (first-token: 1 - max p; a difference of probabilities is at most that of logs)
        differences = [abs(m.score - r.score) for m, r in pairs]
        _check_close(differences, tol.median, tol.max)
        threshold = sorted(r.score for _, r in pairs)[len(pairs) // 2]
        mine_gate.threshold = ref_gate.threshold = threshold
        clear = [(m, r) for m, r in pairs if abs(r.score - threshold) > max(differences)]
        decided = [(mine_gate.decision(m.score, dict(m.evidence)).retrieve,
                    ref_gate.decision(r.score, dict(r.evidence)).retrieve) for m, r in clear]
        assert decided and all(x == y for x, y in decided), (mine_gate.name, decided)
        assert {y for _, y in decided} == {True, False}, (mine_gate.name, decided)


def test_calibrate_scores_p_true_through_the_server_with_a_chat_template(
        engine: tuple[str, str], tmp_path: Path) -> None:
    """``rag-gates calibrate --model openai:URL --chat-template default``: the client renders
    P(True)'s chat prompt with the embedded model's template and the server scores it by
    echo, so p-true-sampling is built and scores every question (-log p(True), finite and
    >= 0, not all equal); the work directory records the template's hash. vLLM only: with
    llama-cpp-python an echoed prompt costs about 0.3 s a token, and each question's P(True)
    prompt holds ten sampled answers."""
    if engine[0] != "vllm":
        pytest.skip("llama-cpp-python echoes prompt log-probabilities at about 0.3 s a "
                    "token: 30 P(True) prompts take too long")
    from rag_gates.calibration import read_records as read_calibration_records
    from rag_gates.commands.calibrate import chat_template_identity, run_calibration
    from rag_gates.lm.openai_compat import load_chat_template

    data = tmp_path / "questions.jsonl"
    data.write_text("".join(CALIBRATION.read_text(encoding="utf-8")
                            .splitlines(keepends=True)[:30]), encoding="utf-8")
    out = tmp_path / "gate.json"
    report = run_calibration(data=data, corpus=str(CALIBRATION.with_name(
        "calibration_corpus.jsonl")), out=out, model=f"openai:{engine[1]}",
        gates="p-true-sampling,answer-logprob", max_new_tokens=8, k=1, max_loss=0.2,
        concurrency=4, chat_template="default")
    records = read_calibration_records(tmp_path / "gate-work" / "records.jsonl")
    assert len(records) == 30
    scores = [r.scores["p-true-sampling"] for r in records]
    assert all(s is not None and math.isfinite(s) and s >= 0 for s in scores), scores
    assert len(set(scores)) > 1
    assert {row.gate for row in report.rows} >= {"p-true-sampling", "answer-logprob"}
    config = json.loads((tmp_path / "gate-work" / "config.json").read_text())
    assert config["chat_template"] == chat_template_identity(load_chat_template("default"))
