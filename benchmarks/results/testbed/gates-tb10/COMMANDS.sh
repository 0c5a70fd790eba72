#!/bin/bash
# tb10: tb9 with twice its recall examples again (1,200 PopQA facts outside the manifest, of
# the 1,251 there are, each stated 16 times and asked once closed-book): 0, 300 and 600 recall
# examples gave a top rung of 40.0% (tb5), 49.3% (tb8) and 57.3% (tb9), so the share of facts
# practised as questions is still the lever (the manifest, its statements, the ladder 0/2/8/32
# and the reading examples are tb8's and tb9's, byte for byte).
# The steps are benchmarks/testbed_steps.sh's; STEPS picks some, each resumes if interrupted.
# The base model's closed book on the same facts is tb5's run (same manifest and rungs).
TB=tb10 BASE_FACTS=tb5-base-model-facts \
  BUILD_FLAGS="--n-facts 500 --general-paragraphs 370 --ladder 0,2,8,32 --lr 1.5e-4 --save-steps 30 --recall-examples 1200 --recall-repetitions 16" \
  exec bash "$(dirname "$0")/../../../testbed_steps.sh"
