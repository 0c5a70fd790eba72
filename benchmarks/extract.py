"""Measure the QuCo-RAG extractors against HotpotQA supporting-fact titles.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/extract.py --build
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/extract.py --out benchmarks/results/extract.json

The labelled set (``--build``; ``benchmarks/data/hotpotqa_entities_200.jsonl``) is the first
``--n`` rows of the HotpotQA dev (distractor) file (``/work/shared/data/hotpotqa_dev.jsonl``,
CC BY-SA 4.0, Yang et al. 2018). Each row has:

* ``gold_entities``: the distinct titles of the supporting facts (HTML-unescaped), the
  bridge/comparison entities a pre-generation gate should look up; ``gold_mentioned`` flags
  the titles whose disambiguation-free form appears in the question (a bridge entity usually
  does not: no question-only extractor can find it, so recall has a ceiling below 1);
* ``supporting_sentences``: the supporting-fact sentences (declarative facts: an extractor
  should give at least one claim);
* ``non_factual``: one reasoning conclusion built from a template ("Thus, ...",
  "Therefore, ...", "So ...", rotated) over the gold titles (an extractor should give ``[]``).

Entity match rule: both strings are normalised (HTML-unescaped, NFKC, parenthesised
disambiguation such as "(film)" removed, lower-cased, punctuation other than "&" dropped,
a leading "the" dropped, whitespace collapsed); a gold title matches a predicted entity when
one's token sequence is a contiguous part of the other's. Precision = predicted entities
matching some gold title / predicted entities; recall = gold titles matched by some predicted
entity / gold titles (micro-averaged over all questions); ``recall_mentioned`` is recall over
the gold titles that appear in the question. Latency is wall time per call, single thread.

Claims: ``declarative_with_claim`` is the share of supporting sentences with at least one
claim, ``claims_grounded`` the share of claims whose head and tail occur in the sentence (a
model that copies its few-shot examples scores low), ``non_factual_empty`` the share of
"Thus/Therefore/So" conclusions given ``[]``. The LLM extractor is also run without its
rule-based "Thus/Therefore" shortcut (``non_factual_empty_without_shortcut``): that is the
model's own behaviour. The LLM runs on the embedded SmolLM2-135M-Instruct (greedy, one thread).
"""

from __future__ import annotations

import argparse
import datetime as dt
import html
import json
import os
import platform
import re
import statistics
import sys
import time
import unicodedata
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCE = Path("/work/shared/data/hotpotqa_dev.jsonl")
DATA = ROOT / "benchmarks" / "data" / "hotpotqa_entities_200.jsonl"
OUT = ROOT / "benchmarks" / "results" / "extract.json"
_TEMPLATES = (
    "Thus, {a} came out first.",
    "Therefore, {a} and {b} share the same nationality.",
    "So the answer is {b}.",
    "Thus, the director of {a} was born first.",
    "Therefore, {b} is older than {a}.",
    "So {a} is the one that was founded earlier.",
)
_PAREN = re.compile(r"\s*\([^)]*\)")
_NONWORD = re.compile(r"[^\w&]+")


def normalise(text: str) -> list[str]:
    """Token list of ``text`` under the match rule (see the module doc)."""
    text = unicodedata.normalize("NFKC", html.unescape(text))
    text = _PAREN.sub(" ", text).lower()
    tokens = _NONWORD.sub(" ", text).split()
    if tokens and tokens[0] == "the" and len(tokens) > 1:
        tokens = tokens[1:]
    return tokens


def _contains(big: list[str], small: list[str]) -> bool:
    n = len(small)
    return n > 0 and any(big[i:i + n] == small for i in range(len(big) - n + 1))


def matches(gold: str, predicted: str) -> bool:
    """A gold title matches a predicted entity when one contains the other (normalised)."""
    g, p = normalise(gold), normalise(predicted)
    return _contains(g, p) or _contains(p, g)


