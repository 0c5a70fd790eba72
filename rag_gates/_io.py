"""Small file helpers shared by the package."""

from __future__ import annotations

from pathlib import Path

__all__ = ["write_text_atomic"]


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename, so a reader never
    sees a half-written file and an interruption leaves the old one in place."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)
