"""Answer matching: SQuAD-normalised exact match and F1, containment accuracy, PubMedQA
yes/no/maybe accuracy, and answer extraction from "the answer is ..." replies.

Core vocabulary, not benchmark code: a method that labels the model's own answers (CBDR's
probe data, DeepRAG's trajectory search, SR-RAG's source labels) matches them here, and the
benchmark (:mod:`rag_gates_lab.metrics`) scores with the same functions.

Example:
    >>> exact_match("The Eiffel Tower!", ["eiffel tower"])
    1.0
    >>> round(f1("in Paris, France", ["Paris"]), 3)
    0.5
    >>> extract_answer("Both were born in 1950. So the answer is: Paris.")
    'Paris'
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

__all__ = [
    "accuracy",
    "exact_match",
    "extract_answer",
    "extract_decision",
    "f1",
    "normalize_answer",
    "score_answer",
]

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)
_ANSWER_IS = re.compile(r"answer\s+is\s*:?\s*", re.IGNORECASE)


def normalize_answer(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def exact_match(prediction: str, golds: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals any normalised gold answer."""
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in golds))


def _f1_one(prediction: str, gold: str) -> float:
    p, g = normalize_answer(prediction), normalize_answer(gold)
    # HotpotQA's official rule: a yes/no/noanswer on either side must match exactly.
    special = {"yes", "no", "noanswer"}
    if (p in special or g in special) and p != g:
        return 0.0
    p_tokens, g_tokens = p.split(), g.split()
    common = Counter(p_tokens) & Counter(g_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(p_tokens), same / len(g_tokens)
    return 2 * precision * recall / (precision + recall)


def f1(prediction: str, golds: Sequence[str]) -> float:
    """Token-level F1 against the best-matching gold answer."""
    return max((_f1_one(prediction, g) for g in golds), default=0.0)


def accuracy(prediction: str, golds: Sequence[str]) -> float:
    """1.0 when any normalised gold answer occurs in the normalised prediction (as words)."""
    p = f" {normalize_answer(prediction)} "
    return float(any(normalize_answer(g) and f" {normalize_answer(g)} " in p for g in golds))


def extract_answer(text: str) -> str:
    """The text after the last "the answer is", up to the end of its sentence; else the text.

    Used before EM/F1 so a chain-of-thought reply is scored on its final answer.
    """
    matches = list(_ANSWER_IS.finditer(text))
    if not matches:
        return text.strip()
    tail = text[matches[-1].end():].strip()
    first_line = tail.splitlines()[0] if tail else tail
    # Cut at the sentence end ('.', but not inside a number such as 3.5).
    sentence = re.split(r"(?<!\d)\.(?!\d)", first_line, maxsplit=1)[0]
    return sentence.strip().strip('"').strip()


def extract_decision(text: str) -> str | None:
    """The first of yes / no / maybe that the reply states (PubMedQA), or None."""
    for word in normalize_answer(extract_answer(text)).split():
        if word in ("yes", "no", "maybe"):
            return word
    return None


def score_answer(prediction: str, golds: Sequence[str], dataset: str) -> dict[str, float]:
    """EM, F1 and accuracy of one reply (PubMedQA: accuracy of the yes/no/maybe decision)."""
    answer = extract_answer(prediction)
    if dataset == "pubmedqa":
        decision = extract_decision(prediction)
        hit = float(decision is not None and decision == normalize_answer(golds[0]))
        return {"em": hit, "f1": hit, "accuracy": hit}
    return {"em": exact_match(answer, golds), "f1": f1(answer, golds),
            "accuracy": accuracy(prediction, golds)}
