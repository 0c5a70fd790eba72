"""The shared file helpers: a torn last line is cut, whole lines are kept, and a second
writer of one output is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag_gates._io import JsonlLog, append_locked, drop_torn_tail
from rag_gates.errors import ArtifactError, FileInUseError


def test_drop_torn_tail_cuts_only_an_unterminated_last_line(tmp_path: Path) -> None:
    path = tmp_path / "rows.jsonl"
    assert drop_torn_tail(path) is False  # missing: left alone
    path.write_bytes(b'{"id": 1}\n{"id": 2}\n')
    assert drop_torn_tail(path) is False
    assert path.read_bytes() == b'{"id": 1}\n{"id": 2}\n'
    path.write_bytes(b'{"id": 1}\n{"id": 2}\n{"id": ')
    assert drop_torn_tail(path) is True
    assert path.read_bytes() == b'{"id": 1}\n{"id": 2}\n'
    path.write_bytes(b'{"id"')  # only a torn first line: nothing whole remains
    assert drop_torn_tail(path) is True
    assert path.read_bytes() == b""


def test_jsonl_log_resumes_after_a_torn_write(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    with JsonlLog(path, {"model": "m"}) as log:
        assert log.open() == []
        log.append({"id": "a"})
    with path.open("a", encoding="utf-8") as handle:
        handle.write('{"id": "b", "fou')  # interrupted mid-record
    with JsonlLog(path, {"model": "m"}) as log:
        assert log.open() == [{"id": "a"}]
        log.append({"id": "b"})
    lines = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]
    assert lines == [{"header": {"model": "m"}}, {"id": "a"}, {"id": "b"}]
    with pytest.raises(ArtifactError, match="other settings"):
        JsonlLog(path, {"model": "other"}).open()


def test_a_second_writer_is_refused_until_the_first_closes(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl"
    first = append_locked(path)
    try:
        with pytest.raises(FileInUseError, match="another process"):
            append_locked(path)
    finally:
        first.close()
    append_locked(path).close()
