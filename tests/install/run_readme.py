"""Run a README as a user would: its install lines in a fresh venv, then its Python snippets.

The README is the test's only source: code blocks are taken from it verbatim, never copied
here. What runs is chosen by a marker comment on the line right above a fenced block:

- ``<!-- readme-test: install -->`` above a ``bash`` block: each command line runs in order
  (``bash -e``, from the repository root, the venv's ``bin`` first on ``PATH``);
  ``<!-- readme-test: install-text-only -->`` marks a second way to install (the bare core,
  no torch), run with ``install --kind install-text-only`` into a venv of its own;
- every ``python`` block runs, in file order, in one interpreter (a later block sees what an
  earlier one defined, as in a session), unless marked
  ``<!-- readme-test: skip: REASON -->``; the reason must also be said in the README's text
  (the visible line right above the marker), so a reader knows the block is not run.

Stdlib only: it runs in the venv it tests.

    python tests/install/run_readme.py blocks README.md               # list what would run
    python tests/install/run_readme.py install README.md --venv DIR   # fresh venv + install lines
    DIR/bin/python tests/install/run_readme.py snippets README.md     # the Python blocks
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import subprocess
import sys
import time
import traceback
import venv
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_MARKER = re.compile(r"^<!--\s*readme-test:\s*(?P<kind>install-text-only|install|skip)"
                     r"(?::\s*(?P<reason>.*?))?\s*-->\s*$")
_FENCE = re.compile(r"^```(?P<lang>[\w-]*)\s*$")


@dataclass(frozen=True)
class Block:
    """One fenced code block: its language, text, first line and marker (if any)."""

    lang: str
    code: str
    line: int
    marker: str | None
    reason: str | None


def parse(path: Path) -> list[Block]:
    """Every fenced block of ``path`` with the marker on the line right above it; a skip
    marker without a reason, or whose reason the line above it does not mention, is an
    error (the README must tell its reader that the block is not run, and why)."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start = i
        i += 1
        body: list[str] = []
        while i < len(lines) and lines[i].strip() != "```":
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise SystemExit(f"{path}:{start + 1}: code block never closed")
        i += 1
        above = _MARKER.match(lines[start - 1]) if start > 0 else None
        kind = above.group("kind") if above else None
        reason = above.group("reason") if above else None
        if kind == "skip":
            visible = lines[start - 2] if start > 1 else ""
            if not reason or "not run" not in visible:
                raise SystemExit(
                    f"{path}:{start + 1}: a skipped block needs a reason in its marker and "
                    f"a visible line above the marker saying it is not run (got {visible!r})")
        blocks.append(Block(fence.group("lang"), "\n".join(body) + "\n", start + 2, kind,
                            reason))
    return blocks


def install_commands(path: Path, kind: str = "install") -> list[str]:
    """The command lines of the blocks marked ``kind`` (comments and blanks dropped)."""
    commands: list[str] = []
    for block in parse(path):
        if block.marker == kind:
            if block.lang != "bash":
                raise SystemExit(f"{path}:{block.line}: an install block must be bash")
            for line in block.code.splitlines():
                line = line.split(" #", 1)[0].strip()
                if line and not line.startswith("#"):
                    commands.append(line)
    return commands


def snippets(path: Path) -> list[Block]:
    """The Python blocks that run: every one not marked ``skip``."""
    return [b for b in parse(path) if b.lang == "python" and b.marker != "skip"]


def _install(path: Path, venv_dir: Path, fresh: bool, kind: str = "install") -> int:
    commands = install_commands(path, kind)
    if not commands:
        raise SystemExit(f"{path}: no block marked <!-- readme-test: {kind} -->")
    if fresh:
        venv.create(venv_dir, with_pip=True, clear=True)
    env = {**os.environ, "PATH": f"{venv_dir / 'bin'}{os.pathsep}{os.environ['PATH']}",
           "VIRTUAL_ENV": str(venv_dir)}
    env.pop("PYTHONPATH", None)  # only what the venv holds
    for command in commands:
        print(f"$ {command}", flush=True)
        start = time.perf_counter()
        done = subprocess.run(["bash", "-e", "-c", command], cwd=ROOT, env=env, check=False)
        print(f"  ({time.perf_counter() - start:.1f} s, exit {done.returncode})", flush=True)
        if done.returncode != 0:
            print(f"FAILED: {path}: {command}", file=sys.stderr)
            return done.returncode
    return 0


def _exec_block(block: Block, name: str, namespace: dict[str, object]) -> None:
    """Run the block statement by statement, as an interactive session would: a bare
    expression's value is printed (shortened), with the README line it stands on."""
    tree = ast.parse(block.code, filename=f"{name}:{block.line}")
    for node in tree.body:
        line = block.line + node.lineno - 1
        start = time.perf_counter()
        if isinstance(node, ast.Expr):
            code = compile(ast.Expression(node.value), f"{name}:{line}", "eval")
            value = repr(eval(code, namespace))
            value = value if len(value) <= 300 else value[:300] + " ..."
            print(f"  {name}:{line}: {value}", flush=True)
        else:
            module = ast.Module(body=[node], type_ignores=[])
            exec(compile(module, f"{name}:{line}", "exec"), namespace)
        took = time.perf_counter() - start
        if took > 5:
            print(f"  {name}:{line}: {took:.1f} s", flush=True)


def _run_snippets(path: Path) -> int:
    namespace: dict[str, object] = {"__name__": "__readme__"}
    os.chdir(ROOT)
    for block in snippets(path):
        print(f"--- {path.name}:{block.line}", flush=True)
        start = time.perf_counter()
        try:
            _exec_block(block, path.name, namespace)
        except Exception:
            # The traceback's line numbers are within the block; add its first line.
            traceback.print_exc()
            print(f"FAILED: {path}: the python block starting at line {block.line}",
                  file=sys.stderr)
            return 1
        print(f"    ok ({time.perf_counter() - start:.1f} s)", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    show = sub.add_parser("blocks", help="List the blocks and what happens to each.")
    show.add_argument("readme", type=Path)
    inst = sub.add_parser("install", help="Run the install lines in a venv.")
    inst.add_argument("readme", type=Path)
    inst.add_argument("--venv", type=Path, required=True)
    inst.add_argument("--reuse", action="store_true", help="Do not recreate the venv.")
    inst.add_argument("--kind", default="install", choices=["install", "install-text-only"],
                      help="Which marked install blocks to run.")
    run = sub.add_parser("snippets", help="Run the Python blocks in this interpreter.")
    run.add_argument("readme", type=Path)
    args = parser.parse_args(argv)
    if args.command == "blocks":
        for block in parse(args.readme):
            what = (block.marker if block.marker in ("install", "install-text-only") else
                    f"skip ({block.reason})" if block.marker == "skip" else
                    "run" if block.lang == "python" else "shown only")
            print(f"{args.readme}:{block.line}: {block.lang or '-'}: {what}")
        return 0
    if args.command == "install":
        return _install(args.readme, args.venv, fresh=not args.reuse, kind=args.kind)
    return _run_snippets(args.readme)


if __name__ == "__main__":
    sys.exit(main())
