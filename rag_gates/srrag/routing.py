"""What the router reads from the model: the routing distribution ``p_M`` and the kNN key.

The routing prompt asks the untuned model to choose a source; ``p_M(retrieve)`` is the
probability of the retrieval word's first token against the parametric word's, at the first
token of the reply (a white-box next-token distribution). The kNN key of the policy datastore
is the hidden state of the **last question token** at a middle layer. The prompt ends its user
message with the question, so that token sits inside the prompt, a fixed number of template
tokens before the end: :func:`route_features` runs the prompt **once** and reads both the key
(a forward hook on that layer) and the next-token distribution (the end of the same pass).
:func:`question_keys` computes the same keys in batches, without the distribution, for
building the datastore; the two agree.

Example:
    >>> prompt = RoutingPrompt()
    >>> f = route_features(lm, "Who wrote Hamlet?", prompt, layer=15)      # doctest: +SKIP
    >>> f.p_model, f.key.shape, f.one_pass                                 # doctest: +SKIP
    (0.31, torch.Size([576]), True)
"""

from __future__ import annotations

import contextlib
import hashlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rag_gates._optional import require
from rag_gates._text import check_text
from rag_gates.lm.base import require_white_box

__all__ = ["ROUTING_PROMPT", "RouteFeatures", "RoutingPrompt", "check_layer", "default_layer",
           "question_keys", "route_features"]

#: The routing instruction; the question ends the message (the key is its last token).
ROUTING_PROMPT = (
    "Decide where the knowledge to answer this question should come from. Reply Search if "
    "the answer has to be looked up in Wikipedia, or Memory if you know it well enough to "
    "answer from memory. Reply with one word.\nQuestion: {question}"
)


