"""QuCo-RAG's question entities and their counts: the extractor before/after a change, on the
lower-cased and on the cased corpus-statistics index (issue 55, docs/fidelity.md Q20-Q22).

For each dataset (the first N questions, as the gate tables use them), with the committed
closed-book labels (``benchmarks/results/eval/<labels>``, no model loaded):

* how many questions' entities change, how many entities count 0 on each index, and the
  issue's statistic: entities holding a Title-Cased small word ("Of", "The", ...) and how
  many of them count 0 as written / at least once lower-cased;
* the gate's AUROC for "closed-book answer wrong" and its retrievals at the bench's
  ``tau_entity`` for the four combinations extractor (before, after) x index (lower, cased);
* on the cased index, the AUROC with each of the extractor's changes switched off.

Usage:
    python benchmarks/quco_casing.py --before 4e3297b --out benchmarks/results/quco_casing.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DATASETS = [("popqa", 500, "popqa-500"), ("hotpotqa", 200, "hotpotqa-200"),
            ("2wiki", 200, "2wiki-200")]
SMALL = {"Of", "The", "A", "An", "And", "Or", "Nor", "At", "By", "For", "From", "In", "Into",
         "On", "Onto", "To", "With", "Upon"}


def _old_extractor(commit: str) -> Any:
    """The heuristic extractor as it was at ``commit`` (loaded from ``git show``)."""
    source = subprocess.run(["git", "show", f"{commit}:rag_gates/extract/heuristic.py"],
                            cwd=ROOT, check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "heuristic_before.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("heuristic_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["heuristic_before"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.HeuristicExtractor()


def _auroc(scores: list[float], labels: list[bool]) -> float:
    """P(score of a positive > score of a negative), ties counting half."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y]
    neg = [s for s, y in zip(scores, labels, strict=True) if not y]
    wins = sum((p > n) + 0.5 * (p == n) for p in pos for n in neg)
    return wins / (len(pos) * len(neg))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="commit of the extractor before")
    parser.add_argument("--tau-entity", type=float, default=82.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import rag_gates.extract.heuristic as heuristic
    from rag_gates.quco import QuCoGate
    from rag_gates_lab.corpus import load_corpus_stats
    from rag_gates_lab.datasets import load_dataset

    extractors = {"before": _old_extractor(args.before), "after": heuristic.HeuristicExtractor()}
    indexes = {"lower": load_corpus_stats(case="insensitive", cache=False),
               "cased": load_corpus_stats(case="sensitive", cache=False)}
    cls = heuristic.HeuristicExtractor
    switches: dict[str, tuple[Any, str, Any]] = {
        "casing": (heuristic, "_name_case",
                   lambda text, toks, first, last: text[toks[first].start:toks[last].end]),
        "disambiguator": (cls, "_disambiguator", staticmethod(lambda toks, k, longest=8: None)),
        "key entities": (heuristic, "_key_mentions", lambda toks, mentions: mentions),
        "possessive name": (cls, "_possessive_name", staticmethod(lambda toks, j: False)),
    }
    out: dict[str, Any] = {"before": args.before, "tau_entity": args.tau_entity,
                           "datasets": {}}
    for name, n, labels in DATASETS:
        rows = [json.loads(line) for line in
                (ROOT / "benchmarks/results/eval" / labels / "results.jsonl").open()]
        wrong = {r["id"]: r["accuracy"] == 0 for r in rows if r["method"] == "no-rag"}
        examples = load_dataset(name).examples[:n]
        y = [wrong[e.id] for e in examples]
        before = [extractors["before"].entities(e.question) for e in examples]
        after = [extractors["after"].entities(e.question) for e in examples]
        flat_before = [x for ents in before for x in ents]
        flat_after = [x for ents in after for x in ents]
        title_small = [x for x in flat_before if any(w in SMALL for w in x.split()[1:])]
        lower, cased = indexes["lower"], indexes["cased"]
        result: dict[str, Any] = {
            "questions": len(examples),
            "questions_whose_entities_change": sum(a != b for a, b in zip(before, after,
                                                                           strict=True)),
            "entities": {"before": len(flat_before), "after": len(flat_after)},
            "zero_counts": {f"{e}/{i}": sum(idx.count(x).value == 0 for x in flat)
                            for e, flat in (("before", flat_before), ("after", flat_after))
                            for i, idx in indexes.items()},
            "before_title_cased_small_word": {
                "entities": len(title_small),
                "zero_as_written_cased": sum(cased.count(x).value == 0 for x in title_small),
                "at_least_once_lower_cased": sum(lower.count(x).value >= 1
                                                 for x in title_small)},
            "gate": {}, "after_cased_without": {},
        }
        decisions: dict[str, list[bool]] = {}
        for e_name, extractor in extractors.items():
            for i_name, stats in indexes.items():
                gate = QuCoGate(stats, extractor, tau_entity=args.tau_entity)
                ds = [gate.decide(e.question) for e in examples]
                decisions[f"{e_name}/{i_name}"] = [d.retrieve for d in ds]
                result["gate"][f"{e_name}/{i_name}"] = {
                    "auroc": round(_auroc([d.score for d in ds], y), 4),
                    "retrievals": sum(d.retrieve for d in ds)}
        base = decisions["before/lower"]
        for key, retrieve in decisions.items():
            result["gate"][key]["decisions_changed_vs_before_lower"] = sum(
                a != b for a, b in zip(base, retrieve, strict=True))
        for label, (owner, attr, off) in switches.items():
            original = owner.__dict__[attr]
            setattr(owner, attr, off)
            try:
                gate = QuCoGate(indexes["cased"], heuristic.HeuristicExtractor(),
                                tau_entity=args.tau_entity)
                ds = [gate.decide(e.question) for e in examples]
            finally:
                setattr(owner, attr, original)
            result["after_cased_without"][label] = {
                "auroc": round(_auroc([d.score for d in ds], y), 4),
                "retrievals": sum(d.retrieve for d in ds)}
        out["datasets"][name] = result
        print(name, json.dumps(result), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
