"""The CLI checks every name before anything loads, says which names exist, and its help
reads as written (issue 31, item 4).

The commands run in a child process with an empty ``RAG_GATES_HOME``: loading the embedded
model converts it into that directory and imports torch, so "nothing was written there and
torch was never imported" is the observable proof that no model loaded.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from rag_gates.cli import app
from rag_gates.methods import BUILTIN_METHODS
from rag_gates.registry import core_gate_names
from rag_gates_lab.names import (
    BUILTIN_GATE_NAMES,
    BUILTIN_METHOD_NAMES,
    check_gate_names,
    check_methods,
    gate_names,
    method_names,
)

ROOT = Path(__file__).resolve().parents[2]
# Runs the CLI, then reports (after typer's exit) whether torch or transformers (a second or
# two to import) were ever imported.
RUN_CLI = ("import atexit, sys\n"
           "atexit.register(lambda: print('torch imported:', 'torch' in sys.modules,\n"
           "    'transformers imported:', 'transformers' in sys.modules))\n"
           "from rag_gates.cli import main\n"
           "sys.argv[0] = 'rag-gates'\n"
           "main()\n")


def run_cli(tmp_path: Path, *args: str) -> tuple[int, str, Path]:
    home = tmp_path / "home"
    env = dict(os.environ, RAG_GATES_HOME=str(home), COLUMNS="250", OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", RUN_CLI, *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    return done.returncode, done.stdout + done.stderr, home


def nothing_loaded(output: str, home: Path, out: Path) -> None:
    assert "torch imported: False transformers imported: False" in output
    assert not home.exists() or not any(home.iterdir()), sorted(home.rglob("*"))
    assert not out.exists()


def test_an_unknown_gate_fails_before_any_question_is_answered(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, output, home = run_cli(tmp_path, "eval-gate", "--gate", "nosuch", "--dataset",
                                 "popqa", "--n", "4", "--out", str(out))
    assert code == 2, output
    assert "unknown gate 'nosuch'; valid names:" in output
    assert "first-token-prob" in output and "answer-logprob" in output
    nothing_loaded(output, home, out)


def test_an_unknown_gate_inside_an_expression_is_named(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, output, home = run_cli(tmp_path, "eval-gate", "--gate", "first-token-prob&nosuch",
                                 "--dataset", "popqa", "--n", "4", "--out", str(out))
    assert code == 2, output
    assert "unknown gate 'nosuch'" in output
    nothing_loaded(output, home, out)


def test_a_weighted_gate_without_its_file_fails_in_one_line(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, output, home = run_cli(tmp_path, "eval-gate", "--gate", "weighted(missing.json)",
                                 "--dataset", "popqa", "--n", "4", "--out", str(out))
    assert code == 2, output
    assert "weighted(missing.json): no such file" in output and "Traceback" not in output
    nothing_loaded(output, home, out)


def test_an_unknown_dataset_fails_with_the_valid_names_and_no_progress_bar(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, output, home = run_cli(tmp_path, "bench", "--dataset", "nosuch", "--out", str(out))
    assert code == 2, output
    assert "unknown dataset 'nosuch'; valid names: 2wiki, hotpotqa, popqa, pubmedqa" in output
    assert "starting" not in output and "0/?" not in output
    nothing_loaded(output, home, out)


def test_selective_with_an_unknown_gate_fails_before_the_model(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, output, home = run_cli(tmp_path, "bench", "--dataset", "popqa", "--n", "2",
                                 "--methods", "no-rag,selective@quco|nosuch", "--out", str(out))
    assert code == 2, output
    assert "unknown gate 'nosuch'; valid names:" in output
    nothing_loaded(output, home, out)


def test_an_error_inside_the_run_leaves_no_progress_bar(tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, output, _ = run_cli(tmp_path, "bench", "--dataset", "popqa", "--data",
                              str(tmp_path / "missing.jsonl"), "--out", str(out))
    assert code == 2, output
    assert "missing.jsonl does not exist" in output
    assert "starting" not in output and "0/?" not in output


# ------------------------------------------------------------------- the names themselves
def test_the_listed_builtin_names_are_the_registered_ones() -> None:
    assert set(BUILTIN_GATE_NAMES) == set(core_gate_names())
    assert set(BUILTIN_METHOD_NAMES) == set(BUILTIN_METHODS)
    assert {"quco", "cbdr", "srrag"} <= set(gate_names())
    assert {"quco", "cbdr", "deeprag", "tokrag", "srrag"} <= set(method_names())


@pytest.mark.parametrize("expression", ["quco", "cbdr:0.4", "quco&cbdr",
                                        "cascade(quco,first-token-prob,0.2,0.8)",
                                        "(quco|answer-logprob:1.2)&srrag"])
def test_a_valid_expression_passes(expression: str) -> None:
    check_gate_names(expression)


@pytest.mark.parametrize(("names", "message"), [
    (["no-rag", "nosuch"], "unknown method 'nosuch'; valid names:"),
    (["no-rag@1"], "takes no @option"),
    (["selective"], "selective needs a gate"),
    (["selective@cbdr&nosuch"], "unknown gate 'nosuch'"),
    ([], "no method given"),
])
def test_bad_method_lists_are_refused(names: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        check_methods(names)


def test_valid_method_lists_pass() -> None:
    check_methods(["no-rag", "single", "selective@quco&cbdr", "fs-rag"])


# ------------------------------------------------------------------------------- the help
def _commands(command: Any, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = [path]
    for name, sub in sorted((getattr(command, "commands", None) or {}).items()):
        found += _commands(sub, (*path, name))
    return found


COMMANDS = _commands(typer.main.get_command(app))


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: " ".join(p) or "rag-gates")
def test_help_shows_no_value_after_a_flag(path: tuple[str, ...]) -> None:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "--help" in result.output
    assert "<bool>" not in result.output


@pytest.mark.parametrize("group", [p for p in COMMANDS if p in ((), ("srrag",), ("cbdr",),
                                                                ("deeprag",), ("index",))],
                         ids=lambda p: " ".join(p) or "rag-gates")
def test_command_summaries_are_not_broken_mid_sentence(group: tuple[str, ...]) -> None:
    """At a width that fits every summary on one line, no summary wraps: a line of the
    commands panel whose name column is empty is a docstring's own line break."""
    result = CliRunner().invoke(app, [*group, "--help"], env={"COLUMNS": "400"})
    panel = result.output.split("Commands")[1]
    rows = [line for line in panel.splitlines() if line.startswith("│")]
    assert rows, result.output
    continued = [line for line in rows if line[1:].startswith("   ")]
    assert continued == [], continued


