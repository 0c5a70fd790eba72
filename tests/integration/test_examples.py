"""The example scripts run as written, on the embedded model."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.parametrize("script", ["white_box_basics.py", "frameworks_llm.py"])
def test_example_runs(script: str) -> None:
    out = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Paris" in out.stdout or "Hamlet" in out.stdout
