"""Running a document's ``python`` blocks as written, on real objects (shared by the tests
of the integration READMEs and of ``docs/``).

A document's blocks are read verbatim, by order, with the parser ``make test-install`` uses
(``tests/install/run_readme.py``). They run statement by statement with ``exec`` (a bare
expression's value is kept for the checks; tracebacks name the document's line; top-level
``await`` runs on a fresh event loop, as in an async REPL), in a namespace that starts from
the document's *prelude*: only the names it leaves to the reader, each bound to a real object.

The reader's project directory (:func:`workdir`): the paragraphs of the shipped HotpotQA
sample (``examples/my_documents.py``, the examples' stand-in for *your* documents) in
``docs/``, indexed with the READMEs' command ``rag-gates index build docs/ --out
indexes/docs`` (one cpu). ``RAG_GATES_HOME`` is private to the module (:func:`home`).
``tests/integration/conftest.py`` registers the fixtures.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import importlib.util
import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.install.run_readme import ROOT, Block, snippets

SCOTT = "Were Scott Derrickson and Ed Wood of the same nationality?"

# ---------------------------------------------------------------- running a block


def run_block(code: str, line: int, where: str, namespace: dict[str, Any]) -> list[Any]:
    """Execute ``code`` (document line ``line`` onwards) in ``namespace`` statement by
    statement, as a session would; returns the values of its bare expressions, in order. A
    statement with a top-level ``await`` runs to completion on a new event loop."""
    values: list[Any] = []
    tree = ast.parse(code, filename=f"{where}:{line}")
    for node in tree.body:
        name = f"{where}:{line + node.lineno - 1}"
        if isinstance(node, ast.Expr):
            compiled = compile(ast.Expression(node.value), name, "eval",
                               flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        else:
            compiled = compile(ast.Module(body=[node], type_ignores=[]), name, "exec",
                               flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
        value = eval(compiled, namespace)
        if compiled.co_flags & inspect.CO_COROUTINE:
            value = asyncio.run(value)
        if isinstance(node, ast.Expr):
            values.append(value)
    return values


def check_block_counts(paths: dict[str, Path], blocks: dict[str, int],
                       covered: set[tuple[str, int]]) -> None:
    """Each document still has the python blocks a test knows (matched by order), and
    ``covered`` (checked or skipped blocks) names each of them once."""
    for name, path in paths.items():
        found = len(snippets(path))
        assert found == blocks[name], (
            f"{path.relative_to(ROOT)} has {found} python blocks, this test knows "
            f"{blocks[name]}: update BLOCKS, the prelude and CHECKS (matched by order)")
    assert covered == {(d, i) for d, n in blocks.items() for i in range(1, n + 1)}


class Session:
    """One document's blocks in order, in namespaces that start from its prelude.

    ``chained`` (a reader's session): block ``i`` starts from what block ``i - 1`` left
    (:meth:`before` runs earlier blocks once). Not chained (the blocks are alternatives, e.g.
    one section per framework): every block starts from the prelude alone, so each must
    import what it uses. Each test runs its block in a copy.
    """

    def __init__(self, path: Path, prelude: dict[str, Any], workdir: Path, expected: int,
                 test_file: str, *, chained: bool = True) -> None:
        self.path = path
        self.where = str(path.relative_to(ROOT))
        self.blocks: list[Block] = snippets(path)
        if len(self.blocks) != expected:
            pytest.fail(
                f"{self.where} has {len(self.blocks)} python blocks, this test knows "
                f"{expected}: update the block count, the prelude and CHECKS in {test_file} "
                "for the added or removed block (blocks are matched by order)", pytrace=False)
        self.workdir = workdir
        self.chained = chained
        self.prelude = {"__name__": "__readme__", **prelude}
        self.states: dict[int, dict[str, Any]] = {1: self.prelude}

    def run(self, i: int) -> tuple[dict[str, Any], list[Any]]:
        """Block ``i`` as written, in a copy of the namespace before it; a run that succeeds
        becomes the state later blocks start from (when chained)."""
        namespace = self.before(i)
        block = self.blocks[i - 1]
        with contextlib.chdir(self.workdir):
            values = run_block(block.code, block.line, self.where, namespace)
        self.states.setdefault(i + 1, namespace)
        return namespace, values

    def before(self, i: int) -> dict[str, Any]:
        if not self.chained:
            return dict(self.prelude)
        while max(self.states) < i:
            self.run(max(self.states))
        return dict(self.states[i])

    def close(self) -> None:
        from rag_gates.corpus.base import CorpusStats

        for state in self.states.values():
            for value in state.values():
                if isinstance(value, CorpusStats):
                    with contextlib.suppress(Exception):
                        value.close()


# ---------------------------------------------------------------- the reader's side


def my_documents() -> list[dict[str, str]]:
    """The examples' stand-in for the reader's documents: the 491 distinct paragraphs of
    the shipped HotpotQA sample (``examples/my_documents.py``), as ``id``/``title``/``text``."""
    spec = importlib.util.spec_from_file_location(
        "readme_my_documents", ROOT / "examples" / "my_documents.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    docs: list[dict[str, str]] = module.my_documents()
    return docs


def build_index_cli(root: Path, out: str, *extra: str) -> Path:
    """``rag-gates index build docs/ --out OUT EXTRA... --cpus 1 --quiet`` in ``root``."""
    from typer.testing import CliRunner

    from rag_gates.cli import app

    with contextlib.chdir(root):
        done = CliRunner().invoke(app, ["index", "build", "docs/", "--out", out, *extra,
                                        "--cpus", "1", "--quiet"])
    assert done.exit_code == 0, done.output
    return root / out


def reader_gate(workdir: Path) -> Any:
    """The reader's ``gate`` ("any rag_gates.gate.Gate"): QuCo's corpus-statistics gate over
    the reader's index (deterministic, no model): no entity or a common one (more than 10
    documents) -> no retrieval, rare entities -> retrieve."""
    from rag_gates.corpus import LocalInfiniGram
    from rag_gates.quco import QuCoGate

    return QuCoGate(LocalInfiniGram(workdir / "indexes" / "docs"), tau_entity=10)


@pytest.fixture(scope="module")
def documents() -> list[dict[str, str]]:
    return my_documents()


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A private ``RAG_GATES_HOME`` for the module, so the verified-digest records of the
    temporary indexes (``index-checks/``) never land in the user's; its ``models`` and
    ``model-files`` link to the user's, where ``rag-gates models install`` put the embedded
    models."""
    from rag_gates.lm.defaults import rag_gates_home

    user, private = rag_gates_home(), tmp_path_factory.mktemp("rag-gates-home")
    for name in ("models", "model-files"):
        if (user / name).is_dir():
            (private / name).symlink_to(user / name, target_is_directory=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RAG_GATES_HOME", str(private))
        yield private


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory, documents: list[dict[str, str]],
            home: Path) -> Path:
    """The reader's project directory: ``docs/`` and the README's ``indexes/docs``, built with
    its command ``rag-gates index build docs/ --out indexes/docs`` (plus ``--cpus 1
    --quiet``). In this corpus "United States" is in 91 documents, "Scott Derrickson" and "Ed
    Wood" in 6 each, and "Ed Wood" never shares a document with "Paris"."""
    pytest.importorskip("infini_gram",
                        reason='needs the corpus extra: pip install "rag-gates[corpus]"')
    root = tmp_path_factory.mktemp("reader-project")
    (root / "docs").mkdir()
    (root / "docs" / "my-docs.jsonl").write_text(
        "".join(json.dumps(d) + "\n" for d in documents), encoding="utf-8")
    build_index_cli(root, "indexes/docs")
    return root
