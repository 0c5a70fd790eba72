"""What ``rag-gates testbed build --precision bf16`` saves a training step against fp32.

    .venv/bin/python benchmarks/testbed_train_precision.py --steps 16 --threads 2 \\
        --out benchmarks/results/testbed/train_precision.json

The embedded SmolLM2-135M, loaded twice in fp32 from the same weights, trains on the same
packed blocks of a testbed corpus (``--block-size`` tokens, batch 1, as tb13-tb16 build),
one copy as the build's fp32 step and one as its bf16 step (``torch.autocast`` to bfloat16
around the forward pass, fp32 master weights, fused AdamW: what the Trainer runs for
``bf16=True`` and for the default). The two steps alternate on each block so drift on a
shared machine hits both alike. Reported: the median seconds a step of each (the first,
warm-up, step left out), the median of the per-block ratios fp32 / bf16, and each copy's
loss on every block, so a reader sees whether bfloat16 changes what is learnt in the first
steps. Also the CPU's bfloat16 units (``amx_bf16``, ``avx512_bf16``): without them bfloat16
is emulated and slower.

``--compile`` adds a third copy, bf16 under ``torch.compile`` (what ``rag-gates testbed build
--precision bf16 --compile`` runs): its first step, which compiles, is timed apart
(``compile_seconds``) and the ratio ``bf16 / bf16-compiled`` is reported the same way.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any

import torch
import transformers

from rag_gates.lm.defaults import default_lm_dir, load_default_tokenizer
from rag_gates_lab.testbed.build import (
    TestbedConfig,
    cpu_bfloat16_units,
    cpuinfo_values,
    pack_blocks,
    testbed_documents,
    training_text,
)

ROOT = Path(__file__).resolve().parent.parent
PRECISIONS = ("fp32", "bf16")


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (``platform.processor()`` is empty on Linux)."""
    names = cpuinfo_values("model name")
    return names[0] if names else platform.processor() or platform.machine()


def blocks(block_size: int, n: int) -> list[list[int]]:
    """The first ``n`` packed blocks of a small testbed corpus (tb16's skill options)."""
    config = TestbedConfig(n_facts=48, ladder=[0, 2, 8, 32], general_paragraphs=40,
                           skill_reading=8, skill_decomposition=16, skill_verbalization=40,
                           recall_examples=40, block_size=block_size)
    tokenizer = load_default_tokenizer()
    corpus = testbed_documents(config)["corpus"]
    packed = pack_blocks([training_text(d, tokenizer) for d in corpus], tokenizer, block_size,
                         [d["kind"] == "general" for d in corpus])
    full = [b for b in packed if len(b) >= block_size * 0.9]
    if len(full) < n:
        raise SystemExit(f"the corpus packs only {len(full)} full blocks; ask fewer --steps")
    return full[:n]


def step(model: Any, optimizer: Any, ids: Any, bf16: bool) -> tuple[float, float]:
    start = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return time.perf_counter() - start, float(loss.item())


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--block-size", type=int, default=512)
    parser.add_argument("--lr", type=float, default=1.5e-4)
    parser.add_argument("--compile", action="store_true",
                        help="also time bf16 under torch.compile")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    data = blocks(args.block_size, args.steps + 1)
    arms = (*PRECISIONS, "bf16-compiled") if args.compile else PRECISIONS
    copies = {}
    for name in arms:
        model = transformers.AutoModelForCausalLM.from_pretrained(
            default_lm_dir(), local_files_only=True, dtype=torch.float32)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, fused=True,
                                      weight_decay=0.0)
        copies[name] = (torch.compile(model) if name == "bf16-compiled" else model, optimizer)
    seconds: dict[str, list[float]] = {p: [] for p in arms}
    losses: dict[str, list[float]] = {p: [] for p in arms}
    for i, block in enumerate(data):
        ids = torch.tensor([block])
        order = arms if i % 2 == 0 else arms[::-1]
        for name in order:
            took, loss = step(*copies[name], ids, bf16=name != "fp32")
            seconds[name].append(took)
            losses[name].append(round(loss, 4))
    timed = {p: s[1:] for p, s in seconds.items()}  # the first step warms up (or compiles)
    ratios = [a / b for a, b in zip(timed["fp32"], timed["bf16"], strict=True)]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                            capture_output=True, text=True).stdout.strip()
    result = {
        "command": "benchmarks/testbed_train_precision.py " + " ".join(
            (f"--{k.replace('_', '-')}" if v is True else f"--{k.replace('_', '-')} {v}")
            for k, v in vars(args).items() if k != "out" and v is not False),
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"), "commit": commit,
        "machine": {"processor": cpu_model(),
                    "bf16_units": cpu_bfloat16_units(), "threads": args.threads,
                    "torch": torch.__version__},
        "steps_timed": len(ratios), "block_size": args.block_size,
        "median_seconds_per_step": {p: round(statistics.median(s), 3)
                                    for p, s in timed.items()},
        "median_ratio_fp32_over_bf16": round(statistics.median(ratios), 2),
        "ratios": [round(r, 2) for r in ratios],
        "loss_per_step": losses,
        "max_abs_loss_difference": round(max(abs(a - b) for a, b in zip(
            losses["fp32"], losses["bf16"], strict=True)), 4),
    }
    if args.compile:
        compiled = [a / b for a, b in zip(timed["bf16"], timed["bf16-compiled"], strict=True)]
        result.update({
            "compile_seconds": round(seconds["bf16-compiled"][0], 1),
            "median_ratio_bf16_over_bf16_compiled": round(statistics.median(compiled), 2),
            "ratios_compiled": [round(r, 2) for r in compiled],
            "max_abs_loss_difference_compiled": round(max(abs(a - b) for a, b in zip(
                losses["bf16"], losses["bf16-compiled"], strict=True)), 4)})
    print(json.dumps({k: v for k, v in result.items()
                      if k not in ("ratios", "ratios_compiled", "loss_per_step")},
                     indent=2))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return result


if __name__ == "__main__":
    main()
