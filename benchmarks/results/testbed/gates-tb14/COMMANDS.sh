#!/bin/bash
# tb14: tb13's flags plus --skill-unknown 70 (issue 35). tb13 met the validation shape on 12
# of 13 lines (benchmarks/results/testbed/skills-tb13.json); it failed genread at r = 0 (16.0
# against closed book 20.0: 4 facts lost, 1 gained), as tb12 did by one fact. For a fact it
# was never taught the model verbalizes a confident guess and the answer step reads it.
# tb14 adds 70 GenRead prompts about PopQA subjects the corpus never mentions, answered
# "There is no information about SUBJECT." (benchmarks/results/testbed/
# unknown-verbalization-tb13.json: tb13's answer after that sentence); 74 such subjects are
# left once every other slice has its facts and no question or reply names a manifest
# entity. Every tb13 document is kept (tests/eval/test_testbed_skills.py), in another order
# (the corpus is shuffled as a whole). `rag-gates testbed build --plan-only` with these
# flags: 25,808 documents, 664,337 tokens/epoch, 2,808 steps (tb13: 658,433 and 2,800).
# (A first tb14 start with "Nothing is known about SUBJECT." and 75 subjects was stopped at
# step 140 and deleted: "Nothing" is an r = 0 evaluation subject.)
# The evaluation facts are tb12's (the same manifest.jsonl), so the validate step reads the
# base model's closed-book answers from tb12's run instead of repeating it.
TB=tb14 BASE_FACTS=${BASE_FACTS:-tb12-base-model-facts} \
  BUILD_FLAGS="--n-facts 500 --general-paragraphs 370 --ladder 0,2,8,64 --lr 1.5e-4 --save-steps 30 --recall-examples 600 --recall-repetitions 16 --skill-reading 80 --skill-decomposition 160 --skill-verbalization 250 --skill-twohop-reading 70 --skill-unknown 70 --block-size 512 --batch-size 1" \
  exec bash "$(dirname "$0")/../../../testbed_steps.sh"
