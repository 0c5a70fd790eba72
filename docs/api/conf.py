"""Sphinx configuration of the API reference (``make docs``).

The reference is generated from the docstrings of the public names: what each package
below exports in its ``__all__``. At start-up this file writes one page per package into
``generated/`` (git-ignored, rewritten on every build) with an autodoc directive per name;
``index.rst`` lists the pages. A name a package re-exports from another documented package
(``rag_gates.GateDecision`` is ``rag_gates.types.GateDecision``) is documented once, where
it is defined, and linked from the others.

``make docs`` builds with ``-W``: every warning (a docstring that is not valid
reStructuredText, a name in ``__all__`` that does not import) fails the build.
"""

from __future__ import annotations

import builtins
import importlib
import inspect
import re
import sys
from pathlib import Path
from typing import Any

from sphinx.addnodes import pending_xref
from sphinx.errors import PycodeError
from sphinx.pycode import ModuleAnalyzer

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
PAGES = HERE / "generated"

#: The library: ``rag_gates`` without the lab (``rag_gates_lab``) and the test helpers
#: (``rag_gates.testing``).
LIBRARY = (
    "rag_gates", "rag_gates.gate", "rag_gates.calibration", "rag_gates.quco", "rag_gates.cbdr",
    "rag_gates.tokrag", "rag_gates.deeprag", "rag_gates.srrag", "rag_gates.lm",
    "rag_gates.corpus", "rag_gates.retrieval", "rag_gates.extract", "rag_gates.types",
    "rag_gates.errors", "rag_gates.gated", "rag_gates.rerank", "rag_gates.tools",
    "rag_gates.answers", "rag_gates.confidence", "rag_gates.methods", "rag_gates.registry",
    "rag_gates.peers",
)
#: The integrations: LangChain's package and LlamaIndex's leaf packages (each LlamaIndex
#: component type has its own namespace, ``llama_index.<type>.rag_gates``).
INTEGRATIONS = ("langchain_rag_gates", *sorted(
    f"llama_index.{init.parent.parent.name}.rag_gates" for init in
    (ROOT / "integrations" / "llama-index" / "llama_index").glob("*/rag_gates/__init__.py")))

project = "rag-gates"
author = "the rag-gates authors"
copyright = "the rag-gates authors"
extensions = ["sphinx.ext.autodoc", "sphinx.ext.napoleon", "sphinx.ext.viewcode"]
exclude_patterns = ["_build"]
html_theme = "alabaster"
html_title = "rag-gates API reference"
# The docstrings are Google style (Args:, Returns:, Raises:, Example:).
napoleon_google_docstring = True
napoleon_numpy_docstring = False
autodoc_typehints = "signature"
autodoc_typehints_format = "short"
autodoc_member_order = "bysource"
autodoc_default_options = {"show-inheritance": True}
# Pydantic and LangChain models carry long generated signatures; keep the page readable.
maximum_signature_line_length = 100
# `x` (single backticks) in a docstring is code, as on GitHub, like ``x``.
default_role = "code"


def _module_of(obj: Any) -> str | None:
    """Where a class or function is defined, or None for data (constants)."""
    if inspect.isclass(obj) or inspect.isfunction(obj) or inspect.isbuiltin(obj):
        return getattr(obj, "__module__", None)
    return None


def _home(name: str, obj: Any, exporters: dict[str, dict[str, Any]]) -> str | None:
    """The documented package a re-exported class or function is documented under: the
    longest package name that is a prefix of its module and exports the same object."""
    module = _module_of(obj)
    if module is None:
        return None
    homes = [package for package, names in exporters.items()
             if (module == package or module.startswith(package + "."))
             and names.get(name) is obj]
    return max(homes, key=len) if homes else None


def _data_docs(package: str, name: str, obj: Any) -> tuple[str, list[str]]:
    """Where a constant is defined (the package or the submodule it is imported from, found
    by its ``#:`` comment or the string after it) and its documentation lines."""
    prefix = package + "."
    for module_name in sorted(m for m in list(sys.modules) if m == package
                              or m.startswith(prefix)):
        module = sys.modules[module_name]
        if module is None or vars(module).get(name) is not obj:
            continue
        try:
            docs = ModuleAnalyzer.for_module(module_name).find_attr_docs()
        except PycodeError:
            continue
        if ("", name) in docs:
            return module_name, list(docs[("", name)])
    return package, []


