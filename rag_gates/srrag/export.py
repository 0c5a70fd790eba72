"""SR-RAG's two-stage alignment data (paper §3.3) from source labels, as TRL records.

The labels (:mod:`rag_gates.srrag.labels`, ``rag-gates srrag label``) hold, per training
question, the gold answers, every retrieved and verbalized context with the length-normalised
likelihood it gives the gold answer, and the preferred source ``s``. From them:

**Stage 1** (behaviour cloning, :func:`export_stage1`): one pre-tokenised SFT record per
label, ``{"input_ids", "labels"}`` for TRL's ``SFTTrainer``, the paper's single left-to-right
sequence::

    <routing prompt with the question> | Search | \\n- <c_e+>  \\nAnswer: | <answer> <eos>
    <routing prompt with the question> | Memory | \\n- <c_i+>  \\nAnswer: | <answer> <eos>

- the **prompt** is :class:`~rag_gates.srrag.routing.RoutingPrompt`'s text, tokenised as the
  routing pass tokenises it (``lm.encode``: the chat template when the model has one). So the
  kNN key (the question's last token) and ``p_M`` (the next token) are read from the very
  positions the records train, and no ``<EOQ>`` token is needed. The default instruction
  asks for one word; the records go on with the knowledge and the answer (the paper's single
  pass). Another instruction is a field (:class:`ExportFormat`); run the gate with the same;
- the **source marker** (``L_src``, always trained) is the routing prompt's first reply word
  of the preferred source, ``Search`` or ``Memory`` by default, then a newline;
- the **knowledge** is the best context of that source by likelihood (``c_e+`` or ``c_i+``),
  written as the QA prompt lists a context (``- Title: text``), followed by the
  **end-of-knowledge marker** (default ``"\\nAnswer:"``). When the source is parametric the
  model writes both (``L_verb`` on ``c_i+`` and on the marker, which ends its verbalization);
  when it is retrieval the loop inserts both, so they are context: labels ``-100``;
- the **answer** (``L_ans``, always trained, conditioned on ``c_i+`` or ``c_e+``) is the
  label's **first gold answer**, the dataset's canonical one (PopQA's object label), then the
  end-of-sequence token. The first, not the alias that scored best under each context: one
  target per question, the same whichever source wins.

Every part is tokenised on its own and the ids concatenated (the prompt's through
``lm.encode``, the rest literally, as ``score()`` tokenised the gold answer when labelling),
so a boundary between trained and masked text is always a token boundary: the masked
positions decode to exactly the prompt and context text.

**Stage 2** (DPO on verbalizations, :func:`export_stage2_dpo`): for each label whose
preferred source is parametric and whose verbalizations differ in likelihood, TRL's standard
preference record ``{"prompt", "chosen", "rejected"}``: the prompt is the rendered routing
prompt plus the parametric marker line, ``chosen`` the best verbalization ``c_i+`` and
``rejected`` the worst ``c_i-``, each as a knowledge block ending with the end-of-knowledge
marker (TRL appends the end-of-sequence token to both). Retrieval-preferred labels have no
``L_verb`` (the paper's eq. 6), and a label with one verbalization, or verbalizations of
equal likelihood, has no pair: they are skipped and counted. The paper's stage 2 keeps
``L_src`` and ``L_ans``; TRL's ``DPOTrainer`` trains the pairs alone, so mix stage-1 records
in (or use ``rpo_alpha``) to keep them.

**Plain marker strings, not special tokens.** The paper adds ``<EOQ>``, ``<Wiki>``,
``<Self>`` and ``<EOK>`` to the vocabulary. Here the markers are ordinary text (configurable:
:class:`ExportFormat`), because (1) they work with any tokenizer and need no embedding
resize, whose fresh random rows a small model would have to learn from a few hundred
labels; (2) the trained model stays a normal checkpoint every loader and server here reads
(GGUF, llama.cpp, OpenAI-compatible servers) with its own tokenizer; (3) the untuned router
already reads ``p_M`` from the routing words' first tokens after the same prompt, so the same
:class:`~rag_gates.srrag.gate.SelfRoutingGate` routes a trained model unchanged (routing
only: :class:`~rag_gates.srrag.pipeline.SRRAGPipeline` still verbalizes with the GenRead
prompt and answers with the QA prompt, not the trained single sequence). The one
constraint, checked at export: the two source words must start with different tokens.

Records longer than the model's context are skipped and counted. Writing a trainer is out of
scope: the files feed TRL's ``SFTTrainer`` and ``DPOTrainer`` the way ``rag-gates deeprag
train`` feeds its records (pre-tokenised ``input_ids`` / ``labels``; ``prompt`` /
``chosen`` / ``rejected``), with the tokenizer of the model that wrote the labels.

Example:
    >>> header, labels = read_labels("labels.jsonl")                    # doctest: +SKIP
    >>> export_stage1(labels, lm, "stage1.jsonl").records               # doctest: +SKIP
    >>> export_stage2_dpo(labels, lm, "dpo.jsonl").skipped              # doctest: +SKIP
    {'retrieval_preferred': 210, 'tied_verbalizations': 3}
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rag_gates._trl import IGNORE, DPOPair, eos_token_id, write_jsonl
from rag_gates.prompts import format_passages
from rag_gates.srrag.labels import (
    RETRIEVAL,
    ContextScore,
    Source,
    SourceLabel,
    answer_continuation,
)
from rag_gates.srrag.routing import RoutingPrompt, _option_ids
from rag_gates.srrag.verbalizer import PARAMETRIC
from rag_gates.types import Passage

__all__ = ["DPOPair", "ExportCounts", "ExportFormat", "SkipReason", "Stage1Example", "best_context",
           "export_stage1", "export_stage2_dpo", "gold_answer", "stage1_example",
           "stage2_pair", "tokenize_stage1"]

#: Why a label gave no record.
SkipReason = Literal["no_gold_answer", "no_context", "too_long", "retrieval_preferred",
                     "one_verbalization", "tied_verbalizations"]


class ExportFormat(BaseModel):
    """How a label becomes text: the question prompt and the marker strings."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    routing: RoutingPrompt = Field(default_factory=RoutingPrompt, description=(
        "The question prompt (the routing pass's); its first retrieval and parametric reply "
        "words are the source markers."))
    end_of_knowledge: str = Field("\nAnswer:", description=(
        "Written after the knowledge; the answer follows it (the paper's <EOK>)."))

    @field_validator("end_of_knowledge")
    @classmethod
    def _visible(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the end-of-knowledge marker must have visible text, such as "
                             "'\\nAnswer:'")
        return value

    def marker(self, source: Source) -> str:
        """The source word of ``source``."""
        words = self.routing.retrieve_words if source == RETRIEVAL \
            else self.routing.parametric_words
        return words[0].strip()