class RoutingPrompt(BaseModel):
    """The routing instruction and the two reply words whose first tokens give ``p_M``."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    template: str = Field(ROUTING_PROMPT, description=(
        "Instruction ending with '{question}' (nothing after it, so the question's last "
        "token is the end of the user message)."))
    retrieve_words: tuple[str, ...] = Field(("Search",), min_length=1, description=(
        "Replies that choose retrieval (with and without a leading space, any case)."))
    parametric_words: tuple[str, ...] = Field(("Memory",), min_length=1, description=(
        "Replies that choose the model's own knowledge."))

    @field_validator("template")
    @classmethod
    def _ends_with_question(cls, value: str) -> str:
        if value.count("{question}") != 1 or not value.endswith("{question}"):
            raise ValueError("the routing template must end with its one '{question}' field")
        return value

    def text(self, question: str) -> str:
        return self.template.replace("{question}", check_text(question, "question").strip())

    @property
    def sha(self) -> str:
        """A short digest of the prompt (part of a datastore's identity)."""
        return hashlib.sha256(self.model_dump_json().encode()).hexdigest()[:12]


@dataclass(frozen=True)
class RouteFeatures:
    """What one routing pass read."""

    key: Any  # torch.Tensor [d], float32
    p_model: float  # p_M(retrieve), the retrieval words' share of the two options
    option_mass: float  # how much probability the model put on either option at all
    one_pass: bool  # key and distribution from one forward pass
    key_position: int  # index of the last question token in the prompt's tokens


def default_layer(lm: Any) -> int:
    """The middle of the stack (hidden-state index, 0 = embeddings): layer 15 of SmolLM2."""
    return max(1, int(lm.num_layers) // 2)


def check_layer(lm: Any, layer: int) -> int:
    n = int(lm.num_layers)
    if isinstance(layer, bool) or not isinstance(layer, int) or not 1 <= layer <= n:
        raise ValueError(f"key layer {layer!r} out of range: this model has hidden states "
                         f"1..{n} after its decoder layers (0, the embeddings, is not a "
                         "question representation)")
    return layer


def _first_tokens(lm: Any, words: Sequence[str]) -> set[int]:
    ids: set[int] = set()
    for word in words:
        for variant in (word, f" {word}", word.lower(), f" {word.lower()}"):
            tokens = lm.token_ids(variant)
            if tokens:
                ids.add(int(tokens[0]))
    return ids


def _option_ids(lm: Any, prompt: RoutingPrompt) -> tuple[list[int], list[int]]:
    retrieve = _first_tokens(lm, prompt.retrieve_words)
    parametric = _first_tokens(lm, prompt.parametric_words)
    # A token both replies can start with (a bare space in some tokenizers) says nothing.
    shared = retrieve & parametric
    retrieve, parametric = retrieve - shared, parametric - shared
    if not retrieve or not parametric:
        raise ValueError(
            f"the routing words {prompt.retrieve_words} and {prompt.parametric_words} start "
            f"with the same token(s) {sorted(shared)} in this tokenizer, so their first-token "
            "probabilities cannot tell them apart: choose words that start differently")
    return sorted(retrieve), sorted(parametric)


def _locate(lm: Any, prompt: RoutingPrompt, question: str) -> tuple[str, list[int], int]:
    """The prompt text, its token ids, and the index of the question's last token."""
    text = prompt.text(question)
    ids = lm.encode(text)
    content = lm.token_ids(text)
    # The message content is tokenised on its own inside the template (or is the whole
    # plain prompt), so its ids appear in the prompt's ids; find the last occurrence.
    for start in range(len(ids) - len(content), -1, -1):
        if ids[start: start + len(content)] == content:
            return text, ids, start + len(content) - 1
    raise ValueError(
        f"could not find the question's tokens in the rendered routing prompt of "
        f"{lm.model_id} (was it truncated?); shorten the question")


def _logsumexp(logprobs: Any, ids: list[int]) -> float:
    return float(logprobs[ids].logsumexp(dim=0))


@contextlib.contextmanager
def _captured(lm: Any, layer: int, store: dict[str, Any]) -> Iterator[bool]:
    """Capture the output of decoder layer ``layer - 1`` (hidden state ``layer``) while the
    block runs; yields False when the model has no such layer list to hook."""
    decoder = getattr(getattr(getattr(lm, "model", None), "model", None), "layers", None)
    if decoder is None or not 1 <= layer <= len(decoder):
        yield False
        return

    def hook(_module: Any, _args: Any, output: Any) -> None:
        store["hidden"] = output[0] if isinstance(output, tuple) else output

    handle = decoder[layer - 1].register_forward_hook(hook)
    try:
        yield True
    finally:
        handle.remove()


def route_features(lm: Any, question: str, prompt: RoutingPrompt, layer: int
                   ) -> RouteFeatures:
    """``p_M(retrieve)`` and the kNN key for ``question``, from one forward pass where the
    model allows it (a Llama-style decoder stack to hook), else from two calls."""
    lm = require_white_box(lm, "SR-RAG routing")
    check_layer(lm, layer)
    retrieve_ids, parametric_ids = _option_ids(lm, prompt)
    text, ids, position = _locate(lm, prompt, question)
    store: dict[str, Any] = {}
    # The model's own lock (re-entrant) keeps another thread's pass out of the hook.
    with getattr(lm, "_lock", contextlib.nullcontext()), _captured(lm, layer, store) as hooked:
        logprobs = lm.next_token_logprobs(text)
    hidden = store.get("hidden")
    one_pass = bool(hooked) and hidden is not None and hidden.shape[1] == len(ids)
    if hidden is not None and one_pass:
        key = hidden[0, position].float().clone()
    else:
        key = lm.hidden_states([text], [layer], position=position)[0, 0]
    log_r = _logsumexp(logprobs, retrieve_ids)
    log_p = _logsumexp(logprobs, parametric_ids)
    mass = math.exp(log_r) + math.exp(log_p)
    p_model = 1.0 / (1.0 + math.exp(log_p - log_r)) if math.isfinite(log_r - log_p) \
        else float("nan")
    return RouteFeatures(key=key, p_model=p_model, option_mass=mass, one_pass=one_pass,
                         key_position=position)


def question_keys(lm: Any, questions: Sequence[str], prompt: RoutingPrompt, layer: int, *,
                  batch_size: int = 16) -> Any:
    """The kNN keys of many questions, ``[n, hidden_size]`` float32 (the same vectors
    :func:`route_features` reads), in batches of prompts that share the key's offset from
    the end."""
    torch = require("torch", "hf")
    lm = require_white_box(lm, "SR-RAG policy keys")
    check_layer(lm, layer)
    groups: dict[int, list[tuple[int, str]]] = {}
    for i, q in enumerate(questions):
        text, ids, position = _locate(lm, prompt, q)
        groups.setdefault(position - len(ids), []).append((i, text))
    out = torch.empty(len(questions), int(lm.hidden_size))
    for offset, items in groups.items():
        states = lm.hidden_states([t for _, t in items], [layer], position=offset,
                                  batch_size=batch_size)
        for row, (i, _) in enumerate(items):
            out[i] = states[row, 0]
    return out
