"""HeuristicExtractor on the paper's Table A.1 examples and real HotpotQA questions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rag_gates.extract import Claim, Extractor, HeuristicExtractor, default_extractor

SAMPLE = Path(__file__).resolve().parents[2] / "examples" / "data" / "hotpotqa_dev_sample.jsonl"


@pytest.fixture(scope="module")
def ex() -> HeuristicExtractor:
    return HeuristicExtractor()


def triples(claims: list[Claim]) -> list[tuple[str, str, str | None]]:
    return [(c.head, c.relation, c.tail) for c in claims]


# --- the paper's Table A.1 ------------------------------------------------------------------
@pytest.mark.parametrize(
    ("sentence", "expected"),
    [
        ("Kumbasaram was released in 2017.", [("Kumbasaram", "released in", "2017")]),
        ("Beowulf & Grendel was directed by Sturla Gunnarsson.",
         [("Beowulf & Grendel", "directed by", "Sturla Gunnarsson")]),
        ("Coulson Wallop’s father, Nigel Wallop, studied at Eton College.",
         [("Coulson Wallop", "father", "Nigel Wallop"),
          ("Nigel Wallop", "studied at", "Eton College")]),
        ("Coulson Wallop's father, Nigel Wallop, studied at Eton College.",
         [("Coulson Wallop", "father", "Nigel Wallop"),
          ("Nigel Wallop", "studied at", "Eton College")]),
    ],
)
def test_paper_declaratives(ex: HeuristicExtractor, sentence: str,
                            expected: list[tuple[str, str, str]]) -> None:
    assert triples(ex.claims(sentence)) == expected


@pytest.mark.parametrize(
    "sentence",
    ["Thus, Kumbasaram came out first.",
     "Therefore, Robert Enrico, the director of The Woman Thou Gavest Me, was born first.",
     "So the answer is Nigel Wallop.", "  Hence Eton College is older."],
)
def test_paper_non_factual(ex: HeuristicExtractor, sentence: str) -> None:
    assert ex.claims(sentence) == []


def test_paper_questions(ex: HeuristicExtractor) -> None:
    # QuCo's authors' prompts (ZhishanQ/QuCo-RAG src/prompt_templates.json, example 1 of both
    # "entity_extraction_prompt" and "entity_extraction_prompt_for_question") answer
    # "Mystery of the 13th Guest": the name in its own casing, not the question's Title Case.
    q1 = "Which film came out first, Kumbasaram or Mystery Of The 13Th Guest?"
    assert ex.entities(q1) == ["Kumbasaram", "Mystery of the 13th Guest"]
    claims = ex.claims(q1)
    assert [c.head for c in claims] == ["Kumbasaram", "Mystery of the 13th Guest"]
    assert all(c.is_partial and "came out" in c.relation for c in claims)
    q2 = "Where did Diane Meyer Simon’s husband graduate from?"
    assert ex.entities(q2) == ["Diane Meyer Simon"]
    assert triples(ex.claims(q2)) == [("Diane Meyer Simon", "husband", None)]


# --- entities -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("question", "expected"),
    [
        ("Who created Tom and Jerry?", ["Tom and Jerry"]),
        ('Who starred in "Pride and Prejudice" and "War or Peace"?',
         ["Pride and Prejudice", "War or Peace"]),
        ("When was Car and Driver first published?", ["Car and Driver"]),
        ("Are both Ugni and Stenomesson native plants?", ["Ugni", "Stenomesson"]),
        ("Did John Updike and Tom Clancy both publish novels?", ["John Updike", "Tom Clancy"]),
        ("Between Harvey Pekar and Denise Levertov who was born earlier?",
         ["Harvey Pekar", "Denise Levertov"]),
        ("Which battle, the Battle of Cold Harbor, or the Second Battle of Bull Run, was first?",
         ["Battle of Cold Harbor", "Second Battle of Bull Run"]),
        ("The 22nd AVN Awards took place in what Nevada county?", ["22nd AVN Awards", "Nevada"]),
        ("Which Italian-American composer wrote the opera, Maria Golovin?", ["Maria Golovin"]),
        ("What is the name for the adventure in a game designed by Ken St. Andre?",
         ["Ken St. Andre"]),
        ("What company did Henry J. Kaiser found?", ["Henry J. Kaiser"]),
        ("This singer of A Rather Blustery Day also voiced what hedgehog?",
         ["A Rather Blustery Day"]),
        ("Does Phil Urban run Mitchells & Butlers?", ["Phil Urban", "Mitchells & Butlers"]),
        ("what aired from October 1995 to April 2000?", []),
    ],
)
def test_entities(ex: HeuristicExtractor, question: str, expected: list[str]) -> None:
    assert ex.entities(question) == expected


def test_and_or_entities_stay_whole(ex: HeuristicExtractor) -> None:
    # "and"/"or" inside an entity are words of the name, never split or treated as operators.
    assert "Tom and Jerry" in ex.entities("Who created Tom and Jerry?")
    claims = ex.claims("Tom and Jerry was created by William Hanna.")
    assert triples(claims) == [("Tom and Jerry", "created by", "William Hanna")]
    assert ex.entities('Who wrote "Either AND Or"?') == ["Either AND Or"]


def test_hotpotqa_sample_questions(ex: HeuristicExtractor) -> None:
    rows = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines()]
    by_question = {r["question"]: ex.entities(r["question"]) for r in rows}
    assert by_question["Were Scott Derrickson and Ed Wood of the same nationality?"] == [
        "Scott Derrickson", "Ed Wood"]
    assert by_question["Who is older, Annie Morton or Terry Richardson?"] == [
        "Annie Morton", "Terry Richardson"]
    assert "Big Stone Gap" in by_question[
        'The director of the romantic comedy "Big Stone Gap" is based in what New York city?']
    # Every question's entities are non-empty strings that occur in the question.
    for question, entities in by_question.items():
        assert len(set(entities)) == len(entities)
        for e in entities:
            assert e and e == e.strip() and e in question


def test_claims_on_supporting_sentences(ex: HeuristicExtractor) -> None:
    claims = ex.claims(
        "Scott Derrickson (born July 16, 1966) is an American director, screenwriter and producer.")
    assert ("Scott Derrickson", "born", "July 16, 1966") in triples(claims)
    assert ("Scott Derrickson", "", "American") in triples(claims)
    claims = ex.claims("Ed Wood is a 1994 film directed and produced by Tim Burton, and starring "
                       "Johnny Depp.")
    assert ("Ed Wood", "directed and produced by", "Tim Burton") in triples(claims)
    assert ("Ed Wood", "starring", "Johnny Depp") in triples(claims)


@pytest.mark.parametrize("text", ["", "   ", "\n\t", "?", "...", "the of and"])
def test_empty_and_odd_input(ex: HeuristicExtractor, text: str) -> None:
    assert ex.entities(text) == []
    assert ex.claims(text) == []


def test_non_string_raises(ex: HeuristicExtractor) -> None:
    with pytest.raises(TypeError):
        ex.entities(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ex.claims(3)  # type: ignore[arg-type]


def test_lowercase_question_has_no_entities(ex: HeuristicExtractor) -> None:
    assert ex.entities("who wrote the book about the war?") == []


async def test_batch_and_async(ex: HeuristicExtractor) -> None:
    qs = ["Who created Tom and Jerry?", "Who is older, Annie Morton or Terry Richardson?"]
    assert ex.entities_batch(qs) == [ex.entities(q) for q in qs]
    assert await ex.aentities(qs[1]) == ["Annie Morton", "Terry Richardson"]
    assert await ex.aclaims("Thus, X.") == []


def test_default_extractor() -> None:
    default = default_extractor()
    assert isinstance(default, Extractor)
    assert default.name == "heuristic"
    assert default.entities("Were Scott Derrickson and Ed Wood of the same nationality?") == [
        "Scott Derrickson", "Ed Wood"]


def test_bad_config() -> None:
    with pytest.raises(ValueError, match="max_relation_words"):
        HeuristicExtractor(max_relation_words=0)
