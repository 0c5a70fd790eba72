"""End to end under noisy retrieval (Tok-RAG paper, Table 1 protocol) on HotpotQA.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tokrag_noisy.py --n 200 \\
        --out benchmarks/results/tokrag_noisy.json

For the first ``--n`` HotpotQA rows, five passages per question with 0%, 60% or 100% of them
distractors (the row's own HotpotQA distractor paragraphs, ready-made hard negatives):

* 0%: the two gold paragraphs plus the three best BM25 paragraphs of the union corpus that
  are not among the row's own ten (so no hard negative);
* 60%: the two gold paragraphs plus three of the row's distractors;
* 100%: five of the row's distractors;

shuffled with a seed per row. Methods, all through the bench registry with a retriever that
returns exactly those passages: ``no-rag`` (once per question), ``single`` (standard RAG),
``cad`` (alpha 0.5), ``adacad`` and ``tokrag``; greedy, ``--max-new-tokens`` (48). Scores are
the bench's (``rag_gates.answers.score_answer``: EM, F1, containment accuracy).

Resumable: every answer is appended to ``--cache`` (JSONL keyed by row id, share and method);
rerun the same command to continue, ``--summary-only`` to write the table from what is done
(only questions finished for every share and method count).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import random
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from rag_gates.answers import score_answer
from rag_gates.methods import MethodContext, make_method
from rag_gates.retrieval.base import BaseRetriever
from rag_gates.types import Passage, QAExample
from rag_gates_lab.corpus import load_retriever
from rag_gates_lab.datasets import load_dataset

ROOT = Path(__file__).resolve().parent.parent
SHARES = (0, 60, 100)
RAG_METHODS = ("single", "cad", "adacad", "tokrag")
# The committed answers ran the paper's judge (the default before issue 34); the
# label "tokrag" keeps naming it so the cache resumes.
SPECS = {"tokrag": "tokrag@paper"}


class FixedPassages(BaseRetriever):
    """Returns the passages set for the current question (the experiment's controlled top-5)."""

    name = "fixed"

    def __init__(self) -> None:
        self.passages: list[Passage] = []

    def retrieve(self, query: str, k: int = 3) -> list[Passage]:
        return list(self.passages[:k])


def passages_for(example: QAExample, share: int, bm25: Any, seed: int) -> list[Passage]:
    gold = [p for p in example.context if p.title in example.supporting_titles][:2]
    hard = [p for p in example.context if p.title not in example.supporting_titles]
    if share == 100:
        chosen = hard[:5]
    elif share == 60:
        chosen = gold + hard[:3]
    else:
        own = {(p.title, p.text) for p in example.context}
        fill = [p for p in bm25.retrieve(example.question, 20) if (p.title, p.text) not in own]
        chosen = gold + fill[:3]
    chosen = list(chosen)
    random.Random(seed).shuffle(chosen)
    return chosen


def summarise(rows: list[dict[str, Any]], examples: list[QAExample],
              methods: tuple[str, ...] = RAG_METHODS) -> dict[str, Any]:
    keys = {(r["id"], r["share"], r["method"]) for r in rows}
    complete = [e.id for e in examples
                if (e.id, None, "no-rag") in keys
                and all((e.id, s, m) in keys for s in SHARES for m in methods)]
    done = set(complete)
    table: dict[str, dict[str, dict[str, float]]] = {}
    for method in ("no-rag", *methods):
        for share in (None,) if method == "no-rag" else SHARES:
            picked = [r for r in rows if r["method"] == method and r["share"] == share
                      and r["id"] in done]
            if not picked:
                continue
            table.setdefault(method, {})["any" if share is None else f"{share}%"] = {
                m: round(100 * statistics.fmean(r[m] for r in picked), 1)
                for m in ("accuracy", "em", "f1")}
    return {"questions_complete": len(complete), "table": table}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--cache", type=Path,
                        default=ROOT / "benchmarks/results/tokrag_noisy_answers.jsonl")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/tokrag_noisy.json")
    parser.add_argument("--summary-only", action="store_true")
    parser.add_argument("--methods", default=",".join(RAG_METHODS),
                        help="bench methods beside no-rag (e.g. add tokrag@authors; "
                             "'tokrag' is the paper judge the committed table ran)")
    args = parser.parse_args()
    rag_methods = tuple(m.strip() for m in args.methods.split(",") if m.strip())
    examples = load_dataset("hotpotqa", n=args.n).examples
    rows: list[dict[str, Any]] = []
    if args.cache.exists():
        rows = [json.loads(line) for line in args.cache.read_text().splitlines() if line]
    if not args.summary_only:
        torch.set_num_threads(1)
        from rag_gates.lm import load_default_lm

        lm = load_default_lm()
        bm25 = load_retriever("hotpotqa")
        fixed = FixedPassages()
        ctx = MethodContext(lm=lm, retriever=fixed, dataset="hotpotqa", k=5,
                            max_new_tokens=args.max_new_tokens)
        methods = {name: make_method(SPECS.get(name, name), ctx)
                   for name in ("no-rag", *rag_methods)}
        done = {(r["id"], r["share"], r["method"]) for r in rows}
        start = time.perf_counter()
        with args.cache.open("a") as cache:
            for i, example in enumerate(examples):
                plan = [(None, "no-rag")] + [(s, m) for s in SHARES for m in rag_methods]
                for share, name in plan:
                    if (example.id, share, name) in done:
                        continue
                    if share is not None:
                        fixed.passages = passages_for(example, share, bm25, seed=i)
                    t0 = time.perf_counter()
                    result = methods[name].answer(example.question)
                    row = {"id": example.id, "share": share, "method": name,
                           "answer": result.answer, "seconds": time.perf_counter() - t0,
                           **score_answer(result.answer, example.answers, "hotpotqa")}
                    rows.append(row)
                    cache.write(json.dumps(row) + "\n")
                    cache.flush()
                print(f"{i + 1}/{len(examples)} questions, "
                      f"{time.perf_counter() - start:.0f}s", flush=True)
    payload = {
        "command": f"OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tokrag_noisy.py --n {args.n} "
                   f"--max-new-tokens {args.max_new_tokens}"
                   + ("" if rag_methods == RAG_METHODS else
                      f" --methods {','.join(rag_methods)} --out {args.out.name}")
                   + ("" if args.cache.name == "tokrag_noisy_answers.jsonl" else
                      f" --cache {args.cache.name}"),
        "date": dt.date.today().isoformat(), "machine": platform.platform(),
        "dataset": "hotpotqa (dev, file order)", "questions_planned": len(examples),
        "passages": 5, "shares": list(SHARES), **summarise(rows, examples, rag_methods),
    }
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(args.out)
    print(json.dumps(payload["table"], indent=1))


if __name__ == "__main__":
    main()
