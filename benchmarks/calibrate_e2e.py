"""End-to-end time per question at a certified threshold: always retrieve, gate then
generate (the gate's closed-book answer thrown away, as before answer-once), and gate with
the answer reused (a skip costs the gate's one generation).

One run measures, per question and in the same process, the three pieces every policy is
made of: the answer-logprob gate (one greedy closed-book generation with log-probabilities),
a separate closed-book generation (``no-rag``), and BM25 retrieval plus the generation from
the passages (``single``). ``--measure`` writes them; ``--spec``/``--report`` then composes
each policy's time per question at the threshold certified on a calibrate run's records
for each epsilon (no model needed):

- always retrieve: single;
- gate, no reuse: gate + (skip ? no-rag : single);
- gate, answer once: gate + (skip ? 0 : single).

    python benchmarks/calibrate_e2e.py --measure --offset 200 --n 40 --threads 1
    python benchmarks/calibrate_e2e.py --report \\
        benchmarks/results/calibrate/smollm2-200/work/records.jsonl --epsilons 0.05 0.1 0.2
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "benchmarks" / "results" / "calibrate"
DATA = ROOT / "examples" / "data" / "calibration_questions.jsonl"
CORPUS = ROOT / "examples" / "data" / "calibration_corpus.jsonl"
PIECES = OUT / "e2e_pieces.jsonl"
MAX_NEW_TOKENS = 32  # rag-gates calibrate's default: the gate's budget is the answer's


def measure(offset: int, n: int, threads: int, pieces: Path) -> None:
    from rag_gates.answers import accuracy
    from rag_gates.commands.calibrate import read_corpus, read_questions
    from rag_gates.confidence import AnswerLogprobGate
    from rag_gates.lm import load_lm
    from rag_gates.methods import MethodContext, make_method
    from rag_gates.retrieval.bm25 import BM25Retriever

    lm = load_lm("default", num_threads=threads)
    retriever = BM25Retriever.from_passages(read_corpus(CORPUS))
    ctx = MethodContext(lm=lm, retriever=retriever, k=3, max_new_tokens=MAX_NEW_TOKENS)
    single, closed = make_method("single", ctx), make_method("no-rag", ctx)
    gate = AnswerLogprobGate(lm, max_new_tokens=MAX_NEW_TOKENS)
    questions = read_questions(DATA)[offset:offset + n]
    lm.generate("Warm up.", max_new_tokens=4)
    with pieces.open("w") as handle:
        for q in questions:
            t0 = time.perf_counter()
            decision = gate.decide(q.question)
            t1 = time.perf_counter()
            closed_answer = closed.answer(q.question).answer
            t2 = time.perf_counter()
            rag_answer = single.answer(q.question).answer
            t3 = time.perf_counter()
            handle.write(json.dumps({
                "id": q.id, "score": decision.score, "gate_s": t1 - t0, "no_rag_s": t2 - t1,
                "single_s": t3 - t2,
                "gate_answer_is_no_rag": decision.evidence.get("closed_book_answer")
                == closed_answer,
                "closed_book_correct": accuracy(closed_answer, q.answers) > 0,
                "retrieved_correct": accuracy(rag_answer, q.answers) > 0}) + "\n")
            handle.flush()


def _policies(rows: list[dict[str, Any]], threshold: float | None) -> dict[str, Any]:
    """Each policy's time per question at ``threshold`` (None: always retrieve)."""
    skip = [threshold is not None and r["score"] < threshold for r in rows]

    def stats(cost: list[float]) -> dict[str, float]:
        return {"mean_s": round(statistics.fmean(cost), 3),
                "median_s": round(statistics.median(cost), 3)}

    always = [r["single_s"] for r in rows]
    no_reuse = [r["gate_s"] + (r["no_rag_s"] if s else r["single_s"])
                for r, s in zip(rows, skip, strict=True)]
    once = [r["gate_s"] + (0.0 if s else r["single_s"]) for r, s in zip(rows, skip, strict=True)]
    # A spec without a certified threshold always retrieves without consulting its gate.
    served = once if threshold is not None else always
    return {
        "threshold": threshold, "skipped": sum(skip),
        "always_retrieve": stats(always), "gate_then_generate": stats(no_reuse),
        "gate_answer_once": stats(once), "served_by_load_gate": stats(served),
        "ratio_answer_once_vs_always": round(statistics.fmean(once) / statistics.fmean(always),
                                             3),
        "ratio_answer_once_vs_no_reuse": round(
            statistics.fmean(once) / statistics.fmean(no_reuse), 3),
        "accuracy_always_retrieve": round(statistics.fmean(r["retrieved_correct"] for r in rows),
                                          3),
        "accuracy_gated": round(statistics.fmean(
            (r["closed_book_correct"] if s else r["retrieved_correct"])
            for r, s in zip(rows, skip, strict=True)), 3),
    }


def report(records_path: Path, gate: str, epsilons: list[float], delta: float,
           pieces: Path, out: Path) -> None:
    from rag_gates.calibration import ModelIdentity, calibrate, read_records

    records = read_records(records_path)
    rows = [json.loads(line) for line in pieces.read_text().splitlines()]
    per_epsilon = {}
    for eps in epsilons:
        rep = calibrate(records, max_loss=eps, delta=delta, gates=[gate], composite=False,
                        model=ModelIdentity(name="records", fingerprint="records"),
                        retriever="the records' own")
        per_epsilon[str(eps)] = _policies(rows, rep.row(gate).threshold)
    result = {
        "command": "python benchmarks/calibrate_e2e.py --report " + str(records_path)
                   + " --epsilons " + " ".join(map(str, epsilons)) + f" --pieces {pieces.name}"
                   + f" --out {out.name}",
        "calibration_questions": len(records), "timed_questions": len(rows),
        "gate": gate, "delta": delta, "bound": "wsr",
        "gate_answer_equals_no_rag": sum(r["gate_answer_is_no_rag"] for r in rows),
        "pieces_median_s": {
            "gate": round(statistics.median(r["gate_s"] for r in rows), 3),
            "no_rag": round(statistics.median(r["no_rag_s"] for r in rows), 3),
            "single": round(statistics.median(r["single_s"] for r in rows), 3)},
        "by_epsilon": per_epsilon,
    }
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--measure", action="store_true")
    parser.add_argument("--offset", type=int, default=200)
    parser.add_argument("--n", type=int, default=40)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--report", type=Path, default=None,
                        help="records.jsonl of a rag-gates calibrate run")
    parser.add_argument("--gate", default="answer-logprob")
    parser.add_argument("--epsilons", type=float, nargs="+", default=[0.05, 0.1, 0.2])
    parser.add_argument("--delta", type=float, default=0.1)
    parser.add_argument("--pieces", default=PIECES.name, help="file under results/calibrate")
    parser.add_argument("--out", default="e2e.json", help="file under results/calibrate")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if args.measure:
        measure(args.offset, args.n, args.threads, OUT / args.pieces)
    if args.report is not None:
        report(args.report, args.gate, args.epsilons, args.delta, OUT / args.pieces,
               OUT / args.out)


if __name__ == "__main__":
    main()