def build(n: int, source: Path = SOURCE, dest: Path = DATA) -> list[dict[str, Any]]:
    rows = []
    with source.open(encoding="utf-8") as fh:
        for line in fh:
            if len(rows) >= n:
                break
            r = json.loads(line)
            titles = list(dict.fromkeys(html.unescape(t) for t, _ in r["supporting_facts"]))
            context = {t: s for t, s in r["context"]}
            sentences = []
            for t, i in r["supporting_facts"]:
                sents = context.get(t, [])
                if 0 <= i < len(sents) and sents[i].strip():
                    sentences.append(sents[i].strip())
            q_tokens = normalise(r["question"])
            a = _PAREN.sub("", titles[0]).strip()
            b = _PAREN.sub("", titles[-1]).strip()
            rows.append({
                "_id": r["_id"],
                "question": r["question"],
                "type": r["type"],
                "answer": r["answer"],
                "gold_entities": titles,
                "gold_mentioned": [_contains(q_tokens, normalise(t)) for t in titles],
                "supporting_sentences": sentences,
                "non_factual": _TEMPLATES[len(rows) % len(_TEMPLATES)].format(a=a, b=b),
            })
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    tmp.replace(dest)
    return rows


def load(path: Path = DATA) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _timed(fn: Callable[[str], Any], inputs: Sequence[str]) -> tuple[list[Any], list[float]]:
    outs, times = [], []
    for x in inputs:
        start = time.perf_counter()
        outs.append(fn(x))
        times.append(time.perf_counter() - start)
    return outs, times


def score_entities(rows: Sequence[dict[str, Any]],
                   predicted: Sequence[list[str]]) -> dict[str, Any]:
    tp_p = n_p = tp_g = n_g = tp_m = n_m = empty = 0
    for row, preds in zip(rows, predicted, strict=True):
        golds = row["gold_entities"]
        n_p += len(preds)
        tp_p += sum(any(matches(g, p) for g in golds) for p in preds)
        n_g += len(golds)
        hit = [any(matches(g, p) for p in preds) for g in golds]
        tp_g += sum(hit)
        for h, mentioned in zip(hit, row["gold_mentioned"], strict=True):
            if mentioned:
                n_m += 1
                tp_m += h
        empty += not preds
    precision = tp_p / n_p if n_p else 0.0
    recall = tp_g / n_g if n_g else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return {"precision": round(precision, 4), "recall": round(recall, 4), "f1": round(f1, 4),
            "recall_mentioned": round(tp_m / n_m, 4) if n_m else None,
            "predicted": n_p, "gold": n_g, "gold_mentioned": n_m,
            "questions_without_entities": empty}


def _ms(times: Sequence[float]) -> dict[str, float]:
    return {"mean_ms": round(1000 * statistics.fmean(times), 3),
            "median_ms": round(1000 * statistics.median(times), 3)}


