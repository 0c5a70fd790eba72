#!/bin/bash
# tb17: tb16's flags trained in bfloat16 autocast (--precision bf16; issue 35). tb16's build
# (fp32) reached checkpoint-2010 of 3,666 steps and was lost with the machine between two
# sessions; an fp32 build takes about 2.6 hours on this machine's two threads, longer than a
# session leaves beside the validate and skills steps, and bfloat16 autocast over fp32 master
# weights runs a step 1.58 times faster here (benchmarks/results/testbed/train_precision.json).
# Facts, splits, corpus and steps are tb16's (same flags); the saved model is fp32, and every
# step after the build runs it in fp32 as before (docs/testbed.md, "tb17").
TB=tb17 BASE_FACTS=${BASE_FACTS:-} \
  BUILD_FLAGS="--n-facts 500 --general-paragraphs 370 --ladder 0,2,8,128 --lr 1.5e-4 --save-steps 30 --recall-examples 600 --recall-repetitions 16 --skill-reading 80 --skill-decomposition 160 --skill-verbalization 600 --skill-twohop-reading 70 --block-size 512 --batch-size 1 --precision bf16" \
  exec bash "$(dirname "$0")/../../../testbed_steps.sh"
