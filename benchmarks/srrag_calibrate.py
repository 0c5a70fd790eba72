"""Calibrate SR-RAG's tau for each routing mode on the *training* labels, leave-one-out.

    python benchmarks/srrag_calibrate.py --labels benchmarks/results/srrag/labels-train.jsonl \\
        --out benchmarks/results/srrag/tau-train.json

For each labelled training question: ``p_M`` from the routing prompt and ``p_D`` from its k
nearest *other* training questions (the shipped policy's procedure). Then, per mode (SR-RAG's
product ``p_M * p_D``, ``p_M`` alone = SR-RAG without kNN, ``p_D`` alone), the tau whose
routes agree most with the labels (ties: fewer retrievals). No evaluation row is used, so the
end-to-end table can run at these taus. Also recorded: the AUROC of each score for "the label
prefers retrieval" on these training questions, the agreement of always retrieving, and the
same per dataset (``by_dataset``: each dataset's own tau, with ``p_D`` from the whole
datastore), since a tau for the mix can end up telling the datasets apart.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from srrag_ship_policy import best_tau, leave_one_out_components

from rag_gates.lm import load_lm
from rag_gates.srrag.labels import RETRIEVAL, read_labels
from rag_gates.srrag.policy import DEFAULT_K, PolicyEntry
from rag_gates_lab.metrics import auroc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--labels", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--model", default="default")
    parser.add_argument("--k", type=int, default=DEFAULT_K)
    args = parser.parse_args()
    header, labels = read_labels(args.labels)
    lm = load_lm(args.model)
    if lm.model_id != header["model_id"]:
        raise SystemExit(f"the labels are {header['model_id']}'s, the model is {lm.model_id}")
    entries = [PolicyEntry(id=lb.id, dataset=lb.dataset, question=lb.question,
                           source=lb.source) for lb in labels]
    is_retrieval = [e.source == RETRIEVAL for e in entries]
    components = leave_one_out_components(lm, entries, args.k)
    scores = {"srrag": [m * d for m, d in components],
              "srrag-no-knn": [m for m, _ in components],
              "srrag-knn-only": [d for _, d in components]}

    def calibrate(picked: list[int], label: str) -> dict[str, dict[str, float]]:
        truth = [is_retrieval[i] for i in picked]
        out = {}
        for name, values in scores.items():
            tau, agreement, share = best_tau([values[i] for i in picked], truth)
            area = auroc([values[i] for i in picked], truth)
            out[name] = {"tau": tau, "agreement": agreement, "retrieval_share": share,
                         "auroc_prefers_retrieval": area}
            print(f"{label} {name}: tau {tau:.4g}, agrees with {100 * agreement:.1f}% of the "
                  f"labels, routes {100 * share:.1f}% to retrieval, AUROC {area:.3f}")
        return out

    modes = calibrate(list(range(len(entries))), "all")
    # Datasets can prefer opposite sources: a tau for the mix may only tell them apart, so
    # each dataset's own tau is calibrated too (p_D still from the whole datastore).
    by_dataset = {}
    for dataset in sorted({e.dataset for e in entries}):
        picked = [i for i, e in enumerate(entries) if e.dataset == dataset]
        by_dataset[dataset] = {
            "n": len(picked),
            "labelled_retrieval_share": sum(is_retrieval[i] for i in picked) / len(picked),
            "modes": calibrate(picked, dataset)}
    result = {
        "labels": str(args.labels), "model_id": lm.model_id, "k": args.k,
        "n": len(entries), "labelled_retrieval_share": sum(is_retrieval) / len(entries),
        "modes": modes, "by_dataset": by_dataset,
        "components": [{"dataset": e.dataset, "id": e.id, "p_model": m, "p_data": d,
                        "label": e.source} for e, (m, d) in zip(entries, components, strict=True)],
        "command": " ".join(sys.argv), "python": platform.python_version(),
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"always retrieving agrees with {100 * result['labelled_retrieval_share']:.1f}%; "
          f"-> {args.out}")


if __name__ == "__main__":
    main()
