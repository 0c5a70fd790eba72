"""The markers of DeepRAG's trajectory format (the paper's appendix A.1 and the authors'
code): what a model writes to ask a subquery, retrieve, read, answer one and end. A module of
their own so that both the trajectory reader and the gates that read a marker use them
without importing each other."""

from __future__ import annotations

__all__ = ["CONTEXT", "FINAL", "FOLLOW_UP", "INTERMEDIATE", "NOTHING_FOUND", "QUESTION",
           "RETRIEVE"]

QUESTION = "Question:"
FOLLOW_UP = "Follow up:"
RETRIEVE = "Let's search the question in Wikipedia."
CONTEXT = "Context:"
INTERMEDIATE = "Intermediate answer:"
FINAL = "So the final answer is:"
NOTHING_FOUND = "(nothing found)"
