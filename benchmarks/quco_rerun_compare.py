"""Before/after of the end-to-end ``quco*`` rows of a re-run: the committed run against its
resumed copy, paired on the questions both answered (a re-run stopped part-way is compared
on what it answered).

Usage:
    python benchmarks/quco_rerun_compare.py --before benchmarks/results/eval/2wiki-200 \
        --after /tmp/quco-rerun/2wiki-200 [--before-commit 4e3297b] --out FILE.json

``--before-commit`` reads the committed ``results.jsonl`` from git (the run directory may
already hold the new rows).
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
METHODS = ("quco", "quco-no-precheck", "quco-no-runtime")


def _rows(text: str) -> dict[tuple[str, str], dict[str, Any]]:
    out = {}
    for line in text.splitlines():
        if line.strip():
            row = json.loads(line)
            out[(row["id"], row["method"])] = row
    return out


def compare(before: dict[tuple[str, str], dict[str, Any]],
            after: dict[tuple[str, str], dict[str, Any]]) -> dict[str, Any]:
    """Accuracy, retrievals per question and changed answers per QuCo method, paired."""
    result: dict[str, Any] = {}
    for method in METHODS:
        done = {i for (i, m) in before if m == method}
        ids = [i for (i, m) in after if m == method and i in done]  # the run's order
        if not ids:
            continue
        b = [before[(i, method)] for i in ids]
        a = [after[(i, method)] for i in ids]
        n = len(ids)
        result[method] = {
            "questions": n, "first": ids[0], "last": ids[-1],
            "accuracy_before": round(100 * sum(r["accuracy"] for r in b) / n, 1),
            "accuracy_after": round(100 * sum(r["accuracy"] for r in a) / n, 1),
            "retrievals_per_question_before": round(sum(r["retrievals"] for r in b) / n, 2),
            "retrievals_per_question_after": round(sum(r["retrievals"] for r in a) / n, 2),
            "answers_changed": sum(x["prediction"] != y["prediction"] for x, y in zip(b, a,
                                                                                 strict=True)),
            "right_to_wrong": sum(x["accuracy"] > y["accuracy"] for x, y in zip(b, a,
                                                                              strict=True)),
            "wrong_to_right": sum(x["accuracy"] < y["accuracy"] for x, y in zip(b, a,
                                                                              strict=True)),
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", type=Path, required=True)
    parser.add_argument("--after", type=Path, required=True)
    parser.add_argument("--before-commit", default=None)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    results = args.before / "results.jsonl"
    if args.before_commit:
        rel = results.resolve().relative_to(ROOT)
        text = subprocess.run(["git", "show", f"{args.before_commit}:{rel}"], cwd=ROOT,
                              check=True, capture_output=True, text=True).stdout
    else:
        text = results.read_text(encoding="utf-8")
    out = compare(_rows(text), _rows((args.after / "results.jsonl").read_text("utf-8")))
    existing = json.loads(args.out.read_text()) if args.out.is_file() else {}
    existing[args.before.name] = out
    args.out.write_text(json.dumps(existing, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
