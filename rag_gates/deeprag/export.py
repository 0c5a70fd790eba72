"""Synthesized trajectories as training records for TRL's ``SFTTrainer`` and ``DPOTrainer``.

**SFT** (imitation, stage I): the prompt is the one the agent loop starts from (the
instruction and question: a user turn, or plain text), the completion is the trajectory's
steps and final answer. The retrieved passages are inserted by the loop, not written by the
model, so they are left out of the loss: :func:`sft_example` gives the text with the
passages' character spans, :func:`tokenize_sft` the pre-tokenized record TRL uses as is --
``{"input_ids": [...], "labels": [...]}`` with ``-100`` on the prompt and the passages (the
``Context:`` marker itself is trained: the model learns to write it, and the loop stops
there). The completion ends with the tokenizer's end-of-sequence token.

**DPO** (chain of calibration, stage II): one pair per step of the trajectory, all with the
same prefix -- the prompt plus the steps before it and ``Follow up: <subquery>`` -- the
trajectory's decision marker preferred over the other (``Let's search the question in
Wikipedia.`` vs ``Intermediate answer:``), in TRL's standard format ``{"prompt", "chosen",
"rejected"}`` with the prompt rendered as the model sees it (chat template and assistant
prefill), so the shared history, passages included, is prompt and only the decision tokens
are compared. TRL appends the end-of-sequence token to both sides of a standard-format pair;
it is the same token after either marker. Raise ``DPOConfig.max_length`` above the longest
prompt: its default ``keep_start`` truncation would cut the decision tokens at the end.

Example:
    >>> rows = read_rows("deeprag-rows.jsonl")                      # doctest: +SKIP
    >>> export_sft(rows, "sft.jsonl", lm)                           # doctest: +SKIP
    >>> export_dpo(rows, "dpo.jsonl", lm)                           # doctest: +SKIP
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rag_gates._trl import IGNORE, DPOPair, eos_token_id, write_jsonl
from rag_gates.deeprag.engine import subquery_line
from rag_gates.deeprag.trajectory import (
    CONTEXT,
    FINAL,
    INTERMEDIATE,
    RETRIEVE,
    DeepRAGPrompt,
    Trajectory,
    one_line,
    render_steps,
)
from rag_gates.lm.base import Prompt

__all__ = ["DPOPair", "ExportStats", "SFTExample", "dpo_pairs", "export_dpo", "export_sft",
           "sft_example", "tokenize_sft"]


class SFTExample(BaseModel):
    """One trajectory as a prompt and completion, with the passages' spans to mask."""

    model_config = ConfigDict(frozen=True)

    prompt: Prompt
    completion: str
    masked: list[tuple[int, int]] = Field(
        default_factory=list, description="[start, end) character spans of the completion "
                                          "left out of the loss (the retrieved passages).")


class ExportStats(BaseModel):
    """What an export wrote."""

    model_config = ConfigDict(frozen=True)

    rows: int = Field(..., ge=0, description="Rows read.")
    trajectories: int = Field(..., ge=0, description="Rows with a trajectory (exported).")
    records: int = Field(..., ge=0, description="Records written.")
    out: str = ""


def _completion(trajectory: Trajectory) -> str:
    return render_steps(trajectory.steps) + f"{FINAL} {one_line(trajectory.final_answer)}"


def sft_example(trajectory: Trajectory, prompt: DeepRAGPrompt | None = None) -> SFTExample:
    """The trajectory as a prompt, a completion and the passages' spans in it."""
    fmt = prompt or DeepRAGPrompt()
    start = fmt.build(trajectory.question, "")
    completion = _completion(trajectory)
    masked: list[tuple[int, int]] = []
    offset = 0
    for step in trajectory.steps:
        text = step.render()
        if step.retrieved:
            # From just after "Context:" (second line) up to the last line, the answer's.
            begin = text.index("\n", text.index("\n") + 1) + 1 + len(CONTEXT)
            end = text.rindex("\n", 0, len(text) - 1) + 1
            masked.append((offset + begin, offset + end))
        offset += len(text)
    return SFTExample(prompt=start, completion=completion, masked=masked)


def tokenize_sft(example: SFTExample, lm: Any) -> dict[str, list[int]]:
    """``{"input_ids", "labels"}`` for TRL's ``SFTTrainer`` (``-100`` on the prompt and the
    masked spans), tokenised as ``lm`` (an :class:`~rag_gates.lm.hf.HFWhiteBoxLM`) tokenises
    the loop's prompts: the prompt through its chat template when it is messages, the
    completion as literal text, then the end-of-sequence token."""
    tokenizer = lm.tokenizer
    chat = not isinstance(example.prompt, str)
    prompt_ids: list[int] = lm.encode(example.prompt, chat_template=chat)
    encoded = tokenizer(example.completion, add_special_tokens=False,
                        split_special_tokens=True, return_offsets_mapping=True)
    ids: list[int] = list(encoded["input_ids"])
    labels = [IGNORE if any(s < end and begin < e for begin, end in example.masked) else t
              for t, (s, e) in zip(ids, encoded["offset_mapping"], strict=True)]
    eos = eos_token_id(tokenizer)
    return {"input_ids": [*prompt_ids, *ids, eos],
            "labels": [IGNORE] * len(prompt_ids) + labels + [eos]}


def dpo_pairs(trajectory: Trajectory, lm: Any, prompt: DeepRAGPrompt | None = None
              ) -> list[DPOPair]:
    """One pair per step: the trajectory's decision marker preferred over the other, after
    the same history, rendered by ``lm.render`` (chat template and prefill)."""
    fmt = prompt or DeepRAGPrompt()
    pairs = []
    for i, step in enumerate(trajectory.steps):
        history = render_steps(trajectory.steps[:i]) + subquery_line(step.subquery)
        text = lm.render(fmt.build(trajectory.question, history),
                         chat_template=fmt.style == "chat")
        chosen, rejected = (RETRIEVE, INTERMEDIATE) if step.retrieved \
            else (INTERMEDIATE, RETRIEVE)
        pairs.append(DPOPair(prompt=str(text), chosen=chosen, rejected=rejected))
    return pairs


def _trajectories(rows: Iterable[Any]) -> tuple[int, list[Trajectory]]:
    rows = list(rows)
    return len(rows), [r.trajectory for r in rows if r.trajectory is not None]


def _write(out: str | Path, records: list[dict[str, Any]], n_rows: int, n_found: int
           ) -> ExportStats:
    path = write_jsonl(out, records)
    return ExportStats(rows=n_rows, trajectories=n_found, records=len(records), out=str(path))


def export_sft(rows: Iterable[Any], out: str | Path, lm: Any,
               prompt: DeepRAGPrompt | None = None) -> ExportStats:
    """Write one pre-tokenised SFT record per row with a trajectory (rows without one are
    counted, not written)."""
    n, found = _trajectories(rows)
    records = [tokenize_sft(sft_example(t, prompt), lm) for t in found]
    return _write(out, list(records), n, len(found))


def export_dpo(rows: Iterable[Any], out: str | Path, lm: Any,
               prompt: DeepRAGPrompt | None = None) -> ExportStats:
    """Write the step-wise preference pairs of every row with a trajectory."""
    n, found = _trajectories(rows)
    records = [p.model_dump() for t in found for p in dpo_pairs(t, lm, prompt)]
    return _write(out, records, n, len(found))
