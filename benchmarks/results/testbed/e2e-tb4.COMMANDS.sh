#!/bin/bash
# End to end on tb4's evaluation facts: every gate at its threshold calibrated on the
# calibration facts (selective@GATE:T = the gate, then single retrieval or closed book), and
# CBDR's own pipeline at the calibrated beta.
set -x
cd /work/main
export OMP_NUM_THREADS=1
D=~/.cache/rag-gates/testbeds/tb4; O=benchmarks/results/testbed/gates-tb4; E=benchmarks/results/testbed/e2e-tb4
export RAG_GATES_CBDR_PROBE=$O/probe
th() { python3 -c "import json;print(json.load(open('$O/cal-$1/gate.json'))['threshold'])"; }
TQ=$(th quco); TF=$(th first-token-prob); TA=$(th answer-logprob); TC=$(th cbdr)
BETA=$(python3 -c "print(round(1 - $TC, 6))")
mkdir -p $E
.venv/bin/rag-gates bench --dataset testbed:$D --model $D/model --n 1000 --max-new-tokens 24 --threads 1 \
  --methods "no-rag,single,selective@quco:$TQ,selective@first-token-prob:$TF,selective@answer-logprob:$TA,selective@cbdr:$TC,cbdr@$BETA" \
  --out $E
.venv/bin/rag-gates report $E --out $E/report --title "tb4 end to end (56 evaluation facts)"
echo DONE
