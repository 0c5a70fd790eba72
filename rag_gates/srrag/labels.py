"""Source labelling (the paper's Algorithm 1): which knowledge source helps the model more.

For a training question with gold answer ``a``, gather ``n_retrieved`` retrieved passages and
``n_verbalized`` verbalizations (the first greedy, the others sampled), and score every
context ``c`` by the model's likelihood of the gold answer given the question and ``c``:
``l_c = exp(mean log p(a | QA prompt with c))``, the length-normalised likelihood, teacher
forced through the model's ``score()`` (the prompt runs once and its KV cache is shared by
the gold answer's aliases; the best alias counts). The preferred source is

- ``sum`` (default, the paper's Algorithm 1): the source with the larger summed likelihood.
  When the two sources have different numbers of contexts, the sums are compared per
  context (means), so the source with more contexts is not favoured;
- ``top-n``: the source of the majority of the ``n`` most helpful contexts, ``n`` the smaller
  context count (the paper's §3.3 wording).

Ties go to retrieval. The QA prompt is the one the pipeline answers with
(:func:`rag_gates.prompts.qa_prompt`), so a label says which source makes *this* answer step
produce the gold answer.

:func:`collect_labels` appends one JSON line per question to a file whose first line records
the settings, so an interrupted run resumes where it stopped (``rag-gates srrag label``).

Example:
    >>> config = LabelConfig(n_retrieved=5, n_verbalized=2)
    >>> label = label_question(lm, bm25, example, config)                 # doctest: +SKIP
    >>> label.source, label.retrieval_likelihood, label.parametric_likelihood  # doctest: +SKIP
    ('retrieval', 0.41, 0.07)
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from rag_gates._io import JsonlLog, parse_lines_but_a_torn_tail
from rag_gates.lm.base import require_white_box
from rag_gates.prompts import qa_prompt
from rag_gates.retrieval.base import Retriever
from rag_gates.srrag.verbalizer import PARAMETRIC, Verbalizer, VerbalizerConfig
from rag_gates.types import Passage, QAExample

__all__ = ["RETRIEVAL", "ContextScore", "LabelConfig", "LabelRule", "Source", "SourceLabel",
           "answer_continuation", "collect_labels", "label_question", "preferred_source",
           "read_labels"]


#: The label of a question better answered with retrieved passages.
RETRIEVAL: Final = "retrieval"
Source = Literal["retrieval", "parametric"]
LabelRule = Literal["sum", "top-n"]
_RULES: tuple[LabelRule, ...] = ("sum", "top-n")


class LabelConfig(BaseModel):
    """How questions are labelled. Everything but ``rule`` is the label file's identity (the
    rule is recomputed from the stored context scores, so one file serves both rules)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    n_retrieved: int = Field(5, ge=1, le=50, description="Retrieved passages per question.")
    n_verbalized: int = Field(5, ge=1, le=20, description=(
        "Verbalizations per question: the first greedy, the others sampled."))
    temperature: float = Field(0.7, gt=0.0, le=2.0,
                               description="Sampling temperature of the extra verbalizations.")
    seed: int = Field(0, description="Seed of the first sampled verbalization (then +1 ...).")
    max_answers: int = Field(5, ge=1, le=20,
                             description="Gold answer aliases scored (the best one counts).")
    verbalizer: VerbalizerConfig = Field(default_factory=VerbalizerConfig)
    rule: LabelRule = Field("sum", description="'sum' (Algorithm 1) or 'top-n' (majority).")

    def identity(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude={"rule"})


