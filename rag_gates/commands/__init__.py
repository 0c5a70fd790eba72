"""Command-line apps that join a method to the benchmark's data (``rag-gates cbdr ...``).

They live outside the method packages because they load datasets (``rag_gates.eval``),
and the method packages never import the evaluation package.
"""
