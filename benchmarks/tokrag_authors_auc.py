"""The Tok-RAG authors' judges beside ours, on the token set of ``tokrag_auc.py``.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tokrag_authors_auc.py
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tokrag_authors_auc.py --prefix

Replays the HotpotQA rows of ``benchmarks/results/tokrag_auc_tokens.jsonl`` (same passages,
same teacher-forced gold texts, same prompts) and, at every labelled disagreement token,
scores it with the released code's judges (``rag_gates.tokrag.authors``: ``authors-qa`` from
``Tok-RAG_for_ODQA.py``, ``authors-token`` from the primary experiment) at every attention
layer 0..L-1 (their scripts sweep the layer). Each replayed token is checked against the
cached one (position and label), so the AUCs sit on exactly the tokens of today's table,
whose scores (p_R literal / renormalised at the searched l*, log-probability and entropy
differences) are read from the cache. AUC (scikit-learn) and F1 with the rule's own
threshold (> 0 keeps RAG for the authors' judges, >= 0 for the others).

``--summary-only --ours-from CACHE --out FILE`` (issue 55): the cached tokens summarised with
the paper judge's scores taken from another replay of the same tokens (e.g.
``tokrag_auc_authors_rule_tokens.jsonl``, the paper judge under ``layer_rule="authors"``),
matched token by token; the authors' judges' scores are the cached ones (the layer rule does
not touch them)::

    .venv/bin/python benchmarks/tokrag_authors_auc.py --summary-only \
        --ours-from benchmarks/results/tokrag_auc_authors_rule_tokens.jsonl \
        --out benchmarks/results/tokrag_authors_auc_authors_rule.json

``--prefix --cache NEW --out FILE`` (issue 55): the prefix token set recomputed from scratch
into a new cache, so the paper judge's scores follow today's layer rule
(``layer_rule="authors"``); the authors' judges do not depend on it::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tokrag_authors_auc.py --prefix \
        --cache benchmarks/results/tokrag_authors_auc_prefix_authors_rule_tokens.jsonl \
        --out benchmarks/results/tokrag_authors_auc_prefix_authors_rule.json

``--prefix``: the RAG prompt's passages rendered the authors' way (``[Reference]: ``
prefixes, concatenated). The prompt differs, so the token set is its own: every score,
ours included, is recomputed on it (written to ``tokrag_authors_auc_prefix.json``).
Labelled tokens are appended to a JSONL cache, so an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import time
from pathlib import Path
from typing import Any

import torch
from sklearn.metrics import f1_score, roc_auc_score
from tokrag_auc import labelled_steps  # the same rows, passages and gold texts

from rag_gates.lm import load_default_lm
from rag_gates.lm.defaults import DEFAULT_LM_ID
from rag_gates.tokrag import TokRAGConfig, TokRAGDecoder
from rag_gates.tokrag.authors import AUTHORS_VARIANTS
from rag_gates.types import QAExample
from rag_gates_lab.datasets import load_dataset

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks/results"
SMOLLM2_LAYERS = 30  # the embedded model's decoder layers (--summary-only loads no model)
OURS = ("tokrag_literal", "tokrag_renormalised", "logprob_diff", "entropy_diff")


class EveryLayer(TokRAGDecoder):
    """Captures every hidden state and attention layer, so each judge reads any layer."""

    def capture(self) -> tuple[list[int], list[int]]:
        return list(range(self.lm.num_layers)), list(range(self.lm.num_layers))


def label_row(decoder: EveryLayer, example: QAExample, layers: list[int],
              expected: dict[tuple[str, str, int], int] | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for condition, target, position, label, streams, t_rag, t_llm in labelled_steps(
            decoder, example):
        key = (condition, target, position)
        if expected is not None and expected.get(key) != label:
            raise RuntimeError(f"replay of {example.id} {key} gave label {label}, the "
                               f"cache {expected.get(key)}: not the same token set")
        record: dict[str, Any] = {"id": example.id, "condition": condition,
                                  "target": target, "position": position, "label": label}
        for variant in AUTHORS_VARIANTS:
            decoder.config = decoder.config.model_copy(update={"judge": variant})
            record[variant] = {str(layer): decoder.judge_authors(streams, layer=layer).score
                               for layer in layers}
        if expected is None:  # our scores, recomputed on this prompt's token set
            decoder.config = decoder.config.model_copy(update={"judge": "paper"})
            verdict = decoder.judge(streams)
            logp = streams.group.logprobs
            entropy = -(logp.exp() * logp).sum(-1)
            record.update(tokrag_literal=verdict.score_literal,
                          tokrag_renormalised=verdict.score_renormalised,
                          logprob_diff=float(logp[0, t_rag] - logp[1, t_llm]),
                          entropy_diff=float(entropy[1] - entropy[0]))
        out.append(record)
    if expected is not None and len(out) != len(expected):
        raise RuntimeError(f"replay of {example.id} found {len(out)} tokens, the cache "
                           f"{len(expected)}: not the same token set")
    return out


def metrics(labels: list[int], scores: list[float], strict: bool) -> dict[str, float]:
    predicted = [int(s > 0 if strict else s >= 0) for s in scores]
    return {"auc": round(100 * float(roc_auc_score(labels, scores)), 2),
            "f1": round(100 * float(f1_score(labels, predicted)), 2)}


def held_out(records: list[dict[str, Any]], variant: str, layers: list[int]
             ) -> dict[str, Any]:
    """The best layer picked on one half of the rows (ids in file order, alternating) and
    scored on the other, both ways: the best-layer AUC above is picked on the very tokens
    it is scored on, so it flatters the judge."""
    ids = list(dict.fromkeys(r["id"] for r in records))
    halves = [set(ids[0::2]), set(ids[1::2])]
    out: dict[str, Any] = {}
    for name, (pick, score) in (("a->b", halves), ("b->a", halves[::-1])):
        chosen = [r for r in records if r["id"] in pick]
        scored = [r for r in records if r["id"] in score]
        labels = [r["label"] for r in chosen]
        if not 0 < sum(labels) < len(labels):
            continue
        layer = max(layers, key=lambda k: roc_auc_score(labels,
                                                        [r[variant][str(k)] for r in chosen]))
        out[name] = {"layer": layer, "tokens": len(scored),
                     **metrics([r["label"] for r in scored],
                               [r[variant][str(layer)] for r in scored], strict=True)}
    return out


def summarise(records: list[dict[str, Any]], layers: list[int]) -> dict[str, Any]:
    labels = [r["label"] for r in records]
    ours = {name: metrics(labels, [r[name] for r in records], strict=False) for name in OURS}
    authors: dict[str, Any] = {}
    for variant in AUTHORS_VARIANTS:
        by_layer = {str(layer): metrics(labels, [r[variant][str(layer)] for r in records],
                                        strict=True) for layer in layers}
        best = max(by_layer, key=lambda k: by_layer[k]["auc"])
        aucs = [v["auc"] for v in by_layer.values()]
        authors[variant] = {"best_layer": int(best), **by_layer[best],
                            "auc_range": [min(aucs), max(aucs)],
                            "held_out": held_out(records, variant, layers),
                            "by_layer": by_layer}
    return {"tokens": len(records), "positives": sum(labels), "ours": ours, "authors": authors}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prefix", action="store_true",
                        help="passages as '[Reference]: ...' (a token set of its own)")
    parser.add_argument("--source", type=Path, default=RESULTS / "tokrag_auc_tokens.jsonl")
    parser.add_argument("--summary-only", action="store_true",
                        help="only summarise the cached tokens (no model)")
    parser.add_argument("--ours-from", type=Path, default=None,
                        help="with --summary-only: the paper judge's scores from this token "
                             "cache (same tokens, matched one by one)")
    parser.add_argument("--out", type=Path, default=None, help="summary file (default: "
                        "tokrag_authors_auc[_prefix].json)")
    parser.add_argument("--cache", type=Path, default=None, help="token cache (default: "
                        "tokrag_authors_auc[_prefix]_tokens.jsonl); a new one recomputes "
                        "every score with today's code")
    args = parser.parse_args()
    stem = "tokrag_authors_auc_prefix" if args.prefix else "tokrag_authors_auc"
    cache_path, out_path = RESULTS / f"{stem}_tokens.jsonl", RESULTS / f"{stem}.json"
    if args.out is not None:
        out_path = args.out
    if args.cache is not None:
        cache_path = args.cache
    torch.set_num_threads(1)
    lm = None if args.summary_only else load_default_lm()
    layers = list(range(SMOLLM2_LAYERS if lm is None else lm.num_layers))
    source = [json.loads(line) for line in args.source.read_text().splitlines()]
    done: dict[str, list[dict[str, Any]]] = {}
    if cache_path.exists():
        for line in cache_path.read_text().splitlines():
            row = json.loads(line)
            done[row["id"]] = row["tokens"]
    wanted = {row["id"] for row in source}
    examples = [] if lm is None else [
        e for e in load_dataset("hotpotqa", n=1154).examples if e.id in wanted]
    decoder = None if lm is None else EveryLayer(lm, TokRAGConfig(passage_prefix=args.prefix))
    start = time.perf_counter()
    with cache_path.open("a") as cache:
        for example in examples:
            if example.id in done or decoder is None:
                continue
            cached = next(row["tokens"] for row in source if row["id"] == example.id)
            expected = (None if args.prefix else
                        {(t["condition"], t["target"], t["position"]): t["label"]
                         for t in cached})
            tokens = label_row(decoder, example, layers, expected)
            if not args.prefix:  # today's scores on the same tokens, from the cache
                for new, old in zip(tokens, cached, strict=True):
                    new.update({name: old[name] for name in OURS})
            done[example.id] = tokens
            cache.write(json.dumps({"id": example.id, "tokens": tokens}) + "\n")
            cache.flush()
            print(f"{len(done)}/{len(examples)} rows, "
                  f"{sum(len(t) for t in done.values())} tokens, "
                  f"{time.perf_counter() - start:.0f}s", flush=True)
    records = [t for tokens in done.values() for t in tokens]
    if args.ours_from is not None:
        other = {(t["id"], t["condition"], t["target"], t["position"]): t
                 for line in args.ours_from.read_text().splitlines()
                 for t in json.loads(line)["tokens"]}
        for r in records:
            match = other[(r["id"], r["condition"], r["target"], r["position"])]
            if match["label"] != r["label"]:
                raise RuntimeError(f"{args.ours_from.name}: another label at {r['id']}")
            r.update({name: match[name] for name in OURS})
        if len(other) != len(records):
            raise RuntimeError(f"{args.ours_from.name} holds {len(other)} tokens, the cache "
                               f"{len(records)}: not the same token set")
    payload = {
        "command": "OMP_NUM_THREADS=1 .venv/bin/python benchmarks/tokrag_authors_auc.py"
                   + (" --prefix" if args.prefix else "")
                   + (f" --cache {cache_path.name} --out {out_path.name}"
                      if args.cache is not None else "")
                   + (f" --summary-only --ours-from {args.ours_from.name} --out "
                      f"{out_path.name}" if args.ours_from is not None else ""),
        "date": dt.date.today().isoformat(), "machine": platform.platform(),
        "model": DEFAULT_LM_ID, "rows": len(done),
        "token_set": ("its own (prompt with '[Reference]: ' passages)" if args.prefix
                      else f"the same as {args.source.name} (checked token by token)"),
        **summarise(records, layers),
    }
    tmp = out_path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload, indent=2) + "\n")
    tmp.replace(out_path)
    print(json.dumps({k: payload[k] for k in ("tokens", "ours")}, indent=1))
    for variant, row in payload["authors"].items():
        print(variant, {k: v for k, v in row.items() if k != "by_layer"})


if __name__ == "__main__":
    main()
