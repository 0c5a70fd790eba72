"""LM-Polygraph's uncertainty estimators as gates on the embedded SmolLM2 (issue 57): each
question's uncertainty under every estimator, its closed-book correctness, what each
estimator costs per decision, and the AUROC for "closed-book answer wrong".

Runs in the venv that has lm-polygraph (``bash benchmarks/envs/polygraph.sh``), under a model
slot::

    model-slot /work/polyvenv/bin/python benchmarks/polygraph_gates.py \\
        --data examples/data/calibration_questions.jsonl \\
        --out benchmarks/results/polygraph/popqa-calibration.jsonl

Per question (one JSON line, appended as it is done: a rerun skips the ids already in
``--out``; the settings live in ``OUT.config.json`` and a rerun with others is refused):

* ``closed_book_answer`` / ``closed_book_correct``: the ``no-rag`` method's greedy answer
  (``--max-new-tokens``, default 32, as ``rag-gates calibrate``) and its containment accuracy
  (``rag_gates.answers.accuracy``), the label ``rag-gates calibrate`` uses;
* ``scores``: each estimator's uncertainty (lm-polygraph's orientation: higher = less
  confident; ``"nan"`` when it failed, with ``errors``), computed as
  :class:`rag_gates.peers.PolygraphGate` computes it;
* ``seconds``: what one decision of that estimator's gate costs alone: the seconds of the
  stat calculators its gate runs (:attr:`PolygraphGate.calculators`) plus the estimator's
  own. All estimators share one run of each calculator per question (one greedy answer, one
  set of ``--samples`` sampled answers), so the file costs far less than the gates would
  one by one; ``calculator_seconds`` has the shared times;
* ``gate_check`` (first ``--verify`` questions): each estimator run as its own
  ``PolygraphGate``, its score and wall seconds, to check the shared run against.

Estimators (``--estimators`` picks some): ten that read the greedy answer alone, P(True)
among them, and eight sampling-based ones over ``--samples`` answers (default 10,
lm-polygraph's). Estimators that need an NLI or cross-encoder model (semantic entropy, the
NLI degree matrix, CCP, SAR) load it from the Hugging Face hub, which this machine cannot
reach: the degree matrix, eigenvalue Laplacian and eccentricity run on Jaccard similarity
(their paper's lexical variant, arXiv 2305.19187). Attention-based ones (RAUQ, attention
score) need eager attention and are left out (``--eager`` adds RAUQ, running every estimator
under eager attention).

``--summary`` (default ``OUT`` with ``.summary.json``) gets, per estimator, the AUROC for
"closed-book wrong" (a non-finite score ranks as most uncertain: the gate retrieves), the
count of non-finite scores, and the median and mean seconds per decision.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT / "examples" / "data" / "calibration_questions.jsonl"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "polygraph" / "popqa-calibration.jsonl"


def estimator_table(eager: bool) -> dict[str, Callable[[], Any]]:
    """Row name -> a factory of the lm-polygraph estimator (its ``str`` is the row name)."""
    from lm_polygraph import estimators as e

    def jaccard(cls: Any) -> Callable[[], Any]:
        return lambda: cls(similarity_score="Jaccard_score")

    table: dict[str, Callable[[], Any]] = {
        # The greedy answer alone (one generation; PMI adds a pass without the question,
        # P(True) one pass over its prompt).
        "MaximumSequenceProbability": e.MaximumSequenceProbability,
        "Perplexity": e.Perplexity,
        "MeanTokenEntropy": e.MeanTokenEntropy,
        "MeanPointwiseMutualInformation": e.MeanPointwiseMutualInformation,
        "MeanConditionalPointwiseMutualInformation": e.MeanConditionalPointwiseMutualInformation,
        "SelfCertainty": e.SelfCertainty,
        "RenyiNeg": e.RenyiNeg,
        "FisherRao": e.FisherRao,
        "BoostedProbSequence": e.BoostedProbSequence,
        "PTrue": e.PTrue,
        # Sampling-based: --samples sampled answers per question.
        "MonteCarloSequenceEntropy": e.MonteCarloSequenceEntropy,
        "MonteCarloNormalizedSequenceEntropy": e.MonteCarloNormalizedSequenceEntropy,
        "LexicalSimilarity_rougeL": e.LexicalSimilarity,
        "DegMat_Jaccard_score": jaccard(e.DegMat),
        "EigValLaplacian_Jaccard_score": jaccard(e.EigValLaplacian),
        "Eccentricity_Jaccard_score": jaccard(e.Eccentricity),
        "PTrueSampling": e.PTrueSampling,
        "EigenScore": e.EigenScore,
    }
    if eager:
        table["RAUQ"] = e.RAUQ
    return table


def read_questions(path: Path, limit: int | None) -> list[dict[str, Any]]:
    """``id``, ``question`` and ``answers`` of each line of a JSONL file (calibrate's
    ``--data`` format)."""
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        missing = [k for k in ("id", "question", "answers") if k not in row]
        if missing:
            raise SystemExit(f"{path}:{number}: no {', '.join(missing)}")
        rows.append({"id": str(row["id"]), "question": row["question"],
                     "answers": list(row["answers"])})
    return rows[:limit] if limit is not None else rows


def _finite_or_nan(value: float) -> float | str:
    return value if math.isfinite(value) else repr(value)


class SharedRun:
    """Every estimator's uncertainty for one question from one run of each stat calculator
    (an lm-polygraph ``UEManager`` over all the estimators), with each calculator and
    estimator timed, and torch seeded as each gate seeds it."""

    def __init__(self, lm: Any, gates: dict[str, Any], eager: bool) -> None:
        from lm_polygraph import UEManager
        from lm_polygraph.defaults.register_default_stat_calculators import (
            register_default_stat_calculators,
        )
        from lm_polygraph.utils.builder_enviroment_stat_calculator import (
            BuilderEnvironmentStatCalculator,
        )
        from lm_polygraph.utils.dataset import Dataset

        self.lm, self.gates = lm, gates
        first = next(iter(gates.values()))
        self.model, self.seed, self.samples = first.model, first.seed, first.samples
        containers = register_default_stat_calculators(
            "Whitebox", output_attentions=eager, output_hidden_states=False)
        self.manager = UEManager(
            Dataset([""], [""], batch_size=1), self.model,
            [g.estimator for g in gates.values()],
            builder_env_stat_calc=BuilderEnvironmentStatCalculator(self.model),
            available_stat_calculators=containers, generation_metrics=[], ue_metrics=[],
            processors=[], ignore_exceptions=False, verbose=False,
            max_new_tokens=first.max_new_tokens)
        for calculator in self.manager.stat_calculators:
            if hasattr(calculator, "samples_n"):
                calculator.samples_n = self.samples

    def __call__(self, text: str) -> dict[str, Any]:
        import torch

        from rag_gates.lm.hf import _locked

        stats: dict[str, Any] = {"input_texts": [text], "target_texts": [""],
                                 "model": self.model}
        calc_seconds: dict[str, float] = {}
        errors: dict[str, str] = {}
        with _locked(self.lm), torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            for calculator in self.manager.stat_calculators:
                name = type(calculator).__name__
                start = time.perf_counter()
                try:
                    stats = self.manager.calculate(stats, [calculator], [text])
                except Exception as exc:  # its estimators fail below, each with this error
                    errors[name] = f"{type(exc).__name__}: {str(exc)[:300]}"
                calc_seconds[name] = time.perf_counter() - start
        scores: dict[str, float | str] = {}
        seconds: dict[str, float] = {}
        est_seconds: dict[str, float] = {}
        for row, gate in self.gates.items():
            start = time.perf_counter()
            try:
                values = [float(v) for v in gate.estimator(stats)]
                value = values[0] if len(values) == 1 else math.nan
            except Exception as exc:
                value = math.nan
                failed = [errors[c] for c in gate.calculators if c in errors]
                errors[row] = failed[0] if failed else f"{type(exc).__name__}: {exc}"[:300]
            est_seconds[row] = time.perf_counter() - start
            scores[row] = _finite_or_nan(value)
            seconds[row] = est_seconds[row] + sum(calc_seconds.get(c, 0.0)
                                                  for c in gate.calculators)
        greedy = stats.get("greedy_texts") or [None]
        return {"scores": scores, "seconds": seconds, "calculator_seconds": calc_seconds,
                "estimator_seconds": est_seconds, "errors": errors,
                "polygraph_greedy_answer": greedy[0]}


def auroc(scores: Sequence[float | str], wrong: Sequence[int]) -> float:
    """AUROC of ``scores`` for ``wrong`` (a non-finite score ranks above every finite one,
    as the gate's undecided score does); NaN when one class is missing."""
    from sklearn.metrics import roc_auc_score

    ranked = [float(s) if isinstance(s, int | float) and math.isfinite(s) else math.inf
              for s in scores]
    top = max((s for s in ranked if math.isfinite(s)), default=0.0)
    ranked = [s if math.isfinite(s) else top + 1.0 for s in ranked]
    if len(set(wrong)) < 2:
        return math.nan
    return float(roc_auc_score(list(wrong), ranked))


def summarise(rows: Sequence[dict[str, Any]], config: dict[str, Any]) -> dict[str, Any]:
    wrong = [int(not r["closed_book_correct"]) for r in rows]
    names = list(config["estimators"])
    table = {}
    for name in names:
        scores = [r["scores"][name] for r in rows]
        secs = [r["seconds"][name] for r in rows]
        table[name] = {
            "auroc_closed_book_wrong": auroc(scores, wrong),
            "non_finite": sum(not isinstance(s, int | float) for s in scores),
            "median_seconds_per_decision": statistics.median(secs) if secs else None,
            "mean_seconds_per_decision": statistics.fmean(secs) if secs else None,
        }
    closed = [r["closed_book_seconds"] for r in rows]
    return {
        "questions": len(rows), "closed_book_accuracy": 1 - statistics.fmean(wrong)
        if rows else None,
        "closed_book_seconds_median": statistics.median(closed) if closed else None,
        "config": config, "estimators": table,
        "greedy_answer_agrees_with_no_rag": sum(
            (r["polygraph_greedy_answer"] or "").strip() == r["closed_book_answer"].strip()
            for r in rows),
        "made": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "machine": {"python": platform.python_version(), "platform": platform.platform()},
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--summary", type=Path, default=None)
    parser.add_argument("--limit", type=int, default=None, help="first N questions only")
    parser.add_argument("--estimators", default=None,
                        help="comma-separated rows of the estimator table (default: all)")
    parser.add_argument("--samples", type=int, default=10)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--verify", type=int, default=0,
                        help="also run each estimator as its own PolygraphGate on the first N "
                             "new questions")
    parser.add_argument("--eager", action="store_true",
                        help="eager attention for every estimator, and add RAUQ")
    parser.add_argument("--summary-only", action="store_true",
                        help="summarise --out as it is; run nothing")
    args = parser.parse_args(argv)
    summary_path = args.summary or args.out.with_suffix(".summary.json")
    config_path = args.out.with_suffix(".config.json")

    import lm_polygraph  # noqa: F401  (fail now, with the venv hint, not after loading)

    table = estimator_table(args.eager)
    chosen = list(table) if not args.estimators else args.estimators.split(",")
    unknown = [n for n in chosen if n not in table]
    if unknown:
        raise SystemExit(f"unknown estimators {unknown}; the table has {list(table)}")
    questions = read_questions(args.data, args.limit)
    import importlib.metadata as md

    config = {"data": str(args.data.relative_to(ROOT) if args.data.is_relative_to(ROOT)
                          else args.data),
              "estimators": chosen, "samples": args.samples,
              "max_new_tokens": args.max_new_tokens, "seed": args.seed, "eager": args.eager,
              "model": "SmolLM2-135M-Instruct (rag_gates.lm.load_default_lm)",
              "lm_polygraph": md.version("lm-polygraph"), "torch": md.version("torch"),
              "transformers": md.version("transformers")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if config_path.exists():
        old = json.loads(config_path.read_text())
        same = {k: v for k, v in old.items() if k not in ("lm_polygraph", "torch",
                                                          "transformers")}
        if same != {k: v for k, v in config.items() if k in same}:
            raise SystemExit(f"{args.out} was made with other settings ({config_path}): "
                             "use another --out")
    else:
        config_path.write_text(json.dumps(config, indent=2) + "\n")
    done = {}
    if args.out.exists():
        for line in args.out.read_text().splitlines():
            if line.strip():
                row = json.loads(line)
                done[row["id"]] = row

    if not args.summary_only:
        run(args, questions, table, chosen, done)
    rows = [done[q["id"]] for q in questions if q["id"] in done]
    summary = summarise(rows, config)
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    width = max(len(n) for n in chosen)
    print(f"{len(rows)} questions, closed-book accuracy {summary['closed_book_accuracy']}")
    for name, row in summary["estimators"].items():
        print(f"{name:{width}}  AUROC {row['auroc_closed_book_wrong']:.3f}  "
              f"median {row['median_seconds_per_decision']:.3f} s/decision  "
              f"non-finite {row['non_finite']}")


def run(args: argparse.Namespace, questions: list[dict[str, Any]],
        table: dict[str, Callable[[], Any]], chosen: list[str],
        done: dict[str, dict[str, Any]]) -> None:
    import torch

    from rag_gates.answers import accuracy
    from rag_gates.lm import load_default_lm
    from rag_gates.methods import MethodContext, NoRetrievalMethod
    from rag_gates.peers import PolygraphGate

    torch.set_num_threads(1)
    lm = load_default_lm()
    if args.eager:
        lm.model.set_attn_implementation("eager")
    gates = {}
    for name in chosen:
        gate = PolygraphGate(lm, table[name](), threshold=0.0, samples=args.samples,
                             seed=args.seed, max_new_tokens=args.max_new_tokens)
        if str(gate.estimator) != name:
            raise SystemExit(f"table row {name!r} builds {gate.estimator}")
        gates[name] = gate
    shared = SharedRun(lm, gates, args.eager)
    # The no-rag method itself (not through make_method: its entry points name the lab's
    # plugins, which this venv need not have).
    closed_book = NoRetrievalMethod(MethodContext(lm=lm, max_new_tokens=args.max_new_tokens))
    todo = [q for q in questions if q["id"] not in done]
    print(f"{len(done)} done, {len(todo)} to go", file=sys.stderr)
    with args.out.open("a") as out:
        for i, q in enumerate(todo):
            start = time.perf_counter()
            answer = closed_book.answer(q["question"]).answer
            closed_seconds = time.perf_counter() - start
            text = next(iter(gates.values())).prompt_text(q["question"])
            result = shared(text)
            row = {"id": q["id"], "question": q["question"], "answers": q["answers"],
                   "closed_book_answer": answer,
                   "closed_book_correct": accuracy(answer, q["answers"]) > 0,
                   "closed_book_seconds": closed_seconds, **result}
            if i < args.verify:
                check = {}
                for name, gate in gates.items():
                    d = gate.decide(q["question"])
                    value = d.evidence.get("uncertainty")
                    check[name] = {"score": _finite_or_nan(float(value)) if isinstance(
                        value, int | float) else "nan", "seconds": d.latency_ms / 1000.0}
                row["gate_check"] = check
            out.write(json.dumps(row) + "\n")
            out.flush()
            done[q["id"]] = row
            print(f"[{i + 1}/{len(todo)}] {q['id']} "
                  f"{sum(result['calculator_seconds'].values()):.1f} s shared", file=sys.stderr)


if __name__ == "__main__":
    main()
