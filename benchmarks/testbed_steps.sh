#!/bin/bash
# The steps of a testbed's measurement, shared by benchmarks/results/testbed/gates-tbN/COMMANDS.sh
# (which set what differs between builds, then run this). Every step resumes if interrupted.
#   TB           the build's name (tb6, tb7, ...): directories and files are named by it
#   BUILD_FLAGS  the `rag-gates testbed build` options that make this build
#   BASE_FACTS   optional: an existing run of the base model on the same evaluation facts
#                (bench/NAME); without it the validate step runs the base model itself
#   STEPS        build validate skills gates e2e tokrag deeprag deeprag-trained (SFT, then DPO)
#                srrag srrag-auroc
#                expectations
#                (default: all, in that order; skills reads validate's table, deeprag needs
#                gates' calibrated first-token threshold, deeprag-trained reports with
#                deeprag's runs, srrag needs gates' CBDR probe, srrag-auroc needs
#                srrag's policies, expectations reads what the others wrote: no model)
#   SKILLS_N     caps the evaluation facts and two-hop questions the skills step answers
#                (a dry run; it writes apart, skills-$TB-nN.json)
#   SKILLS_SHARD I/K: the skills step answers the I-th of K shares only (K lanes at once,
#                one thread each); a skills step without it then gathers them and writes
#                the table
#   TWOHOP_N     caps the two-hop questions DeepRAG answers (default: all)
#   SRRAG_N      caps the questions per split SR-RAG labels and answers (default: all)
#   BUILD_THREADS  the build's torch threads (default 1); every other step runs on one thread
#   D            the testbed directory (default ~/.cache/rag-gates/testbeds/$TB)
set -ex
: "${TB:?set TB, e.g. TB=tb7}"
STEPS=${STEPS:-"build validate skills gates e2e tokrag deeprag deeprag-trained srrag srrag-auroc expectations"}
for step in $STEPS; do  # a misspelt step fails now, not after an hours-long build
  case $step in build|validate|skills|gates|e2e|tokrag|deeprag|deeprag-trained|srrag|srrag-auroc|expectations) ;;
  *) echo "unknown step $step"; exit 2 ;; esac
