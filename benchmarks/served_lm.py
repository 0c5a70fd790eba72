"""OpenAICompatibleLM on llama.cpp's server vs HFWhiteBoxLM in process, same weights (the
embedded SmolLM2 Q4_1 GGUF; transformers dequantises it to float32).

    .venv/bin/python benchmarks/served_lm.py --n 50 --out benchmarks/results/served_lm.json

For each of the first N HotpotQA questions of examples/data (as QA prompts, chat template):
greedy generation of --tokens tokens on both sides with log-probabilities; the served
model's teacher-forced score() of the in-process model's answer (echoed prompt
log-probabilities, probed aligned for chat prompts), compared token by token with the
in-process log-probabilities. Reports agreement of first tokens and whole texts, and
|delta log p| (median, p95, max) for generated tokens on the common prefix and for scored
tokens; then the tails, where quantisation moves log-probabilities most: the top-5 next-token
distribution after the prompt (by the in-process rank) and the teacher-forced score of the
gold answer, which the model mostly finds unlikely. The server runs on one thread (--threads).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path
from typing import Any

from rag_gates.cli import DEMO_DATA, load_hotpotqa_rows
from rag_gates.lm import load_default_lm
from rag_gates.lm.llamacpp_server import llamacpp_server
from rag_gates.lm.openai_compat import OpenAICompatibleLM
from rag_gates.prompts import qa_prompt


def _quantiles(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {"median": statistics.median(values),
            "p95": values[min(len(values) - 1, int(0.95 * len(values)))],
            "max": values[-1], "count": len(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/served_lm.json"))
    args = parser.parse_args()

    hf = load_default_lm(num_threads=args.threads)
    rows = load_hotpotqa_rows(DEMO_DATA, args.n)
    per: list[dict[str, Any]] = []
    gen_d: list[float] = []
    score_d: list[float] = []
    top_d: dict[int, list[float]] = {rank: [] for rank in range(5)}
    gold_d: list[float] = []
    start = time.perf_counter()
    with llamacpp_server(threads=args.threads) as url, \
            OpenAICompatibleLM(url, chat_template=hf.tokenizer.chat_template) as served:
        probe = {"alignment": dict(served.alignment), "notes": served.capabilities.notes}
        for row in rows:
            prompt = qa_prompt(row["question"])
            t0 = time.perf_counter()
            mine = served.generate(prompt, max_new_tokens=args.tokens, logprobs=0)
            t_served = time.perf_counter() - t0
            t0 = time.perf_counter()
            ref = hf.generate(prompt, max_new_tokens=args.tokens, logprobs=0)
            t_hf = time.perf_counter() - t0
            a = mine.logprobs or []
            b = ref.logprobs or []
            n = 0
            while n < min(len(a), len(b)) and a[n].token == b[n].token:
                n += 1
            gen_d += [abs(x.logprob - y.logprob) for x, y in zip(a[:n], b[:n], strict=True)]
            scored = None
            if ref.text.strip():
                [s] = served.score(prompt, [ref.text])
                if s.tokens == [t.token for t in b[: len(s.tokens)]]:
                    d = [abs(x - y.logprob) for x, y in zip(s.logprobs, b, strict=False)]
                    score_d += d
                    scored = max(d)
            theirs = hf.top_next_tokens(prompt, k=5)
            served_top = {t.token: t.logprob for t in served.top_next_tokens(prompt, k=5)}
            for rank, t in enumerate(theirs):
                if t.token in served_top:
                    top_d[rank].append(abs(served_top[t.token] - t.logprob))
            [g_served] = served.score(prompt, [row["answer"]])
            [g_hf] = hf.score(prompt, [row["answer"]])
            if g_served.tokens == g_hf.tokens:
                gold_d += [abs(x - y) for x, y in zip(g_served.logprobs, g_hf.logprobs,
                                                      strict=True)]
            per.append({"question": row["question"], "served": mine.text, "hf": ref.text,
                        "first_token_same": bool(a and b and a[0].token == b[0].token),
                        "text_same": mine.text == ref.text, "common_prefix_tokens": n,
                        "score_max_abs_diff": scored, "served_s": t_served, "hf_s": t_hf})
    result = {
        "command": f"benchmarks/served_lm.py --n {args.n} --tokens {args.tokens} "
                   f"--threads {args.threads}",
        "machine": {"python": platform.python_version(), "cpu": platform.processor()},
        "server": "llama-cpp-python[server] 0.3.36, SmolLM2-135M-Instruct.Q4_1.gguf, "
                  "--logits_all true",
        "probe": probe,
        "n": len(per),
        "first_token_agreement": sum(p["first_token_same"] for p in per) / len(per),
        "text_agreement": sum(p["text_same"] for p in per) / len(per),
        "generated_logprob_abs_diff": _quantiles(gen_d) if gen_d else None,
        "scored_logprob_abs_diff": _quantiles(score_d) if score_d else None,
        "next_token_top5_abs_diff_by_rank": {str(r + 1): _quantiles(v)
                                             for r, v in top_d.items() if v},
        "next_token_top5_abs_diff": _quantiles([x for v in top_d.values() for x in v]),
        "gold_answer_scored_abs_diff": _quantiles(gold_d) if gold_d else None,
        "served_generate_s_median": statistics.median(p["served_s"] for p in per),
        "hf_generate_s_median": statistics.median(p["hf_s"] for p in per),
        "wall_s": time.perf_counter() - start,
        "rows": per,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))


if __name__ == "__main__":
    main()
