"""LocalInfiniGram on a real-text index: literal phrases, variants, case, scopes, bad input."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest

from rag_gates.corpus import (
    CooccurrenceResult,
    CorpusError,
    CorruptIndexError,
    CountResult,
    EmptyPhraseError,
    IndexNotFoundError,
    InvalidPhraseError,
    LocalInfiniGram,
    PhraseTooLongError,
    Window,
    build_index,
)
from rag_gates.corpus.tokenizer import CorpusTokenizer

from . import brute
from .conftest import write_jsonl


def _texts(wiki_index: Path) -> list[str]:
    rows = [json.loads(line) for line in (wiki_index.parent / "wiki.jsonl").read_text(
        encoding="utf-8").splitlines()]
    return [r["text"] for r in rows]


def test_counts_match_a_scan_of_real_paragraphs(wiki: Any, wiki_index: Path) -> None:
    encode = wiki.tokenizer.encode
    docs = brute.doc_tokens(_texts(wiki_index), encode)
    for phrase in ["the", "Paris", "United States", "American", "film", "born in",
                   "Tom AND Jerry", "nothing like this phrase at all"]:
        expected = brute.count(docs, brute.phrase_variants(phrase, encode))
        answer = wiki.count(phrase)
        assert answer.value == expected, phrase
        assert answer.backend == "local-infini-gram" and answer.index == "wiki-index"
        assert answer.approximate is False and answer.latency_ms > 0


@pytest.mark.parametrize("phrase", ["Tom AND Jerry", "rock OR roll", "(a OR b)",
                                    '"quoted words"', "AND", "OR"])
def test_operator_words_parentheses_and_quotes_are_matched_literally(
        wiki: Any, wiki_index: Path, phrase: str) -> None:
    encode = wiki.tokenizer.encode
    docs = brute.doc_tokens(_texts(wiki_index), encode)
    expected = brute.count(docs, brute.phrase_variants(phrase, encode))
    assert expected >= 1
    assert wiki.count(phrase).value == expected
    if phrase == "Tom AND Jerry":  # the literal text occurs in exactly two documents
        assert wiki.count(phrase).value == 2


def test_both_space_variants_are_matched(wiki: Any) -> None:
    both = wiki.count("Paris")
    assert set(both.variants) == {"Paris", " Paris"}
    only_leading = LocalInfiniGram(wiki.path, spaces="leading").count("Paris")
    only_bare = LocalInfiniGram(wiki.path, spaces="none").count("Paris")
    assert only_leading.variants == (" Paris",)
    assert both.value == only_leading.value + only_bare.value
    assert only_bare.value >= 1  # "(Paris)" in a test document: no space before it


def test_document_cooccurrence_is_exact_on_real_text(wiki: Any, wiki_index: Path) -> None:
    encode = wiki.tokenizer.encode
    docs = brute.doc_tokens(_texts(wiki_index), encode)
    pairs = [("film", "American"), ("the", "of"), ("Paris", "New York"), ("born", "died"),
             ("Tom", "Jerry"), ("zzzz unseen", "the")]
    for a, b in pairs:
        va, vb = brute.phrase_variants(a, encode), brute.phrase_variants(b, encode)
        answer = wiki.cooccurrence(a, b)
        assert isinstance(answer, CooccurrenceResult)
        assert answer.value == brute.doc_cooccurrence(docs, va, vb), (a, b)
        assert answer.unit == "documents" and answer.scope == "document"
        for w in (1, 5, 50):
            windowed = wiki.cooccurrence(a, b, scope=Window(tokens=w))
            assert windowed.value == brute.window_cooccurrence(docs, va, vb, w), (a, b, w)
            assert windowed.scope == f"window:{w}"
        assert wiki.cooccurrence(a, b, scope=7).scope == "window:7"


def test_engine_window_query_undercounts_where_we_do_not(tmp_path: Path,
                                                        tokenizer_path: Path) -> None:
    """Why co-occurrence is computed from document ids: the engine's AND query merges the
    nearest partners on both sides into one span and drops it when the span crosses into the
    previous document, even though the partner inside the same document is in range."""
    src = write_jsonl(tmp_path / "c.jsonl", [
        {"text": "The story ends with Jerry"},
        {"text": "In Paris was where Jerry lived"}])
    build_index(src, tmp_path / "idx", tokenizer=tokenizer_path, cpus=1)
    backend = LocalInfiniGram(tmp_path / "idx")
    a = [[list(ids) for _, ids in backend._variants("Paris")[1]]]
    b = [[list(ids) for _, ids in backend._variants("Jerry")[1]]]
    engine = backend.engine.count_cnf(cnf=a + b, max_clause_freq=1000, max_diff_tokens=50)
    assert engine["count"] == 0  # the engine misses the pair in the second document
    assert backend.cooccurrence("Paris", "Jerry", scope=Window(tokens=50)).value == 1
    assert backend.cooccurrence("Paris", "Jerry").value == 1


def test_case_options(wiki: Any, wiki_index: Path, tmp_path: Path) -> None:
    insensitive = LocalInfiniGram(wiki.path, case="insensitive")
    answer = insensitive.count("paris")
    assert answer.approximate is True  # a cased index can only search common casings
    assert {"paris", "Paris", "PARIS"} <= {v.strip() for v in answer.variants}
    assert answer.value == wiki.count("paris").value + wiki.count("Paris").value + \
        wiki.count("PARIS").value
    # A lower-cased index is exactly case-insensitive.
    out = tmp_path / "lower"
    build_index(wiki_index.parent / "wiki.jsonl", out, tokenizer=wiki_index / "tokenizer.json",
                lowercase=True, cpus=1)
    lower = LocalInfiniGram(out)
    exact = lower.count("PARIS")
    assert exact.approximate is False and exact.phrase == "PARIS"
    encode = lower.tokenizer.encode
    docs = brute.doc_tokens([t.lower() for t in _texts(wiki_index)], encode)
    assert exact.value == brute.count(docs, brute.phrase_variants("paris", encode))


def test_batch_forms_keep_order_and_async_forms_agree(wiki: Any) -> None:
    phrases = ["film", "Paris", "the", "zzz", "American"]
    batch = wiki.count_batch(phrases)
    assert [r.phrase for r in batch] == phrases
    assert [r.value for r in batch] == [wiki.count(p).value for p in phrases]
    pairs = [("film", "American"), ("Paris", "the"), ("zzz", "the")]
    cooc = wiki.cooccurrence_batch(pairs, scope=Window(tokens=10))
    assert [(r.a, r.b) for r in cooc] == pairs

    async def run() -> tuple[list[CountResult], CountResult, CooccurrenceResult]:
        gathered = await asyncio.gather(*(wiki.acount(p) for p in phrases))
        return (list(gathered), await wiki.acount("film"),
                await wiki.acooccurrence("film", "American"))

    gathered, one, pair = asyncio.run(run())
    assert [r.value for r in gathered] == [r.value for r in batch]
    assert one.value == batch[0].value
    assert pair.value == wiki.cooccurrence("film", "American").value
    assert [r.value for r in asyncio.run(wiki.acount_batch(phrases))] == [r.value for r in batch]


def test_phrase_normalisation(wiki: Any) -> None:
    assert wiki.count("  United \n States ").phrase == "United States"
    assert wiki.count("  United \n States ").value == wiki.count("United States").value
    assert wiki.count("Zu\u0308rich").phrase == "Zürich"  # NFC


@pytest.mark.parametrize(("phrase", "error"), [
    ("", EmptyPhraseError), ("   \n\t ", EmptyPhraseError), ("x" * 1001, PhraseTooLongError),
    (None, InvalidPhraseError), (42, InvalidPhraseError)])
def test_bad_phrases_raise_specific_errors(wiki: Any, phrase: Any, error: type) -> None:
    with pytest.raises(error):
        wiki.count(phrase)
    with pytest.raises(error):
        wiki.cooccurrence("Paris", phrase)


def test_a_lone_surrogate_is_a_value_error_naming_its_position(wiki: Any,
                                                               tmp_path: Path) -> None:
    from rag_gates.corpus import CachedCorpusStats

    cached = CachedCorpusStats(LocalInfiniGram(wiki.path), tmp_path / "c.sqlite")
    for backend in (wiki, cached):
        for call in (lambda b: b.count("a\ud800b"),
                     lambda b: b.cooccurrence("Paris", "a\ud800b"),
                     lambda b: b.count_batch(["Paris", "a\ud800b"]),
                     lambda b: asyncio.run(b.acount("a\ud800b"))):
            with pytest.raises(InvalidPhraseError, match=r"phrase .*position 1 .*U\+D800"):
                call(backend)
    assert len(cached) == 0  # nothing was stored for the refused batch


def test_phrase_over_the_token_limit(wiki: Any) -> None:
    backend = LocalInfiniGram(wiki.path, max_phrase_tokens=3)
    with pytest.raises(PhraseTooLongError, match="tokens long"):
        backend.count("the quick brown fox jumps")


def test_bad_scopes(wiki: Any) -> None:
    for scope in ("sentence", 0, -3, True, 2.5):
        with pytest.raises(ValueError):
            wiki.cooccurrence("a", "b", scope=scope)


def test_missing_index_directory(tmp_path: Path) -> None:
    with pytest.raises(IndexNotFoundError, match="rag-gates index build"):
        LocalInfiniGram(tmp_path / "nope")
    (tmp_path / "file").write_text("x")
    with pytest.raises(IndexNotFoundError):
        LocalInfiniGram(tmp_path / "file")
    with pytest.raises(CorruptIndexError, match="tokenized"):
        LocalInfiniGram(tmp_path)  # a directory, but not an index


def _copy(index: Path, dest: Path) -> Path:
    shutil.copytree(index, dest)
    return dest


@pytest.mark.parametrize("damage", [
    "truncate-table", "truncate-tokens", "drop-offset", "drop-table", "stray-dir",
    "manifest-garbage", "offsets-shuffled", "table-from-other-build", "empty-table",
    "drop-tokenizer"])
def test_corrupt_index_gives_a_clear_error_not_a_crash(wiki_index: Path, tmp_path: Path,
                                                      damage: str) -> None:
    index = _copy(wiki_index, tmp_path / "idx")
    table, tokens, offsets = index / "table.0", index / "tokenized.0", index / "offset.0"
    if damage == "truncate-table":
        table.write_bytes(table.read_bytes()[:-7])
    elif damage == "truncate-tokens":
        tokens.write_bytes(tokens.read_bytes()[:-1])
    elif damage == "drop-offset":
        offsets.unlink()
    elif damage == "drop-table":
        table.unlink()
    elif damage == "stray-dir":
        (index / "table_backup").mkdir()
    elif damage == "manifest-garbage":
        (index / "rag_gates_index.json").write_text("{not json")
    elif damage == "offsets-shuffled":
        data = bytearray(offsets.read_bytes())
        data[8:16], data[16:24] = data[16:24], data[8:16]
        offsets.write_bytes(bytes(data))
    elif damage == "table-from-other-build":
        table.write_bytes(b"\xff" * table.stat().st_size)
    elif damage == "empty-table":
        table.write_bytes(b"")
    elif damage == "drop-tokenizer":
        (index / "tokenizer.json").unlink()
    with pytest.raises(CorruptIndexError) as info:
        LocalInfiniGram(index)
    assert str(info.value)


def test_index_path_with_engine_keywords_still_works(wiki_index: Path, tmp_path: Path) -> None:
    """The engine classifies files by substrings of the whole path: "portable" contains
    "table". A neutral path is handed to it."""
    index = _copy(wiki_index, tmp_path / "portable_tokenized_offset" / "idx")
    backend = LocalInfiniGram(index)
    assert backend.count("film").value == LocalInfiniGram(wiki_index).count("film").value


def test_foreign_index_needs_its_tokenizer(wiki_index: Path, tmp_path: Path) -> None:
    index = _copy(wiki_index, tmp_path / "foreign")
    (index / "rag_gates_index.json").unlink()
    tok = index / "tokenizer.json"
    moved = tmp_path / "tok.json"
    tok.rename(moved)
    with pytest.raises(CorruptIndexError, match="tokenizer"):
        LocalInfiniGram(index)
    backend = LocalInfiniGram(index, tokenizer=moved)
    assert backend.count("film").value == LocalInfiniGram(wiki_index).count("film").value
    assert backend.index_key.startswith("local-path:")


def test_stats_and_full_verification(wiki: Any) -> None:
    info = wiki.stats()
    assert info.documents == 403 and info.tokens > 10_000 and info.shards == 1
    assert info.token_dtype == "u16" and info.size_bytes > 0 and info.index_id
    wiki.verify()


def test_verify_detects_a_wrong_suffix_array(wiki_index: Path, tmp_path: Path) -> None:
    index = _copy(wiki_index, tmp_path / "idx")
    table = index / "table.0"
    data = bytearray(table.read_bytes())
    ptr = len(data) // (len((index / "tokenized.0").read_bytes()) // 2)
    # Swap two suffix-array entries: still a valid-looking permutation, but out of order.
    data[0:ptr], data[ptr * 500:ptr * 501] = data[ptr * 500:ptr * 501], data[0:ptr]
    table.write_bytes(bytes(data))
    # The build-time digests refuse the index at open (tests/corpus/test_digests.py); the
    # structural deep check is what remains for an index without digests.
    with pytest.raises(CorruptIndexError, match="digest"):
        LocalInfiniGram(index)
    manifest = json.loads((index / "rag_gates_index.json").read_text())
    del manifest["digests"]
    (index / "rag_gates_index.json").write_text(json.dumps(manifest))
    backend = LocalInfiniGram(index, verify_on_open=False)
    with pytest.raises(CorruptIndexError, match="out of order"):
        backend.verify()


def test_closed_backend_says_so(wiki_index: Path) -> None:
    backend = LocalInfiniGram(wiki_index)
    backend.close()
    with pytest.raises(CorpusError, match="closed"):
        backend.count("film")


def test_documents_with_ids_and_titles_are_kept_as_metadata(wiki_index: Path) -> None:
    backend = LocalInfiniGram(wiki_index)
    doc = backend.engine.get_doc_by_ix(doc_ix=400, max_disp_len=10)
    meta = json.loads(doc["metadata"])
    assert meta["metadata"] == {"id": "op-1", "title": "Cartoons"}
    assert meta["path"] == "wiki.jsonl" and meta["linenum"] == 401


def test_tokenizer_spec_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="not fetched"):
        CorpusTokenizer.resolve("meta-llama/Llama-2-7b-hf")
    with pytest.raises(FileNotFoundError, match=r"tokenizer\.json"):
        CorpusTokenizer.resolve(tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(ValueError, match="not a valid tokenizer"):
        CorpusTokenizer.resolve(bad)


def test_unicode_documents(tmp_path: Path, tokenizer_path: Path) -> None:
    src = write_jsonl(tmp_path / "u.jsonl", [
        {"text": "Zu\u0308rich is in Switzerland."},  # NFD in the corpus
        {"text": "Zürich again, and café."}])
    build_index(src, tmp_path / "idx", tokenizer=tokenizer_path, cpus=1)
    backend = LocalInfiniGram(tmp_path / "idx")
    assert backend.count("Zürich").value == 2  # both normalised to NFC
    assert backend.cooccurrence("Zürich", "café").value == 1
    assert re.fullmatch(r"[0-9a-f]{32}", backend.index_key.split(":")[1])
