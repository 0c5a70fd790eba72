"""Which committed QuCo bench rows would a change of the heuristic extractor move?

Replays the extractor of two commits (``--before``, default the commit before the fix that
keeps subtitles and title appositions whole, and the working tree) on the committed
``rag-gates bench`` rows of QuCo's methods: the entities of each question (the pre-check's
input) and the claims of each final answer (the runtime verifier's input). No model runs:
extraction is text only, so a row whose question entities and answer claims are the same
under both extractors was decided on the same inputs. What it cannot see: the rejected
texts of multi-round rows (the bench does not record them), so those are counted apart.

    python benchmarks/quco_extractor_replay.py --out benchmarks/results/quco_extractor_replay.json

``--run DIR`` (repeatable) replays other bench directories instead, e.g. the testbed's
end-to-end runs (``benchmarks/results/testbed/e2e-tb11``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from collections import Counter
from io import BytesIO
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("benchmarks/results/eval/hotpotqa-200", "benchmarks/results/eval/2wiki-200")
BEFORE = "391f6b8~1"  # the commit before "the heuristic extractor keeps subjects whole"


def extract_rows(runs: list[str]) -> dict[str, dict[str, object]]:
    """Question entities and answer claims of every QuCo row, by the importable extractor."""
    from rag_gates.extract.heuristic import HeuristicExtractor
    from rag_gates.extract.sentences import split_sentences

    extractor = HeuristicExtractor()
    out: dict[str, dict[str, object]] = {}
    for run in runs:
        for line in (ROOT / run / "results.jsonl").read_text().splitlines():
            row = json.loads(line)
            if not row["method"].startswith("quco"):
                continue
            claims = [repr(c) for s in split_sentences(row["prediction"])
                      for c in extractor.claims(s)]
            out[f"{Path(run).name}/{row['method']}/{row['id']}"] = {
                "entities": extractor.entities(row["question"]), "claims": claims,
                "multi_round": row["llm_calls"] > 1}
    return out


def rows_at(commit: str, runs: list[str]) -> dict[str, dict[str, object]]:
    """``extract_rows`` with the package as it was at ``commit`` (in a subprocess)."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit, "rag_gates"],
                             check=True, capture_output=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        with tarfile.open(fileobj=BytesIO(archive)) as tar:
            tar.extractall(tmp, filter="data")
        env = {**os.environ, "PYTHONPATH": tmp}
        done = subprocess.run([sys.executable, __file__, "--child", *runs], check=True,
                              capture_output=True, text=True, env=env, cwd=tmp)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=BEFORE)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--run", action="append", help="A bench directory (relative to the "
                        "repository; repeatable); default: the Wikipedia benchmark's runs.")
    parser.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        print(json.dumps(extract_rows(args.child)))
        return
    runs = args.run or list(RUNS)
    before, after = rows_at(args.before, runs), extract_rows(runs)
    counts: Counter[str] = Counter()
    changed: list[dict[str, object]] = []
    for key, old in before.items():
        new = after[key]
        run, method, _ = key.split("/")
        group = f"{run}/{method}"
        counts[f"{group}: rows"] += 1
        counts[f"{group}: multi-round"] += bool(old["multi_round"])
        for field in ("entities", "claims"):
            if old[field] != new[field]:
                counts[f"{group}: {field} differ"] += 1
                changed.append({"row": key, "field": field, "before": old[field],
                                "after": new[field]})
    result = {"before": args.before, "runs": runs, "counts": dict(sorted(counts.items())),
              "changed": changed}
    text = json.dumps(result, indent=2, ensure_ascii=False)
    if args.out:
        args.out.write_text(text + "\n")
    print(json.dumps(result["counts"], indent=2))


if __name__ == "__main__":
    main()
