"""Token-level benefit/detriment classification (Tok-RAG paper, Table 3 protocol) on HotpotQA.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tokrag_auc.py --min-tokens 300 \\
        --out benchmarks/results/tokrag_auc.json

For HotpotQA distractor rows (in file order), two conditions: the passages are the row's two
gold (supporting) paragraphs, or two of its distractor paragraphs. Both streams (RAG: the
``single`` prompt with those passages; LLM: the ``no-rag`` prompt) are fed a gold text token by
token, two targets per row: the gold answer, and the first sentence of the first supporting
paragraph (at most 24 tokens; the paper's "cut a sentence at token i"). At each position
where the streams' greedy tokens differ and exactly
one equals the gold token, the label is 1 when the RAG stream is right, 0 when the LLM stream
is. Scores (higher = trust the RAG stream):

* Tok-RAG ``cos(w_RAG, w_IR) - cos(w_RAG, w_LLM)`` with l* searched (Eq. 14), p_R renormalised
  and literal; and at every fixed layer 1..L-1 (both forms);
* top-1 log-probability difference ``log p_RAG(t_rag) - log p_LLM(t_llm)``;
* entropy difference ``H(p_LLM) - H(p_RAG)``.

AUC (scikit-learn) and F1 at each score's natural threshold 0 (predict 1 when >= 0). Labelled
tokens are appended to ``--cache`` (JSONL), so an interrupted run resumes where it stopped.

``--replay OLD_CACHE`` (issue 55, the layer rule): the rows of an earlier cache again, each
token checked to come back with the same position and label; the searched-l* scores are
recomputed with today's ``layer_rule`` and the fixed-layer scores (which the rule does not
touch) copied from the old cache. Per token it also records where Eq. 14's second term
fired under each rule (``authors``; ``paper-jsd``, the reading before; and the authors'
divergence under the paper's ``|.|`` from layer 1), to say how often it is not the first
layer searched::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tokrag_auc.py \
        --replay benchmarks/results/tokrag_auc_tokens.jsonl \
        --cache benchmarks/results/tokrag_auc_authors_rule_tokens.jsonl \
        --out benchmarks/results/tokrag_auc_authors_rule.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import os
import platform
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from sklearn.metrics import f1_score, roc_auc_score

from rag_gates.lm import load_default_lm
from rag_gates.tokrag import TokRAGConfig, TokRAGDecoder
from rag_gates.tokrag.decoder import authors_layer_divergence
from rag_gates.tokrag.streams import TwoStreams
from rag_gates.types import QAExample
from rag_gates_lab.datasets import load_dataset

ROOT = Path(__file__).resolve().parent.parent


def conditions(example: QAExample) -> dict[str, list[Any]]:
    gold = [p for p in example.context if p.title in example.supporting_titles]
    other = [p for p in example.context if p.title not in example.supporting_titles]
    return {"gold": gold[:2], "distractor": other[:2]}


def targets(example: QAExample) -> dict[str, str]:
    first = next(p for p in example.context if p.title in example.supporting_titles)
    sentence = first.text.split(". ")[0].strip()
    return {"answer": example.answers[0], "sentence": sentence}


def labelled_steps(decoder: TokRAGDecoder, example: QAExample
                   ) -> Iterator[tuple[str, str, int, int, TwoStreams, int, int]]:
    """Each labelled disagreement of a row, with the streams positioned at it:
    (condition, target, position, label, streams, RAG token, LLM token)."""
    lm = decoder.lm
    for (condition, passages), (target, text) in itertools.product(
            conditions(example).items(), targets(example).items()):
        gold_ids = lm.tokenizer(text, add_special_tokens=False)["input_ids"][:24]
        if not passages or not gold_ids:
            continue
        streams = decoder.open(example.question, passages, max_new_tokens=len(gold_ids) + 1)
        group = streams.group
        for position, gold in enumerate(gold_ids):
            t_rag, t_llm = group.greedy_tokens()
            if t_rag != t_llm and (t_rag == gold) != (t_llm == gold):
                yield condition, target, position, int(t_rag == gold), streams, t_rag, t_llm
            group.advance(gold)


def label_row(decoder: TokRAGDecoder, example: QAExample, layers: list[int]
              ) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for condition, target, position, label, streams, t_rag, t_llm in labelled_steps(
            decoder, example):
        logp = streams.group.logprobs
        entropy = -(logp.exp() * logp).sum(-1)
        dynamic = decoder.judge(streams)
        fixed = {layer: decoder.judge(streams, layer=layer) for layer in layers}
        out.append({
            "id": example.id, "condition": condition, "target": target,
            "position": position, "label": label,
            "tokrag_renormalised": dynamic.score_renormalised,
            "tokrag_literal": dynamic.score_literal, "layer": dynamic.layer,
            "fixed_renormalised": {str(k): v.score_renormalised for k, v in fixed.items()},
            "fixed_literal": {str(k): v.score_literal for k, v in fixed.items()},
            "logprob_diff": float(logp[0, t_rag] - logp[1, t_llm]),
            "entropy_diff": float(entropy[1] - entropy[0]),
        })
    return out


class AllHidden(TokRAGDecoder):
    """Opens the streams with every hidden state 0..L-1 and attention 1..L-1, so both layer
    rules (and the by-hand variant) read the same step."""

    def capture(self) -> tuple[list[int], list[int]]:
        return list(range(self.lm.num_layers)), list(range(1, self.lm.num_layers))


def abs_from_one(decoder: TokRAGDecoder, streams: TwoStreams) -> int | None:
    """The authors' divergence under the paper's Eq. 13-14 reading: first l >= 1 with
    |div_RAG(l-1, l) - div_LLM(l-1, l)| > a (None: no layer)."""
    for layer in range(1, decoder.lm.num_layers + 1):
        change = authors_layer_divergence(decoder.head_lens(streams, layer - 1),
                                          decoder.head_lens(streams, layer))
        if abs(float(change[0] - change[1])) > decoder.config.a:
            return layer
    return None


def replay_row(opener: TokRAGDecoder, old_rule: TokRAGDecoder, example: QAExample,
               cached: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cached row's tokens again (same position and label, else an error), scored with
    today's rule; fixed-layer and baseline scores copied from the cache."""
    expected = {(t["condition"], t["target"], t["position"]): t for t in cached}
    out: list[dict[str, Any]] = []
    for condition, target, position, label, streams, _, _ in labelled_steps(opener, example):
        old = expected.get((condition, target, position))
        if old is None or old["label"] != label:
            raise RuntimeError(f"replay of {example.id} {(condition, target, position)} gave "
                               f"label {label}, the cache {old and old['label']}")
        layer, curves = opener.fusion_layer(streams)
        verdict = opener.judge(streams, layer=layer)
        before, before_curves = old_rule.fusion_layer(streams)
        out.append({**old, "tokrag_renormalised": verdict.score_renormalised,
                    "tokrag_literal": verdict.score_literal, "layer": layer,
                    "fired": curves["fired"], "pairs_read": len(curves["g"]),
                    "before_layer": before, "before_fired": before_curves["fired"],
                    "before_tokrag_literal": old["tokrag_literal"],
                    "before_tokrag_renormalised": old["tokrag_renormalised"],
                    "abs_from_one_fired": abs_from_one(opener, streams)})
    if len(out) != len(cached):
        raise RuntimeError(f"replay of {example.id} found {len(out)} tokens, the cache "
                           f"{len(cached)}: not the same token set")
    return out


