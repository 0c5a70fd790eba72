"""A knowledge-controlled testbed: the embedded model taught a known set of PopQA facts at
controlled repetition counts, with its exact training corpus, so every gate can be judged
against what the model saw (``rag-gates testbed build``; docs/testbed.md).

Example:
    >>> from rag_gates_lab.testbed import TestbedConfig, build_testbed
    >>> build_testbed(TestbedConfig(n_facts=40), "testbeds/small")     # doctest: +SKIP
    >>> from rag_gates.lm import load_lm
    >>> lm = load_lm("testbeds/small/model")                            # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

__all__ = ["TestbedConfig", "build_testbed", "read_manifest"]


def __getattr__(name: str) -> Any:
    # Lazy: the builder imports torch only when a build runs.
    if name in __all__:
        from rag_gates_lab.testbed import build

        return getattr(build, name)
    raise AttributeError(name)