def test_every_command_that_loads_a_model_takes_threads() -> None:
    """A command with --model (or info/demo, which load the embedded one) has --threads."""
    root = typer.main.get_command(app)
    missing = []
    for path in COMMANDS:
        command = root
        for name in path:
            command = command.commands[name]  # type: ignore[attr-defined]
        params = {p.name for p in command.params}
        loads = "model" in params or path in (("info",), ("demo",))
        if loads and "threads" not in params:
            missing.append(" ".join(path))
    assert missing == []


# ------------------------------------------------------- method options, before any import
@pytest.mark.parametrize(("method", "message"), [
    ("cbdr@2", "cbdr@2: the option is beta"),
    ("quco@-1", "quco@-1: the option is tau_entity"),
    ("srrag@1.5", "srrag@1.5: the option is tau"),
])
def test_an_out_of_range_method_option_fails_before_torch(tmp_path: Path, method: str,
                                                          message: str) -> None:
    out = tmp_path / "out"
    code, output, home = run_cli(tmp_path, "bench", "--dataset", "popqa", "--n", "2",
                                 "--methods", f"no-rag,{method}", "--out", str(out))
    assert code == 2, output
    assert message in output, output
    nothing_loaded(output, home, out)


# Every shipped method's option check, in one child process: the message, and whether torch
# or transformers were imported to give it.
CHECK_OPTIONS = ("import sys\n"
                 "from rag_gates_lab.names import check_methods\n"
                 "for name in sys.argv[1:]:\n"
                 "    try:\n"
                 "        check_methods([name])\n"
                 "        print(name, 'ok')\n"
                 "    except ValueError as exc:\n"
                 "        print(name, 'refused:', exc)\n"
                 "print('torch imported:', 'torch' in sys.modules, 'transformers imported:',\n"
                 "      'transformers' in sys.modules)\n")
