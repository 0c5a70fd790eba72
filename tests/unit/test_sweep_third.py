"""Fail closed, the independent sweep of issue 54: cases tried as an attacker and as a
careless user would, on certified specs and ``load_gate``, ``rag-gates calibrate``, the
calibration core, the read-only policy stores, served models, hosted counts and the
framework shells' handling of decisions.

Each test is one thing a user could do; each failed on the code before its fix, or guards
a rule that already held (docs/reliability.md, "Third sweep").

The servers here are real HTTP servers on 127.0.0.1 (``http.server``): one answers as an
OpenAI-compatible or Qdrant server would, so a request gets as far as the wire."""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import JsonValue
from typer.testing import CliRunner

from rag_gates.calibration import (
    CalibrationRecord,
    CertifiedGate,
    GateSpec,
    ModelIdentity,
    calibrate,
    load_gate,
    register_gate,
)
from rag_gates.gate import BaseGate

KEY = "sk-SWEEP3-0123456789abcdef"


def _whole(exc: BaseException) -> str:
    """What a user could see: the message and the traceback printed for it."""
    return "".join(traceback.format_exception(exc))


# ---------------------------------------------------------------- a server on 127.0.0.1
class _Answer(http.server.BaseHTTPRequestHandler):
    """``GET /models`` and ``GET /collections`` as an OpenAI-compatible and a Qdrant server
    answer them; anything else 404."""

    def do_GET(self) -> None:
        if self.path.endswith("/models"):
            data: dict[str, Any] = {"object": "list", "data": [{"id": "m"}]}
        elif self.path.endswith("/collections"):
            data = {"result": {"collections": []}, "status": "ok", "time": 0.0}
        else:
            self.send_error(404)
            return
        body = json.dumps(data).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:  # quiet
        pass


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Answer)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


# ================================================================ URLs and keys (rule 1)
# A key read from a file keeps its newline (open(f).read(), a Kubernetes secret mounted as
# a file); h11 refuses the header and its message prints the key, escaped ("\\n"), which a
# scrub of the key as sent never matches.
NEWLINE_KEYS = [KEY + "\n", KEY + "\r\n", " " + KEY]


@pytest.mark.parametrize("key", NEWLINE_KEYS)
def test_qdrant_key_with_a_newline_is_refused_without_showing_it(server: str, key: str
                                                                 ) -> None:
    pytest.importorskip("qdrant_client")
    from rag_gates._qdrant import connect_server
    from rag_gates.errors import VectorStoreError
    from rag_gates.retrieval.dense import QdrantDenseRetriever
    from rag_gates.srrag.policy import SourcePolicy

    calls = (lambda: connect_server(server, api_key=key, what="url", error=RuntimeError,
                                    hint="start it"),
             lambda: SourcePolicy.connect(url=server, api_key=key),
             lambda: QdrantDenseRetriever.connect(url=server, api_key=key))
    for call in calls:
        with pytest.raises((ValueError, RuntimeError, VectorStoreError)) as caught:
            call()
        text = _whole(caught.value)
        assert KEY not in text, text
        assert "strip it" in str(caught.value)


