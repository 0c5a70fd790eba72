"""Property tests: on random small corpora, built into real infini-gram indexes, count,
document co-occurrence and window co-occurrence equal a brute-force scan of the tokens."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rag_gates.corpus import LocalInfiniGram, Window, build_index
from rag_gates.corpus.tokenizer import CorpusTokenizer

from . import brute
from .conftest import train_tokenizer, write_jsonl

WORDS = ["Paris", "paris", "France", "Tom", "AND", "Jerry", "OR", "the", "a", "(Paris)",
         '"Tom"', "New", "York", "café", "Zu\u0308rich", "Zürich", "fox", "x", "-", "."]
SEPARATORS = [" ", " ", " ", "  ", "\n", ", ", " (", ") "]

word = st.sampled_from(WORDS)
document = st.lists(st.tuples(word, st.sampled_from(SEPARATORS)), min_size=0, max_size=40).map(
    lambda parts: "".join(w + s for w, s in parts))
corpus = st.lists(document, min_size=1, max_size=8).filter(
    lambda docs: any(d.strip() for d in docs))
phrase = st.lists(word, min_size=1, max_size=3).map(" ".join)

_TOKENIZER: dict[str, Path] = {}


def tokenizer_file() -> Path:
    """One byte-level BPE for every example, trained on the word list (merges inside words,
    so phrases and documents tokenize in several ways)."""
    if "path" not in _TOKENIZER:
        folder = Path(tempfile.mkdtemp(prefix="rg-prop-tok-"))
        texts = [" ".join(WORDS)] * 20 + [w + " " + v for w in WORDS for v in WORDS]
        _TOKENIZER["path"] = train_tokenizer(texts, folder / "tok.json", vocab_size=300)
    return _TOKENIZER["path"]


def build(docs: list[str], folder: Path) -> Path:
    src = write_jsonl(folder / "c.jsonl", [{"text": d} for d in docs])
    out = folder / "index"
    build_index(src, out, tokenizer=tokenizer_file(), cpus=1)
    return out


@settings(max_examples=30, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(docs=corpus, pairs=st.lists(st.tuples(phrase, phrase), min_size=1, max_size=4),
       window=st.integers(min_value=1, max_value=12))
def test_counts_and_cooccurrence_equal_a_brute_force_scan(
        docs: list[str], pairs: list[tuple[str, str]], window: int) -> None:
    encode = CorpusTokenizer.from_file(tokenizer_file()).encode
    tokens = brute.doc_tokens(docs, encode)
    with tempfile.TemporaryDirectory(prefix="rg-prop-") as tmp:
        index = build(docs, Path(tmp))
        backends: list[Any] = [LocalInfiniGram(index, strategy=s, lookup=lk) for s, lk in (
            ("auto", "python"), ("map", "engine"), ("scan", "python"), ("auto", "engine"))]
        try:
            for a, b in pairs:
                va, vb = brute.phrase_variants(a, encode), brute.phrase_variants(b, encode)
                expected_a = brute.count(tokens, va)
                expected_doc = brute.doc_cooccurrence(tokens, va, vb)
                expected_win = brute.window_cooccurrence(tokens, va, vb, window)
                for backend in backends:
                    assert backend.count(a).value == expected_a, (a, docs)
                    doc = backend.cooccurrence(a, b)
                    assert doc.value == expected_doc, (a, b, docs, backend.config)
                    assert doc.a_count == expected_a
                    assert doc.b_count == brute.count(tokens, vb)
                    win = backend.cooccurrence(a, b, scope=Window(tokens=window))
                    assert win.value == expected_win, (a, b, window, docs, backend.config)
                    assert win.value <= doc.value
        finally:
            for backend in backends:
                backend.close()
