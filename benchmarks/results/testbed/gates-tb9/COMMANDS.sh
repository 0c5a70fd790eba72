#!/bin/bash
# tb9: tb8 with twice the recall examples (600 PopQA facts outside the manifest, each stated
# 16 times and asked once closed-book): tb8's 300 lifted the top rung from tb5's 40.0% to
# 49.3%, so the share of facts practised as questions is the lever tested here (the manifest,
# its statements, the ladder 0/2/8/32 and the reading examples are tb8's, byte for byte).
# The steps are benchmarks/testbed_steps.sh's; STEPS picks some, each resumes if interrupted.
# The base model's closed book on the same facts is tb5's run (same manifest and rungs).
TB=tb9 BASE_FACTS=tb5-base-model-facts \
  BUILD_FLAGS="--n-facts 500 --general-paragraphs 370 --ladder 0,2,8,32 --lr 1.5e-4 --save-steps 30 --recall-examples 600 --recall-repetitions 16" \
  exec bash "$(dirname "$0")/../../../testbed_steps.sh"
