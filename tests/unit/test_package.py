"""Packaging promises: a light import, extras that exist, a public API that is what it says."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import rag_gates
import rag_gates.errors
import rag_gates.lm
import rag_gates.types
from rag_gates._optional import EXTRAS, require
from rag_gates.testing import check_exports

ROOT = Path(__file__).resolve().parents[2]


def test_import_does_not_pull_heavy_frameworks() -> None:
    code = (
        "import sys, rag_gates, rag_gates.lm, rag_gates.types, rag_gates.cli;"
        "heavy = [m for m in ('torch', 'transformers', 'llama_index', 'langchain_core',"
        " 'sentence_transformers') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == ""


def test_every_extra_named_anywhere_exists_in_pyproject() -> None:
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"])
    assert declared >= EXTRAS
    named: set[str] = set()
    for path in (ROOT / "rag_gates").rglob("*.py"):
        text = path.read_text()
        named |= set(re.findall(r"rag-gates\[([a-z,]+)\]", text))
        for call in ast.walk(ast.parse(text)):
            if (isinstance(call, ast.Call) and getattr(call.func, "id", None) == "require"
                    and len(call.args) == 2 and isinstance(call.args[1], ast.Constant)):
                named.add(str(call.args[1].value))
    extras = {e for group in named for e in group.split(",")}
    assert extras, "expected at least one require(...) call"
    assert extras <= declared, extras - declared


def test_require_names_the_install_command() -> None:
    with pytest.raises(ImportError, match=r'pip install "rag-gates\[corpus\]"'):
        require("no_such_module_for_rag_gates", "corpus")
    with pytest.raises(ValueError, match="unknown extra"):
        require("json", "nope")


def test_dunder_all_matches_public_names() -> None:
    for module in (rag_gates, rag_gates.types, rag_gates.errors, rag_gates.lm):
        public = {n for n in dir(module) if not n.startswith("_")}
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name} missing"
        # Every exported class/function of the module's own is listed.
        own = {n for n in public
               if getattr(getattr(module, n), "__module__", "").startswith(module.__name__)
               and callable(getattr(module, n))}
        assert own <= set(module.__all__) | {"annotations"}, own - set(module.__all__)


@pytest.mark.parametrize("package", [
    "rag_gates.quco", "rag_gates.cbdr", "rag_gates.tokrag", "rag_gates.deeprag",
    "rag_gates.srrag", "rag_gates.corpus", "rag_gates.retrieval", "rag_gates.extract",
])
def test_method_package_all_is_what_it_binds_and_every_name_resolves(package: str) -> None:
    check_exports(package)
