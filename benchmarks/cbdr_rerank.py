"""Rank the 10 paragraphs of HotpotQA distractor questions: do the 2 gold ones come first?

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cbdr_rerank.py \\
        --reranker ~/.cache/rag-gates/rerankers/smollm2-cbdr \\
        --out benchmarks/results/cbdr_rerank.json

Rows ``--offset`` .. ``--offset + --n`` of the HotpotQA dev (distractor) file (default 0-199:
the benchmark questions, held apart from the rows 500+ that trained the probe and the
reranker). Each question's candidates are its own 10 context paragraphs (2 supporting, 8
distractors), in the file's order. Rankers:

* ``confidence-gain``: zero-shot CBDR, ``Conf(q + c) - Conf(q)`` with the shipped probe on the
  embedded SmolLM2-135M-Instruct;
* ``cross-encoder-ft``: the cross-encoder fine-tuned on Inc preferences (``--reranker``;
  skipped when not given);
* ``bm25``: BM25 (bm25s) over the 10 paragraphs;
* ``minilm-cosine``: cosine of the embedded all-MiniLM-L6-v2 embeddings.

P@1 = the top paragraph is gold; P@2 = share of gold among the top 2; MRR = 1 / rank of the
first gold paragraph. Cost: wall seconds per question to rank its 10 paragraphs (median, one
thread), and the ratio to MiniLM cosine measured on the same questions in the same run.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from rag_gates.cbdr import ConfidenceGainReranker, CrossEncoderReranker, load_default_probe
from rag_gates.lm import load_default_lm
from rag_gates.lm.defaults import load_default_embedder
from rag_gates.retrieval.bm25 import BM25Retriever
from rag_gates.types import Passage
from rag_gates_lab.datasets import QAExample, load_dataset

ROOT = Path(__file__).resolve().parent.parent
Ranker = Callable[[str, Sequence[Passage]], list[int]]


def metrics(order: list[int], gold: set[int]) -> dict[str, float]:
    first = next((rank for rank, i in enumerate(order, start=1) if i in gold), None)
    return {"p@1": float(order[0] in gold), "p@2": sum(i in gold for i in order[:2]) / 2,
            "mrr": 1.0 / first if first else 0.0}


def bm25_ranker(query: str, passages: Sequence[Passage]) -> list[int]:
    tagged = [p.model_copy(update={"id": str(i)}) for i, p in enumerate(passages)]
    hits = BM25Retriever.from_passages(tagged).retrieve(query, len(tagged))
    seen = [int(p.id or 0) for p in hits]
    return seen + [i for i in range(len(passages)) if i not in seen]  # zero-score ones last


def cosine_ranker(embedder: Any) -> Ranker:
    def rank(query: str, passages: Sequence[Passage]) -> list[int]:
        texts = [f"{p.title}\n{p.text}" for p in passages]
        q = embedder.encode([query], normalize_embeddings=True, convert_to_tensor=True)
        d = embedder.encode(texts, normalize_embeddings=True, convert_to_tensor=True)
        scores = (d @ q[0]).tolist()
        return sorted(range(len(passages)), key=lambda i: -scores[i])
    return rank


def reranker_ranker(reranker: Any) -> Ranker:
    def rank(query: str, passages: Sequence[Passage]) -> list[int]:
        return [s.index for s in reranker.rerank(query, passages).ranked]
    return rank


def run(examples: Sequence[QAExample], rankers: dict[str, Ranker]) -> dict[str, Any]:
    per: dict[str, list[dict[str, float]]] = {name: [] for name in rankers}
    seconds: dict[str, list[float]] = {name: [] for name in rankers}
    for n, ex in enumerate(examples, start=1):
        gold = {i for i, p in enumerate(ex.context) if p.title in set(ex.supporting_titles)}
        if len(gold) != 2 or len(ex.context) != 10:
            continue
        for name, ranker in rankers.items():  # same question, every ranker, back to back
            start = time.perf_counter()
            order = ranker(ex.question, ex.context)
            seconds[name].append(time.perf_counter() - start)
            per[name].append(metrics(order, gold))
        if n % 20 == 0:
            print(n, {k: round(statistics.mean(m["p@1"] for m in v), 3)
                      for k, v in per.items()}, flush=True)
    base = statistics.median(seconds["minilm-cosine"])
    return {name: {
        "questions": len(rows),
        **{k: round(100 * statistics.mean(r[k]for r in rows), 1) for k in ("p@1", "p@2", "mrr")},
        "median_seconds_per_question": round(statistics.median(seconds[name]), 4),
        "ratio_to_minilm_cosine": round(statistics.median(seconds[name]) / base, 1),
    } for name, rows in per.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--reranker", type=Path, default=None,
                        help="fine-tuned cross-encoder directory (train-reranker output)")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/cbdr_rerank.json")
    args = parser.parse_args()
    torch.set_num_threads(1)
    examples = load_dataset("hotpotqa", n=args.n, offset=args.offset).examples
    lm = load_default_lm()
    probe = load_default_probe(lm)
    rankers: dict[str, Ranker] = {
        "confidence-gain": reranker_ranker(ConfidenceGainReranker(lm, probe)),
        "bm25": bm25_ranker,
        "minilm-cosine": cosine_ranker(load_default_embedder()),
    }
    if args.reranker is not None:
        rankers["cross-encoder-ft"] = reranker_ranker(CrossEncoderReranker(args.reranker))
    results = run(examples, rankers)
    payload = {
        "command": "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/cbdr_rerank.py "
                   + (f"--reranker {args.reranker} " if args.reranker else "")
                   + f"--n {args.n} --offset {args.offset}",
        "date": dt.date.today().isoformat(), "machine": platform.platform(),
        "dataset": f"hotpotqa dev rows {args.offset}..{args.offset + args.n - 1}",
        "model": lm.model_id, "probe": probe.config.model_dump(mode="json"),
        "results": results,
    }
    args.out.write_text(json.dumps(payload, indent=2) + "\n", encoding="utf-8")
    for name, r in results.items():
        print(f"{name:18s} P@1 {r['p@1']:5.1f}  P@2 {r['p@2']:5.1f}  MRR {r['mrr']:5.1f}  "
              f"{r['median_seconds_per_question']:.3f} s/q ({r['ratio_to_minilm_cosine']}x)")


if __name__ == "__main__":
    main()
