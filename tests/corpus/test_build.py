"""The index builder: inputs, skips, metadata, atomic publishing, overwrite rules, pitfalls."""

from __future__ import annotations

import gzip
import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rag_gates.corpus import (
    IndexBuildError,
    IndexExistsError,
    LocalInfiniGram,
    build_index,
)
from rag_gates.corpus import build as build_module
from rag_gates.corpus.errors import CorruptIndexError

from .conftest import write_jsonl


def _meta(index: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (index / "metadata.0").read_text().splitlines()]


def test_jsonl_text_and_gzip_inputs_with_counted_skips(tmp_path: Path,
                                                       tokenizer_path: Path) -> None:
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    with (src / "a.jsonl").open("wb") as f:
        f.write(b'{"text": "Paris is in France.", "id": 7, "title": "Paris"}\n')
        f.write(b'{"text": "caf\xe9 latin-1 bytes"}\n')          # not UTF-8
        f.write(b"not json at all\n")
        f.write(b"[1, 2]\n")                                    # not an object
        f.write(b'{"title": "no text"}\n')
        f.write(b'{"text": "   "}\n')                           # empty
        f.write(b"\n")                                          # blank line: ignored
        f.write('{"text": "Zürich, no id"}\n'.encode())
    with gzip.open(src / "sub" / "b.jsonl.gz", "wt", encoding="utf-8") as g:
        g.write(json.dumps({"text": "Gzipped Paris line", "id": "g1"}) + "\n")
    (src / "sub" / "c.txt").write_text("First paragraph about Paris.\n\nSecond one.\n")
    (src / "ignored.csv").write_text("a,b\n")
    report = build_index(src, tmp_path / "idx", tokenizer=tokenizer_path, cpus=1)
    assert report.documents == 4
    assert report.skipped == {"empty_text": 1, "invalid_json": 1, "missing_text": 1,
                              "non_utf8": 1, "not_an_object": 1}
    assert "a.jsonl:2: non_utf8" in report.skipped_examples
    meta = _meta(tmp_path / "idx")
    assert meta[0] == {"path": "a.jsonl", "linenum": 1,
                       "metadata": {"id": "7", "title": "Paris"}}
    assert meta[1]["metadata"] == {"id": "a.jsonl:8", "title": None}
    assert meta[2]["metadata"] == {"id": "g1", "title": None}
    assert meta[3]["metadata"] == {"id": "sub/c.txt", "title": "c"}
    backend = LocalInfiniGram(tmp_path / "idx")
    assert backend.count("Paris").value == 3
    manifest = json.loads((tmp_path / "idx" / "rag_gates_index.json").read_text())
    assert manifest["documents"] == 4 and manifest["skipped"] == report.skipped
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_row_with_a_lone_surrogate_is_skipped_not_fatal(tmp_path: Path,
                                                          tokenizer_path: Path) -> None:
    # JSON escapes decode to lone surrogates that no tokenizer or UTF-8 writer accepts.
    src = tmp_path / "a.jsonl"
    src.write_text('{"text": "Paris is fine."}\n{"text": "bad \\ud800 text"}\n'
                   '{"text": "good text", "title": "bad \\udfff title"}\n'
                   '{"text": "Paris again."}\n', encoding="utf-8")
    report = build_index(src, tmp_path / "idx", tokenizer=tokenizer_path, cpus=1)
    assert report.documents == 2 and report.skipped == {"unencodable_text": 2}
    assert report.skipped_examples == ["a.jsonl:2: unencodable_text",
                                       "a.jsonl:3: unencodable_text"]
    assert LocalInfiniGram(tmp_path / "idx").count("Paris").value == 2


@pytest.mark.parametrize(("unit", "docs"), [("file", 1), ("paragraph", 3), ("line", 4)])
def test_text_units(tmp_path: Path, tokenizer_path: Path, unit: str, docs: int) -> None:
    text = tmp_path / "t.txt"
    text.write_bytes(b"one Paris\ntwo Paris\n\nthree\n\n\n\xff\xfe bad line\nfour\n")
    report = build_index(text, tmp_path / "idx", tokenizer=tokenizer_path, cpus=1,
                         text_unit=unit)
    assert report.documents == docs
    assert report.skipped.get("non_utf8") == 1


