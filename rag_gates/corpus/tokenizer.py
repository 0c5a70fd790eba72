"""The tokenizer an index is built and queried with: a fast (Rust) ``tokenizers.Tokenizer``.

An index stores its tokenizer (``tokenizer.json``) so that queries always use the tokenizer
the corpus was encoded with. ``CorpusTokenizer.resolve`` accepts:

* ``None`` or ``"default"``: the embedded model's tokenizer (SmolLM2, through
  :func:`rag_gates.lm.defaults.load_default_tokenizer`, which needs the ``hf`` extra);
* a path to a ``tokenizer.json`` file, or to a directory holding one (any local HF model or
  tokenizer folder);
* a ``tokenizers.Tokenizer``, or a transformers *fast* tokenizer object.

Nothing is fetched from a hub.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag_gates._optional import require

if TYPE_CHECKING:  # pragma: no cover
    from tokenizers import Tokenizer

__all__ = ["CorpusTokenizer"]

_EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|im_end|>", "<eos>", "<|end_of_text|>")


class CorpusTokenizer:
    """Text to token ids without special tokens, truncation or padding."""

    def __init__(self, tokenizer: Tokenizer, name: str) -> None:
        tokenizer.no_truncation()
        tokenizer.no_padding()
        self._tk = tokenizer
        self.name = name
        self.vocab_size = int(tokenizer.get_vocab_size(with_added_tokens=True))
        self.eos_token_id = next(
            (i for i in (tokenizer.token_to_id(t) for t in _EOS_CANDIDATES) if i is not None), 0
        )

    @property
    def backend(self) -> Tokenizer:
        return self._tk

    def encode(self, text: str) -> list[int]:
        return list(self._tk.encode(text, add_special_tokens=False).ids)

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [list(e.ids) for e in self._tk.encode_batch(texts, add_special_tokens=False)]

    def decode(self, ids: list[int]) -> str:
        return str(self._tk.decode(ids, skip_special_tokens=False))

    def to_json(self) -> str:
        return str(self._tk.to_str())

    def sha256(self) -> str:
        return hashlib.sha256(self.to_json().encode("utf-8")).hexdigest()

    def save(self, path: Path) -> None:
        path.write_text(self.to_json(), encoding="utf-8")

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], name: str | None = None) -> CorpusTokenizer:
        tokenizers = require("tokenizers", "corpus")
        p = Path(path)
        try:
            tk = tokenizers.Tokenizer.from_file(str(p))
        except Exception as exc:  # the Rust side raises a plain Exception on bad JSON
            raise ValueError(f"{p} is not a valid tokenizer.json ({exc})") from exc
        return cls(tk, name or str(p))

    @staticmethod
    def converts_model(spec: Any = None) -> bool:
        """Whether resolving ``spec`` converts the embedded model first (the default tokenizer
        before the model's first use on this machine: tens of seconds, once)."""
        if not (spec is None or (isinstance(spec, str) and spec == "default")):
            return False
        from rag_gates.lm import defaults

        return not (defaults._is_complete(defaults.default_lm_dir())
                    and (defaults.default_lm_dir() / "tokenizer.json").is_file())

    @classmethod
    def resolve(cls, spec: Any = None) -> CorpusTokenizer:
        """Turn any accepted tokenizer spec (see the module docstring) into a CorpusTokenizer."""
        if isinstance(spec, CorpusTokenizer):
            return spec
        if spec is None or (isinstance(spec, str) and spec == "default"):
            from rag_gates.lm import defaults

            converted = defaults.default_lm_dir() / "tokenizer.json"
            if defaults._is_complete(defaults.default_lm_dir()) and converted.is_file():
                # The converted copy's tokenizer.json: no transformers (or torch) import.
                return cls.from_file(converted, name=defaults.DEFAULT_LM_ID)
            return cls._from_transformers(defaults.load_default_tokenizer(),
                                          defaults.DEFAULT_LM_ID)
        if isinstance(spec, str | os.PathLike):
            p = Path(spec).expanduser()
            if p.is_dir():
                candidate = p / "tokenizer.json"
                if candidate.is_file():
                    return cls.from_file(candidate, name=str(p))
                raise FileNotFoundError(
                    f"{p} has no tokenizer.json; pass a folder with a fast tokenizer "
                    "(tokenizer.json) or the file itself")
            if p.is_file():
                return cls.from_file(p)
            raise FileNotFoundError(
                f"tokenizer {spec!r} not found: pass 'default', a tokenizer.json file or a local "
                "folder holding one (hub names are not fetched)")
        tokenizers = require("tokenizers", "corpus")
        if isinstance(spec, tokenizers.Tokenizer):
            return cls(spec, "tokenizers.Tokenizer")
        return cls._from_transformers(spec, str(getattr(spec, "name_or_path", type(spec).__name__)))

    @classmethod
    def _from_transformers(cls, tok: Any, name: str) -> CorpusTokenizer:
        backend = getattr(tok, "backend_tokenizer", None)
        if backend is None:
            raise TypeError(
                f"{type(tok).__name__} is not a fast tokenizer; corpus indexes need a "
                "tokenizers-backed (fast) tokenizer with a tokenizer.json")
        # Work on a copy: no_truncation()/no_padding() must not change the caller's tokenizer.
        tokenizers = require("tokenizers", "corpus")
        return cls(tokenizers.Tokenizer.from_str(backend.to_str()), name)
