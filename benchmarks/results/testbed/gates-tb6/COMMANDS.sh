#!/bin/bash
# tb6: tb5's 500 facts (the same 300 evaluation facts) with the purpose-written bridges (second
# hops for DeepRAG's two-hop questions) and lr 3e-4 (tb5: 1.5e-4), built, validated, its gates
# measured (AUROC on the 300 evaluation facts, thresholds calibrated on the calibration facts,
# the CBDR probe retrained on the probe-training facts), then the methods end to end.
# One thread throughout; every step resumes if interrupted. STEPS picks a part: build,
# validate, gates, e2e, tokrag, deeprag (default: all, in that order); TWOHOP_N caps the
# two-hop questions DeepRAG answers (all 142 by default).
# Run on 2026-11-25: build (resumed once from checkpoint-300), validate, and deeprag with
# TWOHOP_N=60. The gates, e2e and tokrag steps were not run on tb6 (its ladder is tb5's:
# docs/testbed.md); they are the same commands as tb5's, for the next build.
set -ex
cd "$(dirname "$0")/../../../.."
export OMP_NUM_THREADS=1
D=${D:-~/.cache/rag-gates/testbeds/tb6}; O=benchmarks/results/testbed/gates-tb6; R=benchmarks/results/testbed/bench
STEPS=${STEPS:-"build validate gates e2e tokrag deeprag"}
RG=.venv/bin/rag-gates
T="--threads 1 --max-new-tokens 24"
C="--model $D/model --n 1000 --max-new-tokens 24 --threads 1"
for step in $STEPS; do case $step in
build)
  $RG testbed build --out $D --threads 1 --n-facts 500 --general-paragraphs 370 --lr 3e-4 --save-steps 30
  cp $D/config.json benchmarks/results/testbed/tb6-config.json
  cp $D/training.json benchmarks/results/testbed/tb6-training.json ;;
validate)
  # Closed book and single on the evaluation facts (the labels run) and HotpotQA closed book.
  # The base model's run on these same 300 questions is tb5's (bench/tb5-base-model-facts).
  $RG bench --dataset testbed:$D --methods no-rag,single --model $D/model --n 1000 $T --out $O/labels
  $RG bench --dataset hotpotqa --methods no-rag --model $D/model --n 100 $T --out $R/tb6-testbed-model-hotpotqa
  (cd benchmarks/results/testbed && ../../../$RG testbed table bench/tb5-base-model-facts \
      gates-tb6/labels bench/base-model-hotpotqa bench/tb6-testbed-model-hotpotqa --out validation-tb6.json) ;;
gates)
  for g in first-token-prob answer-logprob quco; do
    $RG eval-gate --gate $g --dataset testbed:$D $C --labels $O/labels --create-labels --out $O/$g
    $RG eval-gate --gate $g --dataset testbed-calibration:$D $C --labels $O/cal-labels --create-labels --out $O/cal-$g
  done
  $RG cbdr train-probe --out $O/probe --dataset testbed-probe:$D --model $D/model \
      --n 1000 --offset 0 --prompt-style rag-gates --label-max-new-tokens 24 --threads 1
  RAG_GATES_CBDR_PROBE=$O/probe $RG eval-gate --gate cbdr --dataset testbed:$D $C --labels $O/labels --out $O/cbdr
  RAG_GATES_CBDR_PROBE=$O/probe $RG eval-gate --gate cbdr --dataset testbed-calibration:$D $C --labels $O/cal-labels --out $O/cal-cbdr
  .venv/bin/python benchmarks/gate_composition.py --testbed $O --out benchmarks/results/testbed/composition-tb6 ;;
e2e)
  # The methods' own pipelines: QuCo at the bench's tau_entity (calibrated for the Wikipedia
  # index) and at the tau_entity calibrated on this testbed's calibration facts, CBDR at the
  # beta calibrated on the calibration facts;
  # the e2e directory starts from the labels run's no-rag and single answers (same config).
  E=benchmarks/results/testbed/e2e-tb6; mkdir -p $E
  [ -f $E/results.jsonl ] || cp $O/labels/config.json $O/labels/results.jsonl $E/
  TC=$(python3 -c "import json;print(json.load(open('$O/cal-cbdr/gate.json'))['threshold'])")
  BETA=$(python3 -c "print(round(1 - $TC, 6))")
  TQ=$(python3 -c "import json;print(json.load(open('$O/cal-quco/gate.json'))['threshold'])")
  TAU=$(python3 -c "print(round(1 / $TQ - 1, 3))")
  RAG_GATES_CBDR_PROBE=$O/probe $RG bench --dataset testbed:$D --model $D/model --n 1000 --max-new-tokens 24 \
      --threads 1 --methods "no-rag,single,quco,quco@$TAU,cbdr@$BETA" --out $E
  $RG report $E --out $E/report --title "tb6 end to end (300 evaluation facts)" ;;
tokrag)
  .venv/bin/python benchmarks/tokrag_testbed.py --testbed $D --per-rung 25 --out benchmarks/results/testbed/tokrag-tb6.json ;;
deeprag)
  # Per-subquery knowledge boundary: each hop alone (closed book), then the two-hop questions.
  W=benchmarks/results/testbed/deeprag-tb6
  $RG bench --dataset testbed-hops:$D --model $D/model --methods no-rag --n 1000 $T --out $W/hops
  $RG bench --dataset testbed-twohop:$D --model $D/model --prefix-cache-mb 256 --threads 1 \
      --methods no-rag,single,deeprag,deeprag-likelihood --n ${TWOHOP_N:-1000} --out $W/twohop
  $RG report $W/twohop $W/hops --out $W/report --title "tb6 two-hop questions: DeepRAG" ;;
*) echo "unknown step $step"; exit 2 ;;
esac; done
