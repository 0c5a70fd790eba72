"""The dependency direction: the library never imports the lab, and no modules import each
other in a loop.

The lab (``rag_gates_lab``, its own distribution in ``benchmarks/lab``) depends on the library,
never the reverse, so a user who wants one gate in their app does not load (or install) the
evaluation harness. The check reads the import
graph of the source (every ``import`` statement, at module level or inside a function, with
relative imports resolved) and follows it transitively; a grep of one file would miss an
import made through another module.

No circles: a module that imports another (at module level, inside a function or under
``TYPE_CHECKING``: each is a dependency of the source) is never imported back by it, directly
or through others, in the library or the lab.

The last part measures what importing the public packages loads: no torch, transformers or
sentence-transformers until a model is used.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAB_ROOT = ROOT / "benchmarks" / "lab"
METHOD_PACKAGES = ("quco", "cbdr", "tokrag", "deeprag", "srrag")
# The floors every method stands on; their CLI modules may reach the benchmark's data.
FLOORS = ("types", "gate", "rerank", "answers", "confidence", "prompts", "errors", "lm",
          "corpus", "retrieval", "extract")
BENCH = "rag_gates_lab"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, name: str) -> set[str]:
    """Every module ``path`` (module ``name``) imports, relative imports resolved; for
    ``from a import b`` both ``a`` and ``a.b`` (b may be a submodule)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[: len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def import_graph(*packages: Path) -> dict[str, set[str]]:
    """module -> the in-tree modules it imports, over the package directories ``packages``
    (default: the library and the lab; importing ``a.b.c`` runs ``a`` and ``a.b`` too, so
    parents are edges as well)."""
    dirs = packages or (ROOT / "rag_gates", LAB_ROOT / BENCH)
    files = {module_name(p, d.parent): p for d in dirs for p in d.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        edges: set[str] = set()
        for target in imports_of(path, name):
            parts = target.split(".")
            for i in range(1, len(parts) + 1):
                prefix = ".".join(parts[:i])
                if prefix in files and prefix != name:
                    edges.add(prefix)
        graph[name] = edges
    return graph


def reaches(graph: dict[str, set[str]], start: str, forbidden: str) -> list[str] | None:
    """The import chain from ``start`` to a module under ``forbidden``, or None."""
    parent: dict[str, str | None] = {start: None}
    queue = [start]
    while queue:
        node = queue.pop(0)
        if node == forbidden or node.startswith(forbidden + "."):
            chain = [node]
            while (prev := parent[chain[-1]]) is not None:
                chain.append(prev)
            return chain[::-1]
        for nxt in sorted(graph.get(node, ())):
            if nxt not in parent:
                parent[nxt] = node
                queue.append(nxt)
    return None


def violations(graph: dict[str, set[str]], starts: Iterable[str]) -> list[str]:
    return [" -> ".join(chain) for s in starts if (chain := reaches(graph, s, BENCH))]


def _under(graph: dict[str, set[str]], packages: Iterable[str]) -> list[str]:
    prefixes = tuple(f"rag_gates.{p}" for p in packages)
    return sorted(m for m in graph
                  if m.startswith(prefixes) and (m in prefixes or m.startswith(
                      tuple(p + "." for p in prefixes))))


def test_the_library_never_reaches_the_lab() -> None:
    """Every module of the library, its CLI included: the lab adds its commands through the
    ``rag_gates.cli`` entry points, never by an import."""
    graph = import_graph()
    assert any(m.startswith(BENCH + ".") for m in graph)  # the lab is in the graph
    starts = sorted(m for m in graph if m == "rag_gates" or m.startswith("rag_gates."))
    assert "rag_gates.cli" in starts and "rag_gates.commands.calibrate" in starts
    assert violations(graph, starts) == []


def test_method_packages_never_reach_the_benchmark() -> None:
    graph = import_graph()
    starts = _under(graph, METHOD_PACKAGES)
    assert "rag_gates.quco.pipeline" in starts and "rag_gates.cbdr.probe" in starts
    assert violations(graph, starts) == []


def test_floors_never_reach_the_benchmark() -> None:
    graph = import_graph()
    starts = [m for m in _under(graph, FLOORS) if not m.endswith(".cli")]
    assert "rag_gates.lm.hf" in starts and "rag_gates.types" in starts
    assert violations(graph, starts) == []


def test_calibration_never_reaches_the_benchmark() -> None:
    """rag_gates.calibration (certified thresholds, spec files, load_gate) is core: a user
    serving a spec does not load the evaluation harness."""
    graph = import_graph()
    starts = _under(graph, ("calibration",))
    assert "rag_gates.calibration.load" in starts and "rag_gates.calibration.fit" in starts
    assert violations(graph, starts) == []


def test_the_check_finds_an_indirect_and_a_lazy_import(tmp_path: Path) -> None:
    """The checker itself: a method that reaches the benchmark through a helper module, by a
    relative import inside a function, is caught with the whole chain."""
    pkg, lab = tmp_path / "rag_gates", tmp_path / "lab" / BENCH
    for directory in (pkg, pkg / "quco", pkg / "lm", pkg / "lm" / "deep", lab):
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "__init__.py").write_text("")
    (lab / "metrics.py").write_text("X = 1\n")
    (pkg / "lm" / "deep" / "helper.py").write_text(
        "def f():\n    from ... import quco\n    from rag_gates_lab import metrics\n")
    (pkg / "quco" / "gate.py").write_text("from rag_gates.lm.deep.helper import f\n")
    (pkg / "quco" / "clean.py").write_text("import json\n")
    graph = import_graph(pkg, lab)
    found = violations(graph, ["rag_gates.quco.gate", "rag_gates.quco.clean"])
    assert found == ["rag_gates.quco.gate -> rag_gates.lm.deep.helper -> rag_gates_lab"]
    assert "rag_gates.quco" in graph["rag_gates.lm.deep.helper"]  # the relative import


def written_graph(*packages: Path) -> dict[str, set[str]]:
    """module -> the in-tree modules its import statements name (``from a import b``: the
    module ``a.b`` when there is one, else ``a``); unlike :func:`import_graph`, without the
    parent packages Python runs on the way, which would make every package a circle with
    its own modules."""
    dirs = packages or (ROOT / "rag_gates", LAB_ROOT / BENCH)
    files = {module_name(p, d.parent): p for d in dirs for p in d.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                edges.update(a.name for a in node.names if a.name in files)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    parts = parts[: len(parts) - (node.level - 1)]
                    base = ".".join(parts + ([node.module] if node.module else []))
                else:
                    base = node.module or ""
                for alias in node.names:
                    if f"{base}.{alias.name}" in files:
                        edges.add(f"{base}.{alias.name}")
                    elif base in files:
                        edges.add(base)
        edges.discard(name)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: each set of two or more modules that reach each other
    (a strongly connected component, Tarjan's algorithm), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


# Circles being taken apart elsewhere, named so that a new one fails at once; the test also
# fails when one of them is gone, so this list only shrinks. (calibrate_by_group reads the
# calibration run's private checks; issue 56 asks for 0 circles.)
KNOWN_CIRCLES: list[list[str]] = []


def test_no_import_circles() -> None:
    """No two modules of the library or the lab import each other, directly or through
    others (lazy and type-only imports included)."""
    graph = written_graph()
    assert "rag_gates.lm.streams" in graph["rag_gates.lm.hf"]  # the graph is the real one
    assert circles(graph) == KNOWN_CIRCLES


def test_the_circle_check_finds_a_lazy_and_a_type_only_loop(tmp_path: Path) -> None:
    """The checker itself: a loop closed by an import inside a function and one closed by a
    ``TYPE_CHECKING`` import are both found; a package importing its own modules is not a
    circle."""
    pkg = tmp_path / "rag_gates"
    (pkg / "lm").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from rag_gates.lm import a\n")
    (pkg / "lm" / "__init__.py").write_text("from .a import A\n")
    (pkg / "lm" / "a.py").write_text("from rag_gates.lm.b import B\nA = 1\n")
    (pkg / "lm" / "b.py").write_text("B = 1\ndef f():\n    from . import c\n")
    (pkg / "lm" / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from rag_gates.lm.b import B\n")
    (pkg / "lm" / "d.py").write_text("import rag_gates.lm.e\n")
    (pkg / "lm" / "e.py").write_text("def g():\n    import rag_gates.lm.d\n")
    graph = written_graph(pkg)
    assert circles(graph) == [["rag_gates.lm.b", "rag_gates.lm.c"],
                              ["rag_gates.lm.d", "rag_gates.lm.e"]]


HEAVY = ("torch", "transformers", "sentence_transformers")
FRAMEWORKS = ("llama_index", "langchain_core", "langchain")
LIGHT_IMPORTS = [
    "rag_gates", "rag_gates.gate", "rag_gates.confidence", "rag_gates.quco", "rag_gates.cbdr",
    "rag_gates.lm", "rag_gates.retrieval", "rag_gates.corpus", "rag_gates.cli",
    "rag_gates.calibration",
    "langchain_rag_gates", "llama_index.llms.rag_gates", "llama_index.retrievers.rag_gates",
    "llama_index.query_engine.rag_gates", "llama_index.tools.rag_gates",
    "llama_index.postprocessor.rag_gates",
]


@pytest.mark.parametrize("module", LIGHT_IMPORTS)
def test_import_is_light(module: str) -> None:
    """Importing a public package loads no model library (and the core no framework)."""
    code = (
        "import sys, importlib; before = set(sys.modules); "
        f"importlib.import_module({module!r}); "
        "new = set(sys.modules) - before; tops = {m.split('.')[0] for m in new}; "
        "print(len(new)); "
        f"print(' '.join(sorted(tops & {set(HEAVY)!r}))); "
        f"print(' '.join(sorted(tops & {set(FRAMEWORKS)!r})))"
    )
    count, heavy, frameworks = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
    ).stdout.split("\n")[:3]
    assert int(count) > 0
    assert heavy == "", f"importing {module} loaded {heavy}"
    if module.startswith("rag_gates"):
        assert frameworks == "", f"importing {module} loaded {frameworks}"
