"""OpenAICompatibleLM's protocol handling, against replies recorded from llama-cpp-python's
server running the embedded SmolLM2 GGUF (tests/lm/replay_server.py). The live-server
comparison with HFWhiteBoxLM is tests/server/ (``make test-server``)."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Iterator
from typing import Any

import pytest

from rag_gates.errors import (
    ContextLengthError,
    ServerError,
    ServerReplyError,
    ServerTimeoutError,
    ServerUnavailableError,
    WhiteBoxRequiredError,
)
from rag_gates.lm.base import capabilities_of, require_capabilities, require_white_box
from rag_gates.lm.openai_compat import PROBE_RAW, OpenAICompatibleLM
from tests.lm.replay_server import ReplayServer

UPSTREAM = os.environ.get("RAG_GATES_RECORD_UPSTREAM")
FAST = {"backoff_base": 0.0, "backoff_max": 0.0}


@pytest.fixture(scope="module")
def server() -> Iterator[ReplayServer]:
    with ReplayServer(upstream=UPSTREAM) as s:
        if UPSTREAM:
            from rag_gates.lm import load_default_tokenizer

            s.chat_template = load_default_tokenizer().chat_template
        yield s


@pytest.fixture(autouse=True)
def _reset(server: ReplayServer) -> Iterator[None]:
    yield
    server.faults.clear()
    server.transform = None


@pytest.fixture(scope="module")
def chat_lm(server: ReplayServer) -> Iterator[OpenAICompatibleLM]:
    with OpenAICompatibleLM(server.url, chat_template=server.chat_template, **FAST) as lm:
        yield lm


@pytest.fixture(scope="module")
def raw_lm(server: ReplayServer) -> Iterator[OpenAICompatibleLM]:
    with OpenAICompatibleLM(server.url, chat=False, **FAST) as lm:
        yield lm


def test_probe_finds_llamacpp_raw_prompts_shifted_and_chat_prompts_aligned(
        chat_lm: OpenAICompatibleLM) -> None:
    assert chat_lm.alignment == {"raw": "shifted", "chat": "aligned"}
    caps = chat_lm.capabilities
    assert caps.score and caps.logprobs and caps.next_token == "top-k"
    assert not (caps.hidden_states or caps.attention or caps.streams)
    assert "raw prompts: shifted" in caps.notes["score"]
    assert "chat prompts: aligned" in caps.notes["score"]
    assert chat_lm.model_name and chat_lm.model_name.endswith(".gguf")  # from GET /models


def test_generate_with_logprobs_matches_the_recorded_tokens(chat_lm: OpenAICompatibleLM
                                                            ) -> None:
    g = chat_lm.generate("What is the capital of France?", max_new_tokens=6, logprobs=3)
    assert g.text and g.logprobs is not None and len(g.logprobs) == g.completion_tokens == 6
    assert "".join(t.token for t in g.logprobs) == g.text
    for t in g.logprobs:
        assert len(t.top_logprobs) == 3
        values = [a.logprob for a in t.top_logprobs]
        assert values == sorted(values, reverse=True) and t.logprob <= values[0] + 1e-9
    assert g.finish_reason == "length" and g.prompt_tokens > 10


def test_stop_strings_cut_text_and_logprobs(raw_lm: OpenAICompatibleLM) -> None:
    full = raw_lm.generate(PROBE_RAW, max_new_tokens=8, logprobs=0)
    assert full.text.startswith(" Paris")
    cut = raw_lm.generate(PROBE_RAW, max_new_tokens=8, logprobs=0, stop=["."])
    assert cut.text == " Paris" and cut.finish_reason == "stop"
    # The token that completed the stop string keeps its entry, as in HFWhiteBoxLM.
    assert [t.token for t in cut.logprobs or []] == [" Paris", "."]
    # More stop strings than the server takes: the rest are cut here.
    many = OpenAICompatibleLM(raw_lm.base_url, chat=False, probe=False, max_stop_strings=0)
    assert many.generate(PROBE_RAW, max_new_tokens=8, stop=["is"]).text == " Par"


def test_stream_joins_to_the_generated_text(raw_lm: OpenAICompatibleLM) -> None:
    whole = raw_lm.generate(PROBE_RAW, max_new_tokens=8)
    stream = raw_lm.stream(PROBE_RAW, max_new_tokens=8)
    pieces = list(stream)
    assert len(pieces) > 1 and "".join(pieces) == whole.text
    cut = list(raw_lm.stream(PROBE_RAW, max_new_tokens=8, stop=["."]))
    assert "".join(cut) == " Paris"


async def test_async_generate_and_stream(raw_lm: OpenAICompatibleLM) -> None:
    whole = raw_lm.generate(PROBE_RAW, max_new_tokens=8)
    gens = await asyncio.gather(*(raw_lm.agenerate(PROBE_RAW, max_new_tokens=8)
                                  for _ in range(3)))
    assert {g.text for g in gens} == {whole.text}
    assert "".join([p async for p in raw_lm.astream(PROBE_RAW, max_new_tokens=8)]) == whole.text


async def test_concurrency_is_bounded(server: ReplayServer) -> None:
    lm = OpenAICompatibleLM(server.url, chat=False, probe=False, max_concurrency=2)
    server.max_in_flight = 0
    for _ in range(6):
        server.faults.append(("sleep", 0.1))
    gens = await asyncio.gather(*(lm.agenerate(PROBE_RAW, max_new_tokens=8) for _ in range(6)))
    assert len({g.text for g in gens}) == 1
    assert server.max_in_flight == 2
    lm.close()


def test_top_next_tokens_is_the_first_tokens_distribution(raw_lm: OpenAICompatibleLM) -> None:
    top = raw_lm.top_next_tokens(PROBE_RAW, k=5)
    assert len(top) == 5 and top[0].token == " Paris"
    assert abs(top[0].logprob - raw_lm.generate(PROBE_RAW, max_new_tokens=8, logprobs=0)
               .logprobs[0].logprob) < 1e-6  # type: ignore[index]


def test_score_on_aligned_chat_prompts_agrees_with_generation(chat_lm: OpenAICompatibleLM
                                                              ) -> None:
    q = "What is the capital of France?"
    g = chat_lm.generate(q, max_new_tokens=6, logprobs=0)
    [s] = chat_lm.score(q, [g.text])
    assert s.tokens == [t.token for t in g.logprobs or []]
    assert s.logprobs == pytest.approx([t.logprob for t in g.logprobs or []], abs=0.05)


def test_shifted_raw_scores_are_corrected_or_refused(raw_lm: OpenAICompatibleLM) -> None:
    g = raw_lm.generate(PROBE_RAW, max_new_tokens=8, logprobs=0)
    [paris] = raw_lm.score(PROBE_RAW, [" Paris"])
    assert paris.tokens == [" Paris"]
    assert paris.logprobs[0] == pytest.approx(g.logprobs[0].logprob, abs=0.05)  # type: ignore[index]
    with pytest.raises(ServerError, match="not among the previous position's top 20"):
        raw_lm.score(PROBE_RAW, [" Rome"])


def test_chat_endpoint_without_template(server: ReplayServer) -> None:
    lm = OpenAICompatibleLM(server.url, **FAST)  # chat prompts go to /chat/completions
    g = lm.generate("What is the capital of France?", max_new_tokens=5, logprobs=2)
    assert g.text and g.logprobs and len(g.logprobs[0].top_logprobs) == 2
    with pytest.raises(WhiteBoxRequiredError, match="chat_template="):
        lm.score("What is the capital of France?", [" Paris"])
    lm.close()


@pytest.mark.parametrize(("edit", "expected"), [("missing", "missing"), ("wrong", "mismatch")])
def test_probe_disables_score_when_echo_is_missing_or_wrong(
        server: ReplayServer, edit: str, expected: str, caplog: pytest.LogCaptureFixture) -> None:
    def transform(path: str, payload: Any, reply: Any) -> Any:
        if payload and payload.get("echo"):
            lp = reply["choices"][0]["logprobs"]
            if edit == "missing":
                lp["token_logprobs"] = [None] * len(lp["token_logprobs"])
            else:  # values that fit neither reading
                lp["token_logprobs"] = [None if v is None else v - 1.0
                                        for v in lp["token_logprobs"]]
                lp["top_logprobs"] = [None if d is None else {k: v - 1.0 for k, v in d.items()}
                                      for d in lp["top_logprobs"]]
        return reply

    server.transform = transform
    with caplog.at_level(logging.WARNING):
        lm = OpenAICompatibleLM(server.url, chat=False, **FAST)
    assert lm.alignment == {"raw": expected} and not lm.capabilities.score
    assert "score() on raw prompts disabled" in caplog.text
    with pytest.raises(WhiteBoxRequiredError, match="not available"):
        lm.score(PROBE_RAW, [" Paris"])
    lm.close()


def test_components_check_capabilities_at_construction(chat_lm: OpenAICompatibleLM) -> None:
    caps = capabilities_of(chat_lm)
    assert caps.offered() == ["text", "logprobs", "score", "next_token"]
    require_capabilities(chat_lm, "a likelihood gate", "score", "logprobs")
    with pytest.raises(WhiteBoxRequiredError) as info:
        require_white_box(chat_lm, "the CBDR probe", instead="CrossEncoderReranker")
    message = str(info.value)
    assert "hidden_states" in message and "CrossEncoderReranker" in message
    assert "offers text, logprobs, score, next_token" in message


# ------------------------------------------------------------------------------ faults
def _plain(server: ReplayServer, **kw: Any) -> OpenAICompatibleLM:
    # A model name given: no GET /models before the request a test breaks.
    return OpenAICompatibleLM(server.url, chat=False, probe=False, model="smollm2",
                              **{**FAST, **kw})


def test_retries_429_and_5xx_then_succeeds(server: ReplayServer) -> None:
    lm = _plain(server)
    expected = lm.generate(PROBE_RAW, max_new_tokens=8).text
    sent = lm.requests_sent
    server.faults.extend([("status", 429), ("status", 503), ("drop", None)])
    assert lm.generate(PROBE_RAW, max_new_tokens=8).text == expected
    assert lm.requests_sent - sent == 4


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork is POSIX")
def test_a_forked_worker_gets_its_own_event_loop_and_client(server: ReplayServer) -> None:
    """Built (and probed) in the parent, used in a worker forked after (gunicorn --preload):
    without a loop of its own the child waits for the parent's loop thread, which does not
    exist there, until the backstop timeout (2 * timeout + 5 = 9 s): the 8 s limit catches it."""
    from tests.forked import run_in_forked_child

    with OpenAICompatibleLM(server.url, chat=False, timeout=2.0, **FAST) as lm:
        expected = lm.generate(PROBE_RAW, max_new_tokens=8).text
        child = run_in_forked_child(lambda: lm.generate(PROBE_RAW, max_new_tokens=8).text,
                                    timeout=8.0)
        assert child == expected
        assert lm.generate(PROBE_RAW, max_new_tokens=8).text == expected  # parent unharmed


def test_gives_up_after_the_retries(server: ReplayServer) -> None:
    lm = _plain(server, max_retries=2)
    server.faults.extend([("status", 500)] * 3)
    with pytest.raises(ServerUnavailableError, match="after 3 attempt"):
        lm.generate(PROBE_RAW, max_new_tokens=8)


@pytest.mark.parametrize("fault", [("malformed", None), ("body", b'{"choices": []}'),
                                   ("body", b'{"choices": [{"finish_reason": "stop"}]}')])
def test_malformed_reply_is_a_clear_error(server: ReplayServer, fault: Any) -> None:
    server.faults.append(fault)
    with pytest.raises(ServerReplyError, match="/completions"):
        _plain(server).generate(PROBE_RAW, max_new_tokens=8)


def test_context_length_refusal(server: ReplayServer) -> None:
    server.faults.append(("refuse", b'{"error": {"message": "Requested tokens (9000) exceed '
                                    b'context window of 2048"}}'))
    with pytest.raises(ContextLengthError, match="too long"):
        _plain(server).generate(PROBE_RAW, max_new_tokens=8)


def test_total_timeout(server: ReplayServer) -> None:
    lm = _plain(server, timeout=0.5, attempt_timeout=0.3, max_retries=5)
    server.faults.extend([("sleep", 1.0)] * 6)
    start = time.monotonic()
    with pytest.raises(ServerTimeoutError):
        lm.generate(PROBE_RAW, max_new_tokens=8)
    assert time.monotonic() - start < 1.5


def test_api_key_is_sent_and_never_shown(server: ReplayServer, monkeypatch: pytest.MonkeyPatch,
                                         caplog: pytest.LogCaptureFixture) -> None:
    secret = "sk-test-0123456789abcdef"
    monkeypatch.setenv("RAG_GATES_TEST_KEY", secret)
    lm = _plain(server, api_key_env="RAG_GATES_TEST_KEY", max_retries=1)
    lm.generate(PROBE_RAW, max_new_tokens=8)
    assert server.headers_seen[-1].get("Authorization") == f"Bearer {secret}"
    server.faults.extend([("status", 500)] * 2)
    with caplog.at_level(logging.DEBUG), pytest.raises(ServerUnavailableError) as info:
        lm.generate(PROBE_RAW, max_new_tokens=8)
    shown = str(info.value) + repr(lm) + caplog.text + lm.config.model_dump_json()
    assert secret not in shown


def test_bad_arguments_fail_before_any_request(server: ReplayServer) -> None:
    lm = _plain(server, max_top_logprobs=5)
    sent = lm.requests_sent
    with pytest.raises(ValueError, match="max_top_logprobs"):
        lm.generate(PROBE_RAW, logprobs=6)
    with pytest.raises(ValueError, match="empty"):
        lm.generate("  ")
    with pytest.raises(ValueError, match="http"):
        OpenAICompatibleLM("127.0.0.1:8000/v1", probe=False)
    assert lm.requests_sent == sent


# ------------------------------------------------------- log-probabilities that are not ones
def _set_logprobs(value: float, *, top: bool = False) -> Any:
    """A transform making the server report ``value`` for every generated token's
    log-probability (or its top alternatives'), chat and completions shapes alike."""

    def transform(path: str, payload: Any, reply: Any) -> Any:
        for choice in reply.get("choices") or []:
            lp = choice.get("logprobs")
            if not isinstance(lp, dict) or (payload or {}).get("echo"):
                continue
            if "content" in lp:  # chat
                for item in lp["content"] or []:
                    if top and item.get("top_logprobs"):
                        item["top_logprobs"][0]["logprob"] = value
                    elif not top:
                        item["logprob"] = value
            elif top:
                lp["top_logprobs"] = [{k: value for k in d} if d else d
                                      for d in lp["top_logprobs"]]
            else:
                lp["token_logprobs"] = [value for _ in lp["token_logprobs"]]
        return reply

    return transform


@pytest.mark.parametrize("value", [5.0, 1e-3, float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("top", [False, True])
def test_log_probabilities_outside_minus_inf_to_zero_are_refused(
        server: ReplayServer, chat_lm: OpenAICompatibleLM, raw_lm: OpenAICompatibleLM,
        value: float, top: bool) -> None:
    """Issue 32, item 3: a server reporting log p = +5.0 (or NaN, inf) was accepted. Chat
    prompts rendered here, raw prompts, and the chat endpoint."""
    from rag_gates.errors import ServerLogprobError

    server.transform = _set_logprobs(value, top=top)
    chat_endpoint = OpenAICompatibleLM(server.url, probe=False, model="smollm2", **FAST)
    calls = [lambda: chat_lm.generate("What is the capital of France?", max_new_tokens=6,
                                      logprobs=3),
             lambda: raw_lm.generate(PROBE_RAW, max_new_tokens=8, logprobs=0),
             lambda: chat_endpoint.generate("What is the capital of France?",
                                            max_new_tokens=5, logprobs=2)]
    try:
        for call in calls:
            with pytest.raises(ServerLogprobError,
                               match=r"finite and <= 0 \(tolerance 1e-06\)"):
                call()
    finally:
        chat_endpoint.close()
    assert issubclass(ServerLogprobError, ServerReplyError)


def test_a_rounding_overshoot_within_the_tolerance_is_read_as_zero(
        server: ReplayServer, raw_lm: OpenAICompatibleLM) -> None:
    server.transform = _set_logprobs(5e-7)
    g = raw_lm.generate(PROBE_RAW, max_new_tokens=8, logprobs=0)
    assert g.logprobs and all(t.logprob == 0.0 for t in g.logprobs)


def _completion(text: str, logprob: float) -> bytes:
    """A completions reply of one token with the given log-probability."""
    import json

    return json.dumps({"object": "text_completion", "choices": [{
        "index": 0, "text": text, "finish_reason": "stop", "logprobs": {
            "tokens": [text], "token_logprobs": [logprob], "top_logprobs": [{text: logprob}],
            "text_offset": [0]}}], "usage": {"prompt_tokens": 9, "completion_tokens": 1}
    }).encode()


def test_answer_logprob_gate_fails_closed_on_a_positive_log_probability(
        server: ReplayServer, raw_lm: OpenAICompatibleLM) -> None:
    """Issue 32, item 3: +5.0 for the answer's token made the mean -5, a confident answer:
    no retrieval at threshold 1.0. Now the gate cannot decide, so it retrieves and says why."""
    from rag_gates.confidence import AnswerLogprobGate

    gate = AnswerLogprobGate(raw_lm, threshold=1.0, max_new_tokens=6)
    server.faults.append(("body", _completion(" Paris", -0.25)))  # a real one first
    assert not gate.decide("What is the capital of France?").retrieve
    server.faults.append(("body", _completion(" Paris", 5.0)))
    d = gate.decide("What is the capital of France?")
    assert d.retrieve and "could not decide" in d.reason
    assert "5.0 is above 0.0" in str(d.evidence["undecided"])
    assert "ServerLogprobError" in str(d.evidence["error"])


def _completion_logprobs_as(logprobs: object) -> bytes:
    import json

    return json.dumps({"object": "text_completion", "choices": [{
        "index": 0, "text": " Paris", "finish_reason": "stop", "logprobs": logprobs}],
        "usage": {"prompt_tokens": 9, "completion_tokens": 1}}).encode()


@pytest.mark.parametrize("logprobs", [None, {"tokens": [" Paris"]}],
                         ids=["missing", "another-shape"])
def test_a_reply_without_usable_log_probabilities_makes_the_gates_retrieve(
        server: ReplayServer, raw_lm: OpenAICompatibleLM, logprobs: object) -> None:
    """One reply of a server that passed the start-up probe lacks the log-probabilities it
    was asked for (a mixed backend pool): the gates reading them retrieve and say why; they
    raised ServerReplyError out of the gate before (audit s15 #3)."""
    from rag_gates.confidence import AnswerLogprobGate
    from rag_gates.errors import LogprobsMissingError

    server.faults.append(("body", _completion_logprobs_as(logprobs)))
    with pytest.raises(LogprobsMissingError):
        raw_lm.generate("The capital of France is", max_new_tokens=4, logprobs=0)
    gate = AnswerLogprobGate(raw_lm, threshold=1.0, max_new_tokens=6)
    server.faults.append(("body", _completion_logprobs_as(logprobs)))
    d = gate.decide("What is the capital of France?")
    assert d.retrieve and "could not decide" in d.reason
    assert "LogprobsMissingError" in str(d.evidence["error"])


def test_a_server_sending_no_log_probabilities_at_all_is_refused_at_construction(
        server: ReplayServer) -> None:
    """The start-up probe still refuses a server that drops log-probabilities (the reply
    error now being a LogprobsMissingError must not turn it into "invalid values")."""
    from rag_gates.errors import LogprobsMissingError

    def drop(path: str, payload: Any, reply: Any) -> Any:
        if not (payload or {}).get("echo"):
            for choice in reply.get("choices") or []:
                choice["logprobs"] = None
        return reply

    server.transform = drop
    with pytest.raises(LogprobsMissingError, match="logits_all"):
        OpenAICompatibleLM(server.url, chat=False, **FAST)


def test_a_server_with_invalid_log_probabilities_is_probed_as_offering_none(
        server: ReplayServer) -> None:
    """At construction the probe reads generated tokens' log-probabilities: positive ones
    turn the logprobs capability off, with the reason in its notes."""
    from rag_gates.confidence import AnswerLogprobGate

    server.transform = _set_logprobs(5.0)
    lm = OpenAICompatibleLM(server.url, chat=False, **FAST)
    try:
        assert not lm.supports_logprobs and not lm.capabilities.score
        assert "5.0 is above 0.0" in lm.capabilities.notes["logprobs"]
        with pytest.raises(TypeError, match="log-probabilities"):
            AnswerLogprobGate(lm)
    finally:
        lm.close()


# --- Secrets (issue 32, item 4) and bounded replies (item 6) ---------------------------------

SECRET = "sk-test-SECRET-0123456789"
CREDENTIAL_URLS = [f"http://user:{SECRET}@127.0.0.1:9/v1", f"http://{SECRET}@127.0.0.1:9/v1",
                   f"http://127.0.0.1:9/v1?api_key={SECRET}", f"user:{SECRET}@127.0.0.1:9/v1"]


def leaks(text: str) -> bool:
    """Whether ``text`` shows the secret or a piece of it (pydantic shortens long values to
    ``sk-te...23456789``; terminals wrap lines)."""
    flat = "".join(text.split()).replace("│", "")
    return any(SECRET[i:i + 8] in flat for i in range(len(SECRET) - 7))


@pytest.mark.parametrize("url", CREDENTIAL_URLS)
def test_a_url_with_credentials_is_refused_without_repeating_them(
        url: str, caplog: pytest.LogCaptureFixture) -> None:
    from rag_gates.corpus import HostedInfiniGram
    from rag_gates.lm.openai_compat import OpenAIConfig
    from rag_gates_lab.gate_eval import GateEvalConfig
    from rag_gates_lab.runner import BenchConfig

    shown = []
    with caplog.at_level(logging.DEBUG):
        for build in (lambda: OpenAICompatibleLM(url, probe=False),
                      lambda: OpenAICompatibleLM.from_spec(f"openai:{url}#m", probe=False),
                      lambda: OpenAIConfig(base_url=url),
                      lambda: HostedInfiniGram("idx", url=url),
                      lambda: BenchConfig(dataset="hotpotqa", methods=["no-rag"],
                                          model=f"openai:{url}"),
                      lambda: GateEvalConfig(gate="quco", dataset="popqa",
                                             model=f"openai:{url}")):
            with pytest.raises(ValueError) as info:
                made = build()
                shown.append(repr(made))  # what leaked before the fix
            shown.append(str(info.value))
    shown.append(caplog.text)
    assert not leaks("\n".join(shown))
    assert all("credentials" in s or "query string" in s or "http" in s for s in shown[:-1])


def test_the_cli_refuses_a_credential_url_without_printing_it(tmp_path: Any) -> None:
    from typer.testing import CliRunner

    from rag_gates.cli import app

    for command in (["bench", "--dataset", "hotpotqa", "--n", "1"],
                    ["eval-gate", "--gate", "first-token-prob", "--dataset", "popqa"]):
        result = CliRunner().invoke(app, [*command, "--out", str(tmp_path / "run"),
                                          "--model", f"openai:{CREDENTIAL_URLS[0]}"])
        assert result.exit_code != 0
        assert "credentials" in result.output and not leaks(result.output), result.output
        assert not (tmp_path / "run").exists()


def test_a_key_the_server_echoes_never_reaches_errors_or_logs(
        server: ReplayServer, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from rag_gates.errors import ServerRequestError
    from rag_gates.lm.recorded import RecordedLM
    from rag_gates.types import TraceRecorder

    monkeypatch.setenv("RAG_GATES_TEST_KEY", SECRET)
    lm = _plain(server, api_key_env="RAG_GATES_TEST_KEY", max_retries=1)
    shown = [repr(lm), lm.model_id]
    rec = TraceRecorder()
    with caplog.at_level(logging.DEBUG):  # the root logger: httpx's and httpcore's too
        RecordedLM(lm, rec).generate(PROBE_RAW, max_new_tokens=8)
        server.faults.extend([("echo_auth", 500)] * 2)
        with pytest.raises(ServerUnavailableError) as unavailable:
            RecordedLM(lm, rec).generate(PROBE_RAW, max_new_tokens=8)
        server.faults.append(("echo_auth", 400))
        with pytest.raises(ServerRequestError) as refused:
            lm.generate(PROBE_RAW, max_new_tokens=8)
        server.faults.append(("body", f'{{"choices": [], "echo": "Bearer {SECRET}"}}'.encode()))
        with pytest.raises(ServerReplyError) as malformed:
            lm.generate(PROBE_RAW, max_new_tokens=8)
    assert server.headers_seen[-1].get("Authorization") == f"Bearer {SECRET}"
    for info in (unavailable, refused, malformed):
        shown += [str(info.value), repr(info.value)]
    assert "HTTP 500" in str(unavailable.value) and "HTTP 400" in str(refused.value)
    assert "retrying" in caplog.text  # the debug line was written, scrubbed
    shown += [caplog.text, rec.trace().model_dump_json()]
    assert not leaks("\n".join(shown))


def test_a_placeholder_key_is_not_scrubbed_from_the_models_text(
        server: ReplayServer, monkeypatch: pytest.MonkeyPatch) -> None:
    # vLLM's usual placeholder: scrubbing it would change answers that contain the word.
    monkeypatch.setenv("RAG_GATES_TEST_KEY", "EMPTY")
    server.transform = lambda path, payload, reply: {
        **reply, "choices": [{**reply["choices"][0], "text": " Paris. EMPTY"}]}
    lm = _plain(server, api_key_env="RAG_GATES_TEST_KEY")
    assert lm.generate(PROBE_RAW, max_new_tokens=8).text == " Paris. EMPTY"


@pytest.mark.parametrize("fault", ["big", "big_chunked"])
def test_a_reply_over_the_size_limit_is_refused_unread(server: ReplayServer, fault: str) -> None:
    lm = _plain(server, max_response_bytes=4096)
    sent = lm.requests_sent
    server.faults.append((fault, 64 * 1024))
    with pytest.raises(ServerReplyError, match=r"4096.*max_response_bytes"):
        lm.generate(PROBE_RAW, max_new_tokens=8)
    assert lm.requests_sent - sent == 1  # not retried: the next reply would be as large
    assert lm.generate(PROBE_RAW, max_new_tokens=8).text  # replies under the limit still work


def test_a_deeply_nested_reply_is_a_reply_error_not_a_recursion_error(
        server: ReplayServer) -> None:
    server.faults.append(("body", b"[" * 100_000 + b"]" * 100_000))
    with pytest.raises(ServerReplyError, match="nested deeper than"):
        _plain(server).generate(PROBE_RAW, max_new_tokens=8)


def test_a_streamed_reply_over_the_size_limit_is_refused(server: ReplayServer) -> None:
    lm = _plain(server, max_response_bytes=4096)
    server.faults.append(("big_chunked", 64 * 1024))  # one endless line, no newline
    with pytest.raises(ServerReplyError, match="max_response_bytes"):
        list(lm.stream(PROBE_RAW, max_new_tokens=8))


def test_deeprag_likelihood_gate_fails_closed_on_broken_prompt_log_probabilities(
        server: ReplayServer, raw_lm: OpenAICompatibleLM) -> None:
    """The marker likelihood reads the prompt's log-probabilities (``score``): a server
    reporting +5.0 there raised out of the gate and ended the DeepRAG run; now the step
    retrieves and the decision names the error."""
    from rag_gates.deeprag.gates import MarkerLikelihoodGate
    from rag_gates.deeprag.trajectory import INTERMEDIATE, RETRIEVE

    gate = MarkerLikelihoodGate(raw_lm)
    assert gate.method == "score"
    prompt = "Question: Who directed Jaws?\nFollow up: Who directed Jaws?\n"
    def echoes(values: dict[str, float]) -> None:
        """The next two requests (one per marker, sent concurrently) get their echoes."""
        def reply(request: dict[str, Any]) -> bytes:
            marker = next(m for m in values if request["prompt"] == prompt + m)
            return _echo(prompt, marker, values[marker])
        server.faults.extend([("reply", reply)] * 2)

    echoes({RETRIEVE: -2.5, INTERMEDIATE: -0.5})  # healthy: the direct marker is likelier
    healthy = gate.decide("Who directed Jaws?", prompt=prompt)
    assert healthy.retrieve is False and healthy.score == pytest.approx(-2.0), healthy.reason
    echoes({RETRIEVE: 5.0, INTERMEDIATE: 5.0})
    d = gate.decide("Who directed Jaws?", prompt=prompt)
    assert d.retrieve and "undecided" in d.evidence, d.reason
    assert "ServerLogprobError" in d.reason and "unusable" in d.reason


def _echo(prompt: str, continuation: str, logprob: float) -> bytes:
    """An echoed completions reply (a server's reply, not a recording): the prompt as two
    tokens, the continuation as one with the given log-probability, reported both at its
    own position and in the previous one's top list (this server's echo is shifted by one,
    which the client corrects)."""
    import json

    return json.dumps({"object": "text_completion", "choices": [{
        "index": 0, "text": prompt + continuation, "finish_reason": "length", "logprobs": {
            "tokens": [prompt[:-1], prompt[-1:], continuation],
            "token_logprobs": [None, -1.0, logprob],
            "top_logprobs": [None, {continuation: logprob}, {continuation: logprob}],
            "text_offset": [0, len(prompt) - 1, len(prompt)]}}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 0}}).encode()


def _completion_reply(tokens: list[tuple[str, float, dict[str, float]]]) -> bytes:
    """A completions reply (a server's reply, not a recording) whose tokens carry the given
    log-probabilities and top alternatives."""
    import json

    text, offsets = "", []
    for t, _, _ in tokens:
        offsets.append(len(text))
        text += t
    return json.dumps({"object": "text_completion", "choices": [{
        "index": 0, "text": text, "finish_reason": "stop", "logprobs": {
            "tokens": [t for t, _, _ in tokens], "token_logprobs": [lp for _, lp, _ in tokens],
            "top_logprobs": [top for _, _, top in tokens], "text_offset": offsets}}],
        "usage": {"prompt_tokens": 9, "completion_tokens": len(tokens)}}).encode()


def test_first_token_logprob_gate_reads_a_served_reply(chat_lm: OpenAICompatibleLM,
                                                       server: ReplayServer) -> None:
    """Issue 58: the first-token gate for a model behind a server, from the reply's first
    token and its alternatives; the reply is kept for reuse; a log-probability above 0 (a
    broken server) leaves it undecided."""
    import math

    from rag_gates.answer_once import reusable_answer
    from rag_gates.confidence import FirstTokenLogprobGate
    from rag_gates.prompts import qa_prompt

    gate = FirstTokenLogprobGate(chat_lm, threshold=0.5, max_new_tokens=8)
    sure = [(" Paris", -0.1, {" Paris": -0.1, " Lyon": -3.0}), (".", -0.05, {".": -0.05})]
    server.faults.append(("reply", lambda request: _completion_reply(sure)))
    d = gate.decide("Where is the Eiffel Tower?")
    assert d.score == pytest.approx(1 - math.exp(-0.1)) and d.retrieve is False, d.reason
    assert d.evidence["closed_book_answer"] == " Paris."
    reuse = reusable_answer(d, lm=chat_lm, prompt=qa_prompt("Where is the Eiffel Tower?"),
                            max_new_tokens=8)
    assert reuse.answer == " Paris."  # a skip replies with it: no second generation
    unsure = [(" Lyon", -1.2, {" Lyon": -1.2, " Paris": -1.3})]
    server.faults.append(("reply", lambda request: _completion_reply(unsure)))
    assert gate.decide("Where is the Eiffel Tower?").retrieve is True
    broken = [(" Paris", 0.7, {" Paris": 0.7})]
    server.faults.append(("reply", lambda request: _completion_reply(broken)))
    d = gate.decide("Where is the Eiffel Tower?")
    assert d.retrieve and "undecided" in d.evidence, d.reason