def test_refuses_to_overwrite_without_force_and_keeps_the_old_index(
        tmp_path: Path, tokenizer_path: Path) -> None:
    first = write_jsonl(tmp_path / "one.jsonl", [{"text": "Paris Paris"}])
    second = write_jsonl(tmp_path / "two.jsonl", [{"text": "Paris"}])
    out = tmp_path / "idx"
    build_index(first, out, tokenizer=tokenizer_path, cpus=1)
    old_id = LocalInfiniGram(out).index_key
    with pytest.raises(IndexExistsError, match="--force"):
        build_index(second, out, tokenizer=tokenizer_path, cpus=1)
    assert LocalInfiniGram(out).count("Paris").value == 2
    # A failing --force rebuild leaves the old index in place.
    empty = write_jsonl(tmp_path / "empty.jsonl", [{"text": ""}, {"nope": 1}])
    with pytest.raises(IndexBuildError, match="no documents"):
        build_index(empty, out, tokenizer=tokenizer_path, cpus=1, force=True)
    assert LocalInfiniGram(out).count("Paris").value == 2
    build_index(second, out, tokenizer=tokenizer_path, cpus=1, force=True)
    fresh = LocalInfiniGram(out)
    assert fresh.count("Paris").value == 1 and fresh.index_key != old_id
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty.jsonl", "idx", "one.jsonl",
                                                          "two.jsonl"]


def test_force_never_deletes_a_directory_that_is_not_an_index(tmp_path: Path,
                                                              tokenizer_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "thesis.tex").write_text("do not delete")
    src = write_jsonl(tmp_path / "c.jsonl", [{"text": "Paris"}])
    with pytest.raises(IndexExistsError, match="not a rag-gates index"):
        build_index(src, precious, tokenizer=tokenizer_path, cpus=1, force=True)
    assert (precious / "thesis.tex").read_text() == "do not delete"


def test_bad_inputs(tmp_path: Path, tokenizer_path: Path) -> None:
    with pytest.raises(IndexBuildError, match="does not exist"):
        build_index(tmp_path / "missing.jsonl", tmp_path / "idx", tokenizer=tokenizer_path)
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(IndexBuildError, match=r"no \.jsonl"):
        build_index(tmp_path / "empty_dir", tmp_path / "idx", tokenizer=tokenizer_path)
    src = write_jsonl(tmp_path / "c.jsonl", [{"text": "Paris"}])
    with pytest.raises(IndexBuildError, match="tokenizer"):
        build_index(src, tmp_path / "idx", tokenizer=tmp_path / "no-tokenizer.json")
    assert not (tmp_path / "idx").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_interrupted_build_leaves_no_half_index(tmp_path: Path, tokenizer_path: Path) -> None:
    rows = [{"text": f"Paragraph {i} about Paris and the river number {i * 7}. " * 20}
            for i in range(20_000)]
    src = write_jsonl(tmp_path / "big.jsonl", rows)
    out = tmp_path / "idx"
    code = ("import sys; from rag_gates.corpus import build_index; "
            "build_index(sys.argv[1], sys.argv[2], tokenizer=sys.argv[3], cpus=1)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(src), str(out),
                             str(tokenizer_path)])
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        building = [p for p in tmp_path.iterdir() if ".building-" in p.name]
        if building and (building[0] / "tokenized.0").exists() and \
                (building[0] / "tokenized.0").stat().st_size > 0:
            break
        time.sleep(0.02)
    else:
        proc.kill()
        pytest.fail("the build never started writing")
    proc.send_signal(signal.SIGINT)
    code = proc.wait(timeout=60)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    if code == 0:
        # The build won the race with the signal (seen once on an idle machine): then the
        # index must be whole, never half.
        from rag_gates.corpus import LocalInfiniGram

        with LocalInfiniGram(out) as index:
            index.verify()
            assert index.count("Paris").value > 0
    else:
        assert not out.exists()


def test_small_corpus_uses_one_part_even_with_many_cpus(tmp_path: Path,
                                                        tokenizer_path: Path) -> None:
    src = write_jsonl(tmp_path / "c.jsonl", [{"text": f"Paris {i} and Jerry"}
                                             for i in range(3000)])
    report = build_index(src, tmp_path / "idx", tokenizer=tokenizer_path, cpus=8)
    assert report.suffix_array_parts == 1
    LocalInfiniGram(tmp_path / "idx").verify()
    assert LocalInfiniGram(tmp_path / "idx").count("Jerry").value == 3000


