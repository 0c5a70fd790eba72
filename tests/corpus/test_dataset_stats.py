"""The dataset corpus-statistics index (``rag_gates_lab.corpus.load_corpus_stats``): built
from the HotpotQA and 2Wiki slices shipped in examples/data into a temporary RAG_GATES_HOME,
checked against a brute-force scan of the same documents, reused from its cache, and rebuilt
when the data changes."""

from __future__ import annotations

import json
import shutil
import unicodedata
from pathlib import Path
from typing import Any

import pytest

from rag_gates.corpus import CachedCorpusStats, LocalInfiniGram
from rag_gates.corpus import build as corpus_build
from rag_gates.corpus.index_format import MANIFEST_NAME
from rag_gates.corpus.tokenizer import CorpusTokenizer
from rag_gates_lab.corpus import (
    build_corpus_stats,
    corpus_stats_dir,
    corpus_stats_documents,
    load_corpus_stats,
)

from . import brute

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "data"
SLICES = ("hotpotqa_dev_sample.jsonl", "2wikimultihopqa_dev_sample.jsonl")
# Real entities of the shipped questions: supporting-fact titles, names inside paragraphs,
# and common place names; one title that only occurs as a title ("Big Stone Gap (film)").
ENTITIES = ["Scott Derrickson", "Ed Wood", "Laleli Mosque", "Esma Sultan Mansion",
            "Big Stone Gap (film)", "Adriana Trigiani", "Terry Richardson", "Blind Shaft",
            "The Mask of Fu Manchu", "Cleopatra IV of Egypt", "Ștefan I. Nenițescu",
            "New York", "United States", "American", "Eenasul Fateh"]


@pytest.fixture()
def data_dir(tmp_path: Path) -> Path:
    """A private copy of the shipped HotpotQA and 2Wiki slices (tests may change it)."""
    out = tmp_path / "data"
    out.mkdir()
    for name in SLICES:
        shutil.copy(EXAMPLES / name, out / name)
    return out


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "home"
    monkeypatch.setenv("RAG_GATES_HOME", str(path))
    return path