class ContextScore(BaseModel):
    """One context of a question and how likely it makes the gold answer."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    source: Source
    passage_id: str | None = None
    title: str | None = None
    text: str
    answer: str = Field(..., description="The alias with the highest mean log-probability.")
    mean_logprob: float = Field(..., description="Mean token log p(answer | prompt + context).")
    tokens: int = Field(..., ge=1, description="Tokens of that alias.")
    hit_token_cap: bool = Field(False, description="A verbalization cut at the token cap.")

    @property
    def likelihood(self) -> float:
        """The length-normalised likelihood ``exp(mean log p)``."""
        return math.exp(self.mean_logprob)


class SourceLabel(BaseModel):
    """A labelled training question: its contexts, their scores and the preferred source."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    dataset: str
    question: str
    answers: list[str]
    source: Source = Field(..., description="The preferred source under the chosen rule.")
    by_rule: dict[str, Source] = Field(..., description="The preferred source under each rule.")
    retrieval_likelihood: float = Field(..., description="Summed likelihood, retrieved.")
    parametric_likelihood: float = Field(..., description="Summed likelihood, verbalized.")
    contexts: list[ContextScore]
    seconds: float = Field(0.0, ge=0.0, description="Time spent labelling this question.")


def preferred_source(contexts: Sequence[ContextScore], rule: LabelRule = "sum") -> Source:
    """The source the contexts prefer under ``rule`` (see the module docstring); ties and a
    source without contexts go to retrieval."""
    if rule not in _RULES:
        raise ValueError(f"rule must be one of {_RULES}, got {rule!r}")
    retrieved = [c.likelihood for c in contexts if c.source == RETRIEVAL]
    verbalized = [c.likelihood for c in contexts if c.source == PARAMETRIC]
    if not retrieved or not verbalized:
        return RETRIEVAL if retrieved or not verbalized else PARAMETRIC
    if rule == "sum":
        # Per-context means: equal to the summed comparison when the counts are equal.
        retrieval = sum(retrieved) / len(retrieved)
        parametric = sum(verbalized) / len(verbalized)
        return RETRIEVAL if retrieval >= parametric else PARAMETRIC
    n = min(len(retrieved), len(verbalized))
    ranked = sorted(contexts, key=lambda c: (-c.likelihood, c.source != RETRIEVAL))[:n]
    votes = sum(1 for c in ranked if c.source == RETRIEVAL)
    return RETRIEVAL if 2 * votes >= n else PARAMETRIC


def answer_continuation(lm: Any, prompt: str, answer: str) -> str:
    """The gold answer as the model would write it after ``prompt``: no leading space after a
    prompt that ends in whitespace (a chat template's assistant header), one otherwise."""
    render = getattr(lm, "render", None)
    rendered = render(prompt) if callable(render) else prompt
    answer = answer.strip()
    return answer if str(rendered)[-1:].isspace() else f" {answer}"


def _score_context(lm: Any, example: QAExample, passage: Passage, source: Source,
                   max_answers: int) -> ContextScore:
    prompt = qa_prompt(example.question, [passage], dataset=example.dataset)
    aliases = list(dict.fromkeys(a.strip() for a in example.answers if a.strip()))[:max_answers]
    if not aliases:
        raise ValueError(f"question {example.id!r} has no non-empty gold answer to score")
    scores = lm.score(prompt, [answer_continuation(lm, prompt, a) for a in aliases],
                      reuse_prefix=True, truncation="left")
    best = max(range(len(aliases)), key=lambda i: scores[i].mean)
    return ContextScore(
        source=source, passage_id=passage.id, title=passage.title, text=passage.text,
        answer=aliases[best], mean_logprob=scores[best].mean, tokens=len(scores[best].logprobs),
        hit_token_cap=bool(passage.metadata.get("hit_token_cap", False)))