class Stage1Example(BaseModel):
    """One label as the routing prompt and the text after it, part by part."""

    model_config = ConfigDict(frozen=True)

    id: str
    source: Source
    prompt: str = Field(..., description="The routing prompt's message (the lm renders it).")
    parts: list[tuple[str, bool]] = Field(..., description=(
        "(text, trained) in order after the prompt: the source line, the knowledge, the "
        "end-of-knowledge marker, the answer."))


class ExportCounts(BaseModel):
    """What an export wrote and what it skipped, by reason."""

    model_config = ConfigDict(frozen=True)

    labels: int = Field(..., ge=0, description="Labels read.")
    records: int = Field(..., ge=0, description="Records written.")
    skipped: dict[str, int] = Field(default_factory=dict, description="Reason -> labels.")
    out: str = ""


def gold_answer(label: SourceLabel) -> str | None:
    """The answer the records train: the label's first non-empty gold answer."""
    return next((a.strip() for a in label.answers if a.strip()), None)


def best_context(label: SourceLabel, source: Source, *, worst: bool = False
                 ) -> ContextScore | None:
    """The context of ``source`` with the highest likelihood (``c_e+`` / ``c_i+``), or the
    lowest with ``worst`` (``c_i-``); the first one on ties; None without one."""
    contexts = [c for c in label.contexts if c.source == source]
    if not contexts:
        return None
    pick = min if worst else max
    return pick(contexts, key=lambda c: c.mean_logprob)


def _knowledge(context: ContextScore) -> str:
    return format_passages([Passage(text=context.text, title=context.title)])


def _source_line(lm: Any, fmt: ExportFormat, question: str, source: Source) -> str:
    return answer_continuation(lm, fmt.routing.text(question), fmt.marker(source)) + "\n"


def stage1_example(label: SourceLabel, lm: Any, fmt: ExportFormat | None = None
                   ) -> Stage1Example:
    """The stage-1 text of ``label`` (see the module docstring for what is trained)."""
    fmt = fmt or ExportFormat()
    answer = gold_answer(label)
    context = best_context(label, label.source)
    if answer is None or context is None:
        raise ValueError(f"label {label.id!r} has no "
                         f"{'gold answer' if answer is None else label.source + ' context'}")
    own = label.source == PARAMETRIC  # the model writes its knowledge; else it is inserted
    eok = fmt.end_of_knowledge
    return Stage1Example(
        id=label.id, source=label.source, prompt=fmt.routing.text(label.question),
        parts=[(_source_line(lm, fmt, label.question, label.source), True),
               (_knowledge(context), own), (eok, own),
               (answer if eok[-1].isspace() else f" {answer}", True)])


def tokenize_stage1(example: Stage1Example, lm: Any) -> dict[str, list[int]]:
    """``{"input_ids", "labels"}`` for TRL's ``SFTTrainer``: the prompt as ``lm.encode``
    tokenises it (masked), each part literally (masked unless trained), then the
    end-of-sequence token (trained)."""
    ids = list(lm.encode(example.prompt))
    labels = [IGNORE] * len(ids)
    for text, trained in example.parts:
        part = lm.token_ids(text)
        ids += part
        labels += part if trained else [IGNORE] * len(part)
    eos = eos_token_id(lm.tokenizer)
    return {"input_ids": [*ids, eos], "labels": [*labels, eos]}


