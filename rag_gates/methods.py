"""The method protocol, its registry, and the baselines.

A method answers one question and returns the answer with the :class:`Trace` of what it did.
Built-in baselines: ``no-rag`` (closed book), ``single`` (retrieve once with the question,
top-k), ``fs-rag`` (retrieve before every generated sentence). Other packages add methods
through the ``rag_gates.methods`` entry-point group (``llama-index-rag-gates`` adds ``flare``
and ``subquestion``: LlamaIndex's own FLARE and SubQuestion query engines), each entry a
factory ``(MethodContext) -> Method``.

Example:
    >>> from rag_gates.methods import MethodContext, make_method
    >>> method = make_method("single", MethodContext(lm=lm, retriever=bm25, dataset="hotpotqa"))
    >>> result = method.answer("Who directed Ed Wood?")
    >>> result.answer, result.trace.retrievals
"""

from __future__ import annotations

import re
from collections.abc import Callable
from importlib.metadata import entry_points
from typing import Any, Protocol, runtime_checkable

from pydantic import Field

from rag_gates.answer_once import record_reuse, reusable_answer
from rag_gates.gate import is_gate_expression
from rag_gates.lm.recorded import RecordedLM, generate_recorded
from rag_gates.prompts import continue_prompt, qa_prompt
from rag_gates.registry import GateContext
from rag_gates.retrieval.base import Retriever
from rag_gates.retrieval.recorded import RecordedRetriever, retrieve_recorded
from rag_gates.types import Passage, PipelineResult, TraceRecorder

__all__ = [
    "BUILTIN_METHODS",
    "FSRAGMethod",
    "Method",
    "MethodContext",
    "MethodResult",
    "NoRetrievalMethod",
    "RecordedLM",
    "RecordedRetriever",
    "SelectiveRetrievalMethod",
    "SingleRetrievalMethod",
    "available_methods",
    "check_method_name",
    "generate_recorded",
    "make_method",
    "need_retriever",
    "retrieve_recorded",
    "split_method_list",
]

ENTRY_POINT_GROUP = "rag_gates.methods"


class MethodContext(GateContext):
    """What a method is built from: the model, the retriever and the settings of the run (a
    :class:`~rag_gates.registry.GateContext`, so ``selective@GATE`` builds its gate from
    the same context)."""

    lm: Any = Field(..., description="A TextLM (white-box methods require a WhiteBoxLM).")
    retriever: Any = Field(None, description="A rag_gates Retriever; None for closed book.")
    k: int = Field(3, ge=1, le=50, description="Passages per retrieval.")
    option: str | None = Field(
        None, description="The OPTION of a method named NAME@OPTION (e.g. the beta of "
                          "'cbdr@0.9'); only methods that declare options accept one.")


#: What a method returns: the core result type, so pipelines need no benchmark code.
MethodResult = PipelineResult


@runtime_checkable
class Method(Protocol):
    """Answers one question; records decisions, retrievals and model calls in the trace."""

    @property
    def name(self) -> str: ...

    def answer(self, question: str) -> MethodResult: ...


def need_retriever(ctx: MethodContext, name: str) -> Retriever:
    """The context's retriever, or an error naming the method that needs one."""
    if ctx.retriever is None:
        raise ValueError(f"method {name!r} retrieves: give the run a retriever (bm25 or dense)")
    if not isinstance(ctx.retriever, Retriever):
        raise TypeError(f"retriever must follow rag_gates' Retriever protocol, got "
                        f"{type(ctx.retriever).__name__}")
    retriever: Retriever = ctx.retriever
    return retriever


class NoRetrievalMethod:
    """Closed book: the model answers from its own knowledge."""

    name = "no-rag"

    def __init__(self, ctx: MethodContext) -> None:
        self.ctx = ctx

    def answer(self, question: str) -> MethodResult:
        rec = TraceRecorder()
        text = generate_recorded(rec, self.ctx.lm, qa_prompt(question, dataset=self.ctx.dataset),
                                 self.ctx.max_new_tokens)
        return MethodResult(answer=text, trace=rec.trace())


class SingleRetrievalMethod:
    """Retrieve once with the question (top-k), then answer from the passages."""

    name = "single"

    def __init__(self, ctx: MethodContext) -> None:
        self.ctx = ctx
        self.retriever = need_retriever(ctx, self.name)

    def answer(self, question: str) -> MethodResult:
        rec = TraceRecorder()
        passages = retrieve_recorded(rec, self.retriever, question, self.ctx.k)
        text = generate_recorded(rec, self.ctx.lm,
                                 qa_prompt(question, passages, dataset=self.ctx.dataset),
                                 self.ctx.max_new_tokens)
        return MethodResult(answer=text, trace=rec.trace(), passages=passages)