@pytest.fixture()
def builds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Records every index build (the real builder runs)."""
    calls: list[str] = []
    real = corpus_build.build_index

    def counting(corpus: Any, out: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(str(out))
        return real(corpus, out, *args, **kwargs)

    monkeypatch.setattr(corpus_build, "build_index", counting)
    return calls


def _fold(text: str, lower: bool) -> str:
    text = unicodedata.normalize("NFC", text)
    return text.lower() if lower else text


def _brute_counts(data_dir: Path, tokenizer_path: Path, phrases: list[str],
                  lower: bool = True) -> dict[str, int]:
    tok = CorpusTokenizer.from_file(tokenizer_path)
    docs = brute.doc_tokens([_fold(d["text"], lower) for d in corpus_stats_documents(
        path=data_dir)], tok.encode)
    return {p: brute.count(docs, brute.phrase_variants(_fold(p, lower), tok.encode))
            for p in phrases}


def test_counts_match_brute_force(home: Path, data_dir: Path, tokenizer_path: Path,
                                  builds: list[str]) -> None:
    stats = load_corpus_stats(path=data_dir, tokenizer=tokenizer_path, case="insensitive")
    try:
        assert isinstance(stats, CachedCorpusStats)
        assert isinstance(stats.backend, LocalInfiniGram)
        assert stats.backend.lowercase  # a lower-cased index, exact case folding
        assert not stats.count("Ed Wood").approximate
        expected = _brute_counts(data_dir, tokenizer_path, ENTITIES)
        got = {e: stats.count(e).value for e in ENTITIES}
        assert got == expected
        assert all(v > 0 for v in got.values())  # every one is a real entity of the slices
        assert got["Big Stone Gap (film)"] >= 1  # the title line is part of the document
        assert [r.value for r in stats.count_batch(ENTITIES)] == [expected[e] for e in ENTITIES]
        assert stats.count("Ed Wood").cached
        # 2Wiki questions Title-Case names: still found
        assert stats.count("The Mask Of Fu Manchu").value == got["The Mask of Fu Manchu"]
    finally:
        stats.close()
    assert len(builds) == 1
    # built in a temporary directory beside the cache, then renamed into place
    assert Path(builds[0]).parent.parent == home / "indexes"
    assert Path(builds[0]).parent.name.startswith(".corpus-stats-")


def test_case_sensitive_index(home: Path, data_dir: Path, tokenizer_path: Path,
                              builds: list[str]) -> None:
    # The default: a cased index, as QuCo-RAG's authors count (docs/fidelity.md, Q20).
    with load_corpus_stats(path=data_dir, tokenizer=tokenizer_path, cache=False) as stats:
        assert isinstance(stats, LocalInfiniGram)
        assert not stats.lowercase and stats.config.case == "sensitive"
        expected = _brute_counts(data_dir, tokenizer_path, ENTITIES, lower=False)
        assert {e: stats.count(e).value for e in ENTITIES} == expected
        assert stats.count("The Mask Of Fu Manchu").value == 0
        sensitive_dir = stats.path
    insensitive_dir = build_corpus_stats(path=data_dir, tokenizer=tokenizer_path, lowercase=True)
    assert insensitive_dir.resolve() != sensitive_dir and len(builds) == 2
    assert sensitive_dir == corpus_stats_dir(path=data_dir, tokenizer=tokenizer_path,
                                             lowercase=False).resolve()
    with pytest.raises(ValueError, match="case must be"):
        load_corpus_stats(path=data_dir, tokenizer=tokenizer_path, case="upper")  # type: ignore[arg-type]


def test_documents_are_distinct_titled_paragraphs(data_dir: Path) -> None:
    docs = corpus_stats_documents(path=data_dir)
    keys = [(d["title"], d["text"]) for d in docs]
    assert len(keys) == len(set(keys))
    assert all(d["text"].startswith(d["title"] + "\n") for d in docs if d["title"])
    one = corpus_stats_documents(("hotpotqa",), data_dir)
    assert 0 < len(one) < len(docs)
    assert corpus_stats_documents("hotpotqa,2wiki", data_dir) == docs


def test_cache_reused_and_atomic(home: Path, data_dir: Path, tokenizer_path: Path,
                                 builds: list[str]) -> None:
    first = build_corpus_stats(path=data_dir, tokenizer=tokenizer_path)
    manifest = first / MANIFEST_NAME
    stamp = manifest.stat().st_mtime_ns
    index_id = json.loads(manifest.read_text())["index_id"]
    assert len(builds) == 1
    assert first == corpus_stats_dir(path=data_dir, tokenizer=tokenizer_path)
    assert first.parent == home / "indexes" and first.name.startswith("corpus-stats-")
    sources = json.loads((first / "sources.json").read_text())
    assert [d["name"] for d in sources["datasets"]] == ["hotpotqa", "2wiki"]

    stats = load_corpus_stats(path=data_dir, tokenizer=tokenizer_path, cache=False)
    try:
        assert isinstance(stats, LocalInfiniGram)
        assert stats.path == first.resolve()
        assert stats.stats().index_id == index_id
    finally:
        stats.close()
    assert len(builds) == 1  # the second call loaded, it did not rebuild
    assert manifest.stat().st_mtime_ns == stamp
    # nothing half-made is left beside the index
    assert sorted(p.name for p in (home / "indexes").iterdir()) == [first.name]


def test_changed_data_gets_a_new_index(home: Path, data_dir: Path, tokenizer_path: Path,
                                       builds: list[str]) -> None:
    old = build_corpus_stats(path=data_dir, tokenizer=tokenizer_path)
    hotpot = data_dir / SLICES[0]
    row = json.loads(hotpot.read_text(encoding="utf-8").splitlines()[0])
    row["_id"] = "added-row"
    row["context"] = [["Quillon Abernathy", ["Quillon Abernathy is a fictional lighthouse."]]]
    with hotpot.open("a", encoding="utf-8") as handle:
        handle.write(json.dumps(row) + "\n")
    new = build_corpus_stats(path=data_dir, tokenizer=tokenizer_path)
    assert new != old and len(builds) == 2
    with LocalInfiniGram(new) as fresh, LocalInfiniGram(old) as stale:
        assert fresh.count("Quillon Abernathy").value == 2  # title line + paragraph
        assert stale.count("Quillon Abernathy").value == 0
        assert fresh.stats().documents == stale.stats().documents + 1


def test_slices_alone_through_the_search_path(home: Path, data_dir: Path, tokenizer_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """No ``path``: the resolver takes $RAG_GATES_DATA first, here holding only the slices."""
    monkeypatch.setenv("RAG_GATES_DATA", str(data_dir))
    tok = CorpusTokenizer.from_file(tokenizer_path)
    docs = brute.doc_tokens([_fold(d["text"], True) for d in corpus_stats_documents()],
                            tok.encode)
    pairs = [("Scott Derrickson", "Ed Wood"), ("Ed Wood", "American"),
             ("Laleli Mosque", "Esma Sultan Mansion")]
    with load_corpus_stats(tokenizer=tokenizer_path, cache=home / "counts.sqlite") as stats:
        assert stats.count("Scott Derrickson").value >= 1
        for a, b in pairs:
            assert stats.cooccurrence(a, b).value == brute.doc_cooccurrence(
                docs, brute.phrase_variants(_fold(a, True), tok.encode),
                brute.phrase_variants(_fold(b, True), tok.encode))
    assert (home / "counts.sqlite").is_file()
    assert corpus_stats_dir(tokenizer=tokenizer_path) == corpus_stats_dir(
        path=data_dir, tokenizer=tokenizer_path)


def test_bad_arguments(data_dir: Path, home: Path) -> None:
    with pytest.raises(ValueError, match="is a file but 2 datasets"):
        corpus_stats_documents(path=data_dir / SLICES[0])
    with pytest.raises(ValueError, match="unknown dataset"):
        corpus_stats_documents(("hotpotqa", "nope"), data_dir)
    with pytest.raises(ValueError, match="at least one dataset"):
        corpus_stats_documents((), data_dir)


def test_cli_from_datasets(home: Path, data_dir: Path, tokenizer_path: Path) -> None:
    from typer.testing import CliRunner

    import rag_gates.cli  # noqa: F401 - loads the lab's entry point, which adds from-datasets
    from rag_gates.corpus.cli import index_app

    runner = CliRunner()
    args = ["from-datasets", "--datasets", "hotpotqa,2wiki", "--data", str(data_dir),
            "--tokenizer", str(tokenizer_path)]
    result = runner.invoke(index_app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    info = json.loads(result.output)
    expected = corpus_stats_dir(path=data_dir, tokenizer=tokenizer_path)
    assert Path(info["path"]) == expected.resolve()
    assert info["documents"] == len(corpus_stats_documents(path=data_dir))
    plain = runner.invoke(index_app, [*args, "-q"])
    assert plain.exit_code == 0, plain.output
    assert str(expected) in plain.output
    bad = runner.invoke(index_app, ["from-datasets", "--datasets", "nope", "--data",
                                    str(data_dir)])
    assert bad.exit_code == 1 and "unknown dataset" in bad.output


def test_leftover_without_manifest_is_reported(home: Path, data_dir: Path,
                                               tokenizer_path: Path) -> None:
    from rag_gates.corpus.errors import IndexExistsError

    target = corpus_stats_dir(path=data_dir, tokenizer=tokenizer_path)
    target.mkdir(parents=True)
    (target / "stray.txt").write_text("not an index")
    with pytest.raises(IndexExistsError, match="no complete index"):
        build_corpus_stats(path=data_dir, tokenizer=tokenizer_path)
    assert sorted(p.name for p in target.parent.iterdir()) == [target.name]