def stage2_pair(label: SourceLabel, lm: Any, fmt: ExportFormat | None = None
                ) -> DPOPair | None:
    """The DPO pair of ``label``: best over worst verbalization after the parametric marker;
    None when the label has none (not parametric, under two verbalizations, or a tie)."""
    found = _pair(label, lm, fmt or ExportFormat())
    return found if isinstance(found, DPOPair) else None


def _pair(label: SourceLabel, lm: Any, fmt: ExportFormat) -> DPOPair | SkipReason:
    if label.source != PARAMETRIC:
        return "retrieval_preferred"
    verbalized = [c for c in label.contexts if c.source == PARAMETRIC]
    if len(verbalized) < 2:
        return "one_verbalization"
    best = max(verbalized, key=lambda c: c.mean_logprob)
    worst = min(verbalized, key=lambda c: c.mean_logprob)
    if best.mean_logprob == worst.mean_logprob or best.text == worst.text:
        return "tied_verbalizations"
    prompt = str(lm.render(fmt.routing.text(label.question)))
    return DPOPair(prompt=prompt + _source_line(lm, fmt, label.question, PARAMETRIC),
                   chosen=_knowledge(best) + fmt.end_of_knowledge,
                   rejected=_knowledge(worst) + fmt.end_of_knowledge)


def _stage1_record(label: SourceLabel, lm: Any, fmt: ExportFormat
                   ) -> dict[str, Any] | SkipReason:
    if gold_answer(label) is None:
        return "no_gold_answer"
    if best_context(label, label.source) is None:
        return "no_context"
    record = tokenize_stage1(stage1_example(label, lm, fmt), lm)
    return "too_long" if len(record["input_ids"]) > lm.max_context else record


def _dpo_record(label: SourceLabel, lm: Any, fmt: ExportFormat) -> dict[str, Any] | SkipReason:
    pair = _pair(label, lm, fmt)
    if isinstance(pair, str):
        return pair
    # TRL tokenises the rendered prompt as text (control tokens parsed) and appends eos.
    longest = max(len(lm.token_ids(pair.chosen)), len(lm.token_ids(pair.rejected)))
    size = len(lm.token_ids(pair.prompt, literal=False)) + longest + 1
    return "too_long" if size > lm.max_context else pair.model_dump()


def _export(labels: Iterable[SourceLabel | dict[str, Any]], lm: Any, out: str | Path,
            fmt: ExportFormat | None,
            make: Callable[[SourceLabel, Any, ExportFormat], dict[str, Any] | SkipReason]
            ) -> ExportCounts:
    if isinstance(labels, (str, Path)):
        raise TypeError("labels must be label rows, not a path: pass read_labels(path)[1]")
    missing = [m for m in ("tokenizer", "encode", "render", "token_ids", "max_context")
               if not hasattr(lm, m)]
    if missing:
        raise TypeError(f"the export tokenises with the model to be trained: pass an "
                        f"HFWhiteBoxLM (rag_gates.lm.load_lm('default' | PATH)), got "
                        f"{type(lm).__name__} without {', '.join(missing)}")
    fmt = fmt or ExportFormat()
    eos_token_id(lm.tokenizer)
    _option_ids(lm, fmt.routing)  # the two source words must start with different tokens
    rows = [SourceLabel.model_validate(lb) if isinstance(lb, dict) else lb for lb in labels]
    records: list[dict[str, Any]] = []
    skipped: Counter[str] = Counter()
    for label in rows:
        if not isinstance(label, SourceLabel):
            raise TypeError(f"labels must be SourceLabel rows (read_labels(path)[1]), got "
                            f"{type(label).__name__}")
        made = make(label, lm, fmt)
        if isinstance(made, str):
            skipped[made] += 1
        else:
            records.append(made)
    path = write_jsonl(out, records)
    return ExportCounts(labels=len(rows), records=len(records), skipped=dict(skipped),
                        out=str(path))


def export_stage1(labels: Iterable[SourceLabel | dict[str, Any]], lm: Any, out: str | Path,
                  fmt: ExportFormat | None = None) -> ExportCounts:
    """Write one stage-1 SFT record per usable label to ``out`` (JSONL).

    ``lm``: the model to be trained, an :class:`~rag_gates.lm.hf.HFWhiteBoxLM` (its
    tokenizer and chat template shape the records; the weights are not used). Skipped and
    counted: a label without a gold answer (``no_gold_answer``), without a context of its
    preferred source (``no_context``), or longer than ``lm.max_context`` (``too_long``).
    """
    return _export(labels, lm, out, fmt, _stage1_record)


def export_stage2_dpo(labels: Iterable[SourceLabel | dict[str, Any]], lm: Any,
                      out: str | Path, fmt: ExportFormat | None = None) -> ExportCounts:
    """Write the stage-2 DPO pairs (best over worst verbalization) to ``out`` (JSONL).

    Skipped and counted: retrieval-preferred labels (``retrieval_preferred``), labels with
    fewer than two verbalizations (``one_verbalization``) or with verbalizations of equal
    likelihood (``tied_verbalizations``), and pairs longer than ``lm.max_context``
    (``too_long``). ``lm`` as for :func:`export_stage1`.
    """
    return _export(labels, lm, out, fmt, _dpo_record)
