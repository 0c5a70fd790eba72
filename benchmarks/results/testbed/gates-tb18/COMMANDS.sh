#!/bin/bash
# tb18: tb17's flags with each recall fact's closed-book question in the corpus 8 times
# (--recall-question-repetitions 8; issue 35, docs/testbed.md "tb18", written before the build):
# more practice at answering from statements, without more recall facts. Everything else,
# the manifest and every other document are tb17's.
TB=tb18 BASE_FACTS=${BASE_FACTS:-tb17-base-model-facts} \
  BUILD_FLAGS="--n-facts 500 --general-paragraphs 370 --ladder 0,2,8,128 --lr 1.5e-4 --save-steps 30 --recall-examples 600 --recall-repetitions 16 --recall-question-repetitions 8 --skill-reading 80 --skill-decomposition 160 --skill-verbalization 600 --skill-twohop-reading 70 --block-size 512 --batch-size 1 --precision bf16" \
  exec bash "$(dirname "$0")/../../../testbed_steps.sh"
