#!/bin/bash
# tb15: tb13's flags with --skill-verbalization 600 in place of 250 (issue 35). tb13 met the
# validation shape on 12 of 13 lines; it failed genread at r = 0 (16.0 against closed book
# 20.0), as tb12 and tb14 did (tb13 + tb14: 10 facts lost by verbalizing, 4 gained). tb14's
# lever (untaught-subject practice) needed the model to tell seen subjects from unseen ones
# and failed. tb15's lever needs no such skill: closed book is the prompt form the model
# practises on 600 recall questions, genread's verbalization only on 250 of them, so it
# verbalizes every recall fact (docs/testbed.md, "tb15"). Every tb13 document is kept and
# 350 verbalization documents are added (the manifest is tb12's and tb13's, byte for byte).
# `rag-gates testbed build --plan-only` with these flags: 26,088 documents, 699,645
# tokens/epoch, 2,972 steps (tb13: 658,433 and 2,800).
TB=tb15 BASE_FACTS=${BASE_FACTS:-tb12-base-model-facts} \
  BUILD_FLAGS="--n-facts 500 --general-paragraphs 370 --ladder 0,2,8,64 --lr 1.5e-4 --save-steps 30 --recall-examples 600 --recall-repetitions 16 --skill-reading 80 --skill-decomposition 160 --skill-verbalization 600 --skill-twohop-reading 70 --block-size 512 --batch-size 1" \
  exec bash "$(dirname "$0")/../../../testbed_steps.sh"
