"""What Tok-RAG costs against standard RAG on the same prompts and passages.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tokrag_cost.py --n 8 --repeats 5 \\
        --out benchmarks/results/tokrag_cost.json

For ``--n`` HotpotQA rows (file order), the passages are the row's two gold paragraphs plus
three distractors (top-5, shuffled with a fixed seed), greedy, ``--max-new-tokens`` (64). Three
ways, run back to back in a rotating order so drift on a shared machine hits all alike, each
row ``--repeats`` times (each way's time on a row is the median of its repeats):

* ``rag``: standard RAG, ``lm.generate(qa_prompt(question, passages))`` (the ``single`` method);
* ``two-streams``: CAD at alpha 0: both streams decoded in lockstep, no judging (the cost of
  the second stream alone; its text equals ``rag``'s);
* ``tokrag``: :class:`~rag_gates.tokrag.TokRAGDecoder` with its defaults (l* search).

Reported: medians over rows of each way's time per generated token and of its total time,
divided by ``rag``'s on the same row (answers may end at different lengths); the same ratios
taken per repeat (each repeat's three ways ran back to back), median over all repeats; the share of
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
import os
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

from rag_gates.lm import load_default_lm
from rag_gates.prompts import qa_prompt
from rag_gates.tokrag import CADDecoder, TokRAGConfig, TokRAGDecoder
from rag_gates.types import Passage
from rag_gates_lab.datasets import load_dataset

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

    def __init__(self, lm: Any, judge: str) -> None:
        super().__init__(lm, TokRAGConfig(judge=judge))
        self.judge_seconds: list[float] = []

    def judge(self, streams: Any, *, layer: int | None = None) -> Any:
        start = time.perf_counter()
        verdict = super().judge(streams, layer=layer)
        self.judge_seconds.append(time.perf_counter() - start)
        return verdict

    def judge_authors(self, streams: Any, *, layer: int | None = None) -> Any:
        start = time.perf_counter()
        verdict = super().judge_authors(streams, layer=layer)
        self.judge_seconds.append(time.perf_counter() - start)
        return verdict


def _drain(pieces: Any) -> tuple[Any, float]:
    """Run a streaming generator to its end: (its return value, seconds to the first piece,
    or the whole run when nothing was yielded)."""
    start = time.perf_counter()
    first: float | None = None
    while True:
        try:
            next(pieces)
        except StopIteration as done:
            return done.value, first if first is not None else time.perf_counter() - start
        if first is None:
            first = time.perf_counter() - start


def runners(lm: Any, budget: int, tokrag: TokRAGDecoder) -> dict[str, Any]:
    """Each way as ``run(question, passages) -> (tokens, disagreements, steps, seconds to
    the first piece)``; all stream (same loop as generate) so the first piece is timed."""
    two = CADDecoder(lm, 0.0)

    def rag(q: str, p: list[Passage]) -> tuple[int, int, int, float]:
        g, first = _drain(lm.stream(qa_prompt(q, p), max_new_tokens=budget))
        return g.completion_tokens, 0, 0, first

    def decode(decoder: Any) -> Any:
        def run(q: str, p: list[Passage]) -> tuple[int, int, int, float]:
            g, first = _drain(decoder.stream(q, passages=p, max_new_tokens=budget))
            return g.completion_tokens, len(g.disagreements), len(g.choices), first
        return run

    return {"rag": rag, "two-streams": decode(two), "tokrag": decode(tokrag)}


def _rss_mb() -> float:
    with open("/proc/self/statm") as handle:
        return int(handle.read().split()[1]) * resource.getpagesize() / 2**20


def memory_child(way: str, n: int, budget: int, judge: str) -> None:
    """Resident memory while decoding (sampled every 5 ms), in a fresh process: the model's
    own loading peak is over before sampling starts."""
    torch.set_num_threads(1)
    lm = load_default_lm()
    run = runners(lm, budget, TokRAGDecoder(lm, TokRAGConfig(judge=judge)))[way]
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
    parser.add_argument("--repeats", type=int, default=5,
                        help="runs of each way per row; a row's time is their median")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/tokrag_cost.json")
    parser.add_argument("--judge", default=TokRAGConfig.model_fields["judge"].default,
                        help="Tok-RAG's judge (default: the package's; tokrag_cost.json "
                             "timed 'paper', the default before issue 34)")
    parser.add_argument("--memory-child", choices=WAYS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_child:
        memory_child(args.memory_child, args.n, args.max_new_tokens, args.judge)
        return
    torch.set_num_threads(1)
    lm = load_default_lm()
    timed = TimedTokRAG(lm, args.judge)
    ways = runners(lm, args.max_new_tokens, timed)
    data = rows(args.n)
    ways["rag"](*data[0])  # warm-up
    seconds: dict[str, list[float]] = {w: [] for w in WAYS}
    firsts: dict[str, list[float]] = {w: [] for w in WAYS}  # seconds to the first piece
    tokens: dict[str, list[int]] = {w: [] for w in WAYS}
    paired: dict[str, list[float]] = {w: [] for w in WAYS}  # per repeat, per token vs rag
    disagreements: list[int] = []
    steps: list[int] = []
    turn = 0
    for i, (q, p) in enumerate(data):
        runs: dict[str, list[float]] = {w: [] for w in WAYS}
        first_runs: dict[str, list[float]] = {w: [] for w in WAYS}
        for _ in range(args.repeats):
            made: dict[str, int] = {}
            for way in WAYS[turn % 3:] + WAYS[: turn % 3]:
                start = time.perf_counter()
                made[way], disagreed, chosen, first = ways[way](q, p)
                runs[way].append(time.perf_counter() - start)
                first_runs[way].append(first)
                if way == "tokrag" and len(runs[way]) == 1:
                    disagreements.append(disagreed)
                    steps.append(chosen)
            turn += 1
            for way in WAYS:
                paired[way].append((runs[way][-1] / max(made[way], 1))
                                   / (runs["rag"][-1] / max(made["rag"], 1)))
        for way in WAYS:
            seconds[way].append(statistics.median(runs[way]))
            firsts[way].append(statistics.median(first_runs[way]))
            tokens[way].append(made[way])
        print(f"row {i}: " + ", ".join(f"{w} {seconds[w][-1]:.2f}s/{tokens[w][-1]}t "
                                       f"(first {firsts[w][-1]:.2f}s)" for w in WAYS),
              flush=True)

    def per_token(way: str, i: int) -> float:
        return seconds[way][i] / max(tokens[way][i], 1)

    def per_step(way: str, i: int) -> float | None:
        """Seconds per decoding step after the first piece (prefill excluded)."""
        if tokens[way][i] < 2:
            return None
        return (seconds[way][i] - firsts[way][i]) / (tokens[way][i] - 1)

    def ratio_median(value: Any) -> dict[str, float]:
        out = {}
        for w in WAYS:
            pairs = [(value(w, i), value("rag", i)) for i in range(n)]
            out[w] = round(statistics.median(a / b for a, b in pairs if a and b), 3)
        return out

    n = len(data)
    time_ratio = ratio_median(per_token)
    total_ratio = ratio_median(lambda w, i: seconds[w][i])
    memory: dict[str, dict[str, float]] = {}
    for way in WAYS:
        child = subprocess.run(
            [sys.executable, __file__, "--memory-child", way, "--n", str(args.n),
             "--max-new-tokens", str(args.max_new_tokens), "--judge", args.judge],
            capture_output=True, text=True, check=True)
        memory[way] = json.loads(child.stdout.strip().splitlines()[-1])
    payload = {
        "command": f"OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tokrag_cost.py --n {args.n} "
                   f"--max-new-tokens {args.max_new_tokens} --repeats {args.repeats} "
                   f"--judge {args.judge} --out {os.path.relpath(args.out, ROOT)}",
        "judge": args.judge,
        "layer_rule": timed.config.layer_rule,  # issue 55: the paper judge's Eq. 14 rule
        "date": dt.date.today().isoformat(), "machine": platform.platform(),
        "threads": torch.get_num_threads(), "model": lm.model_id, "rows": n,
        "repeats": args.repeats,
        "time_per_token_ratio_median": time_ratio,
        "time_per_token_ratio_median_of_repeats": {
            w: round(statistics.median(paired[w]), 3) for w in WAYS},
        "total_time_ratio_median": total_ratio,
        # The two parts of the time: up to the first piece (prefill and the first step's
        # choice) and each step after it.
        "first_piece_ratio_median": ratio_median(lambda w, i: firsts[w][i]),
        "step_ratio_median": ratio_median(per_step),
        "first_piece_seconds_median": {w: round(statistics.median(firsts[w]), 3)
                                       for w in WAYS},
        "step_seconds_median": {
            w: round(statistics.median(x for i in range(n) if (x := per_step(w, i))), 4)
            for w in WAYS},
        "median_seconds": {w: round(statistics.median(seconds[w]), 2) for w in WAYS},
        "median_tokens": {w: statistics.median(tokens[w]) for w in WAYS},
        "disagreement_share": round(sum(disagreements) / max(sum(steps), 1), 4),
        "judge_seconds_median": round(statistics.median(timed.judge_seconds), 4)
        if timed.judge_seconds else None,
        "judge_calls": len(timed.judge_seconds),
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
