"""Fail closed, the independent sweep of issue 54: cases tried as an attacker and as a
careless user would, on certified specs and ``load_gate``, ``rag-gates calibrate``, the
calibration core, the read-only policy stores, served models, hosted counts and the
framework shells' handling of decisions.

Each test is one thing a user could do. A test marked ``xfail(strict=True)`` is a fault
found in a file another helper is editing now; its reason says the fix (and the test
starts passing, so the mark must go, when it lands).

The servers here are real HTTP servers on 127.0.0.1 (``http.server``): one answers as an
OpenAI-compatible or Qdrant server would, so a request gets as far as the wire."""

from __future__ import annotations

import http.server
import json
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

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


@pytest.mark.xfail(strict=True, reason=(
    "rag_gates/lm/openai_compat.py is being edited by another helper: OpenAICompatibleLM."
    "_headers must pass the key through rag_gates._http.check_api_key(key, "
    "f'${api_key_env}') and _request must scrub 'last' with scrub_text(..., [key]); today "
    "ServerUnavailableError prints \"Illegal header value b'Bearer sk-...\\n'\""))
@pytest.mark.parametrize("key", NEWLINE_KEYS[:1])
def test_openai_key_with_a_newline_is_refused_without_showing_it(
        server: str, key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from rag_gates.lm.openai_compat import OpenAICompatibleLM

    monkeypatch.setenv("OPENAI_API_KEY", key)
    with pytest.raises(Exception) as caught:
        lm = OpenAICompatibleLM(f"{server}/v1", probe=False, max_retries=0, timeout=10)
        lm.generate("Who wrote Hamlet?", max_new_tokens=2)
    assert KEY not in _whole(caught.value)
    assert "strip it" in str(caught.value)


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


CALIBRATE_LEAK = (
    "rag_gates/commands/calibrate.py is being edited by another helper: check_model_spec "
    "and parse_corpus_spec must take their prefixes in any case (OPENAI:, QDRANT:) and "
    "pass any value that looks_like_server() through check_server_url, showing it only "
    "through redact_url; today the 'not a directory' / 'does not exist' error prints it")


@pytest.mark.xfail(strict=True, reason=CALIBRATE_LEAK)
@pytest.mark.parametrize("model", [f"OPENAI:http://admin:{KEY}@127.0.0.1:8000/v1",
                                   f"http://admin:{KEY}@127.0.0.1:8000/v1"])
def test_calibrate_model_url_in_another_case_or_without_prefix_never_shows_the_key(
        tmp_path: Path, model: str) -> None:
    result = _calibrate_cli(tmp_path, "--corpus", str(CORPUS), "--model", model)
    assert result.exit_code != 0
    assert KEY not in result.output


@pytest.mark.xfail(strict=True, reason=CALIBRATE_LEAK)
@pytest.mark.parametrize("corpus", [f"http://admin:{KEY}@127.0.0.1:6333",
                                    f"QDRANT:http://admin:{KEY}@127.0.0.1:6333#docs",
                                    f"Qdrant:admin:{KEY}@127.0.0.1:6333#docs"])
def test_calibrate_corpus_url_in_another_case_or_without_prefix_never_shows_the_key(
        tmp_path: Path, corpus: str) -> None:
    result = _calibrate_cli(tmp_path, "--corpus", corpus, "--model", "default")
    assert result.exit_code != 0
    assert KEY not in result.output
