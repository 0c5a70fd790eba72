"""What HFWhiteBoxLM exposes, on the embedded SmolLM2 (offline, CPU).

    .venv/bin/python examples/white_box_basics.py

For your own model, replace ``load_default_lm()`` by ``load_lm("PATH_OR_HUB_ID")`` (any local
transformers checkpoint or a Hugging Face hub id).
"""

from __future__ import annotations

import math

from rag_gates.lm import load_default_lm
from rag_gates.prompts import qa_prompt
from rag_gates.types import Passage

lm = load_default_lm()
question = "Which city is the capital of France?"

# 1. Generation with per-token log-probabilities (OpenAI shape).
g = lm.generate(question, max_new_tokens=24, logprobs=2)
print("answer:", g.text)
for item in g.logprobs or []:
    alternatives = ", ".join(f"{a.token!r} {math.exp(a.logprob):.2f}" for a in item.top_logprobs)
    print(f"  {item.token!r:>12} p={math.exp(item.logprob):.2f}  top: {alternatives}")

# 2. Teacher-forced scoring of candidate answers (the prompt's KV cache is shared).
for s in lm.score("Question: Which city is the capital of France?\nAnswer:",
                  [" Paris", " Lyon", " London"], chat_template=False):
    print(f"log p({s.text!r}) = {s.total:.2f}")

# 3. Hidden states of a batch at the last prompt token (what a confidence probe reads).
h = lm.hidden_states([question, "Who wrote Hamlet?"], layers=[lm.num_layers // 2])
print("hidden states:", tuple(h.shape))

# 4. Two streams in lockstep: with and without a passage, one shared answer.
passage = Passage(title="Paris", text="Paris is the capital and largest city of France.")
group = lm.open_streams([qa_prompt(question, [passage]), qa_prompt(question)])
disagreements = 0
for _ in range(16):
    with_passage, without = group.greedy_tokens()
    disagreements += with_passage != without
    if with_passage in lm.eos_token_ids:
        break
    group.advance(with_passage)
print(f"with the passage: {group.text!r} ({disagreements} steps where the streams disagreed)")
