"""The Python blocks of ``docs/methods/*.md``, read verbatim (the parser ``make test-install``
uses), checked without running them: every import resolves; every name a block reads is bound
by the page's blocks (in order) or is one the page leaves to the reader (:data:`READER`);
every keyword a block passes to an imported class or function, or to a method of an object
made from one, is in its signature.

Static on purpose: the blocks load the embedded 135M model and need the reader's index,
retriever and documents; what their calls do is tested by each method's own tests. A block
that uses a name it never imports (docs/methods/deeprag.md's ``QuCoGate``, before) or a
keyword the code renamed fails here.
"""

from __future__ import annotations

import ast
import builtins
import inspect
from pathlib import Path
from typing import Any

import pytest

from tests.install.run_readme import ROOT, snippets

PAGES = sorted((ROOT / "docs" / "methods").glob("*.md"))
#: The names each page leaves to the reader (its text says what they are).
READER = {
    "cbdr.md": {"question", "passages", "retriever", "index", "llm", "vectorstore"},
    "deeprag.md": {"retriever", "stats"},
    "quco.md": {"lm", "retriever", "question"},
    "srrag.md": {"bm25"},
    "tokrag.md": {"passages"},
}


def _bound(tree: ast.AST) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.arg):
            names.add(node.arg)
    return names


def _read(tree: ast.AST) -> set[str]:
    return {node.id for node in ast.walk(tree)
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load)}


def _imports(tree: ast.Module) -> dict[str, Any]:
    """The block's imports, executed (a missing module or name fails the test)."""
    namespace: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            exec(compile(ast.Module(body=[node], type_ignores=[]), "<docs>", "exec"), namespace)
    namespace.pop("__builtins__", None)
    return namespace


def _callee(func: ast.expr, known: dict[str, Any]) -> Any:
    """What a call calls, where the page says: an imported name, an attribute of one (a
    classmethod), or a method of an object a call of an imported class made."""
    if isinstance(func, ast.Name):
        return known.get(func.id)
    if isinstance(func, ast.Attribute):
        owner = _callee(func.value.func, known) if isinstance(func.value, ast.Call) else (
            known.get(func.value.id) if isinstance(func.value, ast.Name) else None)
        if inspect.isclass(owner):
            return getattr(owner, func.attr, None)
    return None


def _keyword_problems(tree: ast.Module, known: dict[str, Any], where: str) -> list[str]:
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            made = _callee(node.value.func, known)
            for target in node.targets:  # x = ImportedClass(...): x's methods are known
                if isinstance(target, ast.Name) and inspect.isclass(made):
                    known[target.id] = made
        if not isinstance(node, ast.Call):
            continue
        callee = _callee(node.func, known)
        if callee is None or not callable(callee):
            continue
        try:
            params = inspect.signature(callee).parameters
        except (TypeError, ValueError):
            continue
        if any(p.kind is p.VAR_KEYWORD for p in params.values()):
            continue
        for keyword in node.keywords:
            if keyword.arg is not None and keyword.arg not in params:
                problems.append(f"{where}:{node.lineno}: {ast.unparse(node.func)}() has no "
                                f"keyword {keyword.arg!r}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_each_methods_page_block_imports_binds_and_calls_what_exists(page: Path) -> None:
    assert page.name in READER, f"add {page.name} to READER: the names it leaves to the reader"
    blocks = snippets(page)
    assert blocks, f"{page.name} has no python block"
    bound = set(READER[page.name]) | set(dir(builtins))
    known: dict[str, Any] = {}
    for block in blocks:
        where = f"docs/methods/{page.name}:{block.line}"
        tree = ast.parse(block.code, filename=where)
        known.update(_imports(tree))
        bound |= _bound(tree)
        unbound = _read(tree) - bound
        assert not unbound, f"{where}: the block uses {sorted(unbound)}, which neither it, " \
            "an earlier block nor the reader (READER) binds"
        problems = _keyword_problems(tree, dict(known), where)
        assert not problems, "\n".join(problems)


def test_the_checks_catch_an_unimported_name_and_an_unknown_keyword() -> None:
    """The two faults the test exists for, in a block written here."""
    tree = ast.parse("from rag_gates.cbdr import CBDRGate\n"
                     "from rag_gates.quco import QuCoGate\n"
                     "gate = QuCoGate(stats, tau_entity=20, tau=3)\n"
                     "cbdr = CBDRGate(lm, probe)\n"
                     "cbdr.prefill('Who wrote Hamlet?', max_tokens=32)\n"
                     "CBDRGate(lm, probe).prefill('Who wrote Hamlet?', max_new_tokens=32)\n"
                     "agent = DeepRAG(lm, retriever)\n")
    known = _imports(tree)
    assert _read(tree) - _bound(tree) - set(dir(builtins)) == {"stats", "DeepRAG", "lm",
                                                              "probe", "retriever"}
    problems = sorted(_keyword_problems(tree, known, "here"))
    assert problems == ["here:3: QuCoGate() has no keyword 'tau'",
                        "here:5: cbdr.prefill() has no keyword 'max_tokens'"]
