"""Which committed end-to-end QuCo rows would issue 55's casing change move? No model runs.

For every ``quco*`` row of the committed runs: the pre-check decision at the bench's
``tau_entity`` (question entities and their counts) and the runtime verifier's verdict on
each sentence of the final answer, once with the extractor of ``--before`` on the
lower-cased index (what the committed runs used) and once with the working tree's extractor
on the cased index (what a re-run uses). A row whose pre-check decision and answer verdicts
agree was decided on the same evidence as far as the final text shows; rejected drafts of
multi-round rows are not recorded by the bench, so those rows may move anyway.

    python benchmarks/quco_casing_replay.py --before 4e3297b \
        --out benchmarks/results/quco_casing_replay.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RUNS = ("benchmarks/results/eval/hotpotqa-200", "benchmarks/results/eval/2wiki-200")


def _extractor_at(commit: str) -> Any:
    source = subprocess.run(["git", "show", f"{commit}:rag_gates/extract/heuristic.py"],
                            cwd=ROOT, check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp()) / "heuristic_before.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location("heuristic_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["heuristic_before"] = module
    spec.loader.exec_module(module)
    return module.HeuristicExtractor()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--tau-entity", type=float, default=82.0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    from rag_gates.extract.heuristic import HeuristicExtractor
    from rag_gates.extract.sentences import split_sentences
    from rag_gates.quco import ClaimVerifier, QuCoGate
    from rag_gates_lab.corpus import load_corpus_stats

    settings = {"before": (_extractor_at(args.before), load_corpus_stats(case="insensitive")),
                "after": (HeuristicExtractor(), load_corpus_stats(case="sensitive"))}
    gates = {k: QuCoGate(s, e, tau_entity=args.tau_entity) for k, (e, s) in settings.items()}
    verifiers = {k: ClaimVerifier(s, e) for k, (e, s) in settings.items()}
    out: dict[str, int] = Counter()
    for run in RUNS:
        name = Path(run).name
        for line in (ROOT / run / "results.jsonl").open():
            row = json.loads(line)
            method = row["method"]
            if not method.startswith("quco"):
                continue
            key = f"{name}/{method}"
            out[f"{key}: rows"] += 1
            if method != "quco-no-precheck":
                decided = {k: g.decide(row["question"]).retrieve for k, g in gates.items()}
                out[f"{key}: pre-check decision flips"] += decided["before"] != decided["after"]
            if method != "quco-no-runtime":
                sentences = split_sentences(row["prediction"])
                flags = {k: [s.flagged for s in v.verify_sentences(sentences).sentences]
                         for k, v in verifiers.items()}
                out[f"{key}: answer verdicts differ"] += flags["before"] != flags["after"]
    args.out.write_text(json.dumps(dict(sorted(out.items())), indent=2) + "\n",
                        encoding="utf-8")
    print(json.dumps(dict(sorted(out.items())), indent=1))


if __name__ == "__main__":
    main()
