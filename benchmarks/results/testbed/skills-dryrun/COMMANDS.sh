#!/bin/bash
# A dry run of the skills step's script (issue 35's validation shape) with the BASE model
# (the embedded SmolLM2-135M, not a testbed model) on the first 10 evaluation facts and 5
# two-hop questions of tb12's plan (manifest and passages only, no training): it shows the
# measurement runs end to end and what each answer costs on one thread. Its accuracies are a
# plumbing check on 10 facts, not a validation of anything.
set -ex
cd "$(dirname "$0")/../../../.."
export OMP_NUM_THREADS=1
.venv/bin/rag-gates testbed build --plan-only --out /tmp/skills-dry-tb12plan --n-facts 500 \
    --general-paragraphs 370 --ladder 0,2,8,64 --lr 1.5e-4 --save-steps 30 --recall-examples 600 \
    --recall-repetitions 16 --skill-reading 80 --skill-decomposition 160 \
    --skill-verbalization 250 --block-size 512 --batch-size 1
.venv/bin/python benchmarks/testbed_skills.py --testbed /tmp/skills-dry-tb12plan --model default \
    --n 10 --twohop-n 5 --rows benchmarks/results/testbed/skills-dryrun/base-model-tb12plan-rows.jsonl \
    --out benchmarks/results/testbed/skills-dryrun/base-model-tb12plan.json
