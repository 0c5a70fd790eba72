"""Training data for the CBDR probe: one hidden state and one label per question.

Each question runs once through the probe's QA prompt: the prefill gives the hidden state,
and the greedy answer continues from the same KV cache (the gate's skip path), so a label
costs one generation and no second prefill. The label is the benchmark's accuracy rule (a
normalised gold answer occurs in the normalised answer). Examples are appended to a JSONL
cache as they finish, so an interrupted collection resumes where it stopped.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from rag_gates._files import parse_json, read_text
from rag_gates._io import append_locked, drop_torn_tail, parse_lines_but_a_torn_tail
from rag_gates._optional import require
from rag_gates.answers import score_answer
from rag_gates.cbdr.prompts import ProbePrompts
from rag_gates.errors import ArtifactFileError
from rag_gates.lm.base import require_white_box
from rag_gates.lm.defaults import rag_gates_home
from rag_gates.types import QAExample

require("torch", "hf")
import torch  # noqa: E402

__all__ = ["ProbeExample", "as_tensors", "collect_probe_data", "default_cache_path"]

logger = logging.getLogger(__name__)


class ProbeExample(BaseModel):
    """One labelled question: the model's greedy answer and whether it was right."""

    model_config = ConfigDict(frozen=True)

    id: str
    dataset: str
    question: str
    answer: str
    correct: bool
    hidden: list[float]


def _identity(lm: Any, prompts: ProbePrompts, layer: int, position: int,
              max_new_tokens: int) -> dict[str, Any]:
    return {"model_id": lm.model_id, "layer": layer, "position": position,
            "prompts": prompts.model_dump(), "max_new_tokens": max_new_tokens}


def default_cache_path(lm: Any, prompts: ProbePrompts, layer: int, *, position: int = -1,
                       max_new_tokens: int = 64) -> Path:
    """One cache file per model and settings (questions of any dataset, keyed by id), under
    ``RAG_GATES_HOME/cbdr-cache``."""
    identity = _identity(lm, prompts, layer, position, max_new_tokens)
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:12]
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", str(lm.model_id)).strip("_")[-60:]
    return rag_gates_home() / "cbdr-cache" / slug / f"probe-data-{digest}.jsonl"


def _read_cache(path: Path, identity: dict[str, Any]) -> dict[tuple[str, str], ProbeExample]:
    if not path.is_file():
        return {}
    header, *lines = read_text(path, fix="delete the file (it is collected again)",
                               error=ArtifactFileError).splitlines() or [""]
    if parse_json(header, path, line=1, fix="a bad header line; delete the file",
                  error=ArtifactFileError) != {"identity": identity}:
        raise ArtifactFileError(
            f"{path} holds probe data collected with other settings; delete it or use "
            "another cache path", path=path, line=1)
    examples = parse_lines_but_a_torn_tail(lines, ProbeExample.model_validate_json, file=path,
                                           first_line=2, what="a probe example",
                                           fix="delete that line (it is collected again)")
    return {(ex.dataset, ex.id): ex for ex in examples}


def collect_probe_data(
    lm: Any,
    examples: Sequence[QAExample],
    prompts: ProbePrompts,
    layer: int,
    *,
    position: int = -1,
    max_new_tokens: int = 64,
    cache: str | Path | None = None,
    progress: Callable[[int, int, int], None] | None = None,
) -> list[ProbeExample]:
    """Hidden state and correctness label of every question, in the order given.

    ``progress(done, total, correct_so_far)`` is called after each question.
    """
    lm = require_white_box(lm, "CBDR probe training")
    identity = _identity(lm, prompts, layer, position, max_new_tokens)
    path = Path(cache) if cache is not None else None
    done: dict[tuple[str, str], ProbeExample] = {}
    handle = None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        # Locked before anything is read or cut: a second run collecting the same data (the
        # cache is shared by model and settings) waits, then reads what the first collected.
        handle = append_locked(path, wait_s=math.inf, on_wait=lambda: logger.warning(
            "another process is collecting the same CBDR probe data into %s; waiting for "
            "it to finish, then reusing its examples", path))
        try:
            drop_torn_tail(path)
            if path.stat().st_size == 0:  # new (append_locked created it)
                handle.write(json.dumps({"identity": identity}) + "\n")
                handle.flush()
            else:
                done = _read_cache(path, identity)
        except BaseException:
            handle.close()
            raise
    out: list[ProbeExample] = []
    correct = 0
    try:
        for i, example in enumerate(examples, start=1):
            key = (example.dataset, example.id)
            if key not in done:
                prompt = prompts.qa(example.question)
                group = lm.open_streams([prompt], hidden_layers=[layer], reserve=max_new_tokens,
                                        truncation="left")
                if position == -1:
                    hidden = group.hidden(layer)[0]
                else:
                    hidden = lm.hidden_states([prompt], [layer], position=position,
                                              truncation="left")[0, 0]
                g = lm.generate_from(group, max_new_tokens=max_new_tokens)
                right = score_answer(g.text, example.answers, example.dataset)["accuracy"] > 0
                done[key] = ProbeExample(id=example.id, dataset=example.dataset,
                                         question=example.question, answer=g.text,
                                         correct=right, hidden=hidden.float().tolist())
                if handle is not None:
                    handle.write(done[key].model_dump_json() + "\n")
                    handle.flush()
            out.append(done[key])
            correct += int(done[key].correct)
            if progress is not None:
                progress(i, len(examples), correct)
    finally:
        if handle is not None:
            handle.close()
    return out


def as_tensors(examples: Sequence[ProbeExample]) -> tuple[torch.Tensor, list[int]]:
    """Features ``[n, d]`` and labels (1 = right) of collected examples."""
    if not examples:
        raise ValueError("no examples")
    return (torch.tensor([e.hidden for e in examples], dtype=torch.float32),
            [int(e.correct) for e in examples])
