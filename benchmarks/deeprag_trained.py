"""Is the trained DeepRAG better than the untrained loop? Paired figures on the same questions.

    .venv/bin/python benchmarks/deeprag_trained.py \\
        --out benchmarks/results/deeprag/trained_vs_untrained.json

For each dataset (HotpotQA, 2Wiki), the bench runs of ``benchmarks/results/deeprag/`` hold the
untrained ``deeprag`` (``DS-200``), the SFT model (``DS-200-sft``) and the SFT+DPO model
(``DS-200-sft-dpo``) on the same 200 questions. Reported per trained model against the
untrained loop, on the questions both answered:

- accuracy, EM and retrievals per question of each, and the exact McNemar test (two-sided
  binomial on the questions where exactly one of the two is right): at 200 questions a
  difference of a few questions is noise, and the p-value says how much;
- the knowledge boundary (DeepRAG's Table 3) of every DeepRAG run against the *base* model's
  closed-book answers (``no-rag`` in ``DS-200``): the trained models have no closed-book run
  of their own, so this asks whether they retrieve where the model they were trained from
  could not answer;
- on 2Wiki's comparison questions ("..., A or B?"), how many correct answers name both
  options: the bench's accuracy (gold contained in the reply) credits such a reply, EM does
  not, which is why no-rag's accuracy there is above ``single``'s.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import re
from pathlib import Path
from typing import Any

from rag_gates_lab.boundary import boundary_by_method
from rag_gates_lab.runner import RunRecord, read_records

RESULTS = Path("benchmarks/results/deeprag")
COMPARISON = re.compile(r",\s*(.+?)\s+or\s+(.+?)\?$")


def mcnemar_p(only_first: int, only_second: int) -> float:
    """Exact two-sided McNemar p-value: the discordant pairs as fair coin flips."""
    n = only_first + only_second
    if n == 0:
        return 1.0
    k = min(only_first, only_second)
    tail = sum(math.comb(n, i) for i in range(k + 1)) / 2**n
    return min(1.0, 2 * tail)


def by_id(records: list[RunRecord], method: str) -> dict[str, RunRecord]:
    return {r.id: r for r in records if r.method == method}


def summary(rows: list[RunRecord]) -> dict[str, float]:
    n = len(rows)
    return {"accuracy": 100 * sum(r.accuracy for r in rows) / n,
            "em": 100 * sum(r.em for r in rows) / n,
            "retrievals_per_question": sum(r.retrievals for r in rows) / n,
            "llm_calls_per_question": sum(r.llm_calls for r in rows) / n}


def paired(untrained: dict[str, RunRecord], trained: dict[str, RunRecord]) -> dict[str, Any]:
    ids = sorted(set(untrained) & set(trained))
    out: dict[str, Any] = {"questions": len(ids),
                           "untrained": summary([untrained[i] for i in ids]),
                           "trained": summary([trained[i] for i in ids])}
    for metric in ("accuracy", "em"):
        only_trained = sum(getattr(trained[i], metric) >= 1 > getattr(untrained[i], metric)
                           for i in ids)
        only_untrained = sum(getattr(untrained[i], metric) >= 1 > getattr(trained[i], metric)
                             for i in ids)
        out[f"{metric}_only_trained_right"] = only_trained
        out[f"{metric}_only_untrained_right"] = only_untrained
        out[f"{metric}_mcnemar_p"] = mcnemar_p(only_trained, only_untrained)
    return out


def names_both(runs: dict[str, list[RunRecord]]) -> dict[str, dict[str, int]]:
    """Per run label: comparison questions, correct answers, correct answers naming both
    options."""
    out: dict[str, dict[str, int]] = {}
    for label, r in ((label, r) for label, records in runs.items() for r in records):
        match = COMPARISON.search(r.question)
        if not match:
            continue
        a, b = match.group(1).casefold(), match.group(2).casefold()
        row = out.setdefault(label, {"comparison_questions": 0, "correct": 0,
                                        "correct_naming_both": 0})
        row["comparison_questions"] += 1
        if r.accuracy >= 1:
            row["correct"] += 1
            text = r.prediction.casefold()
            row["correct_naming_both"] += a in text and b in text
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    report: dict[str, Any] = {"date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
                              "datasets": {}}
    for dataset in ("hotpotqa", "2wiki"):
        base = read_records(args.results / f"{dataset}-200")
        untrained = by_id(base, "deeprag")
        entry: dict[str, Any] = {"boundary_against_base_closed_book": {}, "paired": {}}
        runs = {"untrained": untrained}
        for name in ("sft", "sft-dpo"):
            directory = args.results / f"{dataset}-200-{name}"
            if directory.is_dir():
                runs[name] = by_id(read_records(directory), "deeprag")
                entry["paired"][name] = paired(untrained, runs[name])
        # Each run's records under its own name, so the shared rule pools them against the
        # base model's no-rag answers.
        labelled = [r.model_copy(update={"method": name})
                    for name, records in runs.items() for r in records.values()]
        closed_book = [r for r in base if r.method == "no-rag"]
        entry["boundary_against_base_closed_book"] = {
            name: a.as_dict() for name, a in boundary_by_method(closed_book + labelled).items()}
        if dataset == "2wiki":
            by_label: dict[str, list[RunRecord]] = {}
            for r in [x for x in base if x.method != "deeprag"] + labelled:
                by_label.setdefault(r.method, []).append(r)
            entry["comparison_answers"] = names_both(by_label)
        report["datasets"][dataset] = entry
        if "sft" in runs and "sft-dpo" in runs:  # how far DPO moved the SFT model's answers
            entry["sft_dpo_answers_differing_from_sft"] = sum(
                runs["sft-dpo"][i].prediction != runs["sft"][i].prediction
                for i in runs["sft-dpo"] if i in runs["sft"])
        for name, p in entry["paired"].items():
            print(f"{dataset} {name} vs untrained on {p['questions']}: accuracy "
                  f"{p['trained']['accuracy']:.1f} vs {p['untrained']['accuracy']:.1f} "
                  f"(McNemar p {p['accuracy_mcnemar_p']:.3f}), EM {p['trained']['em']:.1f} vs "
                  f"{p['untrained']['em']:.1f} (p {p['em_mcnemar_p']:.3f}), retrievals "
                  f"{p['trained']['retrievals_per_question']:.2f} vs "
                  f"{p['untrained']['retrievals_per_question']:.2f}")
        for name, a in entry["boundary_against_base_closed_book"].items():
            mcc = "n/a" if a["mcc"] is None else f"{a['mcc']:.3f}"
            print(f"{dataset} {name}: boundary MCC against the base model's closed book {mcc}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
