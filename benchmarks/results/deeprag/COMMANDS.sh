#!/bin/bash
# DeepRAG's end-to-end measurements (issue 15) on the embedded model, in order; every step
# resumes (rag-gates bench keeps finished rows). Run from anywhere, one model process per
# core on this 2-core machine:
#   STEPS="hotpotqa-200 hotpotqa-sft" bash benchmarks/results/deeprag/COMMANDS.sh
# Steps:
#   train           SFT then DPO from the committed synthesis rows (models/ is not committed)
#   hotpotqa-200 2wiki-200     no-rag, single, untrained deeprag on 200 evaluation rows
#                              (deeprag: the fail-closed marker rule, the library default)
#   hotpotqa-authors 2wiki-authors  untrained deeprag@authors (the authors' marker rule,
#                              the reproduction setting; issue 55) on the same 200 rows
#   hotpotqa-sft 2wiki-sft     the SFT model, 200 rows
#   hotpotqa-dpo 2wiki-dpo     the SFT+DPO model, 200 rows
#   calibrate       deeprag-likelihood thresholds on held-out rows (offset 300); the -100
#                   steps run deeprag-likelihood at the best of them (accuracy, then fewer
#                   retrievals), so calibrate comes first
#   hotpotqa-100 2wiki-100     the peers and the other decision modes, 100 rows
#   report          the table, with the knowledge-boundary MCC
set -ex
case ${RG:-} in */*) RG=$(realpath -m "$RG") ;; esac  # a path: absolute before the cd
cd "$(dirname "$0")/../../.."
export OMP_NUM_THREADS=1
RG=${RG:-$PWD/.venv/bin/rag-gates}
R=benchmarks/results/deeprag
STEPS=${STEPS:-"train hotpotqa-200 2wiki-200 hotpotqa-authors 2wiki-authors hotpotqa-sft 2wiki-sft hotpotqa-dpo 2wiki-dpo calibrate hotpotqa-100 2wiki-100 report"}
for step in $STEPS; do  # a misspelt step fails now, not after hours
  case $step in train|hotpotqa-200|2wiki-200|hotpotqa-authors|2wiki-authors|hotpotqa-sft|2wiki-sft|hotpotqa-dpo|2wiki-dpo|hotpotqa-100|2wiki-100|calibrate|report) ;;
  *) echo "unknown step $step"; exit 2 ;; esac
done
B="--threads 1 --prefix-cache-mb 256"
for step in $STEPS; do case $step in
train)
  [ -f models/deeprag-sft/training.json ] || $RG deeprag train --stage sft \
      --rows $R/synth-smollm2.jsonl --out models/deeprag-sft --threads 1
  [ -f models/deeprag-sft-dpo/training.json ] || $RG deeprag train --stage dpo \
      --rows $R/synth-smollm2.jsonl --model models/deeprag-sft --out models/deeprag-sft-dpo --threads 1 ;;
*-200)
  $RG bench --dataset ${step%-200} --n 200 $B --methods no-rag,single,deeprag --out $R/$step ;;
*-authors)
  $RG bench --dataset ${step%-authors} --n 200 $B --methods deeprag@authors \
      --out $R/${step%-authors}-200-authors ;;
*-sft)
  $RG bench --dataset ${step%-sft} --n 200 $B --model models/deeprag-sft --methods deeprag \
      --out $R/${step%-sft}-200-sft ;;
*-dpo)
  $RG bench --dataset ${step%-dpo} --n 200 $B --model models/deeprag-sft-dpo --methods deeprag \
      --out $R/${step%-dpo}-200-sft-dpo ;;
*-100)
  # The threshold the calibrate step chose (held-out rows only).
  T=$(python3 -c "
import json, collections
rows = [json.loads(l) for l in open('$R/likelihood-calib/results.jsonl') if l.strip()]
by = collections.defaultdict(list)
for r in rows: by[r['method']].append(r)
best = max(by, key=lambda m: (sum(r['accuracy'] for r in by[m]), -sum(r['retrievals'] for r in by[m])))
print(best.split('@')[1])")
  $RG bench --dataset ${step%-100} --n 100 $B \
      --methods "flare,subquestion,deeprag-likelihood@$T,deeprag-always,deeprag-never,deeprag-gate@quco" \
      --out $R/$step ;;
calibrate)
  $RG bench --dataset hotpotqa --n 50 --offset 300 $B \
      --methods deeprag-likelihood@-2,deeprag-likelihood@0,deeprag-likelihood@2 \
      --out $R/likelihood-calib ;;
report)
  runs=$(for d in hotpotqa-200 2wiki-200 hotpotqa-200-authors 2wiki-200-authors hotpotqa-200-sft 2wiki-200-sft hotpotqa-200-sft-dpo \
      2wiki-200-sft-dpo hotpotqa-100 2wiki-100; do [ ! -d $R/$d ] || echo $R/$d; done)
  # shellcheck disable=SC2086  # a list of directories
  $RG report $runs --out $R/report --title "DeepRAG end to end (SmolLM2-135M)" ;;
esac; done
