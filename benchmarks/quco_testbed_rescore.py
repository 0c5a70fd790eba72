"""What re-scoring the testbed QuCo gates with another extractor changed, per build.

Compares the QuCo ``eval-gate`` decisions of each testbed build as committed at ``--before``
(scored with the extractor of that time) with those in the working tree (re-scored by
``benchmarks/results/testbed/quco-rescore.COMMANDS.sh``): the questions whose entities
changed, whose score changed, whose decision changed at the bench's ``tau_entity`` (82) and
at the ``tau_entity`` calibrated on the build's calibration facts (what its end-to-end
``quco@TAU`` row runs), and the AUROCs. It also checks that the regenerated corpus is the
one the committed decisions counted in: every entity both runs extracted must have the
same count (a mismatch stops the script).

    python benchmarks/quco_testbed_rescore.py --before fd12e41 tb3 tb4 tb5 tb7 tb8 tb9 tb10 tb11 \
        --out benchmarks/results/testbed/quco-rescore.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = "benchmarks/results/testbed"
BENCH_TAU = 82.0


def _rows(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _at(commit: str, path: str) -> str | None:
    done = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:{path}"],
                          capture_output=True, text=True)
    return done.stdout if done.returncode == 0 else None


def compare(build: str, split: str, before: str, threshold: float | None) -> dict[str, Any]:
    """One build's split (``quco`` = evaluation facts, ``cal-quco`` = calibration facts)."""
    path = f"{RESULTS}/gates-{build}/{split}"
    old_text = _at(before, f"{path}/decisions.jsonl")
    if old_text is None:
        return {}
    old, new = _rows(old_text), _rows((ROOT / path / "decisions.jsonl").read_text())
    if [r["id"] for r in old] != [r["id"] for r in new]:
        raise SystemExit(f"{path}: the question ids differ from {before}'s")
    changed, mismatched = [], []
    for o, n in zip(old, new, strict=True):
        oc, nc = o["evidence"].get("counts", {}), n["evidence"].get("counts", {})
        mismatched += [(o["id"], e, oc[e], nc[e]) for e in oc if e in nc and oc[e] != nc[e]]
        if o["evidence"]["entities"] != n["evidence"]["entities"]:
            changed.append({"id": o["id"], "before": oc or o["evidence"]["entities"],
                            "after": nc or n["evidence"]["entities"],
                            "score": [o["score"], n["score"]]})
    if mismatched:  # not the corpus the committed run counted in
        raise SystemExit(f"{path}: counts of the same entity differ: {mismatched[:5]}")
    auroc = [json.loads(_at(before, f"{path}/gate_eval.json") or "{}").get("auroc"),
             json.loads((ROOT / path / "gate_eval.json").read_text())["auroc"]]

    def flips(t: float) -> int:
        return sum((o["score"] >= t) != (n["score"] >= t) for o, n in zip(old, new, strict=True))

    out: dict[str, Any] = {
        "questions": len(old), "entities_changed": len(changed),
        "scores_changed": sum(o["score"] != n["score"] for o, n in zip(old, new, strict=True)),
        "decisions_changed_at_bench_tau": flips(1.0 / (1.0 + BENCH_TAU)),
        "auroc": auroc, "changed": changed}
    if threshold is not None:
        out["calibrated_threshold"] = threshold
        out["decisions_changed_at_calibrated_tau"] = flips(threshold)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("builds", nargs="+", help="tb3, tb11, ...")
    parser.add_argument("--before", required=True, help="The commit of the old decisions.")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result: dict[str, Any] = {"before": args.before, "builds": {}}
    for build in args.builds:
        gate = ROOT / RESULTS / f"gates-{build}" / "cal-quco" / "gate.json"
        threshold = json.loads(gate.read_text())["threshold"] if gate.is_file() else None
        result["builds"][build] = {
            split: compare(build, split, args.before, threshold if split == "quco" else None)
            for split in ("quco", "cal-quco")}
    text = json.dumps(result, indent=2, ensure_ascii=False)
    if args.out:
        args.out.write_text(text + "\n")
    for build, splits in result["builds"].items():
        for split, r in splits.items():
            if r:
                print(f"{build} {split}: entities changed {r['entities_changed']} of "
                      f"{r['questions']}, scores {r['scores_changed']}, decisions at tau 82 "
                      f"{r['decisions_changed_at_bench_tau']}, at the calibrated tau "
                      f"{r.get('decisions_changed_at_calibrated_tau', '-')}; AUROC "
                      f"{r['auroc'][0]:.3f} -> {r['auroc'][1]:.3f}")


if __name__ == "__main__":
    main()
