#!/bin/bash
# tb5: the 300-evaluation-fact testbed (500 facts), built, validated, and its gates measured
# (AUROC on the 300 evaluation facts, thresholds calibrated on the 76 calibration facts, the
# CBDR probe retrained on the 125 probe-training facts). One thread throughout.
set -x
cd "$(dirname "$0")/../../../.."
export OMP_NUM_THREADS=1
D=${D:-~/.cache/rag-gates/testbeds/tb5}; O=benchmarks/results/testbed/gates-tb5; R=benchmarks/results/testbed/bench
.venv/bin/rag-gates testbed build --out $D --threads 1 --n-facts 500 --general-paragraphs 370 --save-steps 60
T="--threads 1 --max-new-tokens 24"
# Validation: closed book on the evaluation facts (the labels run), the base model on the same
# facts, and the testbed model's HotpotQA closed book.
.venv/bin/rag-gates bench --dataset testbed:$D --methods no-rag --model $D/model --n 1000 $T --out $O/labels
.venv/bin/rag-gates bench --dataset testbed:$D --methods no-rag --model default --n 1000 $T --out $R/tb5-base-model-facts
.venv/bin/rag-gates bench --dataset hotpotqa --methods no-rag --model $D/model --n 100 $T --out $R/tb5-testbed-model-hotpotqa
C="--model $D/model --n 1000 --max-new-tokens 24 --threads 1"
for g in first-token-prob quco answer-logprob; do
  .venv/bin/rag-gates eval-gate --gate $g --dataset testbed:$D $C --labels $O/labels --create-labels --out $O/$g
done
for g in first-token-prob answer-logprob quco; do
  .venv/bin/rag-gates eval-gate --gate $g --dataset testbed-calibration:$D $C --labels $O/cal-labels --create-labels --out $O/cal-$g
done
.venv/bin/rag-gates cbdr train-probe --out $O/probe --dataset testbed-probe:$D --model $D/model \
    --n 1000 --offset 0 --prompt-style rag-gates --label-max-new-tokens 24 --threads 1
export RAG_GATES_CBDR_PROBE=$O/probe
.venv/bin/rag-gates eval-gate --gate cbdr --dataset testbed:$D $C --labels $O/labels --out $O/cbdr
.venv/bin/rag-gates eval-gate --gate cbdr --dataset testbed-calibration:$D $C --labels $O/cal-labels --out $O/cal-cbdr
cd benchmarks/results/testbed && ../../../.venv/bin/rag-gates testbed table bench/tb5-base-model-facts \
    gates-tb5/labels bench/base-model-hotpotqa bench/tb5-testbed-model-hotpotqa --out validation-tb5.json && cd -
.venv/bin/python benchmarks/gate_composition.py --testbed $O --out benchmarks/results/testbed/composition-tb5
# End to end with the methods' own pipelines: QuCo (its bench tau_entity) and CBDR at the beta
# calibrated on the calibration facts (the e2e directory starts from the labels run's no-rag and
# single answers: the same configuration, so the bench resumes it).
E=benchmarks/results/testbed/e2e-tb5; mkdir -p $E; cp $O/labels/config.json $O/labels/results.jsonl $E/
TC=$(python3 -c "import json;print(json.load(open('$O/cal-cbdr/gate.json'))['threshold'])")
BETA=$(python3 -c "print(round(1 - $TC, 6))")
.venv/bin/rag-gates bench --dataset testbed:$D --model $D/model --n 1000 --max-new-tokens 24 --threads 1 \
    --methods "no-rag,single,quco,cbdr@$BETA" --out $E
.venv/bin/rag-gates report $E --out $E/report --title "tb5 end to end (300 evaluation facts)"
# Tok-RAG's benefit and detriment cases (25 evaluation facts per rung)
.venv/bin/python benchmarks/tokrag_testbed.py --testbed $D --per-rung 25 --out benchmarks/results/testbed/tokrag-tb5.json