_SENTENCE_END = re.compile(r"[.!?]+[\"')\]]*\s+(?=[A-Z0-9\"'(\[])")
# Words whose trailing period does not end a sentence.
_ABBREVIATIONS = frozenset({"st", "mr", "mrs", "ms", "dr", "jr", "sr", "prof", "no", "vs",
                            "etc", "inc", "ltd", "co", "mt", "ft", "gen", "col", "lt", "sgt",
                            "u.s", "u.k", "e.g", "i.e", "approx", "fig", "vol", "jan", "feb",
                            "aug", "sept", "oct", "nov", "dec"})


def first_sentence(text: str) -> str:
    """The text up to and including its first sentence end (all of it if there is none).

    A period after an abbreviation ("St.", "Dr.") or a single initial ("J.") does not end
    a sentence.
    """
    text = text.strip()
    for match in _SENTENCE_END.finditer(text):
        words = text[: match.start()].split()
        last = words[-1].lower().rstrip(".") if words else ""
        if text[match.start()] == "." and (last in _ABBREVIATIONS or len(last) == 1):
            continue
        return text[: match.end()].rstrip()
    return text


class FSRAGMethod:
    """Retrieve before every sentence (FS-RAG): the query is the question for the first
    sentence, then the question plus the sentence just written; the model writes one more
    sentence given the fresh passages and the answer so far. Stops at the model's end of
    answer, after ``max_sentences`` or when the token budget is spent."""

    name = "fs-rag"

    def __init__(self, ctx: MethodContext, max_sentences: int = 4) -> None:
        self.ctx = ctx
        self.retriever = need_retriever(ctx, self.name)
        self.max_sentences = max_sentences

    def answer(self, question: str) -> MethodResult:
        rec = TraceRecorder()
        sentences: list[str] = []
        used: list[Passage] = []
        budget = self.ctx.max_new_tokens
        for _ in range(self.max_sentences):
            query = question if not sentences else f"{question} {sentences[-1]}"
            passages = retrieve_recorded(rec, self.retriever, query, self.ctx.k)
            used.extend(p for p in passages if p not in used)
            with rec.timed("llm_call", "sentence") as data:
                g = self.ctx.lm.generate(continue_prompt(question, passages, " ".join(sentences),
                                                         self.ctx.dataset),
                                         max_new_tokens=budget)
                data["tokens"] = g.completion_tokens
            budget -= g.completion_tokens
            sentence = first_sentence(g.text)
            if not sentence or sentence in sentences:
                break
            sentences.append(sentence)
            complete = g.finish_reason == "eos" and sentence == g.text.strip()
            if complete or budget <= 0:
                break
        return MethodResult(answer=" ".join(sentences), trace=rec.trace(), passages=used)


class SelectiveRetrievalMethod:
    """``selective@GATE``: the gate decides; retrieve once with the question (as ``single``)
    when it says so, else answer closed book (as ``no-rag``; a gate that generated that
    answer to decide, such as ``answer-logprob``, has it reused: one generation). ``GATE`` is
    any registered gate, ``NAME:THRESHOLD`` or a composite expression (``selective@quco&cbdr``,
    ``selective@cascade(quco,cbdr,0.2,0.8)``; grammar: :data:`rag_gates.gate.GATE_GRAMMAR`).
    The decision, with its sub-decisions, is in the trace."""

    name = "selective"
    accepts_option = True

    def __init__(self, ctx: MethodContext) -> None:
        from rag_gates.registry import make_gate

        if not ctx.option:
            raise ValueError("selective needs a gate: selective@GATE, e.g. selective@quco or "
                             "selective@cascade(quco,cbdr,0.2,0.8)")
        self.ctx = ctx
        # The full name: records of selective@A and selective@B in one run stay apart.
        self.name = f"selective@{ctx.option}"
        self.retriever = need_retriever(ctx, self.name)
        self.gate = make_gate(ctx.option, ctx)

    @staticmethod
    def validate_option(option: str | None) -> None:
        if not option:
            raise ValueError("selective needs a gate: selective@GATE, e.g. selective@quco")
        if is_gate_expression(option) or ":" in option:
            # Syntax, limits, weights files and thresholds; names resolve when built.
            from rag_gates.registry import check_gate_expression

            check_gate_expression(option)

    def answer(self, question: str) -> MethodResult:
        rec = TraceRecorder()
        decision = self.gate.decide(question)
        rec.add_decision(decision)
        passages = retrieve_recorded(rec, self.retriever, question, self.ctx.k) \
            if decision.retrieve else []
        prompt = qa_prompt(question, passages or None, dataset=self.ctx.dataset)
        if not decision.retrieve:
            # A gate that generated the closed-book answer to decide has already written
            # this reply: answer once (rag_gates.answer_once), and say so in the trace.
            reuse = reusable_answer(decision, lm=self.ctx.lm, prompt=prompt,
                                    max_new_tokens=self.ctx.max_new_tokens)
            if reuse.gate is not None:
                record_reuse(rec, reuse)
            if reuse.answer is not None:
                return MethodResult(answer=reuse.answer, trace=rec.trace(), passages=[])
        text = generate_recorded(rec, self.ctx.lm, prompt, self.ctx.max_new_tokens)
        return MethodResult(answer=text, trace=rec.trace(), passages=passages)


