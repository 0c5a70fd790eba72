"""split_sentences: abbreviations, initials, decimals, ellipses, quotes, empty input."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rag_gates.extract import split_sentences


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("Kumbasaram was released in 2017. It is a Malayalam film.",
         ["Kumbasaram was released in 2017.", "It is a Malayalam film."]),
        ("Mr. Smith met Dr. Jones at St. Paul's. They talked.",
         ["Mr. Smith met Dr. Jones at St. Paul's.", "They talked."]),
        ("J. R. R. Tolkien wrote The Hobbit. It sold well.",
         ["J. R. R. Tolkien wrote The Hobbit.", "It sold well."]),
        ("Martin Luther King Jr. was born in Atlanta. He was a minister.",
         ["Martin Luther King Jr. was born in Atlanta.", "He was a minister."]),
        ("The U.S. Army was founded in 1775. It is large.",
         ["The U.S. Army was founded in 1775.", "It is large."]),
        ("He moved to the U.S. He died there in 1990.",
         ["He moved to the U.S.", "He died there in 1990."]),
        ("Pi is about 3.14. The population was 1,234.5 thousand.",
         ["Pi is about 3.14.", "The population was 1,234.5 thousand."]),
        ("He waited... Then he left. Wait... what?",
         ["He waited...", "Then he left.", "Wait... what?"]),
        ("He paused… Then he spoke.", ["He paused…", "Then he spoke."]),
        ('She said "Go home." Then she left.', ['She said "Go home."', "Then she left."]),
        ("“Hello.” She left.", ["“Hello.”", "She left."]),
        ('"Who?" she asked.', ['"Who?" she asked.']),
        ("Is it? Yes! It is.", ["Is it?", "Yes!", "It is."]),
        ("Born Jan. 5, 1990 in Washington, D.C. He left.",
         ["Born Jan. 5, 1990 in Washington, D.C.", "He left."]),
        ("Apple Inc. was founded in 1976 (e.g. by Jobs). Google followed.",
         ["Apple Inc. was founded in 1976 (e.g. by Jobs).", "Google followed."]),
        ("First paragraph\n\nSecond paragraph", ["First paragraph", "Second paragraph"]),
        ("Items:\n- one\n- two", ["Items:", "- one", "- two"]),
        ("No terminal punctuation", ["No terminal punctuation"]),
        ("Version 2.0.1 is out.", ["Version 2.0.1 is out."]),
    ],
)
def test_splits(text: str, expected: list[str]) -> None:
    assert split_sentences(text) == expected


@pytest.mark.parametrize("text", ["", "   ", "\n\n\t", " . ", "..."])
def test_empty_or_punctuation_only(text: str) -> None:
    out = split_sentences(text)
    assert all(s.strip() for s in out)
    assert out == [] or out == [text.strip()]


def test_type_error() -> None:
    with pytest.raises(TypeError, match="str"):
        split_sentences(None)  # type: ignore[arg-type]


@given(st.text(alphabet=st.sampled_from(list("Ab. ?!\"'\n…3 ")), max_size=60))
def test_never_empty_and_loses_no_words(text: str) -> None:
    out = split_sentences(text)
    assert all(s and s == s.strip() for s in out)
    assert "".join(out).replace(" ", "").replace("\n", "").replace("\t", "") == "".join(
        text.split())