def test_the_parallel_small_corpus_pitfall_is_caught_by_verification(
        tmp_path: Path, tokenizer_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With several parts under ~100 KB each, rust_indexing writes a wrong suffix array;
    the builder refuses to publish it."""
    monkeypatch.setattr(build_module, "MIN_PART_BYTES", 1)
    src = write_jsonl(tmp_path / "c.jsonl", [{"text": f"Paris {i} and Jerry"}
                                             for i in range(3000)])
    with pytest.raises(IndexBuildError, match=r"wrong suffix array|verification"):
        build_index(src, tmp_path / "idx", tokenizer=tokenizer_path, cpus=2)
    assert not (tmp_path / "idx").exists()


def test_file_limit_above_the_hard_limit_is_capped(tmp_path: Path,
                                                   tokenizer_path: Path) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    too_many = (hard if hard != resource.RLIM_INFINITY else 1 << 20) + 1_000_000
    src = write_jsonl(tmp_path / "c.jsonl", [{"text": "Paris"}])
    report = build_index(src, tmp_path / "idx", tokenizer=tokenizer_path, cpus=1,
                         ulimit=too_many)
    assert report.documents == 1
    assert resource.getrlimit(resource.RLIMIT_NOFILE) == (soft, hard)  # ours is untouched


def test_default_tokenizer_is_the_embedded_models() -> None:
    pytest.importorskip("transformers")
    from rag_gates.corpus.tokenizer import CorpusTokenizer
    from rag_gates.lm.defaults import default_lm_dir

    if not (default_lm_dir() / "rag_gates_source.json").is_file():
        pytest.skip("the embedded model has not been converted on this machine yet")
    tok = CorpusTokenizer.resolve(None)
    assert tok.vocab_size == 49152
    assert tok.encode("Paris") != tok.encode(" Paris")


def test_corrupt_manifest_of_existing_target_is_still_replaceable(
        tmp_path: Path, tokenizer_path: Path) -> None:
    src = write_jsonl(tmp_path / "c.jsonl", [{"text": "Paris"}])
    out = tmp_path / "idx"
    build_index(src, out, tokenizer=tokenizer_path, cpus=1)
    (out / "table.0").write_bytes(b"")
    with pytest.raises(CorruptIndexError):
        LocalInfiniGram(out)
    build_index(src, out, tokenizer=tokenizer_path, cpus=1, force=True)
    assert LocalInfiniGram(out).count("Paris").value == 1
    assert os.listdir(tmp_path) == ["c.jsonl", "idx"] or sorted(os.listdir(tmp_path)) == [
        "c.jsonl", "idx"]


def test_large_vocabulary_is_remapped_to_16_bit_ids(tmp_path: Path) -> None:
    """rust_indexing would need ~32 GB for 32-bit tokens; ids are renumbered densely."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, **{f"w{i}": i for i in range(1, 70_000)}}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tk.pre_tokenizer = pre_tokenizers.Whitespace()
    tk.save(str(tmp_path / "big.json"))
    src = write_jsonl(tmp_path / "c.jsonl", [{"text": "w69999 w5 w69999"}, {"text": "w5 w7"},
                                             {"text": "w65535 w65534"}])
    build_index(src, tmp_path / "idx", tokenizer=tmp_path / "big.json", cpus=1)
    manifest = json.loads((tmp_path / "idx" / "rag_gates_index.json").read_text())
    assert manifest["token_dtype"] == "u16" and manifest["vocab_map"] == "vocab_map.u32"
    backend = LocalInfiniGram(tmp_path / "idx")
    backend.verify()
    assert backend.count("w69999").value == 2
    assert backend.count("w65535 w65534").value == 1
    assert backend.count("w3").value == 0  # a token the corpus never used
    assert backend.cooccurrence("w69999", "w5").value == 1
    assert backend.cooccurrence("w5", "w7", scope=1).value == 1
    assert backend.cooccurrence("w5", "w3").value == 0
    for strategy in ("map", "scan"):
        other = LocalInfiniGram(tmp_path / "idx", strategy=strategy)
        assert other.cooccurrence("w69999", "w5 w69999").value == 1
        assert other.cooccurrence("w5", "w3 w7").value == 0


# ------------------------------------------------------------------ hard kills
def _children(pid: int) -> list[tuple[int, str]]:
    """(pid, command line) of the live (not zombie) processes whose parent is ``pid``."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append((int(entry.name), cmd))
    return out


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="uses /proc and prctl")
def test_a_sigkilled_build_leaves_no_indexer_and_its_directory_is_cleaned_next_time(
        tmp_path: Path, tokenizer_path: Path) -> None:
    rows = [{"text": f"Paragraph {i} about Paris and the river number {i * 7}. " * 20}
            for i in range(20_000)]
    src = write_jsonl(tmp_path / "big.jsonl", rows)
    out = tmp_path / "idx"
    code = ("import sys; from rag_gates.corpus import build_index; "
            "build_index(sys.argv[1], sys.argv[2], tokenizer=sys.argv[3], cpus=1)")
    proc = subprocess.Popen([sys.executable, "-c", code, str(src), str(out),
                             str(tokenizer_path)])
    deadline = time.monotonic() + 120
    indexers: list[tuple[int, str]] = []
    while time.monotonic() < deadline and proc.poll() is None:
        indexers = [c for c in _children(proc.pid) if "rust_indexing" in c[1]]
        if indexers:
            break
        time.sleep(0.01)
    if not indexers:
        proc.kill()
        pytest.fail("the build never started its indexer")
    child = indexers[0][0]
    # Stopped, the indexer cannot finish on its own before the check below; SIGKILL (the
    # parent-death signal) still ends a stopped process.
    os.kill(child, signal.SIGSTOP)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    orphaned = _alive(child)
    if orphaned:
        os.kill(child, signal.SIGKILL)
    assert not orphaned, "the indexer outlived the SIGKILLed build"
    stale = [p for p in tmp_path.iterdir() if p.name.startswith(".idx.building-")]
    assert len(stale) == 1  # SIGKILL runs no cleanup: the next build must do it
    small = write_jsonl(tmp_path / "small.jsonl", [{"text": "Paris is in France."}])
    build_index(small, out, tokenizer=tokenizer_path, cpus=1)
    assert not [p for p in tmp_path.iterdir() if ".building-" in p.name]
    assert LocalInfiniGram(out).count("Paris").value == 1


def test_only_build_directories_of_gone_processes_are_removed(tmp_path: Path,
                                                              tokenizer_path: Path) -> None:
    from rag_gates.corpus.build import OWNER_NAME

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()

    def leftover(name: str, pid: int | None, age_s: float = 0.0) -> Path:
        d = tmp_path / name
        d.mkdir()
        (d / "tokenized.0").write_bytes(b"\xff\xff" * 100)
        if pid is not None:
            (d / OWNER_NAME).write_text(json.dumps(build_module._owner_record(pid)))
        if age_s:
            old = time.time() - age_s
            os.utime(d, (old, old))
        return d

    dead = leftover(".idx.building-dead", gone.pid)
    live = leftover(".idx.building-live", os.getpid())  # a build still running here
    other_target = leftover(".other.building-dead", gone.pid)
    unowned_new = leftover(".idx.building-new", None)  # just made, owner not yet written
    unowned_old = leftover(".idx.building-old", None, age_s=2 * 3600)  # from before owners
    src = write_jsonl(tmp_path / "c.jsonl", [{"text": "Paris"}])
    build_index(src, tmp_path / "idx", tokenizer=tokenizer_path, cpus=1)
    assert not dead.exists() and not unowned_old.exists()
    assert live.is_dir() and other_target.is_dir() and unowned_new.is_dir()
    # A recycled pid (same number, another process) does not keep a directory alive.
    reused = leftover(".idx.building-reused", None)
    record = build_module._owner_record(os.getpid())
    record["started"] = -1
    (reused / OWNER_NAME).write_text(json.dumps(record))
    build_index(src, tmp_path / "idx", tokenizer=tokenizer_path, cpus=1, force=True)
    assert not reused.exists() and live.is_dir()