def firing(records: list[dict[str, Any]], key: str, first: int) -> dict[str, Any]:
    """Where a rule's second term fired: counts per layer, at the first layer it reads,
    later, never (fallback)."""
    values = [r[key] for r in records]
    counts: dict[str, int] = {}
    for v in values:
        counts[str(v)] = counts.get(str(v), 0) + 1
    return {"first_layer_read": first, "at_first": sum(v == first for v in values),
            "later": sum(v is not None and v != first for v in values),
            "never": sum(v is None for v in values), "by_layer": counts}


def metrics(labels: list[int], scores: list[float]) -> dict[str, float]:
    return {"auc": round(100 * float(roc_auc_score(labels, scores)), 2),
            "f1": round(100 * float(f1_score(labels, [int(s >= 0) for s in scores])), 2)}


def summarise(records: list[dict[str, Any]], layers: list[int]) -> dict[str, Any]:
    labels = [r["label"] for r in records]
    table = {name: metrics(labels, [r[name] for r in records])
             for name in ("tokrag_renormalised", "tokrag_literal", "logprob_diff",
                          "entropy_diff")}
    by_layer = {form: {str(layer): metrics(labels, [r[f"fixed_{form}"][str(layer)]
                                                    for r in records])
                       for layer in layers}
                for form in ("renormalised", "literal")}
    best = {form: max(rows, key=lambda k: rows[k]["auc"]) for form, rows in by_layer.items()}
    layer_counts: dict[str, int] = {}
    for r in records:
        layer_counts[str(r["layer"])] = layer_counts.get(str(r["layer"]), 0) + 1
    distractor = [r for r in records if r["condition"] == "distractor"]
    d_labels = [r["label"] for r in distractor]
    by_distractor = ({name: metrics(d_labels, [r[name] for r in distractor])
                      for name in ("tokrag_renormalised", "tokrag_literal", "logprob_diff",
                                   "entropy_diff")}
                     if 0 < sum(d_labels) < len(d_labels) else {})
    return {"tokens": len(records), "positives": sum(labels),
            "scores_distractor_only": by_distractor,
            "by_condition": {c: sum(r["condition"] == c for r in records)
                             for c in ("gold", "distractor")},
            "by_target": {t: sum(r["target"] == t for r in records)
                          for t in ("answer", "sentence")},
            "scores": table, "fixed_layers": by_layer, "best_fixed_layer": best,
            "searched_layer_counts": layer_counts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--min-tokens", type=int, default=300)
    parser.add_argument("--min-negatives", type=int, default=50,
                        help="also run until this many label-0 tokens (LLM right, RAG wrong)")
    parser.add_argument("--max-rows", type=int, default=1154)
    parser.add_argument("--cache", type=Path,
                        default=ROOT / "benchmarks/results/tokrag_auc_tokens.jsonl")
    parser.add_argument("--out", type=Path,
                        default=ROOT / "benchmarks/results/tokrag_auc.json")
    parser.add_argument("--replay", type=Path, default=None,
                        help="re-score the rows of this earlier token cache (see above)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    lm = load_default_lm()
    decoder = TokRAGDecoder(lm, TokRAGConfig(judge="paper"))  # the paper's l*, p_R scores
    layers = list(range(1, lm.num_layers))
    if args.replay is not None:
        replay(args, lm, layers)
        return
    done: set[str] = set()
    records: list[dict[str, Any]] = []
    if args.cache.exists():
        for line in args.cache.read_text().splitlines():
            row = json.loads(line)
            done.add(row["id"])
            records.extend(row["tokens"])
    examples = load_dataset("hotpotqa", n=args.max_rows).examples
    start = time.perf_counter()
    with args.cache.open("a") as cache:
        for example in examples:
            negatives = sum(1 - r["label"] for r in records)
            if len(records) >= args.min_tokens and negatives >= args.min_negatives:
                break
            if example.id in done:
                continue
            tokens = label_row(decoder, example, layers)
            records.extend(tokens)
            cache.write(json.dumps({"id": example.id, "tokens": tokens}) + "\n")
            cache.flush()
            done.add(example.id)
            print(f"{len(done)} rows, {len(records)} tokens, "
                  f"{time.perf_counter() - start:.0f}s", flush=True)
    payload = {
        "command": f"OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tokrag_auc.py "
                   f"--min-tokens {args.min_tokens} --min-negatives {args.min_negatives}",
        "date": dt.date.today().isoformat(), "machine": platform.platform(),
        "model": lm.model_id, "rows": len(done), "dataset": "hotpotqa (dev, file order)",
        **summarise(records, layers),
    }
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(args.out)
    print(json.dumps({k: payload[k] for k in ("tokens", "scores", "best_fixed_layer")}, indent=1))


def _shown(path: Path) -> str:
    return os.path.relpath(path.resolve(), ROOT)


def replay(args: argparse.Namespace, lm: Any, layers: list[int]) -> None:
    source = [json.loads(line) for line in args.replay.read_text().splitlines()]
    opener = AllHidden(lm, TokRAGConfig(judge="paper"))
    old_rule = TokRAGDecoder(lm, TokRAGConfig(judge="paper", layer_rule="paper-jsd"))
    done: dict[str, list[dict[str, Any]]] = {}
    if args.cache.exists():
        for line in args.cache.read_text().splitlines():
            row = json.loads(line)
            done[row["id"]] = row["tokens"]
    wanted = {row["id"]: row["tokens"] for row in source}
    examples = [e for e in load_dataset("hotpotqa", n=args.max_rows).examples
                if e.id in wanted]
    start = time.perf_counter()
    with args.cache.open("a") as cache:
        for example in examples:
            if example.id in done:
                continue
            tokens = replay_row(opener, old_rule, example, wanted[example.id])
            done[example.id] = tokens
            cache.write(json.dumps({"id": example.id, "tokens": tokens}) + "\n")
            cache.flush()
            print(f"{len(done)}/{len(examples)} rows, "
                  f"{sum(len(t) for t in done.values())} tokens, "
                  f"{time.perf_counter() - start:.0f}s", flush=True)
    records = [t for tokens in done.values() for t in tokens]
    labels = [r["label"] for r in records]
    before = {name: metrics(labels, [r[f"before_{name}"] for r in records])
              for name in ("tokrag_literal", "tokrag_renormalised")}
    low = opener.candidates[[x > 10 * lm.num_layers / 32 for x in opener.candidates].index(True)]
    payload = {
        "command": "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tokrag_auc.py --replay "
                   f"{_shown(args.replay)} --cache {_shown(args.cache)} "
                   f"--out {_shown(args.out)}",
        "date": dt.date.today().isoformat(), "machine": platform.platform(),
        "model": lm.model_id, "rows": len(done), "dataset": "hotpotqa (dev, file order)",
        "layer_rule": opener.config.layer_rule, "a": opener.config.a,
        "token_set": f"the same as {args.replay.name} (checked token by token)",
        **summarise(records, layers),
        "before": {"scores": before, "layer_rule": "paper-jsd"},
        "second_term_fired": {
            "authors": firing(records, "fired", low),
            "paper-jsd": firing(records, "before_fired", 1),
            "authors_divergence_abs_from_layer_1": firing(records, "abs_from_one_fired", 1),
        },
        "searched_layer_counts_before": {
            str(k): sum(r["before_layer"] == k for r in records)
            for k in sorted({r["before_layer"] for r in records})},
    }
    tmp = args.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(args.out)
    print(json.dumps({k: payload[k] for k in ("tokens", "scores", "before",
                                               "second_term_fired")}, indent=1))


if __name__ == "__main__":
    main()
