"""Cost of the text checks at the boundaries, as a ratio to one tokenizer encode of the same
text on the embedded SmolLM2 tokenizer.

    .venv/bin/python benchmarks/text_validation.py --out benchmarks/results/text_validation.json

For three typical lengths (a question; a QA prompt with its gold passages; a long prompt of
many passages, all from the HotpotQA demo slice) it measures, interleaved and repeated:

- ``check_encodable(text)``: the UTF-8 check every prompt, query and passage goes through;
- ``encode``: ``tokenizer(text)``, one plain encode (special-token text parsed);
- ``encode_literal``: ``tokenizer(text, split_special_tokens=True)``, the literal encode user
  text and passages now get (so ``<|im_end|>`` in a passage stays text).

Each figure is the median over ``--repeats`` rounds of the mean of ``--calls`` calls.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rag_gates._text import check_encodable
from rag_gates.cli import DEMO_DATA, gold_passages, load_hotpotqa_rows
from rag_gates.lm import load_default_tokenizer
from rag_gates.prompts import qa_prompt


def per_call_us(fn: Callable[[], object], calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e6


def texts() -> dict[str, str]:
    rows = load_hotpotqa_rows(DEMO_DATA, 12)
    question = rows[0]["question"]
    qa = qa_prompt(question, gold_passages(rows[0]))
    long = "\n\n".join(qa_prompt(r["question"], gold_passages(r)) for r in rows)
    return {"question": question, "qa_prompt": qa, "long_prompt": long}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    tok = load_default_tokenizer()
    results: dict[str, Any] = {}
    for name, text in texts().items():
        fns: dict[str, Callable[[], object]] = {
            "check_encodable": lambda t=text: check_encodable(t, "prompt"),
            "encode": lambda t=text: tok(t, add_special_tokens=False),
            "encode_literal": lambda t=text: tok(t, add_special_tokens=False,
                                                 split_special_tokens=True),
        }
        samples: dict[str, list[float]] = {k: [] for k in fns}
        for _ in range(args.repeats):  # interleaved: noise hits every side alike
            for key, fn in fns.items():
                samples[key].append(per_call_us(fn, args.calls))
        med = {k: statistics.median(v) for k, v in samples.items()}
        results[name] = {
            "chars": len(text),
            "tokens": len(tok(text, add_special_tokens=False)["input_ids"]),
            "median_us": {k: round(v, 3) for k, v in med.items()},
            "check_encodable_over_encode": round(med["check_encodable"] / med["encode"], 5),
            "encode_literal_over_encode": round(med["encode_literal"] / med["encode"], 4),
        }
    report = {
        "command": "python benchmarks/text_validation.py " + " ".join(argv or sys.argv[1:]),
        "repeats": args.repeats, "calls": args.calls,
        "python": platform.python_version(), "machine": platform.machine(),
        "results": results,
    }
    text_out = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text_out + "\n", encoding="utf-8")
    print(text_out)
    return report


if __name__ == "__main__":
    main()
