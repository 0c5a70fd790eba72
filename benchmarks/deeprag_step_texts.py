"""Record what the embedded model really writes at DeepRAG's first step, for the fidelity
tests of the step decision (tests/fidelity/test_deeprag_fidelity.py).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/deeprag_step_texts.py --datasets hotpotqa \\
        --n 3 --max-new-tokens 48 --out tests/fidelity/data/deeprag_step_texts.json

For ``--n`` training rows of HotpotQA (offset 900, beyond the rows the synthesis used) and of
2Wiki (offset 240, among its synthesis rows 200-249; evaluation is 0-199), with the bench's
prompt (the paper's instruction and the one-shot demonstration, chat style), the model's
greedy continuation is recorded twice, with no stop string and ``--max-new-tokens`` tokens:
at the first step (nothing written yet) and after ``Follow up:`` (the loop's nudge, the
authors' first-step prefill). No evaluation row is read.
The committed file was recorded outside the model slots (both were held by long runs), so
it is small: 3 HotpotQA rows, 48 tokens (its ``command`` field names an earlier version whose
2Wiki offset, 250, was past the end of 2Wiki's 250-row file: it recorded HotpotQA only, as
``--datasets hotpotqa`` does now).
The tests replay these texts through the loop (cut at the stop strings the loop asks for, as
any model is) and compare its decision with the authors' rule written out independently.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from pathlib import Path
from typing import Any

from rag_gates.deeprag.trajectory import DEMONSTRATION, FOLLOW_UP, DeepRAGPrompt
from rag_gates.lm import load_default_lm
from rag_gates_lab.datasets import load_dataset

OFFSETS = {"hotpotqa": 900, "2wiki": 240}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", default="hotpotqa,2wiki")
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    lm = load_default_lm()
    fmt = DeepRAGPrompt(demonstration=DEMONSTRATION)
    rows: list[dict[str, Any]] = []
    chosen = args.datasets.split(",")
    for dataset, offset in ((d, OFFSETS[d]) for d in chosen):
        for example in load_dataset(dataset, n=args.n, offset=offset).examples:
            for so_far in ("", FOLLOW_UP):
                g = lm.generate(fmt.build(example.question, so_far),
                                max_new_tokens=args.max_new_tokens)
                rows.append({"dataset": dataset, "id": example.id,
                             "question": example.question, "so_far": so_far,
                             "text": g.text, "finish_reason": g.finish_reason})
                print(json.dumps(rows[-1])[:300], flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/deeprag_step_texts.py "
                   f"--datasets {args.datasets} --n {args.n} "
                   f"--max-new-tokens {args.max_new_tokens} --out {args.out}",
        "date": dt.date.today().isoformat(), "model": lm.model_id,
        "prompt": fmt.model_dump(), "offsets": {d: OFFSETS[d] for d in chosen},
        "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
