"""An extractor that prompts any :class:`~rag_gates.lm.base.TextLM` with the paper's format.

QuCo-RAG's extractor is a small model fine-tuned on few-shot outputs of this shape (paper,
Appendix A.3): a declarative sentence gives ``[["head", "relation", "tail"], ...]``, a
question gives partial items ``[["entity", "relation"], ...]``, a non-factual conclusion
("Thus, ...") gives ``[]``. :class:`LLMExtractor` prompts an instruction model with the
paper's examples (Table A.1) as few-shot turns and parses the reply.

Parsing is forgiving: JSON first, then Python-literal syntax (single quotes), then a regex
over ``["a", "b"(, "c")]`` items; :func:`parse_items` never raises and gives ``[]`` for a
reply with no usable item. :class:`LLMExtractor` tells the two ``[]`` apart: the model's own
``[]`` is "no entity", while a reply with no usable item (prose, an empty reply, or items
that all name something absent from the input) raises
:class:`~rag_gates.errors.ExtractionError`, so a gate that needs the entities retrieves
instead of reading a failed extraction as "nothing to check" (``on_unreadable="empty"``
restores ``[]``). Errors of the model itself (a network error of an API model, a prompt too
long for its context) propagate too, so the caller's error policy applies.

Prompt format: by default one prompt string, the instruction then the examples as
``Input: ... / Output: ...`` pairs and the new input. A chat model's wrapper puts that string
in its chat template as one user turn (``HFWhiteBoxLM`` does when the tokenizer has a
template, as for the embedded SmolLM2; so do the LlamaIndex/LangChain adapters), a
completion model continues it as is. ``chat=True`` sends the examples as separate
user/assistant turns after a system message instead; measured on SmolLM2-135M-Instruct that
makes the model answer ``[]`` to everything (it copies the last turn), so it is off by
default; larger chat models may prefer it.

Example:
    >>> from rag_gates.lm import load_default_lm
    >>> ex = LLMExtractor(load_default_lm())
    >>> ex.claims("Kumbasaram was released in 2017.")
    [Claim(head='Kumbasaram', relation='released in', tail='2017')]
    >>> parse_items('[["Kumbasaram", "came out"]]', question=True)
    [Claim(head='Kumbasaram', relation='came out', tail=None)]
"""

from __future__ import annotations

import ast
import json
import logging
import re
from collections.abc import Sequence
from typing import Any, Literal

from rag_gates.errors import ExtractionError
from rag_gates.extract.base import BaseExtractor, Claim, unique_names
from rag_gates.extract.heuristic import is_non_factual
from rag_gates.lm.base import Prompt, TextLM

__all__ = ["FEW_SHOT", "INSTRUCTION", "LLMExtractor", "parse_items"]

logger = logging.getLogger(__name__)

INSTRUCTION = (
    "Extract knowledge triplets from the input as a JSON list. "
    'A declarative sentence gives [["head entity", "relation", "tail entity"], ...]; '
    "prefer named entities (people, places, organisations, dates) as tails. "
    'A question gives [["entity", "relation"], ...] for the entities it asks about. '
    "A sentence without a new verifiable fact (a conclusion starting with Thus or "
    "Therefore) gives []. Reply with the JSON list only."
)

#: The paper's Table A.1 examples: (input, expected output).
FEW_SHOT: tuple[tuple[str, str], ...] = (
    ("Kumbasaram was released in 2017.", '[["Kumbasaram", "released in", "2017"]]'),
    ("Beowulf & Grendel was directed by Sturla Gunnarsson.",
     '[["Beowulf & Grendel", "directed by", "Sturla Gunnarsson"]]'),
    ("Coulson Wallop's father, Nigel Wallop, studied at Eton College.",
     '[["Coulson Wallop", "father", "Nigel Wallop"], '
     '["Nigel Wallop", "studied at", "Eton College"]]'),
    ("Which film came out first, Kumbasaram or Mystery Of The 13th Guest?",
     '[["Kumbasaram", "came out"], ["Mystery of the 13th Guest", "came out"]]'),
    ("Where did Diane Meyer Simon's husband graduate from?",
     '[["Diane Meyer Simon", "husband"]]'),
    ("Thus, Kumbasaram came out first.", "[]"),
    ("Therefore, Robert Enrico, the director of The Woman Thou Gavest Me, was born first.",
     "[]"),
)

