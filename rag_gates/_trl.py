"""What the TRL training-data exports share (DeepRAG's, SR-RAG's): the preference-pair record,
the ignored label, the end-of-sequence check and the JSONL writer.

The records are what TRL reads as they are: a pre-tokenised SFT record is
``{"input_ids": [...], "labels": [...]}`` with :data:`IGNORE` on the tokens left out of the
loss; a DPO record is TRL's standard preference format ``{"prompt", "chosen", "rejected"}``.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any, Final

from pydantic import BaseModel, ConfigDict

from rag_gates._io import write_text_atomic

__all__ = ["IGNORE", "DPOPair", "eos_token_id", "write_jsonl"]

#: The label of a token left out of the loss (PyTorch's cross-entropy ``ignore_index``).
IGNORE: Final = -100


class DPOPair(BaseModel):
    """One preference pair (TRL standard format): the prompt as the model sees it, the
    preferred continuation and the other."""

    model_config = ConfigDict(frozen=True)

    prompt: str
    chosen: str
    rejected: str


def eos_token_id(tokenizer: Any) -> int:
    """The end-of-sequence id a pre-tokenised completion ends with."""
    eos = tokenizer.eos_token_id
    if not isinstance(eos, int):
        raise ValueError("the tokenizer has no end-of-sequence token; set tokenizer.eos_token")
    return eos


def write_jsonl(out: str | Path, records: Iterable[dict[str, Any]]) -> Path:
    """Write one JSON record per line, atomically (parent directories are created)."""
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
    return path
