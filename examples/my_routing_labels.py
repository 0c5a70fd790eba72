"""Labelled questions standing in for your own SR-RAG labels (``rag-gates srrag label``), the
toy kNN policy the SR-RAG examples build from them, and how they print a routing decision.
Shared by ``llama_index_srrag.py`` and ``langchain_srrag.py``, as ``my_documents.py`` stands in
for your documents."""

from __future__ import annotations

from typing import Any

from rag_gates.srrag import DEFAULT_TAU, HiddenStateKeys, PolicyEntry, SourcePolicy

QUESTIONS = [
    "Were Scott Derrickson and Ed Wood of the same nationality?",  # in the documents
    "What is the capital of France?",  # a textbook fact
    "Who wrote Hamlet?",  # a textbook fact; 1 retrieval vote of 3 is enough at tau 0.1
]
# Hand labels standing in for `rag-gates srrag label` (see the docstring): long-tail entities
# need retrieval; textbook facts the model may know.
LABELLED = {
    "retrieval": [
        "What is Henry Feilden's occupation?",
        "What is Kathy Saltzman's occupation?",
        "Are Local H and For Against both from the United States?",
        "Which writer was from England, Henry Roth or Robert Erskine Childers?",
        "Are the Laleli Mosque and Esma Sultan Mansion located in the same neighborhood?",
        "Who was born earlier, Emma Bull or Virginia Woolf?",
    ],
    "parametric": [
        "What is the capital of Japan?",
        "What is the capital of Germany?",
        "Who wrote Romeo and Juliet?",
        "What is the largest planet in the Solar System?",
        "What language is spoken in Brazil?",
        "Who painted the Mona Lisa?",
    ],
}
K = 3  # neighbours that vote; small because the toy datastore is small (the paper: 30)
TAU = DEFAULT_TAU  # 0.1, the paper's value


def toy_policy(lm: Any) -> SourcePolicy:
    """The kNN datastore of the hand-labelled questions, in an in-memory Qdrant."""
    policy = SourcePolicy.open(HiddenStateKeys(lm), path=":memory:", k=K)
    policy.add_questions([PolicyEntry(id=f"{source}-{i}", dataset="toy", question=q,
                                      source=source)
                          for source, questions in LABELLED.items()
                          for i, q in enumerate(questions)])
    return policy


def show_route(decision: dict[str, Any]) -> None:
    """The routing decision as the retriever annotated it on every node it returned."""
    evidence = decision["evidence"]
    route = "retrieve" if decision["retrieve"] else "verbalize (the model's own knowledge)"
    p_d = evidence.get("p_datastore")
    print(f"  route: {route}  p_M={evidence['p_model']:.3f}  "
          f"p_D={'n/a' if p_d is None else f'{p_d:.3f}'}  "
          f"score={decision['score']:.3f}  tau={decision['threshold']}")
    print(f"  reason: {decision['reason']}")
    for n in evidence.get("neighbours", []):
        print(f"    neighbour {n['similarity']:.3f} {n['source']:<10} {n['question']}")
