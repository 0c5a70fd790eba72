#!/bin/bash
# tb12: tb11 (recall practice on 600 facts outside the manifest, top rung 64; closed book
# 18.7 / 20.0 / 38.7 / 65.3% at r = 0 / 2 / 8 / 64) plus practice of the skills the five
# methods assume, all on PopQA facts outside the manifest (issue 35, "What to build" 1):
# - --skill-reading 80: 80 questions in each of DeepRAG's trajectory with its Context: block
#   (tb11 answered from it for 6 of 141 facts), Tok-RAG's "[Reference]: " passages, SR-RAG's
#   answer after a verbalization and CBDR's paper prompt, each rendered by the method's own
#   code (the benchmark's prompt, shared by Tok-RAG's default, QuCo and CBDR's rag-gates
#   style, keeps tb11's 120 reading examples);
# - --skill-decomposition 160: two-hop DeepRAG trajectories (a fact naming a person, then a
#   purpose-written birthplace), half from memory (each hop stated 8 times), half
#   retrieving one or both hops from a Context: block (such a hop is stated nowhere else);
# - --skill-verbalization 250: SR-RAG's GenRead prompt for recall facts, answered with two of
#   the statements the corpus teaches (tb10: genread 45.3% against closed book 58.7%).
# --block-size 512 --batch-size 1 (tb11: 256 x 2): a DeepRAG trajectory with its prompt and
# Context: blocks is 290-590 tokens, so at 256 every DeepRAG reading example and half the
# trajectories would be cut mid-trajectory by pack_blocks; 512 x 1 keeps tb11's tokens per
# optimizer step, and 4 of 25,668 documents exceed a block.
# The N's keep the build near the ~650,000 tokens/epoch budget (tb11: 468,095):
# `rag-gates testbed build --plan-only` with these flags prints 25,668 documents,
# 648,011 tokens/epoch, 2,738 steps: 1.30 M training tokens, about 4.5 h at ~80 tokens/s on
# one thread (tb11 ran at 144 tokens/s on two: 2.5 h).
# The steps are benchmarks/testbed_steps.sh's; STEPS picks some, each resumes if interrupted.
# The rungs are tb11's, not tb5's, so the validate step runs the base model on these facts.
TB=tb12 \
  BUILD_FLAGS="--n-facts 500 --general-paragraphs 370 --ladder 0,2,8,64 --lr 1.5e-4 --save-steps 30 --recall-examples 600 --recall-repetitions 16 --skill-reading 80 --skill-decomposition 160 --skill-verbalization 250 --block-size 512 --batch-size 1" \
  exec bash "$(dirname "$0")/../../../testbed_steps.sh"