BAD_OPTIONS = {
    "cbdr-ce@nan": "cbdr-ce@nan: the option is beta",
    "quco-no-runtime@x": "quco-no-runtime@x: the option is tau_entity",
    "srrag-no-knn@-0.1": "srrag-no-knn@-0.1: the option is tau",
    "srrag-knn-only@2": "srrag-knn-only@2: the option is tau",
    "tokrag@0": "tokrag@0: the option is a fusion layer",
    "cad@-1": "cad@-1: the option is alpha",
    "deeprag-likelihood@inf": "deeprag-likelihood@inf: the option is a log-probability margin",
    "deeprag-gate": "deeprag-gate needs a gate",
    "genread@3": "method 'genread' takes no @option; drop '@3'",
    "skr@0.5": "method 'skr' takes no @option",
}
GOOD_OPTIONS = ["cbdr@0.9", "quco@20", "srrag@0.2", "srrag-knn-only", "tokrag@authors-0",
                "cad@1", "deeprag-likelihood@-1.5", "deeprag-gate@quco", "genread", "skr"]


def test_every_shipped_method_option_is_checked_without_torch() -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", CHECK_OPTIONS, *BAD_OPTIONS, *GOOD_OPTIONS],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
                          check=False)
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stderr
    for (name, message), line in zip(BAD_OPTIONS.items(), lines, strict=False):
        assert line.startswith(f"{name} refused:") and message in line, line
    assert lines[len(BAD_OPTIONS):-1] == [f"{name} ok" for name in GOOD_OPTIONS]
    assert lines[-1] == "torch imported: False transformers imported: False"


def test_the_option_table_is_what_the_plugins_use() -> None:
    """The early check (no plugin imported) and the plugins' own validate_option are one
    table: a shipped method's option is checked the same before and after it loads."""
    from importlib.metadata import entry_points

    from rag_gates_lab.plugins.options import METHOD_OPTIONS

    shipped = [ep for ep in entry_points(group="rag_gates.methods")
               if ep.value.startswith("rag_gates_lab.plugins.")]
    assert {ep.name for ep in shipped} >= set(METHOD_OPTIONS)
    for ep in shipped:
        factory = ep.load()
        assert getattr(factory, "validate_option", None) is METHOD_OPTIONS.get(ep.name), ep.name
        assert bool(getattr(factory, "accepts_option", False)) == (ep.name in METHOD_OPTIONS)


@pytest.mark.parametrize(("command", "message"), [
    (("eval-gate", "--gate", "cbdr:2"), "gate 'cbdr' at threshold 2.0"),
    (("eval-gate", "--gate", "quco&srrag-knn-only:-0.5"), "gate 'srrag-knn-only' at threshold"),
    (("eval-gate", "--gate", "first-token-prob:7"), "gate 'first-token-prob' at threshold 7.0"),
    (("bench", "--methods", "no-rag,selective@skr:1.5"), "gate 'skr' at threshold 1.5"),
])
def test_an_out_of_range_gate_threshold_fails_before_torch(
        tmp_path: Path, command: tuple[str, ...], message: str) -> None:
    out = tmp_path / "out"
    code, output, home = run_cli(tmp_path, *command, "--dataset", "popqa", "--n", "2",
                                 "--out", str(out))
    assert code == 2, output
    assert message in output and "score scale" in output, output
    nothing_loaded(output, home, out)


def test_the_gate_range_table_is_what_the_plugins_declare() -> None:
    """The early check's score scales are the shipped gates' own: a threshold is refused the
    same before and after its plugin loads."""
    from importlib.metadata import entry_points

    from rag_gates.cbdr.gate import CBDRGate
    from rag_gates.confidence import (
        AnswerLogprobGate,
        FirstTokenLogprobGate,
        FirstTokenProbGate,
    )
    from rag_gates.p_true import PTrueGate
    from rag_gates.quco.gate import QuCoGate
    from rag_gates.registry import CORE_GATE_RANGES
    from rag_gates.sample_agreement import SampleAgreementGate
    from rag_gates_lab.plugins.options import SHIPPED_GATE_RANGES

    shipped = {ep.name: ep for ep in entry_points(group="rag_gates.gates")
               if ep.value.startswith("rag_gates_lab.plugins.")}
    assert set(shipped) == set(SHIPPED_GATE_RANGES)
    for name, ep in shipped.items():
        assert ep.load().threshold_range == SHIPPED_GATE_RANGES[name], name
    core = {"first-token-prob": FirstTokenProbGate, "answer-logprob": AnswerLogprobGate,
            "first-token-logprob": FirstTokenLogprobGate,
            "quco": QuCoGate, "cbdr": CBDRGate, "sample-agreement": SampleAgreementGate,
            "p-true": PTrueGate, "p-true-sampling": PTrueGate}
    assert {name: cls.threshold_range for name, cls in core.items()} == CORE_GATE_RANGES