def _directive(package: str, name: str, obj: Any) -> list[str]:
    full = f"{package}.{name}"
    if inspect.isclass(obj):
        return [f".. autoclass:: {full}", "   :members:", "   :undoc-members:", ""]
    if callable(obj):
        return [f".. autofunction:: {full}", ""]
    # A constant: autodoc reads a constant's ``#:`` documentation from the module that
    # assigns it, and a package only imports it, so the entry is written out here.
    _, docs = _data_docs(package, name, obj)
    value = repr(obj)
    lines = [f".. py:data:: {full}"]
    if len(value) <= 80 and "\n" not in value:
        lines.append(f"   :value: {value}")
    else:
        lines.append(f"   :type: {type(obj).__name__}")
    return [*lines, "", *(f"   {line}" if line else "" for line in docs), ""]


def _kind(obj: Any) -> int:
    """Classes first, then functions, then constants."""
    return 0 if inspect.isclass(obj) else 1 if callable(obj) else 2


def _public(package: str) -> dict[str, Any]:
    module = importlib.import_module(package)
    names = getattr(module, "__all__", None)
    if names is None:
        raise RuntimeError(f"{package} has no __all__: list its public names there")
    return {name: getattr(module, name) for name in names if name != "__version__"}


def _title(package: str) -> str:
    return f"``{package}``"


def write_pages() -> None:
    """One page per package: its docstring, then each public name it defines; the names it
    re-exports link to where they are documented."""
    exporters = {package: _public(package) for package in (*LIBRARY, *INTEGRATIONS)}
    PAGES.mkdir(exist_ok=True)
    wanted = set()
    for package, names in exporters.items():
        title = _title(package)
        lines = [title, "=" * len(title), "", f".. automodule:: {package}", ""]
        elsewhere = []
        for name, obj in sorted(names.items(), key=lambda item: _kind(item[1])):
            home = _home(name, obj, exporters)
            if home is not None and home != package:
                elsewhere.append(f":py:obj:`{home}.{name}`")
            else:
                lines += _directive(package, name, obj)
        if elsewhere:
            lines += ["Also exported here, documented where they are defined:", "",
                      *(f"- {link}" for link in elsewhere), ""]
        page = PAGES / f"{package}.rst"
        wanted.add(page.name)
        text = "\n".join(lines)
        if not page.is_file() or page.read_text(encoding="utf-8") != text:
            page.write_text(text, encoding="utf-8")
    for stale in PAGES.glob("*.rst"):
        if stale.name not in wanted:
            stale.unlink()


_FENCE = re.compile(r"^(?P<indent>\s*)```(?P<lang>[\w-]*)\s*$")


def markdown_fences(lines: list[str]) -> None:
    """Markdown code fences (```python ... ```, LangChain's docstring convention, which the
    integrations follow) as ``.. code-block::`` directives, in place."""
    out: list[str] = []
    i = 0
    while i < len(lines):
        opened = _FENCE.match(lines[i])
        if not opened:
            out.append(lines[i])
            i += 1
            continue
        indent, lang = opened["indent"], opened["lang"] or "text"
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:  # an unclosed fence: leave it for docutils to report
            out.append(lines[i])
            i += 1
            continue
        if out and out[-1].strip():
            out.append("")
        out += [f"{indent}.. code-block:: {lang}", ""]
        out += [f"{indent}   {line[len(indent):]}" if line.strip() else ""
                for line in lines[i + 1:end]]
        out.append("")
        i = end + 1
    lines[:] = out


def _process_docstring(app: Any, what: str, name: str, obj: Any, options: Any,
                       lines: list[str]) -> None:
    markdown_fences(lines)


def _public_bases(app: Any, name: str, obj: Any, options: Any, bases: list[type]) -> None:
    """A private base class (``_Composite``) is shown as the public classes it derives from."""
    shown: list[type] = []
    for base in bases:
        shown += ([b for b in base.__mro__[1:] if not b.__name__.startswith("_")][:1]
                  if base.__name__.startswith("_") else [base])
    bases[:] = list(dict.fromkeys(shown))


def _builtins_stay_builtins(app: Any, doctree: Any) -> None:
    """A type named like a builtin (``bytes`` in a signature) stays unlinked. Sphinx looks
    up a type's name "fuzzily" (any documented object whose name ends with it), so ``bytes``
    would link to the ``bytes`` field of ``TokenLogprob`` or, with two such fields, warn."""
    for ref in doctree.findall(pending_xref):
        if ref.get("refdomain") == "py" and ref.get("reftarget") in _BUILTINS \
                and ref.hasattr("refspecific"):
            del ref["refspecific"]


_BUILTINS = frozenset(dir(builtins))


def setup(app: Any) -> None:
    # before napoleon (priority 500), so its sections see directives, not fences
    app.connect("autodoc-process-docstring", _process_docstring, priority=400)
    app.connect("autodoc-process-bases", _public_bases)
    app.connect("doctree-read", _builtins_stay_builtins)


write_pages()
