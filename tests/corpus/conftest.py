"""Fixtures for the corpus tests: a byte-level BPE tokenizer trained here, real-text indexes.

Everything is built in temporary directories with one cpu; nothing is fetched.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("infini_gram", reason='needs the corpus extra: pip install "rag-gates[corpus]"')
pytest.importorskip("numpy")
pytest.importorskip("tokenizers")
pytest.importorskip("httpx")

FIXTURE_WIKI = Path(__file__).resolve().parent / "data" / "wiki_paragraphs.jsonl"


def wiki_paragraphs(limit: int = 400) -> list[dict[str, str]]:
    """Distinct Wikipedia paragraphs (title, text) from the HotpotQA slice shipped with the
    tests (tests/corpus/data, CC BY-SA 4.0)."""
    rows = [json.loads(line) for line in FIXTURE_WIKI.read_text(encoding="utf-8").splitlines()]
    return rows[:limit]


def train_tokenizer(texts: list[str], path: Path, vocab_size: int = 1500) -> Path:
    """A real byte-level BPE (GPT-2 style: 'Paris' and ' Paris' differ), trained on texts."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=["<|endoftext|>"], show_progress=False)
    tk.train_from_iterator(texts, trainer)
    tk.save(str(path))
    return path


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                    encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("corpus")


@pytest.fixture(scope="session")
def wiki_rows() -> list[dict[str, str]]:
    return wiki_paragraphs()


@pytest.fixture(scope="session")
def tokenizer_path(corpus_dir: Path, wiki_rows: list[dict[str, str]]) -> Path:
    extra = ["Tom AND Jerry", "rock OR roll", "(a OR b)", '"quoted words"', "café Zürich",
             "Paris and New York", "the quick brown fox"]
    return train_tokenizer([r["text"] for r in wiki_rows] + extra, corpus_dir / "tok.json")


@pytest.fixture(scope="session")
def wiki_index(corpus_dir: Path, wiki_rows: list[dict[str, str]], tokenizer_path: Path) -> Path:
    """A real-text index: 400 Wikipedia paragraphs plus a few documents with operator words."""
    from rag_gates.corpus import build_index

    rows: list[dict[str, Any]] = [
        {"id": r["title"], "title": r["title"], "text": r["text"]} for r in wiki_rows]
    rows += [
        {"id": "op-1", "title": "Cartoons", "text": "Tom AND Jerry is a cartoon. Tom and Jerry "
                                                    "chase each other. Jerry wins."},
        {"id": "op-2", "title": "Music", "text": 'They played rock OR roll, "quoted words" and '
                                                 "(a OR b) all night; Tom AND Jerry watched."},
        {"id": "op-3", "title": "Cities", "text": "Paris and New York. café Zürich (Paris)"},
    ]
    src = write_jsonl(corpus_dir / "wiki.jsonl", rows)
    out = corpus_dir / "wiki-index"
    build_index(src, out, tokenizer=tokenizer_path, cpus=1)
    return out


@pytest.fixture()
def wiki(wiki_index: Path) -> Iterator[Any]:
    from rag_gates.corpus import LocalInfiniGram

    backend = LocalInfiniGram(wiki_index)
    yield backend
    backend.close()


# The user's rag-gates home as the session found it (where `rag-gates models install` put the
# model files), read before the fixture below moves RAG_GATES_HOME to a temporary folder.
USER_RAG_GATES_HOME = os.environ.get("RAG_GATES_HOME")


@pytest.fixture(autouse=True)
def _rag_gates_home(tmp_path_factory: pytest.TempPathFactory,
                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Caches the corpus code keeps under RAG_GATES_HOME (verified index digests) stay in a
    temporary folder shared by the session, never in the user's home."""
    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path_factory.getbasetemp() / "home"))
