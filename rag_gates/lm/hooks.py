"""Forward hooks and small tensor helpers on a transformers model, used by
:class:`~rag_gates.lm.hf.HFWhiteBoxLM` and its lockstep streams
(:class:`~rag_gates.lm.streams.StreamGroup`).

Every hook is installed for one call under the model holder's lock (:func:`locked`): the
hooks fire on every forward pass of the shared model, so another thread's pass in between
would run this call's hooks. Needs ``rag-gates[hf]`` (torch).
"""

from __future__ import annotations

import inspect
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

from rag_gates._optional import require

require("torch", "hf")
import torch  # noqa: E402

__all__ = ["AttentionInputs", "CallHooks", "EarlyExit", "HiddenStates", "ModelHolder",
           "cache_keyword", "locked", "output_cache", "rotate_half", "weight_major",
           "weight_major_head"]


class ModelHolder(Protocol):
    """What the hooks need of a model's holder (an ``HFWhiteBoxLM``): the transformers model
    and the re-entrant lock its forward passes take."""

    @property
    def model(self) -> Any: ...

    @property
    def _lock(self) -> AbstractContextManager[Any]: ...


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """The rotary embedding's half rotation, as transformers' Llama applies it to queries."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def weight_major(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight.T`` for a few rows ``x [..., d]`` of a large ``weight [out, d]``, as
    ``(weight @ x.T).T``: on CPU, F.linear reads the weight about once per row when there
    are a few rows (SmolLM2's 49k x 576 head: 34.6 ms for 2 rows vs 16.0 ms for 1), this
    product reads it once. Same values up to float rounding."""
    flat = x.reshape(-1, x.shape[-1])
    return torch.mm(weight, flat.t()).t().reshape(*x.shape[:-1], weight.shape[0])


@contextmanager
def weight_major_head(model: Any) -> Iterator[None]:
    """During a pass over several rows, the LM head (a bias-free ``nn.Linear`` only) runs
    as :func:`weight_major`; what the model does with the logits afterwards is untouched."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if type(head) is not torch.nn.Linear or head.bias is not None:
        yield
        return
    head.forward = lambda x: weight_major(x, head.weight)  # instance attribute, removed below
    try:
        yield
    finally:
        del head.forward


def cache_keyword(model: Any) -> str:
    """The forward keyword for the KV cache: transformers 5.x renamed ``past_key_values`` to
    ``cache`` (the old name warns on every call), and releases before the rename would drop an
    unknown ``cache`` keyword silently, so ask the model's signature."""
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # a wrapped forward without a signature: the old name
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def output_cache(out: Any) -> Any:
    """The KV cache a forward pass returned, under either name (see :func:`cache_keyword`)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


@contextmanager
def locked(lm: ModelHolder) -> Iterator[None]:
    """Hold ``lm``'s lock from before per-call state is registered on its shared model (a
    capture hook) until it is removed: the hooks fire on every forward pass of the model, so
    another thread's pass in between would run this call's hooks and its own would miss
    theirs (a ``KeyError`` for a layer, or another call's hidden state). The lock is
    re-entrant: the forward pass inside takes it again."""
    with lm._lock:
        yield


class CallHooks(ABC):
    """Hooks registered on a shared model for one call and removed after it."""

    @contextmanager
    def installed(self, lm: ModelHolder) -> Iterator[None]:
        """These hooks on ``lm``'s model for one call, under its lock (:func:`locked`)."""
        with locked(lm), self._hooks(lm.model):
            yield

    @abstractmethod
    def _hooks(self, model: Any) -> AbstractContextManager[None]:
        """Register the hooks on ``model`` for the duration of the context."""


class AttentionInputs(CallHooks):
    """Forward pre-hooks that keep what one attention layer was fed: its normalised hidden
    states and rotary (cos, sin). With the cached keys, that is enough to recompute the
    attention row of a query position without eager attention. ``last_only`` keeps the last
    fed position (a copy, so a long prefill's full-length tensors are not held); otherwise
    every fed position, by reference."""

    def __init__(self, layers: Sequence[int], *, last_only: bool = True) -> None:
        self.layers = tuple(layers)
        self.last_only = last_only
        self.inputs: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    @contextmanager
    def _hooks(self, model: Any) -> Iterator[None]:
        handles = []
        decoder_layers = model.model.layers
        for layer in self.layers:

            def hook(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *,
                     _layer: int = layer) -> None:
                hidden: Any = kwargs.get("hidden_states", args[0] if args else None)
                cos, sin = kwargs["position_embeddings"]
                if self.last_only:
                    hidden, cos, sin = (t[:, -1:].clone() for t in (hidden, cos, sin))
                self.inputs[_layer] = (hidden, cos, sin)

            handles.append(
                decoder_layers[layer].self_attn.register_forward_pre_hook(hook, with_kwargs=True)
            )
        try:
            yield
        finally:
            for h in handles:
                h.remove()


class HiddenStates(CallHooks):
    """Forward hooks that keep chosen hidden states of one pass, in ``output_hidden_states``
    indexing (0 = what the first decoder layer reads, ``l`` = decoder layer ``l - 1``'s
    output). ``last_only`` keeps the last position as a float32 copy, so a long prefill's
    full-length states are freed as the pass goes; ``stop_after_deepest`` ends the pass once
    the deepest layer asked for has run (raises :class:`EarlyExit`).

    The final hidden state (index ``num_layers``, after the model's last norm) is not hooked:
    :meth:`hookable` says whether a pass can use this instead of ``output_hidden_states``.
    """

    def __init__(self, layers: Sequence[int], *, last_only: bool,
                 stop_after_deepest: bool = False) -> None:
        self.layers = tuple(layers)
        self.last_only = last_only
        self.stop_after_deepest = stop_after_deepest
        self.states: dict[int, torch.Tensor] = {}

    @staticmethod
    def hookable(model: Any, layers: Sequence[int]) -> bool:
        decoder = getattr(getattr(model, "model", None), "layers", None)
        return decoder is not None and all(0 <= layer < len(decoder) for layer in layers)

    def _keep(self, layer: int, value: torch.Tensor) -> None:
        self.states[layer] = value[:, -1].to(torch.float32, copy=True) if self.last_only \
            else value
        if self.stop_after_deepest and layer == max(self.layers):
            raise EarlyExit

    @contextmanager
    def _hooks(self, model: Any) -> Iterator[None]:
        decoder = model.model.layers
        handles = []
        for layer in self.layers:
            if layer == 0:  # the first layer's input: the (possibly scaled) embeddings

                def before(_module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
                    hidden: Any = kwargs.get("hidden_states", args[0] if args else None)
                    self._keep(0, hidden)

                handles.append(decoder[0].register_forward_pre_hook(before, with_kwargs=True))
            else:

                def after(_module: Any, _args: Any, output: Any, *, _layer: int = layer
                          ) -> None:
                    self._keep(_layer, output[0] if isinstance(output, tuple) else output)

                handles.append(decoder[layer - 1].register_forward_hook(after))
        try:
            yield
        finally:
            for handle in handles:
                handle.remove()


class EarlyExit(Exception):
    """Raised by a forward hook to stop a pass once the deepest needed layer has run."""
