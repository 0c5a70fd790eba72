"""The Python blocks of ``docs/write-your-own-gate.md`` run as written, on real objects.

As ``test_docs_snippets.py`` (the runner is ``tests/integration/snippets.py``): each block
is read verbatim from the page, by order, in one reader's session (a block starts from what
the one before it left); after each block, ``CHECKS`` asserts what it did. The names the
page leaves to the reader are bound by :func:`prelude`:

* ``store`` / ``index``: a LangChain ``InMemoryVectorStore`` and a LlamaIndex
  ``VectorStoreIndex`` of the reader's documents (300 passages of the shipped calibration
  corpus, ``examples/data/calibration_corpus.jsonl``, cut to 60 characters for the tiny
  model; fake embeddings: the gate, not the ranking, is under test);
* ``model_dir`` / ``lm``: the tiny random-weight Llama of ``rag_gates.testing`` (a
  2048-token context), saved to a directory and loaded from it (plumbing only);
* ``my_questions.jsonl`` (the first 40 shipped calibration questions; every other one's gold
  answer is the first word of the tiny model's own closed-book answer, so that calibration
  sees both classes, as ``test_calibrate_cli.py`` does) and ``my_docs.jsonl`` (the 300
  passages) in the reader's directory.

The expectations are computed here by hand from the page's definition of the score (1 -
the best Jaccard overlap of the question's words with the known questions), not by calling
the gate.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.install.run_readme import ROOT
from tests.integration.snippets import Session, check_block_counts

pytestmark = pytest.mark.integration

PAGE = ROOT / "docs" / "write-your-own-gate.md"
DOCS = {"write-your-own-gate": PAGE}
BLOCKS = {"write-your-own-gate": 6}
QUESTIONS = ROOT / "examples" / "data" / "calibration_questions.jsonl"
CORPUS = ROOT / "examples" / "data" / "calibration_corpus.jsonl"

#: The page's known questions, as word sets (lower-cased ``\w+`` runs), by hand.
HAMLET = {"who", "wrote", "hamlet"}
FRANCE = {"what", "is", "the", "capital", "of", "france"}
ED_WOOD = {"who", "directed", "the", "film", "ed", "wood"}  # "Who directed the film Ed Wood?"
PLAY = {"who", "wrote", "the", "play", "hamlet"}  # "Who wrote the play Hamlet?"


def jaccard_score(words: set[str]) -> float:
    """The page's score, by hand: 1 - the best Jaccard overlap with the known questions."""
    return 1.0 - max(len(words & k) / len(words | k) for k in (FRANCE, HAMLET))


@pytest.fixture(scope="module")
def reader_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reader's project: ``my_questions.jsonl``, ``my_docs.jsonl`` and ``model/``."""
    from rag_gates.testing import tiny_model_and_tokenizer

    root = tmp_path_factory.mktemp("reader")
    passages = [json.loads(line) for line in CORPUS.read_text(encoding="utf-8").splitlines()[:300]]
    (root / "my_docs.jsonl").write_text("".join(
        json.dumps({"id": p["id"], "title": p["title"], "text": p["text"][:60]}) + "\n"
        for p in passages), encoding="utf-8")
    # save_tiny_lm's model reads 256 tokens; three passages and a question need more
    model, tokenizer = tiny_model_and_tokenizer(0, max_context=2048)
    model.save_pretrained(root / "model")
    tokenizer.save_pretrained(root / "model")
    # A random-weight model is never right: calibration needs both classes, so every other
    # question's gold answer is the first word of the model's own closed-book answer (as
    # calibrate generates it: no-rag, 32 new tokens), the rest keep their real gold answers.
    from rag_gates.answers import normalize_answer
    from rag_gates.lm import load_lm
    from rag_gates.methods import MethodContext, make_method

    closed = make_method("no-rag", MethodContext(lm=load_lm(str(root / "model")),
                                                 max_new_tokens=32))
    rows = [json.loads(line) for line in QUESTIONS.read_text(encoding="utf-8").splitlines()[:40]]
    for i, row in enumerate(rows):
        words = normalize_answer(closed.answer(row["question"]).answer).split() if i % 2 == 0 \
            else []
        if words:
            row["answers"] = [words[0]]
    (root / "my_questions.jsonl").write_text("".join(
        json.dumps({"id": r["id"], "question": r["question"], "answers": r["answers"]}) + "\n"
        for r in rows), encoding="utf-8")
    return root


def prelude(root: Path) -> dict[str, Any]:
    from langchain_core.embeddings import DeterministicFakeEmbedding
    from langchain_core.vectorstores import InMemoryVectorStore
    from llama_index.core import Document as Node
    from llama_index.core import VectorStoreIndex
    from llama_index.core.embeddings import MockEmbedding

    from rag_gates.lm import load_lm

    docs = [json.loads(line) for line in
            (root / "my_docs.jsonl").read_text(encoding="utf-8").splitlines()]
    store = InMemoryVectorStore.from_texts([d["text"] for d in docs],
                                           embedding=DeterministicFakeEmbedding(size=16),
                                           metadatas=[{"title": d["title"]} for d in docs])
    index = VectorStoreIndex.from_documents(
        [Node(text=d["text"], metadata={"title": d["title"]}) for d in docs],
        embed_model=MockEmbedding(embed_dim=8))
    model_dir = str(root / "model")
    return {"store": store, "index": index, "model_dir": model_dir,
            "lm": load_lm(model_dir)}


