"""``import rag_gates.corpus`` stays light: no torch, transformers, infini_gram, numpy, httpx."""

from __future__ import annotations

import subprocess
import sys


def test_import_is_light() -> None:
    code = (
        "import sys, rag_gates, rag_gates.corpus, rag_gates.corpus.cli;"
        "heavy = [m for m in ('torch', 'transformers', 'infini_gram', 'numpy', 'httpx',"
        " 'tokenizers') if m in sys.modules];"
        "print(','.join(heavy))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == ""


def test_public_names() -> None:
    import rag_gates.corpus as corpus

    for name in corpus.__all__:
        assert hasattr(corpus, name), name
