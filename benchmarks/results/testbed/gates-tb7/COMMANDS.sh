#!/bin/bash
# tb7: tb5's 500 facts with a steeper ladder, 0/4/16/64 (tb5/tb6: 0/2/8/32), at tb5's lr 1.5e-4,
# 2 epochs, with the bridges: the top rung is stated 128 times over the build (tb5/tb6: 64),
# the lever tb6 left (docs/testbed.md). The steps (build, validate, gates, e2e, tokrag, deeprag)
# are benchmarks/testbed_steps.sh's; STEPS picks some, each resumes if interrupted.
# Run on 2026-11-26: build with BUILD_THREADS=2 (alone on the machine), then the rest on one
# thread each.
TB=tb7 BUILD_FLAGS="--n-facts 500 --general-paragraphs 370 --ladder 0,4,16,64 --lr 1.5e-4 --save-steps 30" \
  exec bash "$(dirname "$0")/../../../testbed_steps.sh"
