"""Write the SR-RAG policy labels the package ships (rag_gates/srrag/policies/smollm2.jsonl)
from a ``rag-gates srrag label`` file: each question and its preferred source (the keys are
recomputed from the model when the policy loads), and a tau calibrated on those questions.

    python benchmarks/srrag_ship_policy.py --labels runs/srrag/labels-train.jsonl \\
        --made-with "rag-gates srrag label --dataset popqa --dataset pubmedqa --n 300 --n 150 \\
        --offset 500 --n-retrieved 5 --n-verbalized 2"

Only training rows belong there (label with --offset 500; the benchmarks evaluate rows
0-299). The tau: each labelled question is routed with the others voting (leave-one-out, the
k nearest after dropping itself), and the threshold whose routes agree most with the labels is
kept (ties: the lower retrieval share), so no evaluation row is used to choose it.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from rag_gates.lm import load_default_lm
from rag_gates.srrag.labels import RETRIEVAL, read_labels
from rag_gates.srrag.policy import DEFAULT_K, HiddenStateKeys, PolicyEntry, SourcePolicy
from rag_gates.srrag.routing import route_features
from rag_gates.srrag.shipped import DEFAULT_POLICY_LABELS, write_policy_labels


def leave_one_out_scores(lm: object, entries: list[PolicyEntry], k: int) -> list[float]:
    """``p_M * p_D`` of each entry, p_D from its k nearest other entries."""
    keys = HiddenStateKeys(lm)
    policy = SourcePolicy.open(keys, path=":memory:", k=k)
    policy.add_questions(entries)
    scores = []
    for e in entries:
        features = route_features(lm, e.question, keys.prompt, keys.layer)
        others = [n for n in policy.vote(features.key, k + 1).neighbours
                  if (n.dataset, n.id) != (e.dataset, e.id)][:k]
        p_data = sum(n.source == RETRIEVAL for n in others) / len(others)
        scores.append(features.p_model * p_data)
    return scores


def best_tau(scores: list[float], labels: list[bool]) -> tuple[float, float, float]:
    """(tau, agreement, retrieval share): retrieve iff score >= tau."""
    candidates = sorted(set(scores))
    best: tuple[float, float, float] | None = None
    for tau in candidates:
        routes = [s >= tau for s in scores]
        agreement = sum(r == y for r, y in zip(routes, labels, strict=True)) / len(labels)
        share = sum(routes) / len(routes)
        if best is None or (agreement, -share) > (best[1], -best[2]):
            best = (tau, agreement, share)
    assert best is not None
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--labels", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=DEFAULT_POLICY_LABELS)
    parser.add_argument("--made-with", default="", help="The labelling command, recorded.")
    parser.add_argument("--k", type=int, default=DEFAULT_K)
    args = parser.parse_args()
    header, labels = read_labels(args.labels)
    entries = [PolicyEntry(id=lb.id, dataset=lb.dataset, question=lb.question,
                           source=lb.source) for lb in labels]
    lm = load_default_lm()
    if lm.model_id != header["model_id"]:
        raise SystemExit(f"the labels are {header['model_id']}'s; the default model is "
                         f"{lm.model_id}")
    is_retrieval = [e.source == RETRIEVAL for e in entries]
    tau, agreement, share = best_tau(leave_one_out_scores(lm, entries, args.k), is_retrieval)
    calibration = {"agreement": agreement, "retrieval_share": share, "k": float(args.k),
                   "labelled_retrieval_share": sum(is_retrieval) / len(entries)}
    out = write_policy_labels(args.out, entries, str(header["model_id"]), args.made_with,
                              tau=tau, calibration=calibration)
    counts = Counter((e.dataset, e.source) for e in entries)
    print(f"{len(entries)} labelled questions -> {out}: "
          + ", ".join(f"{d} {s} {n}" for (d, s), n in sorted(counts.items()))
          + f"; tau {tau:.4g} agrees with {100 * agreement:.1f}% of the labels (leave-one-out)"
          f", routes {100 * share:.1f}% to retrieval")


if __name__ == "__main__":
    main()
