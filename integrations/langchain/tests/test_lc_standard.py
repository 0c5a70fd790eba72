"""LangChain's standard unit tests for ChatRagGates."""

from __future__ import annotations

import functools
from typing import Any

from langchain_tests.unit_tests import ChatModelUnitTests

from langchain_rag_gates import ChatRagGates


@functools.cache
def _tiny() -> Any:
    # Built once for the module: the suite constructs many models from these params.
    from rag_gates.testing import tiny_lm

    return tiny_lm(seed=0)


class TestChatRagGatesStandard(ChatModelUnitTests):
    @property
    def chat_model_class(self) -> type[ChatRagGates]:
        return ChatRagGates

    @property
    def chat_model_params(self) -> dict[str, Any]:
        return {"lm": _tiny()}

    @property
    def has_tool_calling(self) -> bool:
        return False

    @property
    def has_structured_output(self) -> bool:
        return False

    @property
    def supports_model_override(self) -> bool:
        return False  # one ChatRagGates holds one loaded model
