"""Write the SR-RAG policy labels the package ships (rag_gates/srrag/policies/smollm2.jsonl)
from a ``rag-gates srrag label`` file: each question and its preferred source (the keys are
recomputed from the model when the policy loads), and a tau calibrated on those questions.

    python benchmarks/srrag_ship_policy.py --labels runs/srrag/labels-train.jsonl \\
        --made-with "rag-gates srrag label --dataset popqa --dataset pubmedqa --n 300 --n 150 \\
        --offset 500 --n-retrieved 5 --n-verbalized 2"

Only training rows belong there (label with --offset 500; the benchmarks evaluate rows
0-299). k: the paper's 30, or a third of the labelled questions when there are fewer than 90
(so that a vote is not the whole datastore). The tau: each labelled question is routed with
the others voting (leave-one-out, the k nearest after dropping itself), and the threshold
whose routes agree most with the labels is kept (ties: the lower retrieval share; "never
retrieve" is a candidate too), so no evaluation row is used to choose it. The agreement of
always retrieving (the share labelled retrieval) is recorded beside it: a tau that does no
better than that has learned nothing.
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


def leave_one_out_components(lm: object, entries: list[PolicyEntry], k: int
                             ) -> list[tuple[float, float]]:
    """``(p_M, p_D)`` of each entry, p_D from its k nearest other entries."""
    keys = HiddenStateKeys(lm)
    policy = SourcePolicy.open(keys, path=":memory:", k=k)
    policy.add_questions(entries)
    components = []
    for e in entries:
        features = route_features(lm, e.question, keys.prompt, keys.layer)
        others = [n for n in policy.vote(features.key, k + 1).neighbours
                  if (n.dataset, n.id) != (e.dataset, e.id)][:k]
        p_data = sum(n.source == RETRIEVAL for n in others) / len(others)
        components.append((features.p_model, p_data))
    return components


def leave_one_out_scores(lm: object, entries: list[PolicyEntry], k: int) -> list[float]:
    """``p_M * p_D`` of each entry, p_D from its k nearest other entries."""
    return [p_model * p_data for p_model, p_data in leave_one_out_components(lm, entries, k)]


def best_tau(scores: list[float], labels: list[bool]) -> tuple[float, float, float]:
    """(tau, agreement, retrieval share): retrieve iff score >= tau (tau capped at 1)."""
    candidates = [*sorted(set(scores)), 1.01]  # the last: never retrieve
    best: tuple[float, float, float] | None = None
    for tau in candidates:
        routes = [s >= tau for s in scores]
        agreement = sum(r == y for r, y in zip(routes, labels, strict=True)) / len(labels)
        share = sum(routes) / len(routes)
        if best is None or (agreement, -share) > (best[1], -best[2]):
            best = (tau, agreement, share)
    assert best is not None
    return min(best[0], 1.0), best[1], best[2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--labels", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=DEFAULT_POLICY_LABELS)
    parser.add_argument("--made-with", default="", help="The labelling command, recorded.")
    parser.add_argument("--k", type=int, default=None,
                        help="Neighbours that vote (default: 30, or a third of the labels).")
    args = parser.parse_args()
    header, labels = read_labels(args.labels)
    entries = [PolicyEntry(id=lb.id, dataset=lb.dataset, question=lb.question,
                           source=lb.source) for lb in labels]
    lm = load_default_lm()
    if lm.model_id != header["model_id"]:
        raise SystemExit(f"the labels are {header['model_id']}'s; the default model is "
                         f"{lm.model_id}")
    k = args.k or min(DEFAULT_K, max(1, len(entries) // 3))
    is_retrieval = [e.source == RETRIEVAL for e in entries]
    tau, agreement, share = best_tau(leave_one_out_scores(lm, entries, k), is_retrieval)
    calibration = {"agreement": agreement, "retrieval_share": share,
                   "labelled_retrieval_share": sum(is_retrieval) / len(entries)}
    out = write_policy_labels(args.out, entries, str(header["model_id"]), args.made_with,
                              tau=tau, calibration=calibration, k=k)
    counts = Counter((e.dataset, e.source) for e in entries)
    print(f"{len(entries)} labelled questions -> {out}: "
          + ", ".join(f"{d} {s} {n}" for (d, s), n in sorted(counts.items()))
          + f"; k {k}, tau {tau:.4g} agrees with {100 * agreement:.1f}% of the labels "
          f"(leave-one-out; always retrieving: {100 * calibration['labelled_retrieval_share']:.1f}"
          f"%), routes {100 * share:.1f}% to retrieval")


if __name__ == "__main__":
    main()