def label_question(lm: Any, retriever: Retriever, example: QAExample, config: LabelConfig,
                   *, verbalizer: Verbalizer | None = None) -> SourceLabel:
    """Label one question (Algorithm 1). ``lm`` must be white-box (teacher-forced scoring)."""
    lm = require_white_box(lm, "SR-RAG source labelling")
    verbalizer = verbalizer or Verbalizer(lm, config.verbalizer.max_new_tokens,
                                          prompt=config.verbalizer.prompt)
    start = time.perf_counter()
    retrieved = retriever.retrieve(example.question, config.n_retrieved)
    verbalized = [verbalizer.verbalize(example.question)]
    verbalized += [verbalizer.verbalize(example.question, temperature=config.temperature,
                                        seed=config.seed + i)
                   for i in range(config.n_verbalized - 1)]
    contexts = [_score_context(lm, example, p, RETRIEVAL, config.max_answers)
                for p in retrieved]
    contexts += [_score_context(lm, example, p, PARAMETRIC, config.max_answers)
                 for p in verbalized]
    by_rule = {rule: preferred_source(contexts, rule) for rule in _RULES}
    return SourceLabel(
        id=example.id, dataset=example.dataset, question=example.question,
        answers=list(example.answers), source=by_rule[config.rule], by_rule=by_rule,
        retrieval_likelihood=sum(c.likelihood for c in contexts if c.source == RETRIEVAL),
        parametric_likelihood=sum(c.likelihood for c in contexts if c.source == PARAMETRIC),
        contexts=contexts, seconds=time.perf_counter() - start)


def _identity(lm: Any, retriever: Retriever, config: LabelConfig) -> dict[str, Any]:
    return {"kind": "srrag-labels", "model_id": lm.model_id, "retriever": retriever.name,
            **config.identity()}


def collect_labels(
    lm: Any, retriever: Retriever, examples: Sequence[QAExample], config: LabelConfig,
    out: str | Path, *, progress: Callable[[int, int, int], None] | None = None,
) -> list[SourceLabel]:
    """Label every question, in order, appending to ``out`` (resumed if it exists; a file
    written with other settings, model or retriever is refused).

    ``progress(done, total, retrieval_preferred_so_far)`` is called after each question.
    """
    lm = require_white_box(lm, "SR-RAG source labelling")
    verbalizer = Verbalizer(lm, config.verbalizer.max_new_tokens,
                            prompt=config.verbalizer.prompt)
    log = JsonlLog(Path(out), _identity(lm, retriever, config))
    labels: list[SourceLabel] = []
    with log:
        done = {(r["dataset"], r["id"]): _with_rule(SourceLabel.model_validate(r), config.rule)
                for r in log.open()}
        for i, example in enumerate(examples, start=1):
            key = (example.dataset, example.id)
            if key not in done:
                done[key] = label_question(lm, retriever, example, config,
                                           verbalizer=verbalizer)
                log.append(done[key].model_dump(mode="json"))
            labels.append(done[key])
            if progress is not None:
                progress(i, len(examples), sum(lb.source == RETRIEVAL for lb in labels))
    return labels


def _with_rule(label: SourceLabel, rule: LabelRule) -> SourceLabel:
    source = label.by_rule.get(rule) or preferred_source(label.contexts, rule)
    return label if source == label.source else label.model_copy(update={"source": source})


def read_labels(path: str | Path, rule: LabelRule | None = None
                ) -> tuple[dict[str, Any], list[SourceLabel]]:
    """The settings line and the labels of a file written by :func:`collect_labels`
    (``rule``: recompute each question's preferred source under that rule)."""
    from rag_gates._files import parse_json, read_text
    from rag_gates.errors import ArtifactFileError, InputFileError

    file = Path(path)
    if not file.is_file():
        raise FileNotFoundError(f"label file {file} not found; write one with: rag-gates srrag "
                                "label --dataset popqa --out FILE")
    lines = read_text(file, fix="delete the file and relabel",
                      error=ArtifactFileError).splitlines()
    try:
        first = parse_json(lines[0], file, line=1, expect=dict) if lines else None
    except InputFileError:
        first = None
    header = first.get("header") if isinstance(first, dict) else None
    if not isinstance(header, dict) or header.get("kind") != "srrag-labels":
        raise ArtifactFileError(f"{file} is not an SR-RAG label file (no settings line); "
                                "write one with rag-gates srrag label", path=file, line=1)
    labels = parse_lines_but_a_torn_tail(lines[1:], SourceLabel.model_validate_json,
                                         file=file, first_line=2, what="a label record",
                                         fix="delete that line or relabel")
    return header, [_with_rule(label, rule) if rule is not None else label
                    for label in labels]