def split_method_list(text: str) -> list[str]:
    """``"no-rag,selective@cascade(quco,cbdr,0.2,0.8)"`` -> the two names: commas inside
    parentheses belong to a gate expression."""
    names, depth, current = [], 0, ""
    for char in text:
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            names.append(current.strip())
            current = ""
        else:
            current += char
    names.append(current.strip())
    return [n for n in names if n]


BUILTIN_METHODS: dict[str, Callable[[MethodContext], Method]] = {
    "no-rag": NoRetrievalMethod,
    "single": SingleRetrievalMethod,
    "fs-rag": FSRAGMethod,
    "selective": SelectiveRetrievalMethod,
}


def available_methods() -> dict[str, Callable[[MethodContext], Method]]:
    """Built-in methods plus those registered under the ``rag_gates.methods`` entry points."""
    methods = dict(BUILTIN_METHODS)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        methods.setdefault(ep.name, ep.load())
    return methods


def available_method(name: str) -> Callable[[MethodContext], Method]:
    """One method's factory by its base name, importing only that plugin (a method's
    plugin can take seconds to import: torch, a framework)."""
    if name in BUILTIN_METHODS:
        return BUILTIN_METHODS[name]
    for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
        factory: Callable[[MethodContext], Method] = ep.load()
        return factory
    raise ValueError(f"unknown method {name!r}; valid names: "
                     f"{', '.join(sorted(available_methods()))}")


def split_method_name(name: str) -> tuple[str, str | None]:
    """``"cbdr@0.9"`` -> ``("cbdr", "0.9")``; a name without ``@`` has no option."""
    base, sep, option = name.partition("@")
    if sep and (not base or not option):
        raise ValueError(f"method {name!r}: write NAME@OPTION with both parts, e.g. cbdr@0.9")
    return base, option if sep else None


def check_method_name(name: str, methods: dict[str, Callable[[MethodContext], Method]]) -> None:
    """Raise ValueError unless ``name`` is a registered method (with an option only where
    the method declares ``accepts_option``); the message lists the valid names.

    A factory may also carry ``validate_option``, a cheap, model-free callable given the
    option (or None) that raises ValueError for a bad one (``cbdr@2``: beta outside [0, 1]),
    so a run refuses it before any model is loaded or anything is written.
    """
    base, option = split_method_name(name)
    if base not in methods:
        raise ValueError(f"unknown method {name!r}; valid names: {', '.join(sorted(methods))}")
    factory = methods[base]
    check_method_option(base, option, accepts=bool(getattr(factory, "accepts_option", False)),
                        validate=getattr(factory, "validate_option", None))


def check_method_option(base: str, option: str | None, *, accepts: bool,
                        validate: Callable[[str | None], object] | None) -> None:
    """Raise ValueError for an ``@option`` given to a method that takes none, or one that
    ``validate`` (the method's model-free parser) refuses."""
    if option is not None and not accepts:
        raise ValueError(f"method {base!r} takes no @option; drop '@{option}'")
    if validate is not None:
        validate(option)


def make_method(name: str, ctx: MethodContext) -> Method:
    """Build a method by exact name (``NAME`` or ``NAME@OPTION`` for methods that declare
    ``accepts_option``); an unknown name lists the valid ones."""
    methods = available_methods()
    check_method_name(name, methods)
    base, option = split_method_name(name)
    return methods[base](ctx.model_copy(update={"option": option}))
