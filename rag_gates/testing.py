"""Tiny random-weight models for plumbing tests (sub-second, offline, deterministic).

Not for quality claims: the weights are random. Use the embedded SmolLM2 for those.

Example:
    >>> from rag_gates.testing import tiny_lm
    >>> lm = tiny_lm()
    >>> lm.generate("hello", max_new_tokens=4).completion_tokens
    4
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rag_gates._optional import require

__all__ = ["TINY_CHAT_TEMPLATE", "save_tiny_lm", "tiny_lm", "tiny_model_and_tokenizer"]

TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_TRAINING_TEXT = [
    "What is the capital of France? The capital of France is Paris.",
    "Who wrote Hamlet? William Shakespeare wrote Hamlet in London.",
    "Retrieval augmented generation reads passages before it answers a question.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Scientists measure accuracy, recall and precision on real data sets.",
    "Numbers like 1, 2, 3, 10, 42 and 1999 appear in many documents.",
]


def _tokenizer() -> Any:
    tokenizers = require("tokenizers", "hf")
    transformers = require("transformers", "hf")
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_TRAINING_TEXT, trainer=trainer)
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token="<|im_start|>",
    )
    tok.chat_template = TINY_CHAT_TEMPLATE
    return tok


def tiny_model_and_tokenizer(
    seed: int = 0, *, num_layers: int = 4, hidden_size: int = 64, max_context: int = 256
) -> tuple[Any, Any]:
    """A random-weight Llama (grouped-query attention, rotary) and a tiny byte-level BPE."""
    torch = require("torch", "hf")
    transformers = require("transformers", "hf")
    tok = _tokenizer()
    config = transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_context,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        tie_word_embeddings=True,
        # A wide init keeps random logits well separated, so greedy paths vary by prompt.
        initializer_range=0.3,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    model.config._name_or_path = f"tiny-llama-seed{seed}"
    return model, tok


def tiny_lm(seed: int = 0, **kwargs: Any) -> Any:
    """An :class:`~rag_gates.lm.hf.HFWhiteBoxLM` over :func:`tiny_model_and_tokenizer`."""
    from rag_gates.lm.hf import HFWhiteBoxLM

    model, tok = tiny_model_and_tokenizer(seed, **kwargs)
    return HFWhiteBoxLM(model, tok, model_id=f"tiny-llama-seed{seed}")


def save_tiny_lm(directory: str | Path, seed: int = 0) -> Path:
    """Write a tiny model + tokenizer to ``directory`` (for tests that load from a path)."""
    model, tok = tiny_model_and_tokenizer(seed)
    path = Path(directory)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
