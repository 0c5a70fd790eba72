#!/bin/bash
# SR-RAG's measurements (issue 16) on the embedded model, in order; every step resumes or
# is quick to redo. Run from the repository root, one model process at a time on this
# 2-core machine:  STEPS="policy calibrate auroc popqa pubmedqa report" bash benchmarks/results/srrag/COMMANDS.sh
# The labels (training rows from offset 500, evaluation rows 0-299) are made by the two
# `rag-gates srrag label` commands in docs/methods/srrag.md and committed beside this file.
set -ex
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1
RG=${RG:-$PWD/.venv/bin/rag-gates}
S=benchmarks/results/srrag
STEPS=${STEPS:-"policy calibrate auroc popqa pubmedqa report"}
for step in $STEPS; do  # a misspelt step fails now, not after hours
  case $step in policy|calibrate|auroc|popqa|pubmedqa|report) ;; *) echo "unknown step $step"; exit 2 ;; esac
done
tau() {  # the tau calibrated on the training labels for a mode (see the calibrate step)
  python3 -c "import json;print(round(json.load(open('$S/tau-train.json'))['modes']['$1']['tau'], 4))"
}
methods() {
  echo "no-rag,single,genread,selective@cbdr,skr,srrag-no-knn@$(tau srrag-no-knn),srrag@0.1,srrag@$(tau srrag),srrag-knn-only@$(tau srrag-knn-only)"
}
for step in $STEPS; do case $step in
policy)
  # The datastores from the training labels only: SR-RAG's (layer 15 hidden states), SKR's (MiniLM).
  $RG srrag build-policy --labels $S/labels-train.jsonl --replace --threads 1
  $RG srrag build-policy --labels $S/labels-train.jsonl --keys minilm --replace --threads 1 ;;
calibrate)
  # tau per mode, leave-one-out on the training labels (no evaluation row is used).
  .venv/bin/python benchmarks/srrag_calibrate.py --labels $S/labels-train.jsonl --out $S/tau-train.json ;;
auroc)
  # Source selection on the evaluation rows' labels: does the score predict "retrieval wins"?
  $RG srrag routing-auroc --labels $S/labels-eval.jsonl --gate srrag --gate srrag-no-knn \
      --gate srrag-knn-only --gate skr --gate cbdr --threads 1 --out $S/routing-auroc.json ;;
popqa)
  $RG bench --dataset popqa --n 200 --threads 1 --methods "$(methods)" --out $S/popqa-200 ;;
pubmedqa)
  $RG bench --dataset pubmedqa --n 100 --threads 1 --methods "$(methods)" --out $S/pubmedqa-100 ;;
report)
  $RG report $S/popqa-200 $S/pubmedqa-100 --out $S/report --title "SR-RAG end to end (SmolLM2-135M)" ;;
esac; done
