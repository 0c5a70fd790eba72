"""The methods' entries in ``rag-gates bench`` and ``rag-gates eval-gate``.

The method packages (``rag_gates.quco``, ``rag_gates.cbdr``, ...) know nothing of the
benchmark; each module here adapts one of them: factories ``(MethodContext) -> Method`` and
``(MethodContext, threshold) -> Gate`` registered under the ``rag_gates.methods`` and
``rag_gates.gates`` entry points (pyproject.toml), plus the thresholds calibrated for the
benchmark's corpus. A new method adds a module here and its entry points.
"""