_ITEM = re.compile(
    r"""\[\s*(["'])((?:(?!\1).){1,200})\1\s*,\s*(["'])((?:(?!\3).){0,200})\3"""
    r"""(?:\s*,\s*(["'])((?:(?!\5).){0,200})\5)?\s*\]"""
)


def _items_from(value: Any) -> list[list[Any]] | None:
    """Accept ``[[...], ...]`` or a single flat ``[...]`` item; None if neither."""
    if not isinstance(value, list):
        return None
    if all(isinstance(v, list) for v in value):
        return value
    if 2 <= len(value) <= 3 and all(isinstance(v, str) for v in value):
        return [value]
    return None


def _load(text: str) -> list[list[Any]] | None:
    start = text.find("[")
    if start < 0:
        return None
    body = text[start:]
    end = body.rfind("]")
    candidates = [body[: end + 1]] if end >= 0 else []
    candidates += [body + "]", body + "]]", body + '"]]']
    for cand in candidates:
        for loader in (json.loads, ast.literal_eval):
            try:
                items = _items_from(loader(cand))
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
            if items is not None:
                return items
    return None


_EMPTY_LIST = re.compile(r"^\[\s*\]")


def _says_none(reply: str) -> bool:
    """The reply is the model's own empty list (``[]``, ``Output: []``, ``[[]]``), as the
    paper's extractor answers a sentence without a verifiable fact."""
    items = _load(reply.strip())
    return items is not None and all(item == [] for item in items)


def _lenient(text: str) -> list[list[Any]]:
    """Last resort for quotes inside values: ``[["a "b" c", "d"]]`` split on ``", "``."""
    start, end = text.find("[["), text.rfind("]]")
    if start < 0:
        return []
    body = text[start + 2: end if end > start else len(text)]
    items: list[list[Any]] = []
    for raw in re.split(r"\]\s*,\s*\[", body):
        fields = [f.strip().strip("\"'").strip() for f in re.split(r"[\"']\s*,\s*[\"']", raw)]
        if 2 <= len(fields) <= 3:
            items.append(fields)
    return items


def parse_items(reply: str, *, question: bool = False) -> list[Claim]:
    """Parse a model reply into claims; ``[]`` and a warning when nothing usable is found.

    Args:
        reply: the model's text, e.g. ``'[["Kumbasaram", "released in", "2017"]]'``.
        question: the input was a question, so items are partial (any tail is dropped).

    Items that are not 2-3 strings, or have an empty head, are skipped with a warning.
    """
    text = reply.strip()
    if not text:
        logger.warning("extractor reply is empty; no claims")
        return []
    items = _load(text)
    if items is None:
        found = _ITEM.findall(text)
        if found:
            items = [[g[1], g[3]] + ([g[5]] if g[4] else []) for g in found]
        else:
            items = _lenient(text)
        if not items:
            if not _EMPTY_LIST.match(text):
                logger.warning("extractor reply is not a list of items; no claims: %r",
                               text[:200])
            return []
    out: list[Claim] = []
    seen: set[tuple[str, str, str | None]] = set()
    for item in items:
        if not (isinstance(item, list) and 2 <= len(item) <= 3
                and all(isinstance(v, str) for v in item) and item[0].strip()):
            logger.warning("skipping malformed extractor item %r", item)
            continue
        tail = None if question or len(item) == 2 or not item[2].strip() else item[2]
        claim = Claim(head=item[0], relation=item[1], tail=tail)
        key = (claim.head.lower(), claim.relation.lower(), (claim.tail or "").lower() or None)
        if key not in seen:
            seen.add(key)
            out.append(claim)
    return out


