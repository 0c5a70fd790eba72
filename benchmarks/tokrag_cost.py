"""What Tok-RAG costs against standard RAG on the same prompts and passages.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tokrag_cost.py --n 8 \\
        --out benchmarks/results/tokrag_cost.json

For ``--n`` HotpotQA rows (file order), the passages are the row's two gold paragraphs plus
three distractors (top-5, shuffled with a fixed seed), greedy, ``--max-new-tokens`` (64). Three
ways, run back to back in a rotating order so drift on a shared machine hits all alike:

* ``rag``: standard RAG, ``lm.generate(qa_prompt(question, passages))`` (the ``single`` method);
* ``two-streams``: CAD at alpha 0: both streams decoded in lockstep, no judging (the cost of
  the second stream alone; its text equals ``rag``'s);
* ``tokrag``: :class:`~rag_gates.tokrag.TokRAGDecoder` with its defaults (l* search).

Reported: medians over rows of each way's time per generated token and of its total time,
divided by ``rag``'s on the same row (answers may end at different lengths); the share of
Tok-RAG steps that disagree; the median time of one disagreement step's judging (the
``judge`` call, timed); and the resident memory of a fresh process per way while it decodes
the same rows (sampled every 5 ms after loading and one warm-up answer; model weights
included, as the paper's GB figures), peak as a ratio to ``rag``'s.
"""

from __future__ import annotations

import argparse
import datetime as dt
import gc
import json
import platform
import random
import resource
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch

from rag_gates.eval.datasets import load_dataset
from rag_gates.lm import load_default_lm
from rag_gates.prompts import qa_prompt
from rag_gates.tokrag import CADDecoder, TokRAGDecoder
from rag_gates.types import Passage

ROOT = Path(__file__).resolve().parent.parent
WAYS = ("rag", "two-streams", "tokrag")


def rows(n: int) -> list[tuple[str, list[Passage]]]:
    out = []
    for i, e in enumerate(load_dataset("hotpotqa", n=n).examples):
        gold = [p for p in e.context if p.title in e.supporting_titles][:2]
        other = [p for p in e.context if p.title not in e.supporting_titles][:3]
        passages = gold + other
        random.Random(i).shuffle(passages)
        out.append((e.question, passages))
    return out


class TimedTokRAG(TokRAGDecoder):
    """Tok-RAG with its judging timed (the disagreement steps' extra work)."""

    def __init__(self, lm: Any) -> None:
        super().__init__(lm)
        self.judge_seconds: list[float] = []

    def judge(self, streams: Any, *, layer: int | None = None) -> Any:
        start = time.perf_counter()
        verdict = super().judge(streams, layer=layer)
        self.judge_seconds.append(time.perf_counter() - start)
        return verdict


def runners(lm: Any, budget: int, tokrag: TokRAGDecoder | None = None) -> dict[str, Any]:
    tokrag, two = tokrag or TokRAGDecoder(lm), CADDecoder(lm, 0.0)

    def rag(q: str, p: list[Passage]) -> tuple[int, int, int]:
        g = lm.generate(qa_prompt(q, p), max_new_tokens=budget)
        return g.completion_tokens, 0, 0

    def decode(decoder: Any) -> Any:
        def run(q: str, p: list[Passage]) -> tuple[int, int, int]:
            g = decoder.generate(q, passages=p, max_new_tokens=budget)
            return g.completion_tokens, len(g.disagreements), len(g.choices)
        return run

    return {"rag": rag, "two-streams": decode(two), "tokrag": decode(tokrag)}


def _rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize() / 2**20


