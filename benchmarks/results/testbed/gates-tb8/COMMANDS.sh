#!/bin/bash
# tb8: tb5's 500 facts and ladder (0/2/8/32) at lr 1.5e-4, 2 epochs, with the bridges, plus
# recall examples: 300 PopQA facts outside the manifest, each stated 16 times and asked once
# closed-book in the benchmark's QA format, to teach the model to look up what it has read
# (tb6/tb7 showed the learning rate and the exposures are not the lever: docs/testbed.md).
# The steps are benchmarks/testbed_steps.sh's; STEPS picks some, each resumes if interrupted.
# Run on 2026-11-26: build with BUILD_THREADS=2 (alone on the machine), then the rest on one
# thread each. The base model's closed book on the same facts is tb5's run (same rungs).
TB=tb8 BASE_FACTS=tb5-base-model-facts \
  BUILD_FLAGS="--n-facts 500 --general-paragraphs 370 --ladder 0,2,8,32 --lr 1.5e-4 --save-steps 30 --recall-examples 300 --recall-repetitions 16" \
  exec bash "$(dirname "$0")/../../../testbed_steps.sh"
