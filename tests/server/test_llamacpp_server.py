"""OpenAICompatibleLM against llama.cpp's server (llama-cpp-python) running the embedded
SmolLM2 GGUF, compared with HFWhiteBoxLM on the same weights.

Tolerance: transformers dequantises the Q4_1 GGUF to float32, so both hold the same weight
values; llama.cpp multiplies with quantised activations (8-bit blocks against the 4-bit
weights), which moves a log-probability, and by how much depends on the CPU kernels the build
compiled (one build passed where another, on a CI machine, did not). Measured over 50 HotpotQA
prompts (benchmarks/results/served_lm.json): likely tokens (generated, or scored where the
model would write them) differ by a median of 0.017-0.019 nats, p95 0.13-0.15, max 0.33;
the tail moves more: the top-5 next tokens by a median of 0.073 (max 0.45), a gold answer the
model finds unlikely by a median of 0.049 (p95 0.30, max 0.84). So likely tokens must stay
within MEDIAN_TOL / MAX_TOL and tail tokens within TAIL_MEDIAN_TOL / TAIL_MAX_TOL; a
misaligned reading (the shift llama-cpp-python has on raw prompts) moves them by nats, far
past either. Greedy texts may part only where the in-process model had a near tie (the served
token within MAX_TOL of its top token).
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rag_gates.confidence import AnswerLogprobGate, FirstTokenProbGate
from rag_gates.deeprag.gates import MarkerLikelihoodGate
from rag_gates.errors import WhiteBoxRequiredError
from rag_gates.lm.openai_compat import PROBE_RAW, OpenAICompatibleLM
from rag_gates.types import Trace
from rag_gates_lab.runner import BenchConfig, read_records, run_bench

pytestmark = pytest.mark.server

MEDIAN_TOL = 0.05
MAX_TOL = 0.5
TAIL_MEDIAN_TOL = 0.15
TAIL_MAX_TOL = 1.0
QUESTIONS = [
    "What is the capital of France?",
    "Who wrote Hamlet?",
    "What is the largest planet in the solar system?",
    "How many legs does a spider have?",
    "What language is spoken in Brazil?",
    "Who painted the Mona Lisa?",
]


@pytest.fixture(scope="module")
def served(llama_server: str, smol: Any) -> Iterator[OpenAICompatibleLM]:
    with OpenAICompatibleLM(llama_server, chat_template=smol.tokenizer.chat_template) as lm:
        yield lm


def _common_prefix(a: list[str], b: list[str]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _check_close(diffs: list[float], median_tol: float = MEDIAN_TOL,
                 max_tol: float = MAX_TOL) -> None:
    assert diffs
    diffs = sorted(diffs)
    assert diffs[len(diffs) // 2] <= median_tol, diffs
    assert diffs[-1] <= max_tol, diffs


def test_probe_finds_raw_prompts_shifted_and_chat_prompts_aligned(
        served: OpenAICompatibleLM) -> None:
    assert served.alignment == {"raw": "shifted", "chat": "aligned"}
    assert served.capabilities.offered() == ["text", "logprobs", "score", "next_token"]


def test_greedy_generation_and_logprobs_agree_with_hf(served: OpenAICompatibleLM,
                                                      smol: Any) -> None:
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
            assert b[n].logprob - alternatives[a[n].token] <= MAX_TOL, (q, n, alternatives)
    _check_close(diffs)
    print(f"identical greedy texts: {same_text}/{len(QUESTIONS)}")


def test_score_agrees_with_hf_on_chat_prompts(served: OpenAICompatibleLM, smol: Any) -> None:
    q = "What is the capital of France?"
    continuations = ["Paris", "The capital of France is Paris.", "London is the capital."]
    mine = served.score(q, continuations)
    ref = smol.score(q, continuations)
    diffs = []
    for m, r in zip(mine, ref, strict=True):
        assert m.tokens == r.tokens
        diffs += [abs(x - y) for x, y in zip(m.logprobs, r.logprobs, strict=True)]
    # "London is the capital." is a continuation the model would not write: tail tolerance.
    _check_close(diffs, max_tol=TAIL_MAX_TOL)
    # The ranking a likelihood gate reads is the same.
    assert [s.total for s in mine].index(max(s.total for s in mine)) == \
        [s.total for s in ref].index(max(s.total for s in ref))


def test_shift_corrected_raw_score_agrees_with_hf(llama_server: str, smol: Any) -> None:
    with OpenAICompatibleLM(llama_server, chat=False) as raw:
        [mine] = raw.score(PROBE_RAW, [" Paris"])
    [ref] = smol.score(PROBE_RAW, [" Paris"], chat_template=False)
    assert mine.tokens == ref.tokens == [" Paris"]
    _check_close([abs(mine.logprobs[0] - ref.logprobs[0])])


def test_next_token_distribution_agrees_with_hf(served: OpenAICompatibleLM, smol: Any) -> None:
    q = "Who wrote Hamlet?"
    mine = served.top_next_tokens(q, k=5)
    ref = smol.top_next_tokens(q, k=5)
    theirs = {t.token: t.logprob for t in ref}
    assert set(theirs) & {t.token for t in mine} and len(set(theirs) & {t.token for t in mine}
                                                          ) >= 4
    _check_close([abs(t.logprob - theirs[t.token]) for t in mine if t.token in theirs],
                 TAIL_MEDIAN_TOL, TAIL_MAX_TOL)


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
        llama_server: str, tmp_path: Any) -> None:
    """The issue's bar for serving: QuCo-RAG and DeepRAG in likelihood mode, each from one
    ``rag-gates bench --model openai:URL --chat-template default`` run, answer real HotpotQA
    questions through the server, two at a time; DeepRAG's markers are scored by the
    server's echo, and the run directory records the server, not a key."""
    slices = Path(__file__).resolve().parents[2] / "examples" / "data"
    config = BenchConfig(dataset="hotpotqa", methods=["quco", "deeprag-likelihood"], n=2,
                         max_new_tokens=12, data_path=str(slices),
                         model=f"openai:{llama_server}", concurrency=2,
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
    assert stored["served"]["endpoint"] == llama_server
    assert stored["served"]["chat_template"] is True
    assert "score" in stored["served"]["capabilities"]
