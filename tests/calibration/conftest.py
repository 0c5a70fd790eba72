"""Records for the calibration tests: a synthetic population where a good gate's score
predicts the harm of skipping, and the committed tb11 decisions."""

from __future__ import annotations

import numpy as np
import pytest

from rag_gates.calibration import CalibrationRecord, ModelIdentity


def synthetic_records(n: int, seed: int = 0, *, harm_scale: float = 0.7,
                      help_rate: float = 0.05) -> list[CalibrationRecord]:
    """``good`` scores predict the harm of skipping; ``noise`` does not."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        s = float(rng.random())
        u = float(rng.random())
        if u < harm_scale * s ** 2:          # retrieval fixes a wrong closed-book answer
            closed, retrieved = False, True
        elif u > 1 - help_rate:              # retrieval misleads a right answer
            closed, retrieved = True, False
        else:                                # both right or both wrong
            closed = retrieved = bool(rng.random() < 0.6)
        out.append(CalibrationRecord(id=f"q{i}", question=f"Question {i}?",
                                     closed_book_correct=closed, retrieved_correct=retrieved,
                                     scores={"good": s, "noise": float(rng.random())}))
    return out


@pytest.fixture
def model() -> ModelIdentity:
    return ModelIdentity(name="test-model", fingerprint="f" * 64)
