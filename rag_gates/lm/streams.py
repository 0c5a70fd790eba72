"""Lockstep decoding: several prompts decoded over one shared generated suffix
(:class:`StreamGroup`, opened by :meth:`HFWhiteBoxLM.open_streams
<rag_gates.lm.hf.HFWhiteBoxLM.open_streams>`).

Its own module so that the model protocols (:mod:`rag_gates.lm.base`) can name the group's
type without importing the model class; the group reaches its model only through
:class:`LockstepModel`. Needs ``rag-gates[hf]`` (torch).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Protocol

from rag_gates._optional import require
from rag_gates.lm.hooks import (
    AttentionInputs,
    HiddenStates,
    ModelHolder,
    output_cache,
    rotate_half,
    weight_major_head,
)
from rag_gates.lm.prefix_cache import PrefixCache

require("torch", "hf")
import torch  # noqa: E402

__all__ = ["LockstepModel", "StreamGroup"]


class LockstepModel(ModelHolder, Protocol):
    """What a :class:`StreamGroup` needs of its model (an ``HFWhiteBoxLM``): the model, its
    tokenizer and text config, its prompt-prefix cache, and its forward pass and cache
    constructor (which take the model's lock)."""

    @property
    def tokenizer(self) -> Any: ...

    @property
    def config(self) -> Any: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def prefix_cache(self) -> PrefixCache | None: ...

    def _forward(self, input_ids: torch.Tensor, *, cache: Any,
                 attention_mask: torch.Tensor | None, position_ids: torch.Tensor,
                 logits_to_keep: int = 1, output_hidden_states: bool = False) -> Any: ...

    def _new_cache(self, layers: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None
                   ) -> Any: ...


@dataclass
class _Pass:
    """What one :class:`StreamGroup` forward pass leaves: last-position logits ``[b, vocab]``,
    hidden states ``{layer: [b, d]}``, attention inputs per layer, and the cache."""

    logits: torch.Tensor
    hidden: dict[int, torch.Tensor]
    attention: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
    cache: Any


class StreamGroup:
    """Several prompts decoded in lockstep over one shared generated suffix.

    Create with :meth:`HFWhiteBoxLM.open_streams`. After creation and after each
    :meth:`advance`, ``logits``/``logprobs`` hold every stream's next-token distribution,
    :meth:`hidden` the chosen hidden states of the newest token, and :meth:`attention` that
    token's attention row over a stream's own tokens.

    Each prompt is prefilled alone in its own cache (a short prompt costs its own tokens,
    not the longest prompt's); the caches are then joined, left-padded, into one batch so
    that every :meth:`advance` is one batched forward pass. Only the newest position's
    hidden states and attention inputs are kept.

    Example (Tok-RAG's two streams):
        >>> g = lm.open_streams([with_passages, without_passages], attention_layers=[15])
        >>> t_rag, t_llm = g.greedy_tokens()
        >>> g.advance(t_rag if t_rag == t_llm else pick(g))
        >>> g.text
    """

    def __init__(
        self,
        lm: LockstepModel,
        prompt_ids: Sequence[Sequence[int]],
        *,
        hidden_layers: tuple[int, ...],
        attention_layers: tuple[int, ...],
        keep_prompt_attention: bool = False,
    ) -> None:
        self._lm = lm
        self.prompt_lengths = [len(p) for p in prompt_ids]
        self.hidden_layers = hidden_layers
        self.attention_layers = attention_layers
        self.generated_ids: list[int] = []
        if keep_prompt_attention and len(prompt_ids) != 1:
            raise ValueError("keep_prompt_attention needs a single-stream group")
        # Every prompt position's attention inputs only where asked (attention_row).
        self._capture = AttentionInputs(attention_layers, last_only=not keep_prompt_attention)
        self._pending: int | None = None
        # Prefix reuse for a plain single prompt; attention capture reads every prompt
        # position's inputs, which a reused prefix would not have run.
        reuse = lm.prefix_cache if len(prompt_ids) == 1 and not attention_layers else None
        prefills = []
        for ids in prompt_ids:
            self._capture.inputs = {}
            found = reuse.lookup(ids) if reuse is not None else None
            start, cache = (found[0], lm._new_cache(found[1])) if found else (0, lm._new_cache())
            tokens = torch.tensor([list(ids[start:])], dtype=torch.long)
            prefills.append(self._pass(tokens, torch.arange(start, len(ids))[None], cache,
                                       None))
            layers = prefills[-1].cache.layers
            # Only a cache holding every position can be cut to a prefix: a sliding-window
            # layer keeps just the last window of keys.
            if reuse is not None and all(layer.keys.shape[-2] == len(ids) for layer in layers):
                reuse.store(ids, [(layer.keys, layer.values) for layer in layers])
        self._logits: torch.Tensor = torch.cat([p.logits for p in prefills])
        self._logprobs: torch.Tensor | None = None
        self._hidden = {layer: torch.cat([p.hidden[layer] for p in prefills])
                        for layer in prefills[0].hidden}
        self._capture.inputs = {
            layer: tuple(torch.cat(parts) for parts in zip(
                *(p.attention[layer] for p in prefills), strict=True))  # type: ignore[misc]
            for layer in prefills[0].attention
        }
        width = max(self.prompt_lengths)
        self._padded = any(n != width for n in self.prompt_lengths)
        self._mask = torch.zeros((self.n_streams, width), dtype=torch.long)
        for row, n in enumerate(self.prompt_lengths):
            self._mask[row, width - n:] = 1
        self._cache = self._join(prefills, width)
        self._next_positions = torch.tensor(self.prompt_lengths, dtype=torch.long)
        self._vocab = int(self._logits.shape[-1])

    @property
    def n_streams(self) -> int:
        return len(self.prompt_lengths)

    def _join(self, prefills: list[_Pass], width: int) -> Any:
        """One left-padded batch cache from the streams' own caches (zero keys and values
        at the padding, which the mask hides). Each stream's layer is released once copied, so
        the streams' caches and the joined one are never all held in full at once."""
        if len(prefills) == 1:
            return prefills[0].cache
        parts = [[(layer.keys, layer.values) for layer in p.cache.layers] for p in prefills]
        for p in prefills:
            p.cache = None
        layers = []
        while parts[0]:
            pairs = [stream.pop(0) for stream in parts]  # the stream's reference goes
            joined = []
            for kind in (0, 1):  # keys, values
                first = pairs[0][kind]
                out = first.new_zeros((len(pairs), first.shape[1], width, first.shape[3]))
                for row, pair in enumerate(pairs):
                    out[row, :, width - pair[kind].shape[2]:] = pair[kind][0]
                joined.append(out)
            layers.append((joined[0], joined[1]))
        return self._lm._new_cache(layers)

    def _pass(self, ids: torch.Tensor, positions: torch.Tensor, cache: Any,
              mask: torch.Tensor | None) -> _Pass:
        """One forward pass: the last position's logits, hidden states and attention inputs
        (the captured layers only), and the grown cache."""
        lm = self._lm
        hooks = HiddenStates.hookable(lm.model, self.hidden_layers)
        hidden = HiddenStates(self.hidden_layers, last_only=True)
        with ExitStack() as stack:
            if ids.shape[0] > 1:  # a lockstep step: the head once for all streams
                stack.enter_context(lm._lock)
                stack.enter_context(weight_major_head(lm.model))
            if self.attention_layers:
                stack.enter_context(self._capture.installed(lm))
            if self.hidden_layers and hooks:
                stack.enter_context(hidden.installed(lm))
            out = lm._forward(ids, cache=cache, attention_mask=mask, position_ids=positions,
                              output_hidden_states=bool(self.hidden_layers) and not hooks)
        if self.hidden_layers and not hooks:
            hidden.states = {layer: out.hidden_states[layer][:, -1].to(torch.float32,
                                                                        copy=True)
                             for layer in self.hidden_layers}
        return _Pass(out.logits[:, -1].float(), hidden.states, dict(self._capture.inputs),
                     output_cache(out))

    def _flush(self) -> None:
        """Run the forward pass for a token appended by :meth:`advance`, if not yet run."""
        if self._pending is None:
            return
        token, self._pending = self._pending, None
        b = self.n_streams
        if self._padded:
            self._mask = torch.cat([self._mask, torch.ones((b, 1), dtype=torch.long)], dim=1)
        positions = self._next_positions[:, None].clone()
        self._next_positions += 1
        step = self._pass(torch.full((b, 1), token, dtype=torch.long), positions, self._cache,
                          # Without padding, no mask lets SDPA take its plain causal path.
                          self._mask if self._padded else None)
        self._logits, self._logprobs = step.logits, None
        self._hidden, self._cache = step.hidden, step.cache

    @property
    def logits(self) -> torch.Tensor:
        """Next-token logits, ``[n_streams, vocab]`` float32."""
        self._flush()
        return self._logits

    @property
    def logprobs(self) -> torch.Tensor:
        """Next-token log-probabilities, ``[n_streams, vocab]`` float32."""
        self._flush()
        if self._logprobs is None:
            self._logprobs = torch.log_softmax(self._logits, dim=-1)
        return self._logprobs

    def greedy_tokens(self) -> list[int]:
        """Each stream's most likely next token."""
        return [int(t) for t in self.logits.argmax(dim=-1)]

    def hidden(self, layer: int) -> torch.Tensor:
        """Hidden state ``[n_streams, d]`` of the newest token at a captured layer."""
        self._flush()
        index = layer % (self._lm.num_layers + 1)
        if index not in self._hidden:
            raise KeyError(f"layer {layer} was not captured; open_streams(hidden_layers=[...])")
        return self._hidden[index]

    def advance(self, token_id: int) -> None:
        """Append one token to every stream.

        The batched forward pass runs when the next distribution, hidden state or attention
        row is first read, so a final token that nobody inspects costs nothing.
        """
        if isinstance(token_id, bool) or not isinstance(token_id, int):
            raise TypeError(f"token_id must be an int, got {type(token_id).__name__}")
        if not 0 <= token_id < self._vocab:
            raise ValueError(
                f"token_id {token_id} outside the vocabulary (0..{self._vocab - 1})"
            )
        self._flush()
        self._pending = token_id
        self.generated_ids.append(token_id)

    @property
    def text(self) -> str:
        """The shared generated suffix, decoded."""
        return str(self._lm.tokenizer.decode(self.generated_ids, skip_special_tokens=True))

    def stream_length(self, stream: int) -> int:
        """Real tokens (prompt + generated) in one stream."""
        return self.prompt_lengths[stream] + len(self.generated_ids)

    def attention(self, stream: int, layer: int, *, position: int | None = None) -> torch.Tensor:
        """Attention probabilities ``[heads, position+1]`` of a query over a stream's tokens.

        ``position`` indexes the stream's own tokens (prompt then generated); default: the
        newest token, the only one a group opened by :meth:`HFWhiteBoxLM.open_streams` keeps
        (:meth:`HFWhiteBoxLM.attention_row` reads any prompt position). Columns follow the
        same indexing (column ``j`` = the stream's token ``j``).
        """
        self._flush()
        index = layer % self._lm.num_layers
        if index not in self._capture.inputs:
            raise KeyError(
                f"attention layer {layer} was not captured; open_streams(attention_layers=[...])"
            )
        length = self.stream_length(stream)
        newest = length - 1
        position = newest if position is None else position
        if position < 0:
            raise IndexError(f"position must be >= 0 (stream positions), got {position}")
        hidden, cos, sin = self._capture.inputs[index]
        steps = hidden.shape[1]  # tokens fed in the last forward pass
        first_fed = newest - steps + 1
        if not first_fed <= position <= newest:
            raise IndexError(
                f"position {position} is not available: the last pass fed stream positions "
                f"{first_fed}..{newest}"
            )
        pad = self._cache.layers[index].keys.shape[2] - length  # left padding of this stream
        col = pad + position  # column in the padded layout
        fed_col = steps - 1 - (newest - position)
        attn = self._lm.model.model.layers[index].self_attn
        config = self._lm.config
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        with torch.inference_mode():
            h = hidden[stream, fed_col]
            q = attn.q_proj(h).view(heads, attn.head_dim)
            if hasattr(attn, "q_norm"):
                q = attn.q_norm(q)
            q = q * cos[stream, fed_col] + rotate_half(q) * sin[stream, fed_col]
            keys = self._cache.layers[index].keys[stream, :, pad: col + 1]  # [kv, T, hd]
            # Query heads grouped by the key head they share (no copy of the keys).
            scores = torch.einsum("kgd,ktd->kgt", q.view(kv_heads, heads // kv_heads, -1),
                                  keys).reshape(heads, -1).float() * attn.scaling
            return torch.softmax(scores, dim=-1)