@pytest.fixture(scope="module")
def session(reader_dir: Path) -> Iterator[Session]:
    from rag_gates.registry import available_gates, unregister_gate

    before = set(available_gates())
    made = Session(PAGE, prelude(reader_dir), reader_dir, BLOCKS["write-your-own-gate"],
                   __file__)
    yield made
    made.close()
    # The page registers "faq" in this process: forget it, so other tests see the registry
    # as they expect.
    for name in set(available_gates()) - before:
        unregister_gate(name)


# ---------------------------------------------------------------- what each block did


def check_1(ns: dict[str, Any], values: list[Any]) -> None:
    """The gate: a known question scores 0 and is answered without retrieval; Ed Wood
    shares one word ('who', with Hamlet: 1/8) and retrieves; the reason says so; the
    threshold is checked against threshold_range when the gate is built."""
    ((known_retrieve, new_retrieve, reason),) = values
    assert known_retrieve is False and new_retrieve is True
    assert ns["known"].score == 0.0 == jaccard_score(HAMLET)
    assert math.isclose(ns["new"].score, jaccard_score(ED_WOOD)) \
        and math.isclose(jaccard_score(ED_WOOD), 1 - 1 / 8)
    assert reason == "faq score 0.875 >= threshold 0.5: retrieve"
    assert ns["new"].evidence == {"best_overlap": 0.125, "words": 6}
    with pytest.raises(ValueError, match="'faq'"):
        ns["FAQGate"](ns["FAQ"], threshold=1.5)


def check_2(ns: dict[str, Any], values: list[Any]) -> None:
    """No words: the gate cannot decide, so it retrieves and says why (fail closed)."""
    from rag_gates.gate import UNDECIDED_SCORE

    ((retrieve, reason, undecided),) = values
    assert retrieve is True and ns["d"].score == UNDECIDED_SCORE
    assert undecided == "the question has no words to compare"
    assert reason == "faq could not decide (the question has no words to compare): retrieve"
    assert ns["d"].evidence["raw_score"] == "nan"


def check_3(ns: dict[str, Any], values: list[Any]) -> None:
    """LangChain: no documents for the known question (the decision says no), two for Ed
    Wood, each carrying the gate's evidence; the last decision is the retrieving one."""
    ((skipped, found, evidence),) = values
    assert (skipped, found) == (0, 2)
    assert evidence == {"best_overlap": 0.125, "words": 6}
    assert all(d.metadata["rag_gates"]["retrieve"] is True for d in ns["docs"])
    assert ns["retriever"].last_decision.gate == "faq"


def check_4(ns: dict[str, Any], values: list[Any]) -> None:
    """LlamaIndex: the same decisions over the index's retriever."""
    ((skipped, found, gate),) = values
    assert (skipped, found, gate) == (0, 2, "faq")
    assert all(n.node.metadata["rag_gates"]["retrieve"] is True for n in ns["nodes"])


def check_5(ns: dict[str, Any], values: list[Any]) -> None:
    """The cascade: score 0 (outside the band 0.3..0.8) decides alone; 'Who wrote the play
    Hamlet?' (3 of 5 words shared: score 0.4) asks the model."""
    assert values == [(False, True)]
    assert math.isclose(jaccard_score(PLAY), 0.4)
    assert math.isclose(ns["unsure"].evidence["cheap"]["score"], jaccard_score(PLAY))
    expensive = ns["unsure"].evidence["expensive"]
    assert expensive["gate"] == "first-token-prob" and 0.0 <= expensive["score"] <= 1.0
    assert ns["clear"].retrieve is False and ns["clear"].evidence["expensive"] is None


def check_6(ns: dict[str, Any], values: list[Any]) -> None:
    """Registered: calibrate scored the 40 questions with the faq gate and wrote a spec
    naming it; load_gate built the page's gate through the factory at the spec's
    threshold, and the decision is that gate's at that threshold, with the spec."""
    from rag_gates.calibration import GateSpec

    spec = GateSpec.load(Path("gate.json"))
    assert spec.gate == "faq" and spec.n == 40
    registered, (retrieve, certified) = values  # register_gate(...) is a bare call: None
    assert registered is None
    assert certified is spec.certified
    # These inputs certify a threshold (skipping never costs more than 10 points here), so
    # load_gate builds the inner gate by its registered name: the path under test.
    assert spec.certified and spec.threshold is not None
    served = ns["served"]
    assert isinstance(served.inner, ns["FAQGate"])
    assert served.inner.threshold == spec.threshold
    assert retrieve is (jaccard_score(ED_WOOD) >= spec.threshold)
    assert ns["decision"].evidence["spec"]["name"] == "gate.json"
    records = list(Path("gate-work").glob("*.jsonl"))
    assert records, "calibrate keeps its per-question records in gate-work/"


CHECKS: dict[int, Callable[[dict[str, Any], list[Any]], None]] = {
    1: check_1, 2: check_2, 3: check_3, 4: check_4, 5: check_5, 6: check_6}


def test_the_page_has_the_blocks_this_test_knows() -> None:
    check_block_counts(DOCS, BLOCKS, {("write-your-own-gate", i) for i in CHECKS})


@pytest.mark.parametrize("block", sorted(CHECKS))
def test_page_block_runs(session: Session, block: int) -> None:
    namespace, values = session.run(block)
    with contextlib.chdir(session.workdir):
        CHECKS[block](namespace, values)