class LLMExtractor(BaseExtractor):
    """Entities and claims from any TextLM, prompted with the paper's few-shot format.

    Args:
        lm: any :class:`~rag_gates.lm.base.TextLM` (local, API, framework-wrapped).
        max_new_tokens: reply budget; generation also stops at the end of the first line.
        chat: send the examples as separate chat turns (True) instead of one prompt string
            (False, the default; the model's wrapper applies its chat template to it).
        skip_non_factual: answer ``[]`` for "Thus/Therefore/So ..." sentences without a
            model call (what the paper's extractor is trained to output anyway); claims
            only: :meth:`entities` always asks the model about a question.
        grounded: drop items whose head (or tail) does not occur in the input text
            (case-insensitive); small models copy entities from the few-shot examples.
        few_shot: the (input, output) examples; the paper's Table A.1 by default.
        on_unreadable: a reply with no usable item (not the model's own ``[]``) raises
            :class:`~rag_gates.errors.ExtractionError` (``"raise"``, the default: QuCo's
            gate and verifier then fail closed) or gives ``[]`` (``"empty"``).

    Example:
        >>> ex = LLMExtractor(lm)
        >>> ex.entities("Where did Diane Meyer Simon's husband graduate from?")
        ['Diane Meyer Simon']
    """

    name = "llm"

    def __init__(
        self,
        lm: TextLM,
        *,
        max_new_tokens: int = 64,
        chat: bool = False,
        skip_non_factual: bool = True,
        grounded: bool = True,
        few_shot: Sequence[tuple[str, str]] = FEW_SHOT,
        on_unreadable: Literal["raise", "empty"] = "raise",
    ) -> None:
        if not hasattr(lm, "generate"):
            raise TypeError(f"lm must be a TextLM (with .generate), got {type(lm).__name__}")
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.lm = lm
        self.max_new_tokens = max_new_tokens
        self.chat = chat
        self.skip_non_factual = skip_non_factual
        self.grounded = grounded
        self.few_shot = tuple(few_shot)
        if on_unreadable not in ("raise", "empty"):
            raise ValueError(f"on_unreadable must be 'raise' or 'empty', got {on_unreadable!r}")
        self.on_unreadable = on_unreadable
        self.name = f"llm:{getattr(lm, 'model_id', type(lm).__name__)}"

    def prompt(self, text: str) -> Prompt:
        """The prompt sent for ``text`` (chat messages or a completion string)."""
        if self.chat:
            messages: list[dict[str, str]] = [{"role": "system", "content": INSTRUCTION}]
            for source, target in self.few_shot:
                messages.append({"role": "user", "content": source})
                messages.append({"role": "assistant", "content": target})
            messages.append({"role": "user", "content": text})
            return messages
        shots = "\n\n".join(f"Input: {s}\nOutput: {t}" for s, t in self.few_shot)
        return f"{INSTRUCTION}\n\n{shots}\n\nInput: {text}\nOutput:"

    def _extract(self, text: str, *, conclusion_shortcut: bool) -> list[Claim]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        text = " ".join(text.split())
        if not text or (conclusion_shortcut and self.skip_non_factual
                        and is_non_factual(text)):
            return []
        generation = self.lm.generate(self.prompt(text), max_new_tokens=self.max_new_tokens,
                                      stop=["\n"], temperature=0.0)
        reply = generation.text
        claims = parse_items(reply, question=text.endswith("?"))
        if not claims and not _says_none(reply):
            return self._unreadable(f"the reply holds no item: {reply.strip()[:120]!r}")
        if not self.grounded:
            return claims
        haystack = text.casefold().replace("’", "'")
        kept = [c for c in claims if all(
            v.casefold().replace("’", "'") in haystack for v in (c.head, c.tail) if v)]
        if claims and not kept:
            # Small models copy entities from the few-shot examples instead of the input's.
            return self._unreadable("every item names something absent from the input: "
                                    f"{[c.head for c in claims][:5]}")
        if len(kept) < len(claims):
            logger.debug("dropped %d extractor items not found in the input",
                         len(claims) - len(kept))
        return kept

    def _unreadable(self, why: str) -> list[Claim]:
        if self.on_unreadable == "raise":
            raise ExtractionError(f"{self.name}: {why}")
        logger.warning("%s: %s; no claims", self.name, why)
        return []

    def claims(self, sentence: str) -> list[Claim]:
        """Claims of ``sentence`` (partial ones for a question); ``[]`` if the model says none
        (:class:`~rag_gates.errors.ExtractionError` for a reply with no usable item, unless
        ``on_unreadable="empty"``)."""
        return self._extract(sentence, conclusion_shortcut=True)

    def entities(self, question: str) -> list[str]:
        """The heads (and tails) of the question's items, de-duplicated, in order. The
        "Thus/So ..." shortcut is for generated conclusions, never a question: "So who
        directed Ed Wood?" names an entity, and QuCo skips retrieval on a question without."""
        return unique_names(value for claim in self._extract(question, conclusion_shortcut=False)
                            for value in (claim.head, claim.tail) if value)
