"""Cost of the content-digest check when a corpus index is opened, on the 22M-token benchmark
index that ``benchmarks/corpus.py`` builds (``--stage prepare`` then ``--stage build``):

    .venv/bin/python benchmarks/corpus_verify.py --index /work/corpus-bench/index \
        --out benchmarks/results/corpus_verify.json

Measured, each over ``--rounds`` rounds (medians):

* ``first_open_warm``: :func:`verify_digests` without the verified-state cache, every file
  in the OS page cache: the CPU cost of SHA-256 over the index;
* ``first_open_cold``: the same after ``posix_fadvise(DONTNEED)`` dropped the files from the
  page cache, so they are read from disk (what a first open after a copy or reboot pays);
* ``read_only_warm``/``read_only_cold``: reading the same files in the same chunks without
  hashing, the floor of the two above;
* ``cached_open``: :func:`verify_digests` with the verified state recorded (one ``stat`` per
  file): what every later open pays;
* ``open_*``: a whole ``LocalInfiniGram`` open with ``check_digests="off"`` and with the
  default check once the state is cached, alternating (their difference is within the noise
  of an open; ``cached_open`` is the check's own cost).

The machine has 2 shared cores; its load average is recorded.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CHUNK = 1 << 18  # hashlib.file_digest's buffer size


def drop_page_cache(paths: list[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_only(paths: list[Path]) -> None:
    buffer = bytearray(CHUNK)
    view = memoryview(buffer)
    for path in paths:
        with path.open("rb", buffering=0) as handle:
            while handle.readinto(view):
                pass


def median_ms(run: Callable[[], Any], rounds: int, before: Callable[[], Any] | None = None
              ) -> dict[str, Any]:
    times = []
    for _ in range(rounds):
        if before is not None:
            before()
        start = time.perf_counter()
        run()
        times.append((time.perf_counter() - start) * 1000.0)
    return {"median_ms": statistics.median(times), "min_ms": min(times), "max_ms": max(times),
            "rounds_ms": times}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--index", type=Path, default=Path("/work/corpus-bench/index"))
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/corpus_verify.json")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    # The verified-state cache lives under RAG_GATES_HOME: a fresh one for this run.
    os.environ["RAG_GATES_HOME"] = tempfile.mkdtemp(prefix="rag-gates-verify-")

    from rag_gates.corpus import LocalInfiniGram
    from rag_gates.corpus.index_format import inspect_index_dir, verify_digests

    files = inspect_index_dir(args.index)
    manifest = files.manifest
    if manifest is None or not manifest.digests:
        sys.exit(f"{args.index} has no digests: rebuild it with benchmarks/corpus.py --stage build")
    paths = [files.directory / name for name in sorted(manifest.digests)]
    size = sum(p.stat().st_size for p in paths)
    gb = size / 1e9
    load = os.getloadavg()
    read_only(paths)  # warm the page cache

    def drop() -> None:
        drop_page_cache(paths)

    results: dict[str, Any] = {
        "first_open_warm": median_ms(lambda: verify_digests(files, use_cache=False), args.rounds),
        "read_only_warm": median_ms(lambda: read_only(paths), args.rounds),
        "first_open_cold": median_ms(lambda: verify_digests(files, use_cache=False),
                                     args.rounds, before=drop),
        "read_only_cold": median_ms(lambda: read_only(paths), args.rounds, before=drop),
    }
    read_only(paths)
    verify_digests(files)  # records the verified state
    results["cached_open"] = median_ms(lambda: verify_digests(files), args.rounds * 20)
    assert verify_digests(files).hashed == []

    # The two opens alternate, so a change of machine load hits both alike.
    opens: dict[str, list[float]] = {"off": [], "verify": []}
    for _ in range(args.rounds * 8):
        for mode, times in opens.items():
            start = time.perf_counter()
            LocalInfiniGram(args.index, check_digests=mode).close()
            times.append((time.perf_counter() - start) * 1000.0)
    for mode, key in (("off", "open_digests_off"), ("verify", "open_digests_cached")):
        times = opens[mode]
        results[key] = {"median_ms": statistics.median(times), "min_ms": min(times),
                        "max_ms": max(times), "rounds": len(times)}
    per_gb = {k: v["median_ms"] / gb for k, v in results.items()
              if k.startswith(("first_open", "read_only"))}
    from importlib.metadata import version

    report = {
        "command": "python benchmarks/corpus_verify.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "load_average_at_start": load,
                    "openssl": __import__("ssl").OPENSSL_VERSION,
                    "rag_gates": version("rag-gates")},
        "index": {"path": str(files.directory), "tokens": manifest.tokens,
                  "files": {p.name: p.stat().st_size for p in paths}, "bytes": size},
        "algorithm": "sha256 (hashlib.file_digest, 256 KiB chunks)",
        "ms_per_gb": per_gb,
        "per_open_overhead_ms": results["open_digests_cached"]["median_ms"]
        - results["open_digests_off"]["median_ms"],
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps({"bytes": size, "ms_per_gb": per_gb,
                      "cached_open_ms": results["cached_open"]["median_ms"],
                      "per_open_overhead_ms": report["per_open_overhead_ms"]}, indent=2))


if __name__ == "__main__":
    main()
