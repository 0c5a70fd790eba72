"""The examples' stand-in for *your* documents: the paragraphs of the shipped HotpotQA sample.

Each example starts from :func:`my_documents`: a list of plain records (``id``, ``title``,
``text``), the shape most document stores export. Point the examples at your own data by
returning your documents here (or by replacing the call in an example with your loader);
nothing else in the examples depends on where the documents come from.

    >>> docs = my_documents()
    >>> len(docs), sorted(docs[0])
    (491, ['id', 'text', 'title'])
"""

from __future__ import annotations

import json
from pathlib import Path

SAMPLE = Path(__file__).resolve().parent / "data" / "hotpotqa_dev_sample.jsonl"


def my_documents(path: Path = SAMPLE) -> list[dict[str, str]]:
    """One record per distinct (title, paragraph) of the HotpotQA sample's contexts."""
    docs: dict[tuple[str, str], dict[str, str]] = {}
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            for title, sentences in json.loads(line)["context"]:
                text = "".join(sentences).strip()
                if text and (title, text) not in docs:
                    docs[(title, text)] = {"id": f"doc-{len(docs)}", "title": title,
                                           "text": text}
    return list(docs.values())


def write_jsonl(docs: list[dict[str, str]], path: Path) -> Path:
    """The documents as JSON Lines (``id``, ``title``, ``text``): the input of
    ``rag-gates index build`` and :func:`rag_gates.corpus.build_index`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as handle:
        for doc in docs:
            handle.write(json.dumps(doc) + "\n")
    return path