@pytest.mark.parametrize("key", NEWLINE_KEYS)
def test_openai_key_with_a_newline_is_refused_without_showing_it(
        server: str, key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from rag_gates.lm.openai_compat import OpenAICompatibleLM

    monkeypatch.setenv("OPENAI_API_KEY", key)
    with pytest.raises(Exception) as caught:
        lm = OpenAICompatibleLM(f"{server}/v1", probe=False, max_retries=0, timeout=10)
        lm.generate("Who wrote Hamlet?", max_new_tokens=2)
    assert KEY not in _whole(caught.value)
    assert "strip it" in str(caught.value)


def test_a_qdrant_key_that_is_not_ascii_is_refused_by_name(server: str) -> None:
    """A key pasted with a typographic quote: qdrant-client's HTTP stack raised a bare
    UnicodeEncodeError ("'ascii' codec can't encode character"), naming no option."""
    pytest.importorskip("qdrant_client")
    from rag_gates.srrag.policy import SourcePolicy

    with pytest.raises(ValueError, match=r"API key in api_key .* not ASCII") as caught:
        SourcePolicy.connect(url=server, api_key=KEY + "\u2019")
    assert KEY not in _whole(caught.value)


def test_an_openai_key_that_is_not_ascii_is_refused_by_name(
        server: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from rag_gates.lm.openai_compat import OpenAICompatibleLM

    monkeypatch.setenv("OPENAI_API_KEY", KEY + "\u2019")
    with pytest.raises(ValueError, match="OPENAI_API_KEY"):
        lm = OpenAICompatibleLM(f"{server}/v1", probe=False, max_retries=0, timeout=10)
        lm.generate("Who wrote Hamlet?", max_new_tokens=2)


@pytest.mark.parametrize("tail", [" ", "\t", "%20 "])
def test_a_server_url_holding_whitespace_is_refused(tail: str) -> None:
    """``openai:http://host:8000/v1 `` (a space pasted with it) was accepted and every
    request went to '/v1 /completions'; urlsplit drops a tab silently."""
    from pydantic import ValidationError

    from rag_gates.corpus.hosted import HostedConfig
    from rag_gates.lm.openai_compat import OpenAICompatibleLM, OpenAIConfig

    url = "http://127.0.0.1:8000/v1" + tail
    with pytest.raises(ValidationError, match="whitespace"):
        OpenAIConfig(base_url=url)
    with pytest.raises(ValidationError, match="whitespace"):
        HostedConfig(url=url)
    with pytest.raises(ValueError, match="whitespace"):
        OpenAICompatibleLM.from_spec(f"openai:{url}#m")


class _EchoHeader(_Answer):
    """Answers as Qdrant does, and echoes the API key it got in a response header."""

    def end_headers(self) -> None:
        self.send_header("X-Echo-Api-Key", str(self.headers.get("api-key")))
        super().end_headers()


def test_a_qdrant_key_echoed_in_a_response_header_stays_out_of_debug_logs(
        caplog: pytest.LogCaptureFixture) -> None:
    """httpcore's debug lines print every response header: the OpenAI client registers
    its key with their filter, the Qdrant paths did not."""
    pytest.importorskip("qdrant_client")
    from rag_gates.srrag.policy import SourcePolicy

    key = "qk-LOGGED-only-by-this-test-0042"  # never registered by another test
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EchoHeader)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        with caplog.at_level(logging.DEBUG):
            client = SourcePolicy.connect(url=f"http://127.0.0.1:{httpd.server_address[1]}",
                                          api_key=key)
            client.close()
    finally:
        httpd.shutdown()
        httpd.server_close()
    said = "\n".join(r.getMessage() for r in caplog.records)
    assert "X-Echo-Api-Key" in said  # the header was logged ...
    assert key not in said           # ... without the key


# A password holding '/' (unencoded) ends the authority early: urlsplit reads
# 'http://user:KEY/x@host' as host 'user', port 'KEY', path '/x@host'. It was accepted
# as a URL without credentials, and shown unredacted everywhere the URL is.
SLASHED = [f"http://admin:{KEY}/x@127.0.0.1:8000/v1", f"http://{KEY}/x@127.0.0.1:8000/v1",
           f"HTTPS://admin:{KEY}/@127.0.0.1"]


@pytest.mark.parametrize("url", SLASHED)
def test_a_password_holding_a_slash_is_refused_and_redacted(url: str) -> None:
    from pydantic import ValidationError

    from rag_gates._http import check_server_url, redact_url
    from rag_gates.corpus.hosted import HostedConfig
    from rag_gates.lm.openai_compat import OpenAIConfig

    assert KEY not in redact_url(url)
    with pytest.raises(ValueError) as direct:
        check_server_url(url, "base_url", "")
    with pytest.raises(ValidationError) as served:
        OpenAIConfig(base_url=url)
    with pytest.raises(ValidationError) as hosted:
        HostedConfig(url=url)
    for caught in (direct, served, hosted):
        assert KEY not in _whole(caught.value)


@pytest.mark.parametrize("url", SLASHED[:2])
def test_a_qdrant_url_whose_password_holds_a_slash_is_refused(url: str) -> None:
    pytest.importorskip("qdrant_client")
    from rag_gates.srrag.policy import SourcePolicy

    with pytest.raises(ValueError) as caught:
        SourcePolicy.connect(url=url)
    assert KEY not in _whole(caught.value)


def test_scrub_text_removes_a_key_in_its_escaped_form() -> None:
    """A message built from an exception's repr of the key sent (a header refusal)."""
    from rag_gates._http import scrub_text

    said = f"Illegal header value b'Bearer {KEY}\\n'"
    assert KEY not in scrub_text(said, [KEY + "\n"])
    assert KEY not in scrub_text(f"bad key '{KEY}'", [" " + KEY + " "])


@pytest.mark.parametrize("where", [f"http://admin:{KEY}@127.0.0.1:6333", "localhost:6333",
                                   "HTTP://127.0.0.1:6333"])
def test_a_policy_store_given_a_url_as_its_path_is_refused(
        where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``SourcePolicy.connect("http://...")`` (path is the first argument): a local store
    named after the URL was created in the working directory, silently local, the key in
    its folder name and in every message naming it."""
    pytest.importorskip("qdrant_client")
    from rag_gates.srrag.policy import SourcePolicy

    monkeypatch.chdir(tmp_path)
    for read_only in (False, True):
        with pytest.raises(ValueError) as caught:
            SourcePolicy.connect(where, read_only=read_only)
        assert "url=" in str(caught.value)
        assert KEY not in _whole(caught.value)
    assert list(tmp_path.iterdir()) == []


def test_open_existing_given_a_url_as_its_path_is_refused(
        tiny: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("qdrant_client")
    from rag_gates.srrag.policy import SourcePolicy

    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as caught:
        SourcePolicy.open_existing(tiny, path=f"http://admin:{KEY}@127.0.0.1:6333")
    assert "url=" in str(caught.value) and KEY not in _whole(caught.value)
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------- rag-gates calibrate
ROOT = Path(__file__).resolve().parents[2]
SAMPLE = ROOT / "examples" / "data" / "calibration_questions.jsonl"
CORPUS = ROOT / "examples" / "data" / "calibration_corpus.jsonl"


def _calibrate_cli(tmp_path: Path, *args: str) -> Any:
    from rag_gates.cli import app

    return CliRunner().invoke(app, ["calibrate", "--data", str(SAMPLE), "--out",
                                    str(tmp_path / "gate.json"), *args])




@pytest.mark.parametrize("model", [f"OPENAI:http://admin:{KEY}@127.0.0.1:8000/v1",
                                   f"http://admin:{KEY}@127.0.0.1:8000/v1"])
def test_calibrate_model_url_in_another_case_or_without_prefix_never_shows_the_key(
        tmp_path: Path, model: str) -> None:
    result = _calibrate_cli(tmp_path, "--corpus", str(CORPUS), "--model", model)
    assert result.exit_code != 0
    assert KEY not in result.output


@pytest.mark.parametrize("corpus", [f"http://admin:{KEY}@127.0.0.1:6333",
                                    f"QDRANT:http://admin:{KEY}@127.0.0.1:6333#docs",
                                    f"Qdrant:admin:{KEY}@127.0.0.1:6333#docs"])
def test_calibrate_corpus_url_in_another_case_or_without_prefix_never_shows_the_key(
        tmp_path: Path, corpus: str) -> None:
    result = _calibrate_cli(tmp_path, "--corpus", corpus, "--model", "default")
    assert result.exit_code != 0
    assert KEY not in result.output


def _broken_model(tmp_path: Path) -> Path:
    """A model directory whose weights are garbage: a run that gets as far as loading it
    fails with a load error, so a refusal seen instead came before the model loaded."""
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "model.safetensors").write_bytes(b"not a safetensors file" * 100)
    return folder


def test_a_negative_seed_is_refused_by_name() -> None:
    """``calibrate(seed=-1)`` failed with numpy's "expected non-negative integer", naming
    no option, after the gate columns were built."""
    from rag_gates.calibration import skip_curve
    from rag_gates.errors import CalibrationError

    records = _records({"sweep3-a": [(100 - i) / 100 for i in range(60)]})
    with pytest.raises(CalibrationError, match="seed must be a non-negative integer"):
        calibrate(records, model=MODEL, retriever="r", max_loss=0.1, seed=-1)
    with pytest.raises(CalibrationError, match="seed must be a non-negative integer"):
        skip_curve(records, "sweep3-a", [0.1], seed=-1)


def test_calibrate_cli_refuses_a_negative_seed_before_the_model_loads(tmp_path: Path
                                                                      ) -> None:
    result = _calibrate_cli(tmp_path, "--corpus", str(CORPUS), "--model",
                            str(_broken_model(tmp_path)), "--seed", "-1")
    assert result.exit_code == 2
    assert "seed" in result.output and "tokenizer" not in result.output


def test_calibrate_cli_refuses_quco_without_corpus_statistics_before_the_model_loads(
        tmp_path: Path) -> None:
    """A Qdrant corpus is not read back to be indexed: QuCo needs --corpus-stats there."""
    result = _calibrate_cli(tmp_path, "--corpus", f"qdrant:{tmp_path / 'nothing'}#docs",
                            "--model", str(_broken_model(tmp_path)), "--gates", "quco")
    assert result.exit_code == 2
    assert "--corpus-stats" in result.output and "tokenizer" not in result.output


# ================================================================ specs and load_gate
MODEL = ModelIdentity(name="sweep-model", fingerprint="e" * 64)
QUESTIONS = [f"Who wrote book number {i} of the sweep series?" for i in range(240)]


class TableGate(BaseGate):
    """A gate whose score for each question is looked up in a table (a question it does
    not know raises, so a test cannot pass by scoring something else)."""

    threshold_range = (0.0, 1.0)

    def __init__(self, name: str, table: dict[str, float], threshold: float = 0.5) -> None:
        self.name = name
        self.table = table
        super().__init__(threshold)

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        return self.table[query], {}


def _table(seed: int) -> dict[str, float]:
    import random

    rng = random.Random(seed)
    return {q: rng.random() for q in QUESTIONS}


TABLES = {"sweep3-a": _table(1), "sweep3-b": _table(2)}


class BoomGate(BaseGate):
    """A gate whose model server times out on every question."""

    name = "sweep3-boom"
    threshold_range = (0.0, 1.0)

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        raise TimeoutError("no answer from the served model in 30 s")


@pytest.fixture(autouse=True, scope="module")
def _sweep_gates() -> Iterator[None]:
    """This module's gates, registered for load_gate while its tests run, then removed."""
    from rag_gates.registry import unregister_gate

    for name in TABLES:
        register_gate(name, lambda ctx, th, n=name: TableGate(n, TABLES[n]))
    register_gate("sweep3-boom", lambda ctx, th: BoomGate(0.5))
    yield
    for name in [*TABLES, "sweep3-boom"]:
        unregister_gate(name)


def _records(scores: dict[str, list[float]]) -> list[CalibrationRecord]:
    """The closed-book answer is wrong (retrieval fixes it) mostly where the first gate's
    score is high: a gate worth certifying."""
    first = next(iter(scores.values()))
    return [CalibrationRecord(id=f"q{i}", question=QUESTIONS[i],
                              closed_book_correct=first[i] < 0.6 or i % 7 == 0,
                              retrieved_correct=True,
                              scores={g: v[i] for g, v in scores.items()})
            for i in range(len(first))]


def test_a_loaded_cascade_scores_as_calibration_did_bit_for_bit() -> None:
    """Rule 5 for the cascade composite behind a loaded spec: the score its certified
    threshold is compared with in serving is, on every certification question, the float
    calibrate() ranked, on decide, adecide and decide_batch."""
    from rag_gates.calibration.calibrate import cascade_scores

    names = list(TABLES)
    records = _records({g: [TABLES[g][q] for q in QUESTIONS] for g in names})
    report = calibrate(records, model=MODEL, retriever="r", max_loss=0.1)
    assert report.cascade is not None and report.cascade_name is not None
    spec = report.spec_for(report.cascade_name)
    assert spec.certified, spec.note
    fit = spec.cascade
    assert fit is not None
    cheap, expensive = (np.array([TABLES[f.gates[0]][q] for q in QUESTIONS])
                        for f in (fit.cheap, fit.expensive))
    want = cascade_scores(fit, cheap, expensive).tolist()
    gate = load_gate(spec, allow_other_model=True)

    async def each() -> list[float]:
        return [(await gate.adecide(q)).score for q in QUESTIONS]

    for path, got in (("decide", [gate.decide(q).score for q in QUESTIONS]),
                      ("adecide", asyncio.run(each())),
                      ("decide_batch", [d.score for d in gate.decide_batch(QUESTIONS)])):
        assert got == want, path


def test_a_loaded_weighted_composite_scores_as_calibration_did_bit_for_bit() -> None:
    from rag_gates.calibration.calibrate import _weighted_scores

    names = list(TABLES)
    records = _records({g: [TABLES[g][q] for q in QUESTIONS] for g in names})
    report = calibrate(records, model=MODEL, retriever="r", max_loss=0.1)
    assert report.composite is not None and report.composite_name is not None
    spec = report.spec_for(report.composite_name)
    x = np.array([[TABLES[g][q] for q in QUESTIONS] for g in report.composite.gates])
    want = _weighted_scores(report.composite, x).tolist()
    gate = load_gate(spec, allow_other_model=True)
    assert [d.score for d in gate.decide_batch(QUESTIONS)] == want
    assert [gate.decide(q).score for q in QUESTIONS] == want


def _resealed(spec: GateSpec, **changes: Any) -> GateSpec:
    return GateSpec.model_validate({**spec.model_dump(mode="json"), **changes}).sealed()


def _single_spec() -> GateSpec:
    records = _records({"sweep3-a": [TABLES["sweep3-a"][q] for q in QUESTIONS]})
    spec = calibrate(records, model=MODEL, retriever="r", max_loss=0.1,
                     composite=False).spec_for("sweep3-a")
    assert spec.certified, spec.note
    return spec


def test_an_expression_spec_with_an_off_scale_threshold_is_refused() -> None:
    """A resealed spec naming ``sweep3-a:0.3`` at threshold 5.0 (a score in [0, 1]) was
    served and never retrieved; the same spec naming ``sweep3-a`` is refused."""
    from rag_gates.errors import CalibrationError

    spec = _single_spec()
    with pytest.raises(CalibrationError, match="recalibrate"):
        load_gate(_resealed(spec, threshold=5.0), allow_other_model=True)
    with pytest.raises(CalibrationError, match="recalibrate"):
        load_gate(_resealed(spec, gate="sweep3-a:0.3", threshold=5.0),
                  allow_other_model=True)


def test_an_overridden_spec_says_so_on_every_path() -> None:
    """Held: decide, adecide and decide_batch of an overridden spec all carry
    certified: false and the override, and no reason claims the guarantee."""
    gate = load_gate(_single_spec(), allow_other_model=True)
    batch = gate.decide_batch(QUESTIONS[:4])
    one = asyncio.run(gate.adecide(QUESTIONS[0]))
    for d in [*batch, one, gate.decide(QUESTIONS[1])]:
        assert d.evidence["spec"]["certified"] is False
        assert "allow_other_model=True" in str(d.evidence["spec"]["override"])
        assert "NOT certified here" in d.reason and "certified: accuracy" not in d.reason


# ================================================================ the framework shells
def _overridden(gate_name: str) -> Any:
    records = _records({gate_name: [TABLES["sweep3-a"][q] for q in QUESTIONS]})
    spec = calibrate(records, model=MODEL, retriever="r", max_loss=0.1,
                     composite=False).spec_for(gate_name)
    assert spec.certified, spec.note
    return load_gate(spec, allow_other_model=True)


def _split_questions(gate: Any) -> tuple[str, str]:
    """One question the overridden spec retrieves for, one it skips."""
    decisions = {q: gate.decide(q).retrieve for q in QUESTIONS}
    return (next(q for q, r in decisions.items() if r),
            next(q for q, r in decisions.items() if not r))


def _says_overridden(data: Any) -> None:
    spec = data["evidence"]["spec"]
    assert spec["certified"] is False and "allow_other_model=True" in spec["override"]


def test_a_fail_closed_decision_of_an_overridden_spec_keeps_the_spec() -> None:
    """LlamaIndex's on_gate_error='retrieve' (the setting for an agent's tool): the
    served model times out, the shell retrieves, and the decision it records carried no
    spec at all: not its name, not "certified: false", not the override."""
    from llama_index.core.base.response.schema import Response
    from llama_index.core.llms import MockLLM
    from llama_index.core.query_engine import CustomQueryEngine
    from llama_index.query_engine.rag_gates import GatedQueryEngine

    class Answers(CustomQueryEngine):
        def custom_query(self, query_str: str) -> Response:
            return Response(response="retrieved answer")

    gate = _overridden("sweep3-boom")
    engine = GatedQueryEngine(Answers(), gate=gate, llm=MockLLM(), on_gate_error="retrieve")
    data = engine.query(QUESTIONS[0]).metadata["rag_gates"]
    assert data["retrieve"] is True and "TimeoutError" in data["evidence"]["error"]
    _says_overridden(data)


def test_langchain_shells_keep_the_override_on_both_branches() -> None:
    """Held: GatedRetriever's documents and last decision, and GateRouter's dict output,
    carry certified: false and the override whichever way the spec decides."""
    from langchain_core.callbacks import CallbackManagerForRetrieverRun
    from langchain_core.documents import Document
    from langchain_core.retrievers import BaseRetriever
    from langchain_core.runnables import RunnableLambda

    from langchain_rag_gates import GatedRetriever, route_by_gate

    class Fixed(BaseRetriever):
        def _get_relevant_documents(self, query: str, *,
                                    run_manager: CallbackManagerForRetrieverRun
                                    ) -> list[Document]:
            return [Document(page_content="a passage")]

    gate = _overridden("sweep3-a")
    hit, miss = _split_questions(gate)
    retriever = GatedRetriever(retriever=Fixed(), gate=gate)
    docs = retriever.invoke(hit)
    _says_overridden(docs[0].metadata["rag_gates"])
    assert retriever.invoke(miss) == []
    assert retriever.last_decision is not None
    _says_overridden(retriever.last_decision.model_dump(mode="json"))
    router = route_by_gate(gate, retrieve=RunnableLambda(lambda x: {"answer": "rag"}),
                           direct=RunnableLambda(lambda x: {"answer": "closed"}))
    for question in (hit, miss):
        _says_overridden(router.invoke({"question": question})["rag_gates"])


def test_llama_index_query_engine_keeps_the_override_when_it_skips() -> None:
    """Held: the direct (no retrieval) answer's metadata carries the override."""
    from llama_index.core.base.response.schema import Response
    from llama_index.core.llms import MockLLM
    from llama_index.core.query_engine import CustomQueryEngine
    from llama_index.query_engine.rag_gates import GatedQueryEngine

    class Answers(CustomQueryEngine):
        def custom_query(self, query_str: str) -> Response:
            return Response(response="retrieved answer")

    gate = _overridden("sweep3-a")
    hit, miss = _split_questions(gate)
    engine = GatedQueryEngine(Answers(), gate=gate, llm=MockLLM())
    for question, retrieved in ((hit, True), (miss, False)):
        data = engine.query(question).metadata["rag_gates"]
        assert data["retrieve"] is retrieved
        _says_overridden(data)


def test_two_unnamed_langchain_models_are_not_the_same_model() -> None:
    """A spec calibrated on one HuggingFacePipeline served on another (different weights,
    different answers) passed the model check: its decisions claimed the guarantee."""
    transformers = pytest.importorskip("transformers")
    hf = pytest.importorskip("langchain_huggingface")
    from langchain_rag_gates import as_text_lm
    from rag_gates.errors import SpecModelMismatchError
    from rag_gates.testing import tiny_model_and_tokenizer

    lms = []
    for seed in (0, 1):
        model, tok = tiny_model_and_tokenizer(seed)
        pipe = transformers.pipeline("text-generation", model=model, tokenizer=tok,
                                     max_new_tokens=4)
        lms.append(as_text_lm(hf.HuggingFacePipeline(pipeline=pipe)))
    assert lms[0].generate("Who wrote Hamlet?", max_new_tokens=4).text != \
        lms[1].generate("Who wrote Hamlet?", max_new_tokens=4).text
    spec = _resealed(_single_spec(),
                     model=ModelIdentity.of(lms[0]).model_dump(mode="json"))
    with pytest.raises(SpecModelMismatchError):
        load_gate(spec, lm=lms[1])


def test_calibrate_cli_refuses_a_data_file_repeated_before_the_model_loads(tmp_path: Path
                                                                           ) -> None:
    rows = [json.loads(line) for line in SAMPLE.read_text().splitlines() if line.strip()]
    data = tmp_path / "twice.jsonl"
    data.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "id"}) + "\n"
                            for r in rows + rows))
    from rag_gates.cli import app

    result = CliRunner().invoke(app, ["calibrate", "--data", str(data), "--corpus",
                                      str(CORPUS), "--model", str(_broken_model(tmp_path)),
                                      "--out", str(tmp_path / "gate.json")])
    assert result.exit_code == 2
    assert "tokenizer" not in result.output and f"{data}:{len(rows) + 1}" in result.output


