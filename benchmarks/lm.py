"""Benchmark HFWhiteBoxLM against raw transformers on the embedded SmolLM2-135M-Instruct.

Every target is a ratio measured in the same run, with the two sides interleaved (A, B, A, B,
...) so that machine noise hits both alike; medians of ``--repeats`` runs.

    .venv/bin/python benchmarks/lm.py --out benchmarks/results/lm.json

1. ``HFWhiteBoxLM.generate`` vs raw ``model.generate``, 64 new tokens (target <= 1.05x);
2. generation while capturing a middle-layer hidden state of the prompt (prefill once,
   read the state, continue from the same cache) vs plain generation (target <= 1.05x);
3. scoring 8 continuations of 20 tokens after a shared 400-token prompt with prefix KV reuse
   vs 8 independent full forward passes (target <= 0.4x);
4. default model load: warm cache vs first load from the GGUF (target: warm <= 2 s), each in
   a fresh subprocess, timing the load call only; the one-off module imports (torch,
   transformers' Llama and tokenizer modules) are timed apart and reported as import_median_s.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from rag_gates.cli import DEMO_DATA, load_hotpotqa_rows
from rag_gates.lm import load_default_lm
from rag_gates.lm.hf import HFWhiteBoxLM

GENERATION_PROMPT = "Write a long, detailed story about a dragon who learns to paint."


def interleaved(a: Callable[[], Any], b: Callable[[], Any], repeats: int) -> tuple[list[float],
                                                                                   list[float]]:
    """Time a and b alternately ``repeats`` times each, after one warm-up call of each."""
    a(), b()
    times_a, times_b = [], []
    for _ in range(repeats):
        for fn, sink in ((a, times_a), (b, times_b)):
            start = time.perf_counter()
            fn()
            sink.append(time.perf_counter() - start)
    return times_a, times_b


def summary(ours: list[float], baseline: list[float], target: float | None,
            better: str = "lower") -> dict[str, Any]:
    ratio = statistics.median(ours) / statistics.median(baseline)
    paired = statistics.median(o / b for o, b in zip(ours, baseline, strict=True))
    result: dict[str, Any] = {
        "ours_s": ours, "baseline_s": baseline,
        "ours_median_s": statistics.median(ours), "baseline_median_s": statistics.median(baseline),
        "ratio_of_medians": ratio, "median_of_paired_ratios": paired,
        # The shared machine's noise only adds time; the minimums show the code's own cost.
        "ratio_of_minimums": min(ours) / min(baseline),
    }
    if target is not None:
        result["target"] = target
        result["meets_target"] = ratio <= target if better == "lower" else ratio >= target
    return result


def bench_generate(lm: HFWhiteBoxLM, repeats: int, new_tokens: int) -> dict[str, Any]:
    ids = torch.tensor([lm.encode(GENERATION_PROMPT)])

    def ours() -> int:
        return lm.generate(GENERATION_PROMPT, max_new_tokens=new_tokens).completion_tokens

    def raw() -> int:
        with torch.inference_mode():
            out = lm.model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                    max_new_tokens=new_tokens, pad_token_id=lm.pad_token_id)
        return int(out.shape[1] - ids.shape[1])

    counts = {"ours_tokens": ours(), "raw_tokens": raw()}
    if counts["ours_tokens"] != counts["raw_tokens"]:
        raise RuntimeError(f"the two sides generated different lengths: {counts}")
    result = summary(*interleaved(ours, raw, repeats), target=1.05)
    result.update(counts, prompt_tokens=int(ids.shape[1]))
    return result


def bench_hidden_capture(lm: HFWhiteBoxLM, repeats: int, new_tokens: int) -> dict[str, Any]:
    layer = lm.num_layers // 2

    def capture() -> None:
        group = lm.open_streams([GENERATION_PROMPT], hidden_layers=[layer], reserve=new_tokens)
        group.hidden(layer)  # what a confidence probe would read
        lm.generate_from(group, max_new_tokens=new_tokens)

    def plain() -> None:
        lm.generate(GENERATION_PROMPT, max_new_tokens=new_tokens)

    result = summary(*interleaved(capture, plain, repeats), target=1.05)
    result["layer"] = layer
    return result


def scoring_inputs(lm: HFWhiteBoxLM, prompt_tokens: int, n: int, length: int) -> tuple[str,
                                                                                          list[str]]:
    rows = load_hotpotqa_rows(DEMO_DATA, 20)
    text = " ".join("".join(s) for row in rows for _, s in row["context"])
    ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"]
    prompt = lm.tokenizer.decode(ids[:prompt_tokens])
    continuations = []
    cursor = prompt_tokens + 50
    while len(continuations) < n:
        piece = lm.tokenizer.decode(ids[cursor: cursor + length])
        if len(lm.tokenizer(piece, add_special_tokens=False)["input_ids"]) == length:
            continuations.append(piece)
        cursor += length
    return prompt, continuations


def bench_scoring(lm: HFWhiteBoxLM, repeats: int) -> dict[str, Any]:
    prompt, continuations = scoring_inputs(lm, 400, 8, 20)
    n_prompt = len(lm.encode(prompt, chat_template=False))

    def reuse() -> None:
        lm.score(prompt, continuations, chat_template=False, reuse_prefix=True, batch_size=8)

    def independent() -> None:
        lm.score(prompt, continuations, chat_template=False, reuse_prefix=False, batch_size=1)

    a = lm.score(prompt, continuations, chat_template=False, reuse_prefix=True)
    b = lm.score(prompt, continuations, chat_template=False, reuse_prefix=False, batch_size=1)
    max_diff = max(abs(x - y) for sa, sb in zip(a, b, strict=True)
                   for x, y in zip(sa.logprobs, sb.logprobs, strict=True))
    result = summary(*interleaved(reuse, independent, repeats), target=0.4)
    result.update(prompt_tokens=n_prompt, continuations=len(continuations),
                  continuation_tokens=[len(s.token_ids) for s in a],
                  max_abs_logprob_diff=max_diff)
    return result


LOAD_SNIPPET = """
import json, time
t0 = time.perf_counter()
# Module imports happen once per process whatever the cache holds: time them apart.
import torch, transformers
import transformers.models.llama.modeling_llama
_ = transformers.AutoTokenizer, transformers.AutoModelForCausalLM
import rag_gates.lm.hf
from rag_gates.lm import load_default_lm
t1 = time.perf_counter()
lm = load_default_lm()
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1}))
"""


def bench_load(repeats: int) -> dict[str, Any]:
    def run(home: str) -> dict[str, float]:
        env = dict(os.environ, RAG_GATES_HOME=home, HF_HUB_DISABLE_PROGRESS_BARS="1")
        out = subprocess.run([sys.executable, "-c", LOAD_SNIPPET], env=env, check=True,
                             capture_output=True, text=True)
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))

    cold, warm, imports = [], [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as home:
            first = run(home)   # converts the GGUF into this empty cache
            second = run(home)  # reads the safetensors copy
        cold.append(first["load_s"])
        warm.append(second["load_s"])
        imports.append(second["import_s"])
    result = summary(warm, cold, target=None)
    result.update(warm_target_s=2.0, meets_target=statistics.median(warm) <= 2.0,
                  import_median_s=statistics.median(imports))
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/lm.json"))
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--skip-load", action="store_true", help="skip the cold/warm load runs")
    parser.add_argument("--only", default="", help="comma-separated measurements to (re)run; "
                        "the others are kept from an existing --out file")
    args = parser.parse_args()
    only = {name for name in args.only.split(",") if name}

    lm = load_default_lm()
    previous = json.loads(args.out.read_text()) if only and args.out.is_file() else {}
    results: dict[str, Any] = {
        **previous,
        "command": "python benchmarks/lm.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "cpus": os.cpu_count(),
                    "processor": platform.processor() or platform.machine()},
        "model": lm.model_id, "repeats": args.repeats,
    }
    steps: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("generate_vs_raw", lambda: bench_generate(lm, args.repeats, args.new_tokens)),
        ("hidden_capture_vs_plain", lambda: bench_hidden_capture(lm, args.repeats,
                                                                 args.new_tokens)),
        ("scoring_reuse_vs_independent", lambda: bench_scoring(lm, args.repeats)),
    ]
    if not args.skip_load:
        steps.append(("load_warm_vs_cold", lambda: bench_load(args.repeats)))
    for name, step in steps:
        if only and name not in only:
            continue
        print(f"running {name} ...", flush=True)
        results[name] = step()
        r = results[name]
        print(f"  ratio {r['ratio_of_medians']:.3f} (ours {r['ours_median_s']:.3f} s, "
              f"baseline {r['baseline_median_s']:.3f} s)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n")
    tmp.replace(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
