"""Certified gate thresholds: calibrate on your own questions with a stated risk bound.

With probability at least ``1 - delta`` over the draw of the calibration questions, a
certified threshold's accuracy drop against always retrieving is at most ``epsilon`` on the
population the questions came from. The guarantee assumes that the calibration questions
and the questions served later are exchangeable (drawn from the same distribution, answered
by the same model with the same retriever and corpus); every spec file says so.

This package is core: it never imports ``rag_gates_lab``.

Example:
    >>> from rag_gates.calibration import calibrate, load_gate, ModelIdentity, read_records
    >>> report = calibrate(read_records("records.jsonl"), max_loss=0.05, delta=0.1,
    ...     model=ModelIdentity.of(lm), retriever="bm25 over docs/")  # doctest: +SKIP
    >>> report.best.save("gate.json")                                             # doctest: +SKIP
    >>> gate = load_gate("gate.json", lm=lm)                                      # doctest: +SKIP
"""

from rag_gates.calibration.abstain import (
    AbstentionReport,
    AbstentionRow,
    calibrate_abstention,
)
from rag_gates.calibration.calibrate import (
    MIN_QUESTIONS,
    CalibrationReport,
    GateRow,
    calibrate,
    skip_curve,
)
from rag_gates.calibration.groups import (
    GroupCalibrationReport,
    GroupedGateRow,
    calibrate_by_group,
)
from rag_gates.calibration.judges import SameAnswer, parse_same_answer
from rag_gates.calibration.load import (
    CertifiedGate,
    GateContext,
    load_gate,
    register_gate,
)
from rag_gates.calibration.records import CalibrationRecord, read_records, write_records
from rag_gates.calibration.spec import (
    ASSUMPTION,
    AbstainCertificate,
    CascadeFit,
    GateSpec,
    GroupCertificate,
    ModelIdentity,
    RateInterval,
    WeightedFit,
)
from rag_gates.calibration.watch import WatchedGate, WatchStatus, disagreement_baseline
from rag_gates.errors import CalibrationError, SpecModelMismatchError

__all__ = [
    "ASSUMPTION",
    "MIN_QUESTIONS",
    "AbstainCertificate",
    "AbstentionReport",
    "AbstentionRow",
    "CalibrationError",
    "CalibrationRecord",
    "CalibrationReport",
    "CascadeFit",
    "CertifiedGate",
    "GateContext",
    "GateRow",
    "GateSpec",
    "GroupCalibrationReport",
    "GroupCertificate",
    "GroupedGateRow",
    "ModelIdentity",
    "RateInterval",
    "SameAnswer",
    "SpecModelMismatchError",
    "WatchStatus",
    "WatchedGate",
    "WeightedFit",
    "calibrate",
    "calibrate_abstention",
    "calibrate_by_group",
    "disagreement_baseline",
    "load_gate",
    "parse_same_answer",
    "read_records",
    "register_gate",
    "skip_curve",
    "write_records",
]
