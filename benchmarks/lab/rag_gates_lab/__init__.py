"""The rag-gates lab: the benchmark harness (``bench``, ``eval-gate``, ``report``), the
dataset loaders, the benchmark plugins of the five methods, the testbed, and the research
commands (training probes, rerankers, policies and DeepRAG models).

A distribution of its own (``rag-gates-lab``, in ``benchmarks/lab``), installed beside the
library by ``make install-dev``; it depends on ``rag-gates`` and the library never imports it
(``tests/unit/test_layering.py``). Its methods, gates and commands reach the library through
entry points: ``rag_gates.methods``, ``rag_gates.gates`` and ``rag_gates.cli``.
"""
