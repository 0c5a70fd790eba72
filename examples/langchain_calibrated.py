"""A certified gate in a LangChain application, offline on the embedded SmolLM2.

``rag-gates calibrate`` answered the shipped PopQA sample questions closed book and with BM25
retrieval, scored every gate that applies to the model and certified a threshold: with
probability at least 0.9, skipping retrieval below it costs at most 5 points of accuracy
against always retrieving, on questions like these (same model, same corpus). Its spec is
committed beside the sample; recalibrate (about an hour on two CPU cores) with

    rag-gates calibrate --data examples/data/calibration_questions.jsonl \\
        --corpus examples/data/calibration_corpus.jsonl --limit 200 \\
        --out examples/data/calibration_gate.json

Here the spec is loaded with ``load_gate`` and serves inside ``route_by_gate``: the
questions are sample rows the calibration did not use. The direct branch is
``closed_book_prompt() | llm``, the prompt the gate generated its answer with, so a skip
replies with the gate's own answer (one generation).

    .venv/bin/python examples/langchain_calibrated.py
    .venv/bin/python examples/langchain_calibrated.py --spec gate.json   # a spec you calibrated
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from langchain_core.messages import HumanMessage
from langchain_core.runnables import RunnableLambda

from langchain_rag_gates import ChatRagGates, closed_book_prompt, route_by_gate
from rag_gates.calibration import load_gate
from rag_gates.commands.calibrate import read_corpus, read_questions
from rag_gates.lm import load_default_lm
from rag_gates.prompts import qa_prompt
from rag_gates.retrieval.bm25 import BM25Retriever

DATA = Path(__file__).resolve().parent / "data"
SPEC = DATA / "calibration_gate.json"


def main() -> None:
    parser = argparse.ArgumentParser(description="Serve sample questions with a gate spec.")
    parser.add_argument("--spec", type=Path, default=SPEC,
                        help="a spec `rag-gates calibrate` wrote (default: the committed one)")
    path = parser.parse_args().spec
    lm = load_default_lm()
    gate = load_gate(path, lm=lm)  # refused if the spec was calibrated for another model
    spec = gate.spec
    print(f"{path.name}: {spec.gate} at threshold {spec.threshold}, epsilon {spec.epsilon}, "
          f"delta {spec.delta} ({spec.bound}, n={spec.n})")
    bm25 = BM25Retriever.from_passages(read_corpus(DATA / "calibration_corpus.jsonl"))
    # The answer budget the spec was calibrated with, so a skip can reuse the gate's answer.
    llm = ChatRagGates(lm=lm, max_tokens=int(spec.options.get("max_new_tokens", 32)))

    def with_passages(inputs: dict[str, Any]) -> list[HumanMessage]:
        question = inputs["question"]
        return [HumanMessage(qa_prompt(question, bm25.retrieve(question, 3)))]

    router = route_by_gate(gate, retrieve=RunnableLambda(with_passages) | llm,
                           direct=closed_book_prompt() | llm)
    for q in read_questions(DATA / "calibration_questions.jsonl")[200:205]:
        msg = router.invoke({"question": q.question})
        decision = msg.response_metadata["rag_gates"]
        once = decision.get("answer_once", {})
        print(json.dumps({"question": q.question, "retrieve": decision["retrieve"],
                          "reason": decision["reason"],
                          "answer_reused": once.get("answer_reused", False),
                          "answer": msg.content.strip(), "gold": q.answers[:3]}, indent=1))


if __name__ == "__main__":
    main()