done
case " $STEPS " in *" build "*) : "${BUILD_FLAGS:?set BUILD_FLAGS}" ;; esac
D=$(realpath -m "${D:-$HOME/.cache/rag-gates/testbeds/$TB}")  # absolute before the cd
case ${RG:-} in */*) RG=$(realpath -m "$RG") ;; esac  # a path: absolute; a name: on PATH
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS=1
O=benchmarks/results/testbed/gates-$TB; R=benchmarks/results/testbed/bench
RG=${RG:-$PWD/.venv/bin/rag-gates}
T="--threads 1 --max-new-tokens 24"
C="--model $D/model --n 1000 --max-new-tokens 24 --threads 1"
# A threshold from a JSON file (path, then a Python subscript), rounded down to 4 decimals.
floor4() { python3 -c "import json,math;print(math.floor(json.load(open('$1'))$2 * 1e4) / 1e4)"; }
# The DeepRAG report over whichever of the deeprag and deeprag-trained steps' runs exist.
deeprag_report() {
  local runs
  runs=$(for d in twohop twohop-paper-prompt twohop-sft twohop-sft-dpo hops hops-paper-prompt \
      hops-sft hops-sft-dpo; do [ ! -d "$1/$d" ] || echo "$1/$d"; done)
  # shellcheck disable=SC2086  # a list of directories
  $RG report $runs --out "$1/report" --title "$TB two-hop questions: DeepRAG"
}
for step in $STEPS; do case $step in
build)
  # shellcheck disable=SC2086  # BUILD_FLAGS is a list of options
  OMP_NUM_THREADS=${BUILD_THREADS:-1} $RG testbed build --out $D --threads ${BUILD_THREADS:-1} $BUILD_FLAGS
  cp $D/config.json benchmarks/results/testbed/$TB-config.json
  cp $D/training.json benchmarks/results/testbed/$TB-training.json ;;
validate)
  # Closed book and single on the evaluation facts (the labels run) and HotpotQA closed book.
  # The base model on the same questions, closed book: BASE_FACTS, or run here.
  $RG bench --dataset testbed:$D --methods no-rag,single --model $D/model --n 1000 $T --out $O/labels
  BASE=${BASE_FACTS:-$TB-base-model-facts}
  if [ -n "${BASE_FACTS:-}" ] && [ ! -d "$R/$BASE_FACTS" ]; then echo "no run $R/$BASE_FACTS"; exit 2; fi
  [ -n "${BASE_FACTS:-}" ] || $RG bench --dataset testbed:$D --methods no-rag --model default --n 1000 $T --out $R/$BASE
  $RG bench --dataset hotpotqa --methods no-rag --model $D/model --n 100 $T --out $R/$TB-testbed-model-hotpotqa
  (cd benchmarks/results/testbed && $RG testbed table bench/$BASE \
      gates-$TB/labels bench/base-model-hotpotqa bench/$TB-testbed-model-hotpotqa --out validation-$TB.json) ;;
skills)
  # Issue 35's validation shape: `single` with each fact's own passage in every method's
  # prompt form, DeepRAG's hop answer from Context:, genread against closed book per rung,
  # two-hop `single` with both hops' passages; one pass/fail line per criterion (the
  # thresholds are benchmarks/lab/rag_gates_lab/testbed/skills.py's). The base model's closed book at
  # r = 0 comes from the validate step's table. Resumes from skills-$TB*-rows.jsonl.
  .venv/bin/python benchmarks/testbed_skills.py --testbed $D \
      --validation benchmarks/results/testbed/validation-$TB.json \
      ${SKILLS_N:+--n $SKILLS_N --twohop-n $SKILLS_N} ${SKILLS_SHARD:+--shard $SKILLS_SHARD} \
      --out benchmarks/results/testbed/skills-$TB${SKILLS_N:+-n$SKILLS_N}.json ;;
gates)
  for g in first-token-prob answer-logprob quco; do
    $RG eval-gate --gate $g --dataset testbed:$D $C --labels $O/labels --create-labels --out $O/$g
    $RG eval-gate --gate $g --dataset testbed-calibration:$D $C --labels $O/cal-labels --create-labels --out $O/cal-$g
  done
  $RG cbdr train-probe --out $O/probe --dataset testbed-probe:$D --model $D/model \
      --n 1000 --offset 0 --prompt-style rag-gates --label-max-new-tokens 24 --threads 1
  RAG_GATES_CBDR_PROBE=$O/probe $RG eval-gate --gate cbdr --dataset testbed:$D $C --labels $O/labels --out $O/cbdr
  RAG_GATES_CBDR_PROBE=$O/probe $RG eval-gate --gate cbdr --dataset testbed-calibration:$D $C --labels $O/cal-labels --out $O/cal-cbdr
  .venv/bin/python benchmarks/gate_composition.py --testbed $O --out benchmarks/results/testbed/composition-$TB ;;
e2e)
  # The methods' own pipelines: QuCo at the bench's tau_entity (calibrated for the Wikipedia
  # index) and at the tau_entity calibrated on this testbed's calibration facts, CBDR at the
  # beta calibrated on the calibration facts;
  # the e2e directory starts from the labels run's no-rag and single answers (same config).
  E=benchmarks/results/testbed/e2e-$TB; mkdir -p $E
  [ -f $E/results.jsonl ] || cp $O/labels/config.json $O/labels/results.jsonl $E/
  TC=$(python3 -c "import json;print(json.load(open('$O/cal-cbdr/gate.json'))['threshold'])")
  BETA=$(python3 -c "print(round(1 - $TC, 6))")
  TQ=$(python3 -c "import json;print(json.load(open('$O/cal-quco/gate.json'))['threshold'])")
  # rarity threshold TQ = 1 / (1 + tau_entity); TQ = 0 is "always retrieve" (single's run)
  QT=$(python3 -c "print('' if $TQ <= 0 else ',quco@%s' % round(1 / $TQ - 1, 3))")
  RAG_GATES_CBDR_PROBE=$O/probe $RG bench --dataset testbed:$D --model $D/model --n 1000 --max-new-tokens 24 \
      --threads 1 --methods "no-rag,single,quco$QT,cbdr@$BETA" --out $E
  $RG report $E --out $E/report --title "$TB end to end (300 evaluation facts)" ;;
tokrag)
  # Both judges (issue 34): "tokrag" is the paper's as transcribed, "tokrag@authors" the
  # released code's (the default); the own-passage, counterfactual and distractors cases.
  .venv/bin/python benchmarks/tokrag_testbed.py --testbed $D --per-rung 25 \
      --cases gold,counterfactual,distractors --methods single,cad,adacad,tokrag,tokrag@authors \
      --out benchmarks/results/testbed/tokrag-$TB.json ;;
deeprag)
  # Per-subquery knowledge boundary: each hop alone (closed book), then the two-hop questions.
  W=benchmarks/results/testbed/deeprag-$TB
  $RG bench --dataset testbed-hops:$D --model $D/model --methods no-rag --n 1000 $T --out $W/hops
  $RG bench --dataset testbed-twohop:$D --model $D/model --prefix-cache-mb 256 --threads 1 \
      --methods no-rag,single,deeprag,deeprag-likelihood --n ${TWOHOP_N:-1000} --out $W/twohop
  # The same questions in the paper's prompt without the demonstration, the prompt the
  # decomposition practice (skill_decomposition) trained and a DeepRAG-trained model carries
  # (a view of the model holding deeprag.json: symlinks, no copy): the model's own decisions,
  # the marker likelihood, and the first-token probability gate at its calibrated threshold
  # deciding per subquery; the hops again under the view's name, so the report pairs them.
  V=$D/model-deeprag-paper-prompt
  .venv/bin/python -c "from rag_gates.deeprag.train import prompt_view; prompt_view('$D/model', '$V')"
  TF=$(floor4 $O/cal-first-token-prob/gate.json "['threshold']")
  $RG bench --dataset testbed-hops:$D --model $V --methods no-rag --n 1000 $T --out $W/hops-paper-prompt
  $RG bench --dataset testbed-twohop:$D --model $V --prefix-cache-mb 256 --threads 1 \
      --methods deeprag,deeprag-likelihood,deeprag-gate@first-token-prob:$TF \
      --n ${TWOHOP_N:-1000} --out $W/twohop-paper-prompt
  deeprag_report $W ;;
deeprag-trained)
  # DeepRAG's trained form (docs/methods/deeprag.md, "On the testbed"): the testbed model
  # does not decompose in the one-shot format (tb6), so the synthesis asks the rows' own
  # subqueries (--decomposition given) and searches, per subquery, answering from memory vs
  # from passages; on the training facts only: the probe and calibration facts (one subquery
  # each) and the two-hop questions over calibration facts. SFT on the trajectories found
  # (the model inside the testbed directory, not committed), then the two-hop evaluation
  # questions with the trained model, and each hop alone with it (its own closed-book
  # answers judge its per-subquery decisions); then the same after DPO on the SFT model;
  # the report adds deeprag's runs if there.
  W=benchmarks/results/testbed/deeprag-$TB
  $RG deeprag synthesize --decomposition given --dataset testbed-probe:$D \
      --dataset testbed-calibration:$D --dataset testbed-twohop-calibration:$D --n 1000 \
      --offset 0 --model $D/model --threads 1 --out $W/synth-given.jsonl
  # SFT on the trajectories, then DPO on their step-wise decision pairs (the paper's Chain
  # of Calibration) from the SFT model; each model answers the two-hop evaluation questions
  # and, closed book, each hop alone (its own per-subquery boundary).
  base=$D/model; tag=
  for stage in sft dpo; do
    tag=${tag:+$tag-}$stage; M=$D/deeprag-$tag  # deeprag-sft, then deeprag-sft-dpo
    [ -f $M/training.json ] || $RG deeprag train --stage $stage \
        --rows $W/synth-given.jsonl --model $base --out $M --threads 1
    mkdir -p $W/$stage && cp $M/training.json $M/loss.png $W/$stage/
    $RG bench --dataset testbed-twohop:$D --model $M --prefix-cache-mb 256 --threads 1 \
        --methods deeprag --n ${TWOHOP_N:-1000} --out $W/twohop-$tag
    $RG bench --dataset testbed-hops:$D --model $M --methods no-rag --n 1000 $T \
        --out $W/hops-$tag
    base=$M
  done
  deeprag_report $W ;;
srrag|srrag-auroc)
  # SR-RAG (docs/methods/srrag.md) with the testbed model: source labels on the probe and
  # calibration facts (training rows), the kNN datastores from them (SR-RAG's hidden states,
  # SKR's MiniLM; inside the testbed directory, not committed), tau per mode leave-one-out on
  # those labels; then the end-to-end table on the evaluation facts, starting from the labels
  # run's no-rag and single answers, with CBDR at the threshold calibrated in the gates step.
  # A capped trial (SRRAG_N) writes apart, so it never mixes with a full run's files.
  ( N=${SRRAG_N:+-n$SRRAG_N}
  S=benchmarks/results/testbed/srrag-$TB$N; P=$D/srrag-policy$N; K=$D/srrag-skr-policy$N
  export RAG_GATES_SRRAG_POLICY=$P RAG_GATES_SRRAG_SKR_POLICY=$K RAG_GATES_CBDR_PROBE=$O/probe
  mkdir -p $S
  if [ $step = srrag ]; then
    $RG srrag label --dataset testbed-probe:$D --dataset testbed-calibration:$D --n ${SRRAG_N:-1000} \
        --offset 0 --model $D/model --threads 1 --out $S/labels-train.jsonl
    $RG srrag build-policy --labels $S/labels-train.jsonl --model $D/model --path $P --replace --threads 1
    $RG srrag build-policy --labels $S/labels-train.jsonl --keys minilm --path $K --replace --threads 1
    [ $S/tau-train.json -nt $S/labels-train.jsonl ] || .venv/bin/python benchmarks/srrag_calibrate.py \
        --labels $S/labels-train.jsonl --model $D/model --out $S/tau-train.json
    # Thresholds rounded DOWN to 4 decimals: a score at the calibrated value still retrieves.
    TN=$(floor4 $S/tau-train.json "['modes']['srrag-no-knn']['tau']")
    TS=$(floor4 $S/tau-train.json "['modes']['srrag']['tau']")
    TK=$(floor4 $S/tau-train.json "['modes']['srrag-knn-only']['tau']")
    TC=$(floor4 $O/cal-cbdr/gate.json "['threshold']")
    E=$S/e2e; mkdir -p $E
    # (the labels run answered all the facts: with SRRAG_N set, no-rag and single run here)
    [ -f $E/results.jsonl ] || [ -n "${SRRAG_N:-}" ] || cp $O/labels/config.json $O/labels/results.jsonl $E/
    $RG bench --dataset testbed:$D --model $D/model --n ${SRRAG_N:-1000} --max-new-tokens 24 --threads 1 \
        --methods "no-rag,single,genread,selective@cbdr:$TC,skr,srrag-no-knn@$TN,srrag@0.1,srrag@$TS,srrag-knn-only@$TK" \
        --out $E
    $RG report $E --out $E/report \
        --title "$TB: SR-RAG end to end (${SRRAG_N:+the first $SRRAG_N of }the evaluation facts)"
  else
    # Source selection on the evaluation facts' own labels (never in a datastore).
    $RG srrag label --dataset testbed:$D --n ${SRRAG_N:-1000} --offset 0 --model $D/model --threads 1 \
        --out $S/labels-eval.jsonl
    $RG srrag routing-auroc --labels $S/labels-eval.jsonl --model $D/model --gate srrag \
        --gate srrag-no-knn --gate srrag-knn-only --gate skr --gate cbdr --threads 1 \
        --out $S/routing-auroc.json
  fi ) ;;
expectations)
  # The per-rung figures docs/testbed.md's pre-registered expectations are judged by (gates
  # by rung at their calibrated thresholds, end-to-end retrieval by rung, DeepRAG's steps by
  # hop rung), from the files the steps above wrote; a missing one is listed, not an error.
  .venv/bin/python benchmarks/testbed_expectations.py --tb $TB --testbed $D \
      --out benchmarks/results/testbed/expectations-$TB.json ;;
*) echo "unknown step $step"; exit 2 ;;
esac; done