def test_a_spec_path_with_a_tilde_means_the_home_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    home.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    spec = _single_spec()
    spec.save(home / "gate.json")
    assert load_gate("~/gate.json", allow_other_model=True).spec == GateSpec.load(
        home / "gate.json")
    spec.save("~/other.json")
    assert (home / "other.json").is_file() and not (work / "~").exists()


def test_registering_a_core_gate_name_again_is_refused() -> None:
    """A plugin registering its own 'answer-logprob' (another prompt, say) changed what
    every certified answer-logprob spec builds, without a word."""
    from rag_gates.registry import available_gates, unregister_gate

    before = available_gates()["answer-logprob"]
    try:
        with pytest.raises(ValueError, match="answer-logprob"):
            register_gate("answer-logprob", lambda ctx, th: TableGate("x", TABLES["sweep3-a"]))
        assert available_gates()["answer-logprob"] is before
    finally:
        unregister_gate("answer-logprob")


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999/v1", "http://127.0.0.1:80a/v1"])
def test_a_server_url_with_an_impossible_port_is_refused_when_given(url: str) -> None:
    """A typo in the port passed the URL check; the served model's and the hosted
    counts' first request then failed with a bare ExceptionGroup ("unhandled errors in a
    TaskGroup"), naming neither the URL nor the port."""
    from pydantic import ValidationError

    from rag_gates.corpus.hosted import HostedConfig
    from rag_gates.lm.openai_compat import OpenAIConfig

    for build in (lambda: OpenAIConfig(base_url=url), lambda: HostedConfig(url=url)):
        with pytest.raises(ValidationError, match="port that is not a number from 0 to"):
            build()


