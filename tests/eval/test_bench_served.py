"""``rag-gates bench --model openai:URL --concurrency N``: the bench over a served model,
against replies recorded from llama-cpp-python's server running the embedded SmolLM2 GGUF
(tests/lm/replay_server.py; re-record with RAG_GATES_RECORD_UPSTREAM=http://127.0.0.1:PORT/v1
while such a server runs)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from rag_gates.errors import WhiteBoxRequiredError
from rag_gates.retrieval.bm25 import BM25Retriever
from rag_gates_lab.corpus import corpus_passages
from rag_gates_lab.runner import BenchConfig, load_bench_lm, read_records, run_bench
from tests.lm.replay_server import ReplayServer

SLICES = Path(__file__).resolve().parents[2] / "examples" / "data"
RECORDING = Path(__file__).parent / "data" / "bench-llamacpp-0.3.36.json"
UPSTREAM = os.environ.get("RAG_GATES_RECORD_UPSTREAM")
SECRET = "sk-test-not-a-real-key-4f1c"


@pytest.fixture(scope="module")
def server() -> Iterator[ReplayServer]:
    with ReplayServer(RECORDING, upstream=UPSTREAM) as s:
        yield s


@pytest.fixture(scope="module")
def bm25() -> BM25Retriever:
    return BM25Retriever.from_passages(corpus_passages("hotpotqa", SLICES))


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)


def config(server: ReplayServer, **kw: Any) -> BenchConfig:
    base: dict[str, Any] = {"dataset": "hotpotqa", "methods": ["no-rag", "single"], "n": 4,
                            "max_new_tokens": 8, "data_path": str(SLICES),
                            "model": f"openai:{server.url}"}
    return BenchConfig(**{**base, **kw})


def rows(run: Path) -> list[tuple[Any, ...]]:
    """What an answer is, without its timings."""
    return [(r.id, r.method, r.prediction, r.em, r.f1, r.retrievals, r.llm_calls,
             r.generated_tokens) for r in read_records(run)]


def test_config_records_the_endpoint_and_model_never_the_key(
        server: ReplayServer, bm25: BM25Retriever, tmp_path: Path) -> None:
    run_bench(config(server), tmp_path / "run", retriever=bm25)
    stored = json.loads((tmp_path / "run" / "config.json").read_text())
    served = stored["served"]
    assert served["endpoint"] == server.url
    assert served["model_name"] and served["model_name"].endswith(".gguf")
    assert "text" in served["capabilities"] and served["api_key_env"] == "OPENAI_API_KEY"
    assert stored["config"]["model"] == f"openai:{server.url}"
    # The key went to the server, and nowhere into the run directory.
    assert any(h.get("Authorization") == f"Bearer {SECRET}" for h in server.headers_seen)
    for path in (tmp_path / "run").iterdir():
        assert SECRET not in path.read_text(), path
    assert len(read_records(tmp_path / "run")) == 8


def test_concurrency_gives_the_rows_of_a_sequential_run(
        server: ReplayServer, bm25: BM25Retriever, tmp_path: Path) -> None:
    run_bench(config(server), tmp_path / "one", retriever=bm25)
    cfg = config(server, concurrency=4)
    lm = load_bench_lm(cfg)
    server.max_in_flight = 0
    server.faults.extend([("sleep", 0.3)] * 8)  # slow answers: questions must overlap
    run_bench(cfg, tmp_path / "four", lm=lm, retriever=bm25)
    assert rows(tmp_path / "four") == rows(tmp_path / "one")
    assert server.max_in_flight >= 2


class Interrupt(Exception):
    pass


def test_a_concurrent_run_resumes_without_loss_or_duplicates(
        server: ReplayServer, bm25: BM25Retriever, tmp_path: Path) -> None:
    run_bench(config(server), tmp_path / "one", retriever=bm25)

    def stop(done: int, total: int, _: Any) -> None:
        if done == 3:
            raise Interrupt

    cfg = config(server, concurrency=4)
    with pytest.raises(Interrupt):
        run_bench(cfg, tmp_path / "four", retriever=bm25, progress=stop)
    assert len(read_records(tmp_path / "four")) == 3
    run_bench(cfg, tmp_path / "four", retriever=bm25)
    assert rows(tmp_path / "four") == rows(tmp_path / "one")


def test_white_box_methods_refuse_a_served_model_and_write_nothing(
        server: ReplayServer, bm25: BM25Retriever, tmp_path: Path) -> None:
    for method in ("tokrag", "cbdr@0.5"):
        with pytest.raises(WhiteBoxRequiredError, match=r"white-box|hidden|instead"):
            run_bench(config(server, methods=["no-rag", method]), tmp_path / method,
                      retriever=bm25)
        assert not (tmp_path / method / "config.json").exists()


def test_concurrency_needs_a_served_model_and_urls_carry_no_credentials(
        server: ReplayServer, tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="needs a served model"):
        BenchConfig(dataset="hotpotqa", methods=["no-rag"], concurrency=4)
    with pytest.raises(ValidationError, match="carries credentials"):
        BenchConfig(dataset="hotpotqa", methods=["no-rag"],
                    model="openai:http://user:sk-1@127.0.0.1:8000/v1")
    with pytest.raises(ValidationError, match="carries a query string"):
        BenchConfig(dataset="hotpotqa", methods=["no-rag"],
                    model="openai:http://127.0.0.1:8000/v1?api_key=sk-1")
    from rag_gates.testing import tiny_lm

    with pytest.raises(ValueError, match="one forward pass at a time"):
        run_bench(config(server, methods=["no-rag"], concurrency=2), tmp_path / "x",
                  lm=tiny_lm(seed=0))


def test_deeprag_needs_the_served_models_chat_template_and_says_so_before_any_question(
        server: ReplayServer, bm25: BM25Retriever, tmp_path: Path) -> None:
    """Without the model's template a served chat model cannot continue DeepRAG's trajectory
    (the chat endpoint closes the assistant message) nor score its markers: refused when the
    method is built, naming the fix, and nothing is written."""
    for method in ("deeprag", "deeprag-likelihood"):
        with pytest.raises(ValueError, match=r"chat_template=.*--chat-template"):
            run_bench(config(server, methods=[method]), tmp_path / method, retriever=bm25)
        assert not (tmp_path / method / "config.json").exists()
    with pytest.raises(ValidationError, match="chat_template is for a served model"):
        BenchConfig(dataset="hotpotqa", methods=["deeprag"], chat_template="default")


def test_chat_templates_load_from_a_file_a_model_directory_or_the_embedded_model(
        tmp_path: Path) -> None:
    from rag_gates.lm.openai_compat import load_chat_template

    jinja = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
    (tmp_path / "t.jinja").write_text(jinja)
    assert load_chat_template(str(tmp_path / "t.jinja")) == jinja
    model = tmp_path / "model"
    model.mkdir()
    (model / "tokenizer_config.json").write_text(json.dumps({"chat_template": jinja}))
    assert load_chat_template(str(model)) == jinja
    (model / "tokenizer_config.json").write_text(json.dumps({"bos_token": "<s>"}))
    with pytest.raises(ValueError, match="holds no chat template"):
        load_chat_template(str(model))
    with pytest.raises(ValueError, match="no such file or directory"):
        load_chat_template(str(tmp_path / "missing"))
    assert "<|im_start|>" in load_chat_template("default")


def _readme_bench_command() -> list[str]:
    """The README's served `rag-gates bench` command, continuation lines joined."""
    import shlex

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = text.index("rag-gates bench --dataset hotpotqa --methods quco,deeprag-likelihood")
    end = text.index("\n", text.index("--out", start))
    return shlex.split(text[start:end].replace("\\\n", " "), comments=True)


