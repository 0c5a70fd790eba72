#!/bin/bash
# tb11: tb9's recall practice (600 facts outside the manifest) with the top rung taught 64
# times instead of 32 (ladder 0/2/8/64). Recall examples lifted the top rung from 40.0% (tb5,
# none) to 49.3% (tb8, 300), 57.3% (tb9, 600) and then only 58.7% (tb10, 1,200, with
# `single` down from 80.7% to 75.3%): that lever is spent. Within tb9 and tb10 the rungs
# still climb steeply with exposures (r = 8 -> 32: +24 and +21 points), so more exposures at
# the top is the lever tested here; everything else is tb9's.
# The steps are benchmarks/testbed_steps.sh's; STEPS picks some, each resumes if interrupted.
# The rungs differ from tb5's, so the validate step runs the base model on these facts itself.
TB=tb11 \
  BUILD_FLAGS="--n-facts 500 --general-paragraphs 370 --ladder 0,2,8,64 --lr 1.5e-4 --save-steps 30 --recall-examples 600 --recall-repetitions 16" \
  exec bash "$(dirname "$0")/../../../testbed_steps.sh"
