"""Fixtures for the QuCo-RAG tests: a real local corpus index over 400 HotpotQA Wikipedia
paragraphs (built here, one cpu), a BM25 retriever over the same paragraphs, a gazetteer
extractor and a scripted model.

The extractor and the model are test doubles of *dependencies*; the gate, the verifier and
the pipeline under test run for real against real corpus counts.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from rag_gates.extract.base import BaseExtractor, Claim
from rag_gates.lm.base import BaseTextLM, Prompt
from rag_gates.types import Generation
from tests.corpus import conftest as corpus_fixtures

# The corpus tests' session fixtures (tokenizer, real-text index), shared with these tests.
corpus_dir = corpus_fixtures.corpus_dir
tokenizer_path = corpus_fixtures.tokenizer_path
wiki_index = corpus_fixtures.wiki_index
wiki_rows = corpus_fixtures.wiki_rows


class GazetteerExtractor(BaseExtractor):
    """Entities: known names found in the text, in order. Claims: consecutive entity pairs
    (head, words between, tail); sentences starting with Thus/Therefore give none."""

    name = "gazetteer"

    def __init__(self, names: Sequence[str]) -> None:
        self.names = sorted(set(names), key=len, reverse=True)

    def _found(self, text: str) -> list[tuple[int, str]]:
        hits: list[tuple[int, str]] = []
        taken: list[range] = []
        for name in self.names:
            for m in re.finditer(re.escape(name), text):
                if not any(m.start() in r for r in taken):
                    hits.append((m.start(), name))
                    taken.append(range(m.start(), m.end()))
        return sorted(hits)

    def entities(self, question: str) -> list[str]:
        return list(dict.fromkeys(name for _, name in self._found(question)))

    def claims(self, sentence: str) -> list[Claim]:
        if re.match(r"\s*(Thus|Therefore)\b", sentence):
            return []
        hits = self._found(sentence)
        out = []
        for (start, head), (nxt, tail) in itertools.pairwise(hits):
            relation = sentence[start + len(head):nxt].strip(" ,")
            out.append(Claim(head=head, relation=relation, tail=tail))
        if len(hits) == 1 and sentence.rstrip().endswith("?"):
            start, head = hits[0]
            out.append(Claim(head=head, relation=sentence[start + len(head):].strip(" ?")))
        return out


class ScriptedLM(BaseTextLM):
    """A model whose reply is a function of the prompt; records every prompt it saw."""

    def __init__(self, reply: Callable[[str], str]) -> None:
        self.reply = reply
        self.prompts: list[str] = []

    @property
    def model_id(self) -> str:
        return "scripted"

    def generate(self, prompt: Prompt, *, max_new_tokens: int = 128,
                 stop: Sequence[str] | None = None, temperature: float = 0.0,
                 logprobs: int | None = None) -> Generation:
        assert isinstance(prompt, str)
        self.prompts.append(prompt)
        text = self.reply(prompt)
        words = text.split()
        finish = "length" if len(words) > max_new_tokens else "eos"
        text = " ".join(words[:max_new_tokens])
        return Generation(text=text, finish_reason=finish,
                          completion_tokens=min(len(words), max_new_tokens))


NAMES = ["Ed Wood", "Scott Derrickson", "Tim Burton", "Johnny Depp", "Los Angeles",
         "Tyler Bates", "Woodson", "Arkansas", "Doctor Strange", "Zzyzx Quorvath",
         "Paris and New York", "Tom AND Jerry", "American"]


@pytest.fixture()
def extractor() -> GazetteerExtractor:
    return GazetteerExtractor(NAMES)


@pytest.fixture()
def stats(wiki_index: Path) -> Iterator[Any]:
    from rag_gates.corpus import LocalInfiniGram

    backend = LocalInfiniGram(wiki_index)
    yield backend
    backend.close()


@pytest.fixture(scope="session")
def bm25(wiki_rows: list[dict[str, str]]) -> Any:
    pytest.importorskip("bm25s")
    from rag_gates.retrieval.bm25 import BM25Retriever
    from rag_gates.types import Passage

    return BM25Retriever.from_passages(
        [Passage(id=r["title"], title=r["title"], text=r["text"]) for r in wiki_rows])
