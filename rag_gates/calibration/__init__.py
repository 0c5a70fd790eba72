"""Certified gate thresholds: calibrate on your own questions with a stated risk bound.

This package is core: it never imports ``rag_gates.eval``.
"""

from rag_gates.calibration.records import CalibrationRecord, read_records, write_records

__all__ = ["CalibrationRecord", "read_records", "write_records"]
