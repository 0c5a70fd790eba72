#!/bin/bash
# The testbed QuCo gates re-scored after an extractor change, without the testbed models:
# QuCo's gate reads the question and counts in the testbed's training corpus, which
# `testbed build --plan-only` regenerates from the build's options (same documents, same
# tokens per epoch as the build's training.json; the counts of every entity both runs
# extract agree, checked by benchmarks/quco_testbed_rescore.py). eval-gate scores against
# the committed labels and loads no model for a text-only gate when they are complete.
# Each build is scored into a fresh directory, then copied over its committed decisions
# (eval-gate resumes finished decisions, so scoring in place would keep the old ones).
# Each testbed directory is the path its committed runs name (tb5's was /work/tb5).
set -ex
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1
RG=${RG:-.venv/bin/rag-gates}
PY=${PY:-.venv/bin/python}
declare -A FLAGS=(
  [tb3]="--n-facts 96 --general-paragraphs 72 --save-steps 10 --no-bridges --reading-examples 0 --batch-size 4 --block-size 128"
  [tb4]="--n-facts 96 --general-paragraphs 72 --save-steps 10 --no-bridges"
  [tb5]="--n-facts 500 --general-paragraphs 370 --save-steps 60 --no-bridges"
  [tb7]="--n-facts 500 --general-paragraphs 370 --ladder 0,4,16,64 --lr 1.5e-4 --save-steps 30"
  [tb8]="--n-facts 500 --general-paragraphs 370 --ladder 0,2,8,32 --lr 1.5e-4 --save-steps 30 --recall-examples 300 --recall-repetitions 16"
  [tb9]="--n-facts 500 --general-paragraphs 370 --ladder 0,2,8,32 --lr 1.5e-4 --save-steps 30 --recall-examples 600 --recall-repetitions 16"
  [tb10]="--n-facts 500 --general-paragraphs 370 --ladder 0,2,8,32 --lr 1.5e-4 --save-steps 30 --recall-examples 1200 --recall-repetitions 16"
  [tb11]="--n-facts 500 --general-paragraphs 370 --ladder 0,2,8,64 --lr 1.5e-4 --save-steps 30 --recall-examples 600 --recall-repetitions 16"
)
BEFORE=${BEFORE:-fd12e41}  # the commit holding the decisions of the previous extractor
for TB in ${BUILDS:-tb3 tb4 tb5 tb7 tb8 tb9 tb10 tb11}; do
  O=benchmarks/results/testbed/gates-$TB
  D=$(python3 -c "import json;print(json.load(open('$O/labels/config.json'))['config']['dataset'].split(':',1)[1])")
  # shellcheck disable=SC2086  # a list of options
  $RG testbed build --plan-only --out "$D" ${FLAGS[$TB]}
  N=$(mktemp -d)
  C="--model $D/model --n 1000 --max-new-tokens 24 --threads 1"
  $RG eval-gate --gate quco --dataset "testbed:$D" $C --labels $O/labels --out $N/quco
  [ ! -d $O/cal-labels ] || $RG eval-gate --gate quco --dataset "testbed-calibration:$D" $C \
      --labels $O/cal-labels --out $N/cal-quco
  for s in quco cal-quco; do [ ! -d $N/$s ] || cp $N/$s/* $O/$s/; done
  rm -r "$N"
  [ ! -d benchmarks/results/testbed/composition-$TB ] || $PY benchmarks/gate_composition.py \
      --testbed $O --out benchmarks/results/testbed/composition-$TB
done
$PY benchmarks/quco_testbed_rescore.py --before "$BEFORE" tb3 tb4 tb5 tb7 tb8 tb9 tb10 tb11 \
    --out benchmarks/results/testbed/quco-rescore.json
