#!/bin/bash
# tb6: tb5's 500 facts (the same 300 evaluation facts) with the purpose-written bridges (second
# hops for DeepRAG's two-hop questions) and lr 3e-4 (tb5: 1.5e-4), built, validated, its gates
# measured, then the methods end to end. The steps are benchmarks/testbed_steps.sh's; STEPS
# picks some (build, validate, gates, e2e, tokrag, deeprag), each resumes if interrupted;
# TWOHOP_N caps the two-hop questions DeepRAG answers (all 142 by default).
# Run on 2026-11-25: build (resumed once from checkpoint-300), validate, and deeprag with
# TWOHOP_N=60. The gates, e2e and tokrag steps were not run on tb6 (its ladder is tb5's:
# docs/testbed.md). The base model's run on these same 300 questions is tb5's.
TB=tb6 BASE_FACTS=tb5-base-model-facts \
  BUILD_FLAGS="--n-facts 500 --general-paragraphs 370 --lr 3e-4 --save-steps 30" \
  exec bash "$(dirname "$0")/../../../testbed_steps.sh"
