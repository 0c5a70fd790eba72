"""What one decision of a certified spec runs through: the library files it enters and the
calls that cross from one file to another (issue 56's "file crossings on the certified-spec
decision path").

    .venv/bin/python benchmarks/decision_path.py \\
        --spec benchmarks/results/calibrate/sample-300/gate.json \\
        --out benchmarks/results/decision_path.json

Loads the embedded SmolLM2 and the spec (``load_gate(spec, lm=...)``), decides one question
to warm up, then decides a second question under ``sys.setprofile`` and keeps every Python
call whose callee is in the library (``rag_gates/``, the installed package): the distinct
files entered, the calls whose caller is in another library file (a crossing), and the
calls to the checks that could repeat on the path (names holding ``undecided``,
``fail_closed`` or ``threshold``). Calls into torch, transformers and the standard library
are not counted: only the library's own structure. The same script runs on an older commit
(``git worktree add``) for the before figure; run from that tree with ``PYTHONPATH`` set to
it.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import FrameType
from typing import Any

QUESTION_WARM = "What is the capital of France?"
QUESTION = "In what city was Sebastian Hofmann born?"
CHECKS = ("undecided", "fail_closed", "threshold")


def trace(decide: Any, root: Path) -> dict[str, Any]:
    calls: list[tuple[str, str, str | None]] = []  # (file, function, caller file)

    def library_file(frame: FrameType | None) -> str | None:
        if frame is None:
            return None
        path = Path(frame.f_code.co_filename)
        try:
            name = str(path.resolve().relative_to(root))
        except ValueError:
            return None
        return name if name.startswith("rag_gates/") else None

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call":
            return
        here = library_file(frame)
        if here is not None:
            calls.append((here, frame.f_code.co_name, library_file(frame.f_back)))

    sys.setprofile(profile)
    try:
        decision = decide()
    finally:
        sys.setprofile(None)
    crossings = [(caller, here) for here, _, caller in calls
                 if caller is not None and caller != here]
    checks = Counter(f"{here}:{name}" for here, name, _ in calls
                     if any(word in name for word in CHECKS))
    files = list(dict.fromkeys(here for here, _, _ in calls))
    return {"decision": {"gate": decision.gate, "retrieve": decision.retrieve,
                         "score": decision.score, "threshold": decision.threshold},
            "library_calls": len(calls), "files_entered": len(files), "files": files,
            "crossings": len(crossings),
            "crossing_pairs": Counter(f"{a} -> {b}" for a, b in crossings).most_common(),
            "check_calls": dict(checks)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    import rag_gates
    from rag_gates.calibration import load_gate
    from rag_gates.lm import load_default_lm

    root = Path(rag_gates.__file__).resolve().parent.parent
    lm = load_default_lm()
    gate = load_gate(args.spec, lm=lm)
    gate.decide(QUESTION_WARM)  # lazy imports and caches off the trace
    result = trace(lambda: gate.decide(QUESTION), root)
    commit = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True, check=False).stdout.strip()
    result = {"command": "python benchmarks/decision_path.py " + " ".join(sys.argv[1:]),
              "commit": commit, "spec": str(args.spec), "question": QUESTION, **result}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k not in ("files", "crossing_pairs")},
                     indent=1))


if __name__ == "__main__":
    main()
