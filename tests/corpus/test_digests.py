"""Content digests: damage that keeps every file's size is refused when an index is opened.

Each case damages a copy of the real-text index the way disk faults or stray edits do (one
token flipped, two suffix-array entries swapped) and first shows, with the digest check off,
that the damage really changes counts; then that an open with the default check refuses it
with an error naming the file and the rebuild command.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

import pytest

from rag_gates.corpus import CorruptIndexError, LocalInfiniGram
from rag_gates.corpus.index_format import MANIFEST_NAME, read_manifest

PHRASE = "Tom AND Jerry"  # occurs literally in exactly two documents of the fixture index


@pytest.fixture()
def damaged_copy(wiki_index: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "idx"
    shutil.copytree(wiki_index, copy)
    return copy


def _first_match(index: Path) -> tuple[LocalInfiniGram, tuple[int, ...], int, int]:
    """The index, the ids of PHRASE's leading-space variant, its first byte offset in
    tokenized.0 and its first suffix-array rank."""
    backend = LocalInfiniGram(index, check_digests="off")
    ids = tuple(backend.tokenizer.encode(" " + PHRASE))
    needle = b"".join(i.to_bytes(2, "little") for i in ids)
    data = (index / "tokenized.0").read_bytes()
    at = data.find(needle)
    while at % 2:
        at = data.find(needle, at + 1)
    lo, _ = backend._shards[0].find(needle)
    return backend, ids, at, lo


def _flip_token(index: Path, at: int, new_id: int) -> None:
    path = index / "tokenized.0"
    with path.open("r+b") as handle:
        handle.seek(at)
        handle.write(new_id.to_bytes(2, "little"))


def _swap_entries(index: Path, a: int, b: int, ptr_size: int) -> None:
    path = index / "table.0"
    data = bytearray(path.read_bytes())
    ea, eb = data[a * ptr_size:(a + 1) * ptr_size], data[b * ptr_size:(b + 1) * ptr_size]
    data[a * ptr_size:(a + 1) * ptr_size], data[b * ptr_size:(b + 1) * ptr_size] = eb, ea
    path.write_bytes(bytes(data))


def test_the_build_records_a_sha256_of_every_file(wiki_index: Path) -> None:
    manifest = read_manifest(wiki_index)
    assert manifest is not None
    names = {p.name for p in wiki_index.iterdir() if p.is_file()} - {MANIFEST_NAME}
    assert set(manifest.digests) == names == set(manifest.files)
    for name, digest in manifest.digests.items():
        assert digest == "sha256:" + hashlib.sha256((wiki_index / name).read_bytes()).hexdigest()


def test_a_flipped_token_is_refused_at_open(damaged_copy: Path) -> None:
    with LocalInfiniGram(damaged_copy) as whole:  # verified once, state cached
        truth = whole.count(PHRASE).value
    assert truth == 2
    backend, _, at, _ = _first_match(damaged_copy)
    backend.close()
    size = (damaged_copy / "tokenized.0").stat().st_size
    _flip_token(damaged_copy, at, backend.tokenizer.encode(" Paris")[0])
    assert (damaged_copy / "tokenized.0").stat().st_size == size
    with LocalInfiniGram(damaged_copy, check_digests="off") as unchecked:
        assert unchecked.count(PHRASE).value != truth  # the damage changes answers
    with pytest.raises(CorruptIndexError) as caught:
        LocalInfiniGram(damaged_copy)
    message = str(caught.value)
    assert str(damaged_copy / "tokenized.0") in message
    assert "rag-gates index build" in message and "--force" in message


def test_two_swapped_suffix_array_entries_are_refused_at_open(damaged_copy: Path) -> None:
    backend, _, _, lo = _first_match(damaged_copy)
    ptr_size = backend.files.shards[0].ptr_size
    far = (lo + backend.files.tokens // 2) % backend.files.tokens
    backend.close()
    _swap_entries(damaged_copy, lo, far, ptr_size)
    with LocalInfiniGram(damaged_copy, check_digests="off") as unchecked:
        assert unchecked.count(PHRASE).value != 2
    with pytest.raises(CorruptIndexError, match=r"table\.0.*rag-gates index build"):
        LocalInfiniGram(damaged_copy)


def test_the_verified_state_is_cached_by_size_and_mtime(damaged_copy: Path) -> None:
    first = LocalInfiniGram(damaged_copy)
    names = set(first.digest_check.hashed)
    assert names == set(read_manifest(damaged_copy).digests)  # type: ignore[union-attr]
    assert first.digest_check.trusted == []
    second = LocalInfiniGram(damaged_copy)
    assert second.digest_check.hashed == [] and set(second.digest_check.trusted) == names
    # A file whose mtime moves is hashed again (here its content is unchanged: accepted).
    st = (damaged_copy / "offset.0").stat()
    os.utime(damaged_copy / "offset.0", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    third = LocalInfiniGram(damaged_copy)
    assert third.digest_check.hashed == ["offset.0"]
    # The deep check (`index stats --verify`) hashes everything again, cache or not.
    assert set(third.verify().hashed) == names
    for backend in (first, second, third):
        backend.close()


def test_damage_after_a_cached_verification_is_still_found(damaged_copy: Path) -> None:
    LocalInfiniGram(damaged_copy).close()
    backend, _, at, _ = _first_match(damaged_copy)
    backend.close()
    st = (damaged_copy / "tokenized.0").stat()
    _flip_token(damaged_copy, at, 0)
    # Even with the old mtime put back, the change time (which utime cannot set) moved.
    os.utime(damaged_copy / "tokenized.0", ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(CorruptIndexError, match=r"tokenized\.0"):
        LocalInfiniGram(damaged_copy)


def _strip_digests(index: Path) -> None:
    path = index / MANIFEST_NAME
    data = json.loads(path.read_text())
    del data["digests"]
    path.write_text(json.dumps(data))


def test_an_index_built_before_digests_opens_with_a_warning_or_is_refused_on_request(
        damaged_copy: Path, caplog: pytest.LogCaptureFixture) -> None:
    _strip_digests(damaged_copy)
    with caplog.at_level(logging.WARNING, logger="rag_gates.corpus"):
        backend = LocalInfiniGram(damaged_copy)
    assert backend.count(PHRASE).value == 2
    assert backend.digest_check.hashed == [] and backend.digest_check.trusted == []
    assert any("no content digests" in r.getMessage() and "rag-gates index build" in
               r.getMessage() for r in caplog.records)
    backend.close()
    with pytest.raises(CorruptIndexError, match=r"no content digests.*rag-gates index build"):
        LocalInfiniGram(damaged_copy, check_digests="require")


def test_a_missing_file_listed_in_the_digests_is_refused(damaged_copy: Path) -> None:
    (damaged_copy / "metaoff.0").unlink()
    (damaged_copy / "metadata.0").unlink()
    with pytest.raises(CorruptIndexError, match=r"metaoff\.0|metadata\.0"):
        LocalInfiniGram(damaged_copy)


def test_a_verified_state_that_cannot_be_written_leaves_no_temporary_file(
        tmp_path: Path) -> None:
    """Recording the verified state is best effort (verifying again next time), but a
    failed write must not leave its temporary file behind in the checks folder."""
    from rag_gates.corpus.index_format import _read_state, _write_state

    checks = tmp_path / "index-checks"
    state = checks / "some-index.json"
    (state / "in-the-way").mkdir(parents=True)  # the rename onto it fails (a directory)
    _write_state(state, tmp_path / "index", {"a.bin": [1, 2, 3]})
    assert sorted(p.name for p in checks.iterdir()) == ["some-index.json"]
    _write_state(checks / "other.json", tmp_path / "index", {"a.bin": [1, 2, 3]})  # works
    assert _read_state(checks / "other.json", tmp_path / "index") == {"a.bin": [1, 2, 3]}
