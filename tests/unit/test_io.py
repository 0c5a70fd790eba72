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


def test_a_waiting_writer_gets_the_file_when_the_first_closes(tmp_path: Path) -> None:
    import threading

    path = tmp_path / "labels.jsonl"
    first = append_locked(path)
    with pytest.raises(FileInUseError, match=r"another process \(waited 0 s\)"):
        append_locked(path, wait_s=0.3)
    waits: list[str] = []
    threading.Timer(0.5, first.close).start()
    second = append_locked(path, wait_s=30, on_wait=lambda: waits.append("waiting"))
    second.write("row\n")
    second.close()
    assert waits == ["waiting"] and path.read_text() == "row\n"  # told once, then written


def test_concurrent_atomic_writes_of_one_file_all_succeed(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from rag_gates._io import write_text_atomic

    path = tmp_path / "config.json"

    def write(i: int) -> None:
        for _ in range(200):
            write_text_atomic(path, json.dumps({"writer": i}))

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(write, range(4)))  # a shared temporary name renames another's away
    assert json.loads(path.read_text())["writer"] in range(4)
    assert [p.name for p in tmp_path.iterdir()] == ["config.json"]  # no temporary left


def test_a_bad_line_before_the_last_is_refused_not_dropped(tmp_path: Path) -> None:
    """A run's results read by report, eval-gate's labels and the composite's fit: before,
    every unreadable line was dropped with a warning, so the figures covered fewer
    questions than the run answered; now only the torn last line is."""
    import shutil

    from rag_gates_lab.runner import RESULTS, read_records

    run = tmp_path / "run"
    shutil.copytree(Path(__file__).parents[2] / "benchmarks/results/testbed/e2e-tb13", run,
                    ignore=shutil.ignore_patterns("report"))
    lines = (run / RESULTS).read_text(encoding="utf-8").splitlines()
    whole = read_records(run)
    assert len(whole) == len(lines) > 3
    (run / RESULTS).write_text("\n".join(lines) + '\n{"dataset": "testbed", "id', "utf-8")
    assert read_records(run) == whole  # the interrupted write is ignored
    old_schema = json.loads(lines[1])
    del old_schema["prediction"]
    lines[1] = json.dumps(old_schema)
    (run / RESULTS).write_text("\n".join(lines) + "\n", "utf-8")
    with pytest.raises(ArtifactError, match=rf"{RESULTS}:2 is not a run record"):
        read_records(run)
