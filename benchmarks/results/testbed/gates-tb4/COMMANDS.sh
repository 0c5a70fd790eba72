#!/bin/bash
# Gate AUROCs and calibrated thresholds on tb4 (evaluation facts; calibration facts), the CBDR
# probe retrained on the probe facts.
set -x
cd /work/main
export OMP_NUM_THREADS=1
D=~/.cache/rag-gates/testbeds/tb4; O=benchmarks/results/testbed/gates-tb4
C="--model $D/model --n 1000 --max-new-tokens 24 --threads 1"
.venv/bin/rag-gates cbdr train-probe --out $O/probe --dataset testbed-probe:$D --model $D/model \
    --n 1000 --offset 0 --prompt-style rag-gates --label-max-new-tokens 24 --threads 1
export RAG_GATES_CBDR_PROBE=$O/probe
for g in quco first-token-prob answer-logprob cbdr; do
  .venv/bin/rag-gates eval-gate --gate $g --dataset testbed:$D $C --labels $O/labels --create-labels --out $O/$g
  .venv/bin/rag-gates eval-gate --gate $g --dataset testbed-calibration:$D $C --labels $O/cal-labels --create-labels --out $O/cal-$g
done
echo DONE
