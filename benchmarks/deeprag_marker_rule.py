"""What the marker rule moves: untrained DeepRAG under fail closed against the authors' rule,
paired on the same questions (issue 55; docs/fidelity.md, DeepRAG "What moved").

    .venv/bin/python benchmarks/deeprag_marker_rule.py \\
        --out benchmarks/results/deeprag/marker_rule.json

For each dataset (HotpotQA, 2Wiki): ``DS-200`` holds ``deeprag`` (the fail-closed rule, the
library default: a subquery with no decision marker retrieves) and no-rag;
``DS-200-authors`` holds ``deeprag@authors`` (the authors' rule: only a follow-up ending in
"Let" retrieves). A run still going is compared on the questions both have answered, which
are the dataset's first rows in order (the bench answers them in order), so a partial run is
a prefix of the same 200. Reported per rule on those questions: EM, F1, accuracy, retrievals
and model calls per question, and how the retrieval decisions were taken (marker written,
no marker under each rule); the exact McNemar test on accuracy and EM; and the knowledge
boundary (DeepRAG's Table 3: retrieved at least once against the no-rag answer being wrong).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from rag_gates_lab.boundary import boundary_by_method
from rag_gates_lab.runner import RunRecord, read_records

RESULTS = Path("benchmarks/results/deeprag")
RULES = {"fail_closed": ("", "deeprag"), "authors": ("-authors", "deeprag@authors")}


def mcnemar_p(only_first: int, only_second: int) -> float:
    """Exact two-sided McNemar p-value (as benchmarks/deeprag_trained.py)."""
    n = only_first + only_second
    if n == 0:
        return 1.0
    k = min(only_first, only_second)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


def decisions(rows: list[RunRecord]) -> dict[str, int]:
    """The run's per-subquery decisions by what decided them."""
    counts: Counter[str] = Counter()
    for r in rows:
        for e in r.trace.get("events", []):
            if e["kind"] != "decision":
                continue
            d = e["data"]
            written = (d.get("evidence") or {}).get("written")
            verb = "retrieve" if d.get("retrieve") else "direct"
            why = "no_marker" if written is None else "marker"
            counts[f"{verb}_{why}"] += 1
    return dict(sorted(counts.items()))


def summary(rows: list[RunRecord]) -> dict[str, Any]:
    n = len(rows)
    return {"questions": n,
            "em": round(100 * sum(r.em for r in rows) / n, 2),
            "f1": round(100 * sum(r.f1 for r in rows) / n, 2),
            "accuracy": round(100 * sum(r.accuracy for r in rows) / n, 2),
            "retrievals_per_question": round(sum(r.retrievals for r in rows) / n, 3),
            "llm_calls_per_question": round(sum(r.llm_calls for r in rows) / n, 3),
            "retrievals": sum(r.retrievals for r in rows),
            "questions_retrieving": sum(r.retrievals > 0 for r in rows),
            "decisions": decisions(rows)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    report: dict[str, Any] = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                              "datasets": {}}
    for dataset in ("hotpotqa", "2wiki"):
        runs: dict[str, dict[str, RunRecord]] = {}
        base = read_records(args.results / f"{dataset}-200")
        for rule, (suffix, method) in RULES.items():
            directory = args.results / f"{dataset}-200{suffix}"
            if directory.is_dir():
                runs[rule] = {r.id: r for r in read_records(directory) if r.method == method}
        if len(runs) < 2:
            continue
        ids = [r.id for r in base if r.method == "deeprag" and r.id in runs["authors"]]
        entry: dict[str, Any] = {"questions": len(ids),
                                 "rules": {rule: summary([rows[i] for i in ids])
                                           for rule, rows in runs.items()}}
        for metric in ("accuracy", "em"):
            only_authors = sum(getattr(runs["authors"][i], metric) >= 1 >
                               getattr(runs["fail_closed"][i], metric) for i in ids)
            only_fail_closed = sum(getattr(runs["fail_closed"][i], metric) >= 1 >
                                   getattr(runs["authors"][i], metric) for i in ids)
            entry[f"{metric}_only_authors_right"] = only_authors
            entry[f"{metric}_only_fail_closed_right"] = only_fail_closed
            entry[f"{metric}_mcnemar_p"] = round(mcnemar_p(only_authors, only_fail_closed), 4)
        closed_book = [r for r in base if r.method == "no-rag" and r.id in set(ids)]
        labelled = [runs[rule][i].model_copy(update={"method": rule})
                    for rule in runs for i in ids]
        entry["boundary"] = {name: a.as_dict() for name, a in
                             boundary_by_method(closed_book + labelled).items()}
        entry["no_rag"] = summary([r for r in base if r.method == "no-rag" and r.id in set(ids)])
        report["datasets"][dataset] = entry
        for rule, s in entry["rules"].items():
            mcc = entry["boundary"][rule]["mcc"]
            print(f"{dataset} {rule} on {s['questions']}: EM {s['em']:.1f} F1 {s['f1']:.1f} "
                  f"acc {s['accuracy']:.1f} retrievals/q {s['retrievals_per_question']:.2f} "
                  f"calls/q {s['llm_calls_per_question']:.2f} MCC "
                  f"{'n/a' if mcc is None else format(mcc, '.3f')} {s['decisions']}")
        print(f"{dataset} accuracy McNemar p {entry['accuracy_mcnemar_p']} "
              f"({entry['accuracy_only_authors_right']} / "
              f"{entry['accuracy_only_fail_closed_right']}), EM p {entry['em_mcnemar_p']}")
    args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
