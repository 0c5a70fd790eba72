"""The README's example timings are the committed benchmark's (benchmarks/examples_wall_time.py)."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_readme_lists_the_benchmarked_examples_with_their_measured_cpu_range() -> None:
    text = (ROOT / "README.md").read_text()
    m = re.search(r"`examples/\{llama_index,langchain\}_\{([a-z,]+)\}\.py`:\s+offline, "
                  r"(\d+)-(\d+) s of CPU each on one thread, (\d+)-(\d+) s once their\s+"
                  r"documents' vectors are\s+cached\s+\(`benchmarks/examples_wall_time\.py`\)",
                  text)
    assert m, "the README's runnable-examples sentence changed: update this test with it"
    listed = {f"{fw}_{kind}" for kind in m[1].split(",") for fw in ("llama_index", "langchain")}
    spec = importlib.util.spec_from_file_location(
        "examples_wall_time", ROOT / "benchmarks" / "examples_wall_time.py")
    assert spec and spec.loader
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert set(bench.README_EXAMPLES) == listed
    assert all((ROOT / "examples" / f"{name}.py").is_file() for name in listed)
    results = json.loads((ROOT / "benchmarks/results/examples_wall_time.json").read_text())
    first = {k: r for k, r in results["examples"].items() if k in listed}
    assert set(first) == listed  # the committed run timed every one of them
    assert all(r["returncode"] == 0 for r in results["examples"].values())
    cpu = [r["cpu_seconds"] for r in first.values()]
    assert (int(m[2]), int(m[3])) == (int(min(cpu)), round(max(cpu)))
    # The method examples that found the documents' vectors cached: the second range.
    warm = [r["cpu_seconds"] for r in first.values() if r["embedding_cache"] == "filled"]
    assert sum(r["embedding_cache"] == "empty" for r in first.values()) == 2  # one per framework
    assert (int(m[4]), int(m[5])) == (int(min(warm)), round(max(warm)))
