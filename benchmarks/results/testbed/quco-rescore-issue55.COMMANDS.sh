#!/bin/bash
# The testbed QuCo gates with the issue-55 extractor and the cased index, into /tmp (compare only).
set -x
cd /work/main
export OMP_NUM_THREADS=1
RG=.venv/bin/rag-gates
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
for TB in tb11 tb10 tb9 tb8 tb5 tb4 tb3 tb7; do
  O=benchmarks/results/testbed/gates-$TB
  D=$(python3 -c "import json;print(json.load(open('$O/labels/config.json'))['config']['dataset'].split(':',1)[1])")
  $RG testbed build --plan-only --out "$D" ${FLAGS[$TB]} > /dev/null
  C="--model $D/model --n 1000 --max-new-tokens 24 --threads 1"
  $RG eval-gate --gate quco --dataset "testbed:$D" $C --labels $O/labels --out /tmp/tbq/$TB/quco
  [ ! -d $O/cal-labels ] || $RG eval-gate --gate quco --dataset "testbed-calibration:$D" $C --labels $O/cal-labels --out /tmp/tbq/$TB/cal-quco
done
