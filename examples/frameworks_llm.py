"""The embedded model as a LlamaIndex LLM and a LangChain chat model, with logprobs.

    .venv/bin/python examples/frameworks_llm.py

For your own model, replace ``load_default_lm()`` by ``load_lm("PATH_OR_HUB_ID")`` (any local
transformers checkpoint or a Hugging Face hub id).
"""

from __future__ import annotations

from llama_index.llms.rag_gates import RagGatesLLM

from langchain_rag_gates import ChatRagGates
from rag_gates.lm import load_default_lm

lm = load_default_lm()  # one model shared by both frameworks

llm = RagGatesLLM(lm=lm, max_new_tokens=24)
response = llm.complete("Who wrote Hamlet?", top_logprobs=2)
print("LlamaIndex:", response.text)
print("  first token and alternatives:", [(p.token, round(p.logprob, 2))
                                          for p in (response.logprobs or [[]])[0]])

chat = ChatRagGates(lm=lm, max_tokens=24, logprobs=True, top_logprobs=2)
message = chat.invoke("Who wrote Hamlet?")
print("LangChain:", message.content)
print("  first token:", message.response_metadata["logprobs"]["content"][0]["token"])