def test_the_readmes_served_command_builds_every_method_it_names(
        server: ReplayServer, bm25: BM25Retriever, tmp_path: Path) -> None:
    """The README's command, pointed at the recorded server: its options make a valid
    config whose every method builds against the served model (no refusal before the first
    question); without its --chat-template, DeepRAG refuses it."""
    from rag_gates.methods import MethodContext, make_method

    argv = _readme_bench_command()
    assert argv[:2] == ["rag-gates", "bench"]
    opts = dict(zip(argv[2::2], argv[3::2], strict=True))
    assert opts["--model"].startswith("openai:http://")
    cfg = BenchConfig(dataset=opts["--dataset"], methods=opts["--methods"].split(","),
                      model=f"openai:{server.url}", chat_template=opts["--chat-template"],
                      concurrency=int(opts["--concurrency"]))
    ctx = MethodContext(lm=load_bench_lm(cfg), retriever=bm25, dataset=cfg.dataset)
    assert [make_method(m, ctx).name for m in cfg.methods] == ["quco", "deeprag-likelihood"]
    bare = MethodContext(lm=load_bench_lm(cfg.model_copy(update={"chat_template": None})),
                         retriever=bm25, dataset=cfg.dataset)
    with pytest.raises(ValueError, match="--chat-template"):
        make_method("deeprag-likelihood", bare)
