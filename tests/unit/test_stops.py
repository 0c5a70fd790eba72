"""One stop-string rule for local decoding and framework adapters."""

from __future__ import annotations

import pytest

from rag_gates.lm.stops import StopCutter, find_stop


def test_the_stop_completed_first_wins() -> None:
    assert find_stop("xx abcd yy", ["abcd", "c"]) == (5, 6)
    assert find_stop("xx abcd yy", ["cd", "bcd"]) == (4, 7)  # same end: earlier start
    assert find_stop("nothing", ["zz"]) is None


@pytest.mark.parametrize("pieces", [["hello S", "TO", "P world"], list("hello STOP world")])
def test_streamed_cut_equals_whole_text_cut(pieces: list[str]) -> None:
    cutter = StopCutter(["STOP"])
    out = "".join(cutter.feed(p) for p in pieces) + cutter.flush()
    assert out == "hello " == cutter.text and cutter.stopped


def test_update_holds_back_a_half_decoded_character() -> None:
    cutter = StopCutter([])
    assert cutter.update("caf\ufffd") == "caf"
    assert cutter.update("café!") == "é!"
    assert cutter.flush() == ""