def memory_child(way: str, n: int, budget: int) -> None:
    """Resident memory while decoding (sampled every 5 ms), in a fresh process: the model's
    own loading peak is over before sampling starts."""
    torch.set_num_threads(1)
    run = runners(load_default_lm(), budget)[way]
    data = rows(n)
    run(*data[0])
    gc.collect()
    baseline = _rss_mb()
    peak = [baseline]
    done = threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak.append(max(peak[-1], _rss_mb()))
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    for q, p in data:
        run(q, p)
    done.set()
    sampler.join()
    print(json.dumps({"baseline_mb": baseline, "peak_mb": peak[-1]}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/tokrag_cost.json")
    parser.add_argument("--memory-child", choices=WAYS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child, args.n, args.max_new_tokens)
        return
    torch.set_num_threads(1)
    lm = load_default_lm()
    timed = TimedTokRAG(lm)
    ways = runners(lm, args.max_new_tokens, timed)
    data = rows(args.n)
    ways["rag"](*data[0])  # warm-up
    seconds: dict[str, list[float]] = {w: [] for w in WAYS}
    tokens: dict[str, list[int]] = {w: [] for w in WAYS}
    disagreements: list[int] = []
    steps: list[int] = []
    for i, (q, p) in enumerate(data):
        for way in WAYS[i % 3:] + WAYS[: i % 3]:
            start = time.perf_counter()
            made, disagreed, chosen = ways[way](q, p)
            seconds[way].append(time.perf_counter() - start)
            tokens[way].append(made)
            if way == "tokrag":
                disagreements.append(disagreed)
                steps.append(chosen)
        print(f"row {i}: " + ", ".join(f"{w} {seconds[w][-1]:.1f}s/{tokens[w][-1]}t"
                                       for w in WAYS), flush=True)

    def per_token(way: str, i: int) -> float:
        return seconds[way][i] / max(tokens[way][i], 1)

    n = len(data)
    time_ratio = {w: round(statistics.median(per_token(w, i) / per_token("rag", i)
                                             for i in range(n)), 3) for w in WAYS}
    total_ratio = {w: round(statistics.median(seconds[w][i] / seconds["rag"][i]
                                              for i in range(n)), 3) for w in WAYS}
    memory: dict[str, dict[str, float]] = {}
    for way in WAYS:
        child = subprocess.run(
            [sys.executable, __file__, "--memory-child", way, "--n", str(args.n),
             "--max-new-tokens", str(args.max_new_tokens)],
            capture_output=True, text=True, check=True)
        memory[way] = json.loads(child.stdout.strip().splitlines()[-1])
    payload = {
        "command": f"OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tokrag_cost.py --n {args.n} "
                   f"--max-new-tokens {args.max_new_tokens}",
        "date": dt.date.today().isoformat(), "machine": platform.platform(),
        "threads": torch.get_num_threads(), "model": lm.model_id, "rows": n,
        "time_per_token_ratio_median": time_ratio,
        "total_time_ratio_median": total_ratio,
        "median_seconds": {w: round(statistics.median(seconds[w]), 2) for w in WAYS},
        "median_tokens": {w: statistics.median(tokens[w]) for w in WAYS},
        "disagreement_share": round(sum(disagreements) / max(sum(steps), 1), 4),
        "judge_seconds_median": round(statistics.median(timed.judge_seconds), 4)
        if timed.judge_seconds else None,
        "judge_calls": len(timed.judge_seconds),
        "two_stream_step_seconds_median": round(statistics.median(
            per_token("two-streams", i) for i in range(n)), 4),
        "rss_while_decoding_mb": {w: {k: round(v, 1) for k, v in m.items()}
                                  for w, m in memory.items()},
        "peak_rss_ratio": {w: round(memory[w]["peak_mb"] / memory["rag"]["peak_mb"], 3)
                           for w in WAYS},
        "peak_above_baseline_ratio": {
            w: round((memory[w]["peak_mb"] - memory[w]["baseline_mb"])
                     / max(memory["rag"]["peak_mb"] - memory["rag"]["baseline_mb"], 1e-9), 3)
            for w in WAYS},
        "targets": {"time_ratio": 1.15, "memory_ratio": 1.2},
    }
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(args.out)
    print(json.dumps(payload, indent=2))


if __name__ == "__main__":
    main()
