"""What a loaded gate spec costs per decision over the bare gate (target: under 1 ms).

    .venv/bin/python benchmarks/calibration_overhead.py \
        --out benchmarks/results/calibration_overhead.json

Two real gates: ``first-token-prob`` on the tiny random-weight Llama of rag_gates.testing
(one forward pass, about a millisecond) and a word-length gate in pure Python (microseconds,
so the wrapper's own cost is not hidden in the model's). For each, the bare gate and the same
gate loaded through ``load_gate`` from a saved spec decide the same questions, interleaved
(bare, wrapped, bare, ...), after a warm-up; the figures are medians over all decisions and
the median of the paired differences.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from rag_gates._io import write_text_atomic
from rag_gates.calibration import (
    CalibrationRecord,
    ModelIdentity,
    calibrate,
    load_gate,
    register_gate,
)
from rag_gates.confidence import FirstTokenProbGate
from rag_gates.gate import BaseGate, Gate

QUESTIONS = [f"Who wrote the {w} book number {i}?" for i in range(50)
             for w in ("red", "blue", "extraordinary")]


class LongWords(BaseGate):
    """Share of words longer than six letters."""

    name = "long-words"

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, Any]]:
        words = query.split()
        return sum(len(w) > 6 for w in words) / len(words), {"words": len(words)}


def _spec(gate: Gate, name: str, model: ModelIdentity, directory: Path) -> Path:
    """A certified spec for ``gate`` from labels tied to its score (the cost measured does
    not depend on the labels)."""
    scores = [gate.decide(q).score for q in QUESTIONS]
    cut = sorted(scores)[len(scores) // 2]
    records = [CalibrationRecord(id=str(i), question=q, closed_book_correct=s <= cut,
                                 retrieved_correct=True, scores={name: s})
               for i, (q, s) in enumerate(zip(QUESTIONS, scores, strict=True))]
    spec = calibrate(records, max_loss=0.2, model=model, retriever="none",
                     composite=False).spec_for(name)
    return spec.save(directory / f"{name}.json")


def measure(bare: Gate, wrapped: Gate, rounds: int) -> dict[str, float]:
    for q in QUESTIONS[:20]:                      # warm-up
        bare.decide(q)
        wrapped.decide(q)
    b, w, diff = [], [], []
    for r in range(rounds):
        q = QUESTIONS[r % len(QUESTIONS)]
        t0 = time.perf_counter()
        bare.decide(q)
        t1 = time.perf_counter()
        wrapped.decide(q)
        t2 = time.perf_counter()
        b.append((t1 - t0) * 1e3)
        w.append((t2 - t1) * 1e3)
        diff.append(w[-1] - b[-1])
    return {"decisions": rounds, "bare_median_ms": statistics.median(b),
            "spec_median_ms": statistics.median(w),
            "overhead_median_ms": statistics.median(diff),
            "ratio": statistics.median(w) / statistics.median(b)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3000)
    parser.add_argument("--embedded", action="store_true",
                        help="Also time ModelIdentity.of on the embedded SmolLM2 (what "
                             "load_gate pays once to check the model).")
    parser.add_argument("--out", type=Path,
                        default=Path("benchmarks/results/calibration_overhead.json"))
    args = parser.parse_args()
    from rag_gates.testing import tiny_lm

    lm = tiny_lm(seed=0)
    identity = ModelIdentity.of(lm)
    register_gate("long-words", lambda ctx, t: LongWords(0.5 if t is None else t))
    result: dict[str, Any] = {
        "command": f"python benchmarks/calibration_overhead.py --rounds {args.rounds} "
                   f"{'--embedded ' if args.embedded else ''}--out {args.out}",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "processor": platform.processor()},
        "gates": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name, bare in (("first-token-prob", FirstTokenProbGate(lm)),
                           ("long-words", LongWords(0.5))):
            path = _spec(bare, name, identity, Path(tmp))
            t0 = time.perf_counter()
            wrapped = load_gate(path, lm=lm)
            load_ms = (time.perf_counter() - t0) * 1e3
            result["gates"][name] = {"load_gate_ms": load_ms,
                                     "certified": wrapped.spec.certified,
                                     **measure(bare, wrapped, args.rounds)}
            print(name, json.dumps(result["gates"][name]), flush=True)
    if args.embedded:
        from rag_gates.lm import load_default_lm

        smol = load_default_lm()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            ModelIdentity.of(smol)
            times.append((time.perf_counter() - t0) * 1e3)
        result["embedded_fingerprint_ms"] = {"median": statistics.median(times),
                                             "runs": times, "model": smol.model_id}
        print("embedded fingerprint", result["embedded_fingerprint_ms"], flush=True)
    write_text_atomic(args.out, json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
