"""``rag-gates audit LOG``: replay a log of a watched gate's decisions through the watch's
test (:mod:`rag_gates.calibration.watch`) and say whether the certificate's alarm fires.

The log is JSON Lines, one decision per line: a :class:`~rag_gates.types.GateDecision` as JSON
(``decision.model_dump_json()``) or an object holding one under ``"decision"``, made by a
:class:`~rag_gates.calibration.watch.WatchedGate`, so each carries ``evidence["spec"]`` and
``evidence["watch"]`` (with both replies of every shadow-checked skip). The replay reads the
decisions in the order of the file; ``--judge`` re-judges the logged replies with another
same-answer judge. Exit status: 0 no alarm, 1 the alarm fires, 2 the log cannot be read.

Example:
    $ rag-gates audit decisions.jsonl
    $ rag-gates audit decisions.jsonl --judge f1:0.8 --json
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

__all__ = ["audit_command", "read_decision_log"]

console = Console()


def read_decision_log(path: Path) -> list[dict[str, Any]]:
    """The decisions of a log, in order (a last line cut short by a writer still appending
    is dropped with a warning); raises ValueError naming ``FILE:LINE`` for a line that is
    not a decision, and when the decisions name more than one spec."""
    from rag_gates._files import read_text
    from rag_gates._io import parse_lines_but_a_torn_tail
    from rag_gates.errors import InputFileError

    if path.is_dir():
        raise ValueError(f"{path} is a directory; give the decision log (JSON Lines) in it")
    if not path.is_file():
        raise ValueError(f"{path}: no such decision log; log each decision of a WatchedGate "
                         "as one JSON line (decision.model_dump_json())")
    fix = "each line must be one decision's JSON (decision.model_dump_json())"
    lines = read_text(path, fix=fix, error=InputFileError).splitlines()
    rows = parse_lines_but_a_torn_tail(lines, json.loads, file=path, what="a decision",
                                       fix=fix)
    out: list[dict[str, Any]] = []
    specs: dict[str, int] = {}
    numbers = [i for i, line in enumerate(lines, start=1) if line.strip()]
    for number, row in zip(numbers, rows, strict=False):
        decision = row.get("decision", row) if isinstance(row, dict) else None
        if not isinstance(decision, dict) or not isinstance(decision.get("retrieve"), bool) \
                or not isinstance(decision.get("evidence", {}), Mapping):
            raise ValueError(f"{path}:{number} is not a decision (an object with 'retrieve' "
                             f"and 'evidence'); {fix}")
        spec = decision.get("evidence", {}).get("spec")
        if isinstance(spec, Mapping):
            key = json.dumps({k: spec.get(k) for k in ("name", "threshold", "epsilon",
                                                       "delta")}, sort_keys=True)
            specs.setdefault(key, number)
        out.append(decision)
    if len(specs) > 1:
        first, second = sorted(specs.values())[:2]
        raise ValueError(f"{path} mixes decisions of {len(specs)} specs (lines {first} and "
                         f"{second} differ in evidence['spec']): one certificate per audit; "
                         "split the log by spec")
    if not out:
        raise ValueError(f"{path} holds no decision")
    return out


def _table(status: Any, log: Path) -> Table:
    table = Table(title=f"watch of {status.spec} (replayed from {log})", show_header=False)
    table.add_column("", style="bold")
    table.add_column("")
    rate = "-" if status.observed_rate is None else f"{status.observed_rate:.4f}"
    verdict = (f"[red]ALARM[/]: with confidence {1 - status.alarm_delta:g}, more than "
               f"{status.epsilon:g} of the questions were skipped with replies that differ "
               f"(fired after {status.alarm_after} questions)" if status.alarm
               else "[green]no alarm[/]: no evidence at this level that skipping costs more "
               "than epsilon")
    for name, value in (
            ("H0", status.hypothesis),
            ("questions", f"{status.questions:,}"),
            ("skipped", f"{status.skipped:,}"),
            ("sampled (observations)", f"{status.sampled:,} (shadow share "
                                       f"{status.shadow_share:g})"),
            ("shadow-checked skips", f"{status.shadowed:,}"),
            ("replies differ", f"{status.disagreements:,} (judge {status.judge})"),
            ("failed checks", f"{status.errors:,}"),
            ("observed rate", f"{rate} (epsilon {status.epsilon:g})"),
            ("e-value now / max", f"{status.e_value:.4g} / {status.max_e_value:.4g} (alarm at "
                                  f"{1 / status.alarm_delta:g})"),
            ("verdict", verdict)):
        table.add_row(name, value)
    return table


def audit_command(
    log: Annotated[Path, typer.Argument(
        help="JSON Lines of a WatchedGate's decisions (decision.model_dump_json() per line).",
        show_default=False)],
    judge: Annotated[str | None, typer.Option(
        help="Re-judge the logged replies: 'exact' or 'f1:CUT' (default: the logged judge)."
    )] = None,
    epsilon: Annotated[float | None, typer.Option(
        help="H0's rate of skipped questions whose replies differ (default: the logged "
             "one, the spec's epsilon unless the watch was given another).")] = None,
    alarm_delta: Annotated[float | None, typer.Option(
        help="The test's level: alarm when the e-value reaches 1/alarm-delta (default: the "
             "logged one).")] = None,
    as_json: Annotated[bool, typer.Option(
        "--json", help="Print the status as JSON instead of a table.")] = False,
) -> None:
    """Replay a watched gate's decision log through the watch's anytime-valid test and print
    its status; exit 1 when the alarm fires (the certificate has expired)."""
    from rag_gates._console import error_line
    from rag_gates.calibration.judges import parse_same_answer
    from rag_gates.calibration.watch import replay, status_of
    from rag_gates.errors import RagGatesError

    try:
        decisions = read_decision_log(log)
        spec = next((d["evidence"]["spec"].get("name") for d in decisions
                     if isinstance(d.get("evidence", {}).get("spec"), Mapping)), None)
        state = replay(decisions, judge=None if judge is None else parse_same_answer(judge),
                       epsilon=epsilon, alarm_delta=alarm_delta,
                       spec=str(spec) if spec is not None else str(log))
    except (ValueError, TypeError, RagGatesError, OSError) as exc:
        console.print(error_line(exc), highlight=False, soft_wrap=True)
        raise typer.Exit(2) from None
    status = status_of(state)
    if as_json:
        typer.echo(status.model_dump_json(indent=2, exclude={"state_file", "since"}))
    else:
        console.print(_table(status, log))
    if status.alarm:
        raise typer.Exit(1)
