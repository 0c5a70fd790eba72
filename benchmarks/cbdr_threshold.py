"""How often the shipped CBDR probe's beta retrieves, and the beta that decides (issue 55).

Measures, with the shipped SmolLM2 probe, the share of questions whose probe confidence is
``<= beta`` (the gate retrieves) on

- the PopQA calibration sample shipped before issue 59
  (``benchmarks/data/calibration_questions_before_issue59.jsonl``, 300: what
  ``examples/data/calibration_questions.jsonl`` held until the sample was redrawn uniformly),
- the dev slices under ``examples/data`` (PopQA 60, HotpotQA 50, 2Wiki 40: the first rows
  of the development files, i.e. evaluation rows: measured on, never tuned on),

at the old shipped beta (0.57) and at the beta this script certifies. The rule, fixed before
any evaluation row was looked at: ``rag_gates.calibration.calibrate`` (epsilon 0.05, delta
0.1, exact bound, the cbdr gate alone) on the calibration rows that are no benchmark's
evaluation rows (their ``source`` does not say "evaluation row": 189 place-of-birth rows),
with the closed-book / retrieved labels of the committed calibration records
(``benchmarks/results/calibrate/sample-200/work/records.jsonl``, BM25 k=3 over
``calibration_corpus.jsonl``) and the confidences computed here (checked against the
records' cbdr scores). beta = 1 - the certified score threshold, rounded up to 3 decimals
(a higher beta retrieves more: the rounding can only lower the skip rate).

Those 189 rows are PopQA rows 727-998, inside the probe's training range (PopQA 500-1099):
three quarters of them trained the probe. The script reports the AUROC on the probe's
training-split rows and on its dev-split rows separately, so the optimism this puts in the
certificate is visible.

    OMP_NUM_THREADS=1 python benchmarks/cbdr_threshold.py \\
        --out benchmarks/results/cbdr_threshold.json
"""

from __future__ import annotations

import argparse
import json
import math
import random
from pathlib import Path
from typing import Any

from sklearn.metrics import roc_auc_score

from rag_gates.calibration import CalibrationRecord, ModelIdentity, calibrate, read_records
from rag_gates.cbdr.shipped import load_default_probe
from rag_gates.lm.defaults import load_lm

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "examples" / "data"
#: The calibration sample the committed records (RECORDS) were answered on: the shipped one
#: until issue 59 redrew examples/data/calibration_questions.jsonl uniformly.
SAMPLE = ROOT / "benchmarks" / "data" / "calibration_questions_before_issue59.jsonl"
RECORDS = ROOT / "benchmarks" / "results" / "calibrate" / "sample-200" / "work" / "records.jsonl"
OLD_BETA = 0.57
EPSILON, DELTA = 0.05, 0.1


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()
            if line.strip()]


def _question(row: dict[str, Any]) -> str:
    return str(row.get("question"))


def _probe_split(probe: Any) -> set[int]:
    """PopQA rows in the probe's dev quarter, as ``rag-gates cbdr train-probe`` split them
    (``rag_gates_lab/commands/cbdr.py``: the collected rows in dataset order, shuffled by
    ``random.Random(seed)``, the first ``int(n * dev_fraction)`` are dev)."""
    trained = probe.config.trained_on
    counts = [int(n) for n in trained["n"]]
    offset = int(trained["offset"])
    order = list(range(sum(counts)))
    random.Random(int(trained["seed"])).shuffle(order)
    cut = max(2, int(len(order) * float(trained["dev_fraction"])))
    popqa = trained["datasets"].index("popqa")
    start = sum(counts[:popqa])
    return {offset + i - start for i in order[:cut] if start <= i < start + counts[popqa]}


def _auroc(records: list[CalibrationRecord]) -> float | None:
    wrong = [int(not r.closed_book_correct) for r in records]
    if len(set(wrong)) < 2:
        return None
    return float(roc_auc_score(wrong, [r.scores["cbdr"] for r in records]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    lm = load_lm("default", num_threads=1)
    probe = load_default_probe(lm)

    def confidences(questions: list[str]) -> list[float]:
        return [float(c) for c in probe.confidence(lm, questions, batch_size=8)]

    def rate(confs: list[float], beta: float) -> float:
        return sum(c <= beta for c in confs) / len(confs)

    calibration = _jsonl(SAMPLE)
    slices = {"calibration_questions (300)": calibration,
              "popqa_dev_sample (60)": _jsonl(DATA / "popqa_dev_sample.jsonl"),
              "hotpotqa_dev_sample (50)": _jsonl(DATA / "hotpotqa_dev_sample.jsonl"),
              "2wikimultihopqa_dev_sample (40)": _jsonl(DATA / "2wikimultihopqa_dev_sample.jsonl")}
    confs = {name: confidences([_question(r) for r in rows]) for name, rows in slices.items()}

    by_id = {r.id: r for r in read_records(RECORDS)}
    cal_conf = dict(zip([r["id"] for r in calibration], confs["calibration_questions (300)"],
                        strict=True))
    drift = max(abs((1.0 - cal_conf[i]) - float(by_id[i].scores["cbdr"] or math.nan))
                for i in cal_conf)
    chosen = [r for r in calibration if "evaluation row" not in r["source"]]
    records = [by_id[r["id"]].model_copy(update={"scores": {"cbdr": 1.0 - cal_conf[r["id"]]}})
               for r in chosen]
    report = calibrate(records, max_loss=EPSILON, delta=DELTA, bound="exact",
                       model=ModelIdentity.of(lm), gates=["cbdr"], composite=False,
                       retriever="bm25 over calibration_corpus.jsonl, k=3")
    row = report.row("cbdr")
    if row.threshold is None:
        raise SystemExit("no threshold certified on the chosen rows: keep the old beta and say so")
    new_beta = math.ceil((1.0 - row.threshold) * 1000) / 1000
    dev_rows = _probe_split(probe)
    in_dev = [r for r in records if int(r.id.split("-")[1]) in dev_rows]
    in_train = [r for r in records if int(r.id.split("-")[1]) not in dev_rows]

    result = {
        "command": "OMP_NUM_THREADS=1 python benchmarks/cbdr_threshold.py --out " + str(args.out),
        "probe": "rag_gates/cbdr/probes/smollm2",
        "rule": (f"rag_gates.calibration.calibrate(epsilon={EPSILON}, delta={DELTA}, "
                 "bound='exact', gates=['cbdr'], composite=False) on the calibration rows "
                 "that are no evaluation rows; beta = 1 - threshold, rounded up to 3 decimals"),
        "max_abs_difference_from_committed_cbdr_scores": drift,
        "certification": {
            "rows": len(records), "closed_book_right": sum(r.closed_book_correct for r in records),
            "retrieved_right": sum(r.retrieved_correct for r in records),
            "auroc": row.auroc, "threshold": row.threshold, "beta": new_beta,
            "skip_rate": row.skip_rate.model_dump(), "observed_drop": row.observed_drop,
            "auroc_probe_training_rows": _auroc(in_train), "probe_training_rows": len(in_train),
            "auroc_probe_dev_rows": _auroc(in_dev), "probe_dev_rows": len(in_dev)},
        "retrieval_rate": {name: {"questions": len(c), f"beta {OLD_BETA}": rate(c, OLD_BETA),
                                  f"beta {new_beta}": rate(c, new_beta),
                                  "confidence_min": min(c), "confidence_max": max(c)}
                           for name, c in confs.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
