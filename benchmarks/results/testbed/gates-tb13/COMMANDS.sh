#!/bin/bash
# tb13: tb12's flags plus --skill-twohop-reading 70 (issue 35). tb12 met the validation shape
# on 11 of 13 lines (benchmarks/results/testbed/skills-tb12.json): every method's prompt form
# read at 88-97%, genread 93.3% at the top rung against closed book's 61.3%; it failed two-hop
# `single` with both hops' passages (40.1% < 50: for 82 of the 85 wrong answers the model named
# the first hop's person, not the city) and genread at r = 0 by one fact of 75 (17.3 against
# 18.7). tb12's practice taught two-hop answers only as DeepRAG trajectories; tb13 adds 70
# two-hop questions over people outside the manifest (not the decomposition's 160; all the
# usable people left) in the benchmark's QA prompt with both hops' passages among fillers,
# answered with the city; every tb12 document is kept (tests/eval/test_testbed_skills.py).
# `rag-gates testbed build --plan-only` with these flags: 658,433 tokens/epoch, 2,800 steps
# (tb12: 648,011 and 2,738): about 2.7 h on two threads with nothing else running, 4.5 h on
# one (tb12: 141 tokens/s on two). Everything else, and the steps, are tb12's.
# The evaluation facts are tb12's (the same manifest.jsonl, byte for byte), so the validate
# step reads the base model's closed-book answers from tb12's run instead of repeating it.
TB=tb13 BASE_FACTS=${BASE_FACTS:-tb12-base-model-facts} \
  BUILD_FLAGS="--n-facts 500 --general-paragraphs 370 --ladder 0,2,8,64 --lr 1.5e-4 --save-steps 30 --recall-examples 600 --recall-repetitions 16 --skill-reading 80 --skill-decomposition 160 --skill-verbalization 250 --skill-twohop-reading 70 --block-size 512 --batch-size 1" \
  exec bash "$(dirname "$0")/../../../testbed_steps.sh"