def test_calibrate_with_no_gates_or_one_gate_as_a_string_says_what_it_does() -> None:
    """``gates=[]`` (a filtered list that came out empty) gave an empty report whose
    ``best`` raised "max() arg is an empty sequence"; ``gates="sweep3-a"`` was read letter
    by letter ("no record holds a score for s, w, e, p, 3, -, a")."""
    from rag_gates.errors import CalibrationError

    records = _records({"sweep3-a": [TABLES["sweep3-a"][q] for q in QUESTIONS]})
    with pytest.raises(CalibrationError, match="gates is empty"):
        calibrate(records, model=MODEL, retriever="r", max_loss=0.1, gates=[])
    report = calibrate(records, model=MODEL, retriever="r", max_loss=0.1, gates="sweep3-a")
    assert [row.gate for row in report.rows] == ["sweep3-a"]


def test_build_policy_refuses_a_bad_qdrant_key_before_the_model_loads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``QDRANT_API_KEY`` read from a file with its newline: ``srrag build-policy --url``
    checked the URL before loading the model, but the key only at connect, after the
    model had loaded (here the broken model's load error came first)."""
    pytest.importorskip("qdrant_client")
    from rag_gates.testing import save_tiny_lm
    from rag_gates_lab.commands.srrag import srrag_app

    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path / "home"))
    labels = tmp_path / "labels.jsonl"
    made = CliRunner().invoke(srrag_app, [
        "label", "--model", str(save_tiny_lm(tmp_path / "tiny")), "--dataset", "popqa",
        "--data", str(ROOT / "examples" / "data" / "popqa_dev_sample.jsonl"), "--n", "2",
        "--offset", "0", "--n-retrieved", "2", "--n-verbalized", "2",
        "--max-verbalize-tokens", "3", "--out", str(labels)])
    assert made.exit_code == 0, made.output
    monkeypatch.setenv("QDRANT_API_KEY", KEY + "\n")
    result = CliRunner().invoke(srrag_app, [
        "build-policy", "--labels", str(labels), "--model", str(_broken_model(tmp_path)),
        "--url", "http://127.0.0.1:6333"])
    assert result.exit_code != 0
    said = " ".join(result.output.split())
    assert "API key in QDRANT_API_KEY" in said and "tokenizer" not in said
    assert KEY not in result.output


def test_the_repr_of_an_overridden_spec_says_it_is_not_certified() -> None:
    """``logger.info("serving %r", gate)``: the repr named the spec and its threshold only,
    the same as a certified one's."""
    spec = _single_spec()
    assert "certified=False" in repr(load_gate(spec, allow_other_model=True))
    assert "certified=False" not in repr(CertifiedGate(None, spec))
