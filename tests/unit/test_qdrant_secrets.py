"""No Qdrant path shows a secret (issue 54, leaks 1-3): every URL passes one check whatever
its scheme's case, a server address given without a scheme is never taken for a local
path, and a server that echoes the API key in its refusal has it scrubbed from every
message and traceback.

The refusing server is a real HTTP server on 127.0.0.1 that answers every request 403 with
the ``api-key`` header it received in the body, as a misconfigured proxy would."""

from __future__ import annotations

import http.server
import threading
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rag_gates.cli import app

pytest.importorskip("qdrant_client")

KEY = "qk-SECRET-0123456789"
LEAKY_URLS = [
    f"http://user:{KEY}@127.0.0.1:6333",
    f"http://{KEY}@127.0.0.1:6333",
    f"http://127.0.0.1:6333?api_key={KEY}",
    f"HTTP://admin:{KEY}@127.0.0.1:6333",
    f"Https://127.0.0.1:6333/?key={KEY}",
]


class _EchoKey(http.server.BaseHTTPRequestHandler):
    def _refuse(self) -> None:
        body = f'{{"status": {{"error": "forbidden: api-key {self.headers.get("api-key")} '\
               'is not allowed"}}'.encode()
        self.send_response(403)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_DELETE = _refuse

    def log_message(self, *args: Any) -> None:  # quiet
        pass


@pytest.fixture(scope="module")
def echo_server() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _EchoKey)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _whole(exc: BaseException) -> str:
    """What a user could see: the message and the traceback printed for it."""
    return "".join(traceback.format_exception(exc))


@pytest.mark.parametrize("url", LEAKY_URLS)
def test_source_policy_refuses_a_url_with_a_secret_and_never_shows_it(url: str,
                                                                      tiny: Any) -> None:
    from rag_gates.srrag.policy import HiddenStateKeys, SourcePolicy

    for call in (lambda: SourcePolicy.connect(url=url),
                 lambda: SourcePolicy.open_existing(tiny, url=url),
                 lambda: SourcePolicy.open(HiddenStateKeys(tiny, layer=2), url=url)):
        with pytest.raises(ValueError) as caught:
            call()
        assert KEY not in _whole(caught.value)
        assert "***" in str(caught.value)


@pytest.mark.parametrize("url", LEAKY_URLS)
def test_dense_retriever_refuses_a_url_with_a_secret(url: str) -> None:
    from rag_gates.retrieval.dense import QdrantDenseRetriever

    with pytest.raises(ValueError) as caught:
        QdrantDenseRetriever.connect(url=url)
    assert KEY not in _whole(caught.value)


def test_a_key_echoed_by_the_server_is_scrubbed(echo_server: str, tiny: Any) -> None:
    from rag_gates.errors import VectorStoreError
    from rag_gates.retrieval.dense import QdrantDenseRetriever
    from rag_gates.srrag.policy import PolicyStoreError, SourcePolicy

    with pytest.raises(PolicyStoreError) as policy_error:
        SourcePolicy.connect(url=echo_server, api_key=KEY)
    with pytest.raises(PolicyStoreError) as existing_error:
        SourcePolicy.open_existing(tiny, url=echo_server, api_key=KEY)
    with pytest.raises(VectorStoreError) as dense_error:
        QdrantDenseRetriever.connect(url=echo_server, api_key=KEY)
    for caught in (policy_error, existing_error, dense_error):
        text = _whole(caught.value)
        assert "403" in text and "forbidden: api-key ***" in text  # the server's words stay
        assert KEY not in text


def _calibrate(tmp_path: Path, corpus: str, env: dict[str, str] | None = None) -> Any:
    data = tmp_path / "q.jsonl"
    data.write_text("".join(f'{{"question": "Who wrote book {i}?", "answers": ["A{i}"]}}\n'
                            for i in range(40)))
    # A --model directory that cannot load: every refusal here comes before the model.
    return CliRunner().invoke(app, ["calibrate", "--data", str(data), "--corpus", corpus,
                                    "--out", str(tmp_path / "g.json"),
                                    "--model", str(tmp_path)], env=env)


@pytest.mark.parametrize("corpus", [
    f"qdrant:HTTP://admin:{KEY}@127.0.0.1:6333#docs",   # upper-case scheme
    f"qdrant:admin:{KEY}@127.0.0.1:6333#docs",          # no scheme, credentials
    f"qdrant:{KEY}@127.0.0.1:6333",                     # no scheme, a bare key
    f"qdrant:http://127.0.0.1:6333?api_key={KEY}#docs",
    f"qdrant:http://u:{KEY}@127.0.0.1:6333#",            # malformed and leaky
])
def test_calibrate_never_prints_a_corpus_urls_secret(corpus: str, tmp_path: Path) -> None:
    result = _calibrate(tmp_path, corpus)
    assert result.exit_code == 2, result.output
    assert KEY not in result.output and "no Qdrant folder" not in result.output
    assert result.exception is None or KEY not in _whole(result.exception)


def test_calibrate_scrubs_a_key_echoed_by_the_server(echo_server: str, tmp_path: Path) -> None:
    result = _calibrate(tmp_path, f"qdrant:{echo_server}#docs", env={"QDRANT_API_KEY": KEY})
    assert result.exit_code == 2, result.output
    assert "403" in result.output and KEY not in result.output


def test_build_policy_never_prints_the_urls_secret(tmp_path: Path) -> None:
    labels = tmp_path / "labels.jsonl"
    labels.write_text("")
    result = CliRunner().invoke(app, ["srrag", "build-policy", str(labels), "--url",
                                      f"HTTP://admin:{KEY}@127.0.0.1:6333",
                                      "--model", str(tmp_path)])
    assert result.exit_code != 0
    assert KEY not in result.output
    assert result.exception is None or KEY not in _whole(result.exception)