def measure(name: str, extractor: Any, rows: Sequence[dict[str, Any]], n_sentences: int,
            examples: int = 5) -> dict[str, Any]:
    print(f"[{name}] entities on {len(rows)} questions", file=sys.stderr, flush=True)
    questions = [r["question"] for r in rows]
    extractor.entities(questions[0])  # warm-up (lazy model loads are not per-question cost)
    predicted, q_times = _timed(extractor.entities, questions)
    result: dict[str, Any] = {"questions": len(rows), "entities": score_entities(rows, predicted),
                              "entity_latency": _ms(q_times)}
    sentences = [s for r in rows for s in r["supporting_sentences"]][:n_sentences]
    print(f"[{name}] claims on {len(sentences)} sentences", file=sys.stderr, flush=True)
    claims, s_times = _timed(extractor.claims, sentences)
    n_claims = sum(len(c) for c in claims)
    grounded = sum(c.head.casefold() in s.casefold() and (c.tail is None or c.tail.casefold()
                                                          in s.casefold())
                   for s, cs in zip(sentences, claims, strict=True) for c in cs)
    non_factual = [r["non_factual"] for r in rows][: max(1, n_sentences // 2)]
    nf_claims, _ = _timed(extractor.claims, non_factual)
    result["claims"] = {
        "declarative_sentences": len(sentences),
        "declarative_with_claim": round(sum(bool(c) for c in claims) / len(sentences), 4),
        "mean_claims_per_declarative": round(statistics.fmean(len(c) for c in claims), 3),
        "claims_grounded": round(grounded / n_claims, 4) if n_claims else None,
        "non_factual_sentences": len(non_factual),
        "non_factual_empty": round(sum(not c for c in nf_claims) / len(non_factual), 4),
        "latency": _ms(s_times),
    }
    result["examples"] = [
        {"question": r["question"], "gold": r["gold_entities"], "predicted": p}
        for r, p in zip(rows[:examples], predicted, strict=False)
    ] + [{"sentence": s, "claims": [c.model_dump() for c in cs]}
         for s, cs in zip(sentences[:examples], claims, strict=False)]
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--build", action="store_true", help="(re)build the labelled set and exit")
    parser.add_argument("--n", type=int, default=200, help="questions in the labelled set")
    parser.add_argument("--extractors", default="heuristic,spacy,llm")
    parser.add_argument("--sentences", type=int, default=400,
                        help="supporting sentences for the fast extractors' claim check")
    parser.add_argument("--llm-questions", type=int, default=200)
    parser.add_argument("--llm-sentences", type=int, default=40)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--update", action="store_true",
                        help="keep the other extractors' results already in --out")
    args = parser.parse_args(argv)
    if args.build:
        rows = build(args.n)
        print(f"wrote {len(rows)} rows to {DATA}")
        return
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    rows = load()
    results: dict[str, Any] = {}
    for name in args.extractors.split(","):
        if name == "heuristic":
            from rag_gates.extract import HeuristicExtractor
            results[name] = measure(name, HeuristicExtractor(), rows, args.sentences)
        elif name == "spacy":
            from rag_gates.extract import SpacyExtractor
            results[name] = measure(name, SpacyExtractor(), rows, args.sentences)
        elif name == "llm":
            import torch

            from rag_gates.extract import LLMExtractor
            from rag_gates.lm.defaults import load_default_lm
            torch.set_num_threads(1)
            lm = load_default_lm()
            # Scored as before: an unreadable reply is no claim (the gate's on_error is not
            # what this benchmark measures).
            ex = LLMExtractor(lm, on_unreadable="empty")
            results[name] = measure(name, ex, rows[: args.llm_questions], args.llm_sentences)
            raw = LLMExtractor(lm, skip_non_factual=False, on_unreadable="empty")
            nf = [r["non_factual"] for r in rows[: args.llm_sentences // 2]]
            raw_claims = [raw.claims(s) for s in nf]
            results[name]["claims"]["non_factual_empty_without_shortcut"] = round(
                sum(not c for c in raw_claims) / len(nf), 4)
            results[name]["model"] = lm.model_id
        else:
            raise SystemExit(f"unknown extractor {name!r}")
    import torch

    command = "OMP_NUM_THREADS=1 .venv/bin/python " + " ".join(
        ["benchmarks/extract.py", *(argv if argv is not None else sys.argv[1:])])
    date = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    for value in results.values():
        value["command"], value["date"] = command, date
    if args.update and args.out.exists():
        previous = json.loads(args.out.read_text(encoding="utf-8")).get("results", {})
        results = {**previous, **results}
    out = {
        "command": command,
        "date": date,
        "machine": {"python": platform.python_version(), "torch": torch.__version__,
                    "threads": 1, "cpus": os.cpu_count(),
                    "processor": platform.processor() or platform.machine(),
                    "note": "2 cores shared with a concurrent benchmark run"},
        "data": {"file": str(DATA.relative_to(ROOT)), "rows": len(rows),
                 "source": "HotpotQA dev (distractor), first rows; CC BY-SA 4.0"},
        "match_rule": ("normalised (html-unescape, NFKC, drop '(...)', lower, punctuation "
                       "except & dropped, leading 'the' dropped); gold matches predicted when "
                       "one token sequence contains the other"),
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(args.out)
    print(json.dumps({k: {"entities": v["entities"], "latency": v["entity_latency"],
                          "claims": v["claims"]} for k, v in results.items()}, indent=1))


if __name__ == "__main__":
    main()
