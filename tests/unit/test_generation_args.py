"""``GenerationArgs.checked``: the one check of a call's generation keywords that the models
carry inside (HFWhiteBoxLM, OpenAICompatibleLM, the framework adapters)."""

from __future__ import annotations

from typing import Any

import pydantic
import pytest

from rag_gates.lm.base import GenerationArgs, validate_generation_args


def test_checked_holds_what_the_keywords_said_with_stop_as_a_tuple() -> None:
    args = GenerationArgs.checked(16, "\n", 0.7, 3, seed=11)
    assert (args.max_new_tokens, args.stop, args.temperature, args.logprobs, args.seed) == \
        (16, ("\n",), 0.7, 3, 11)
    assert GenerationArgs.checked(8, None, 0, None).stop == ()
    with pytest.raises(pydantic.ValidationError):
        args.seed = 12  # type: ignore[misc]  # frozen: one call's arguments do not change


@pytest.mark.parametrize(("keywords", "error"), [
    ({"max_new_tokens": 0}, ValueError), ({"max_new_tokens": True}, TypeError),
    ({"stop": [""]}, ValueError), ({"temperature": -1.0}, ValueError),
    ({"logprobs": 21}, ValueError),
])
def test_checked_refuses_what_validate_generation_args_refuses(
        keywords: dict[str, Any], error: type[Exception]) -> None:
    call: dict[str, Any] = {"max_new_tokens": 8, "stop": None, "temperature": 0.0,
                            "logprobs": None, **keywords}
    with pytest.raises(error) as direct:
        validate_generation_args(**call)
    with pytest.raises(error) as built:
        GenerationArgs.checked(**call)
    assert str(built.value) == str(direct.value)


@pytest.mark.parametrize("seed", [True, "3", 1.5])
def test_a_seed_that_is_no_integer_is_refused_not_coerced(seed: Any) -> None:
    with pytest.raises(TypeError, match="seed must be an int"):
        GenerationArgs.checked(8, None, 1.0, None, seed)


def test_a_numpy_integer_seed_is_an_int() -> None:
    np = pytest.importorskip("numpy")
    seed = GenerationArgs.checked(8, None, 1.0, None, np.int64(5)).seed
    assert seed == 5 and type(seed) is int
