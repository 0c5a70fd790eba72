"""``rag-gates calibrate``: which gate, at which threshold, with a stated risk bound, on your
own questions.

It answers each question closed book and with retrieval (``--corpus``), scores every gate
that applies to the model, writes the per-question records (resumable, in ``--work-dir``),
certifies a threshold per gate and for a fitted composite
(:func:`rag_gates.calibration.calibrate`), prints one table, and writes the best gate's spec
(``--out``, load it with :func:`rag_gates.calibration.load_gate`) and a plot of the certified
skip rate against epsilon for each gate and the composite.

``--data`` is JSON Lines, one question a line: ``{"question": "...", "answers": ["gold", "alias",
...]}`` with an optional ``"id"`` (default: the line number) and an optional ``"group"`` (a
relation, a topic, a tenant: ``--by-group`` certifies one threshold per group); other fields
are ignored. An
answer counts as right when a gold answer occurs in it (normalised words, as the bench's
``accuracy``). The work directory is tied to the file's question set (ids, questions and
answers, in any order), so a reordered file resumes; ``--limit N`` uses the first N questions
and leaves the records of the others in the work directory. Give every line an ``"id"`` for
reordering to resume: a line's default id is its number.

``--corpus`` is one of:

- JSON Lines with ``"text"`` (optional ``"title"``, ``"id"``) or a folder of ``.txt`` files
  (one passage each, titled by the file name), searched with BM25;
- ``qdrant:PATH_OR_URL[#COLLECTION]``: a Qdrant collection (default ``passages``) of
  passages embedded with the embedded all-MiniLM-L6-v2, as
  :meth:`~rag_gates.retrieval.QdrantDenseRetriever.build` writes them; ``PATH`` is a local
  Qdrant folder (read into a private copy, so another process may hold it), a URL
  (``http(s)://HOST:6333``) a Qdrant server (its API key from ``QDRANT_API_KEY``).

The gates (``--gates auto``): for an in-process model ``answer-logprob``,
``first-token-prob`` and ``cbdr``; for a served one (``--model openai:URL``) every gate its
replies allow: ``answer-logprob`` and ``first-token-logprob`` (log-probabilities of the
generated tokens and their top alternatives) and ``sample-agreement`` (text only); and
``quco`` for both, counting the question's entities in an infini-gram index of the corpus
that calibrate builds (cached; the ``corpus`` extra) or that ``--corpus-stats`` names. A gate
that does not apply is skipped with why; the composites are fitted over those built.
``p-true-sampling`` (P(True) with brainstormed samples, Kadavath et al. 2022:
:mod:`rag_gates.p_true`) is tried for a served model whose server echoes the prompt's
log-probabilities in the form it sends: its prompt is a chat prompt, so it needs
``--chat-template`` (without it the chat endpoint echoes nothing and the gate is skipped,
saying so); in process it is asked for with ``--gates``, as ``p-true`` (plain P(True)) is on
either.

``--chat-template PATH_OR_NAME`` (a served model only, as ``rag-gates bench``'s): the model's
chat template, ``default`` (the embedded SmolLM2's), a template file, or a model directory
holding ``chat_template.jinja`` or a ``tokenizer_config.json`` with one
(:func:`~rag_gates.lm.openai_compat.load_chat_template`). Chat prompts are then rendered here
and sent to the server's completions endpoint, where the echoed prompt log-probabilities let
``score()`` read them (P(True)); every chat prompt goes that way, the answers too, so the
template is part of the work directory's identity (resuming one with another template, or
adding or dropping one, is refused, saying which). An in-process model uses its tokenizer's
own template: the option is refused there.

``--concurrency N`` (a served model only, as ``rag-gates bench``'s): N questions in flight, so
a batching server (vLLM, llama.cpp's ``--parallel`` slots) answers them together; the
records are written in question order, the same lines as a sequential run's, and an
interrupted run leaves a prefix that the next run resumes.

Example:
    rag-gates calibrate --data examples/data/calibration_questions.jsonl \\
        --corpus examples/data/calibration_corpus.jsonl --out gate.json
    rag-gates calibrate --data my_questions.jsonl --corpus qdrant:indexes/qdrant#docs
    rag-gates calibrate --data my_questions.jsonl --corpus docs.jsonl \\
        --model openai:http://127.0.0.1:8000/v1 --concurrency 8
    rag-gates calibrate --data my_questions.jsonl --corpus docs.jsonl \\
        --model openai:http://127.0.0.1:8000/v1 --chat-template default
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer
from rich.console import Console
from rich.table import Table

from rag_gates._console import error_line

# The per-question records and the work directory's identity live in calibrate_records;
# every name stays importable from here (tests, benchmarks and docs use this module).
from rag_gates.commands.calibrate_records import (  # noqa: F401  (re-exported)
    _AFTER_LOAD,
    _IDENTITY_NAMES,
    _SERIAL_GATES,
    SERVED_PREFIX,
    WORK_LOCK,
    CalibrationQuestion,
    _check_work_dir,
    _decide,
    _score,
    chat_template_identity,
    collect_records,
    in_order,
    model_files_fingerprint,
)
from rag_gates.errors import ArtifactError, VectorStoreError

if TYPE_CHECKING:
    from rag_gates.calibration.certify import Bound

__all__ = ["CalibrationQuestion", "QdrantCollection", "QdrantCorpus", "SkipPlot",
           "calibrate_command", "collect_records", "fixed_draws", "open_qdrant_corpus",
           "parse_corpus", "plot_skip_curves", "question_set_sha", "read_chat_template",
           "read_corpus", "read_questions", "run_calibration", "skip_curves"]

console = Console()

AUTO_GATES = ("answer-logprob", "first-token-prob", "first-token-logprob", "sample-agreement",
              "p-true-sampling", "cbdr", "quco")
"""What ``--gates auto`` tries, in order; each is kept only where it applies to the model
(``first-token-logprob`` where ``first-token-prob`` does not: the same score, read from a
reply; ``sample-agreement`` and ``p-true-sampling`` for a model that is not in process: on
one, each costs ``samples`` generations a question, so ask for it with ``--gates``;
``p-true-sampling`` where the server echoes the log-probabilities of the prompt's tokens, in
the form the gate sends (a chat prompt: it needs ``--chat-template``, else it is skipped,
saying so). ``p-true``, plain P(True), is asked for by name."""
#: Why calibrate skips QuCo on a Qdrant corpus without --corpus-stats (it does not read a
#: whole collection back to index it).
QUCO_NOT_BUILT = ("needs corpus statistics (an infini-gram index of the corpus): give "
                  "--corpus-stats INDEX_DIR (rag-gates index build), or a JSONL / .txt "
                  "folder --corpus, which calibrate indexes itself")
MAX_CONCURRENCY = 64
"""``--concurrency``'s ceiling, as ``rag-gates bench``'s."""
PLOT_EPSILONS = (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2)
QDRANT_PREFIX = "qdrant:"
QDRANT_COLLECTION = "passages"
"""The collection of ``qdrant:PATH`` without ``#COLLECTION``: QdrantDenseRetriever.build's."""
QDRANT_SYNTAX = "--corpus qdrant:PATH_OR_URL[#COLLECTION]"
QDRANT_API_KEY_ENV = "QDRANT_API_KEY"
MAX_INPUT_DEPTH = 16
"""Nesting of a ``--data`` or corpus line (a question nests 2 levels: its answers)."""
MAX_GROUP_CHARS = 200
"""A ``--data`` line's ``group`` is a name (rag_gates.calibration.records.MAX_GROUP_CHARS)."""


def _jsonl(path: Path, keys: Sequence[str], what: str, shape: str
           ) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) of a JSONL file whose rows are objects with ``keys``, read through
    the bounded reader (:func:`rag_gates._files.iter_jsonl`: UTF-8, nesting, finite numbers,
    no lone surrogates); a bad line raises :class:`~rag_gates.errors.InputFileError` naming
    ``FILE:LINE``, with the shape it should have."""
    from rag_gates._files import iter_jsonl
    from rag_gates.errors import InputFileError

    fix = f"each line is {shape}"
    for number, row in iter_jsonl(path, max_depth=MAX_INPUT_DEPTH, fix=fix):
        missing = [k for k in keys if k not in row]
        if missing:
            raise InputFileError(f"{path}:{number}: not {what} (missing {missing}); {fix}",
                                 path=path, line=number)
        yield number, row


def read_questions(path: Path, *, labels_optional: bool = False
                   ) -> list[CalibrationQuestion]:
    """Read ``--data``: JSONL with ``question`` and ``answers`` (optional ``id``, ``group``).
    A bad row
    (not UTF-8, not JSON, a lone surrogate, an answer empty once normalised, a repeated id)
    raises :class:`~rag_gates.errors.InputFileError` naming ``FILE:LINE``; no model is
    needed to read it, so the CLI reads it before one loads. ``labels_optional``
    (``--no-labels``): a row may omit ``answers`` (or give ``[]``): its question is then
    certified by whether its two replies agree."""
    from rag_gates.answers import normalize_answer
    from rag_gates.errors import InputFileError

    if not path.is_file():
        raise ValueError(f"--data {path} does not exist; give a JSONL file of "
                         '{"question": ..., "answers": [...]} lines')
    out: list[CalibrationQuestion] = []
    seen: set[str] = set()
    lines: dict[tuple[str, tuple[str, ...]], int] = {}
    keys = ("question",) if labels_optional else ("question", "answers")
    for number, row in _jsonl(path, keys, "a calibration question",
                              '{"question": "...", "answers": ["..."]}' + (
                                  " (answers optional with --no-labels)" if labels_optional
                                  else " (questions without answers: pass --no-labels)")):
        question, answers = row["question"], row.get("answers", [])
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(question, str) or not question.strip() or not isinstance(
                answers, list) or (not answers and not labels_optional) or not all(
                    isinstance(a, str) for a in answers):
            raise InputFileError(f"{path}:{number}: 'question' must be a non-empty string and "
                                 "'answers' a " + ("list of strings (empty or left out: no "
                                                   "labels)" if labels_optional else
                                                   "non-empty list of strings (or pass "
                                                   "--no-labels)"), path=path, line=number)
        # An answer the matcher reduces to nothing ("", "  ", "the", "?") is never found in
        # a reply: its question would enter certification as wrong both ways and hide harm.
        empty = [a for a in answers if not normalize_answer(a)]
        if empty:
            raise InputFileError(
                f"{path}:{number}: answer {empty[0]!r} is empty once normalised (case, "
                "punctuation and articles removed), so no reply can ever match it; give "
                "the gold answer's words or remove it", path=path, line=number)
        group = row.get("group")
        if group is not None and (not isinstance(group, str) or not group.strip()
                                  or len(group) > MAX_GROUP_CHARS):
            raise InputFileError(f"{path}:{number}: 'group' must be a non-empty string of at "
                                 f"most {MAX_GROUP_CHARS} characters (a relation, a topic, a "
                                 "tenant), or left out", path=path, line=number)
        qid = str(row.get("id") or number)
        if qid in seen:
            raise InputFileError(f"{path}:{number}: id {qid!r} appears twice", path=path,
                                 line=number)
        seen.add(qid)
        # The bound counts independent draws: the same question and answers twice (a file
        # concatenated with itself) would be counted twice.
        key = (question.strip(), tuple(sorted(answers)))
        if key in lines:
            raise InputFileError(
                f"{path}:{number}: the same question and answers as line {lines[key]}; each "
                "question counts once in the certificate: remove the repeat", path=path,
                line=number)
        lines[key] = number
        out.append(CalibrationQuestion(id=qid, question=question, answers=tuple(answers),
                                       group=group))
    if not out:
        raise ValueError(f"--data {path} has no questions")
    return out


def question_set_sha(questions: Sequence[CalibrationQuestion]) -> str:
    """SHA-256 of the canonical question set: (id, question, answers) of every question,
    sorted by id (answers sorted too: any of them counts), so the order of the lines of
    ``--data`` does not count and any edit of a question or its answers does. A question's
    ``group`` is not in it: the answers do not depend on it, so adding or changing groups
    resumes (the records take their groups from ``--data``)."""
    rows = sorted([q.id, q.question, sorted(q.answers)] for q in questions)
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False, separators=(",", ":"))
                          .encode("utf-8")).hexdigest()


def read_corpus(path: Path) -> list[Any]:
    """Read ``--corpus``: JSONL with ``text`` (optional ``title``, ``id``) or a folder of
    ``.txt`` files, as passages. A file or line that is not text (not UTF-8, binary, a
    directory named ``*.txt``, a bad line) raises :class:`~rag_gates.errors.InputFileError`
    naming it (``FILE:LINE`` for a line)."""
    from pydantic import ValidationError

    from rag_gates._files import read_text
    from rag_gates.errors import InputFileError
    from rag_gates.types import Passage

    passages: list[Passage] = []
    if path.is_dir():
        for file in sorted(path.rglob("*.txt")):
            text = read_text(file, fix="a corpus folder holds UTF-8 .txt files, one passage "
                             "each; convert or remove it").strip()
            if text:
                passages.append(Passage(id=str(file.relative_to(path)), title=file.stem,
                                        text=text))
        if not passages:
            raise ValueError(f"--corpus {path} holds no non-empty .txt file")
        return passages
    if not path.is_file():
        raise ValueError(f"--corpus {path} does not exist; give a JSONL file with a 'text' "
                         "field per line or a folder of .txt files")
    for number, row in _jsonl(path, ("text",), "a passage",
                              '{"text": "...", "title": "..." (optional)}'):
        text = row["text"]
        if not isinstance(text, str) or not text.strip():
            raise InputFileError(f"{path}:{number}: 'text' must be a non-empty string",
                                 path=path, line=number)
        try:
            passages.append(Passage(id=str(row.get("id") or number), title=row.get("title"),
                                    text=text))
        except ValidationError as exc:
            raise InputFileError(f"{path}:{number}: not a passage ({exc.errors()[0]['msg']}); "
                                 'each line is {"text": "...", "title": "..." (optional)}',
                                 path=path, line=number) from None
    if not passages:
        raise ValueError(f"--corpus {path} has no passages")
    return passages


def _sha(path: Path) -> str:
    """sha256 of a file, or of a folder's .txt files: for a folder each file's relative path
    (its passage id and title) and length go in too, so renaming a file or moving text
    between files is another corpus."""
    digest = hashlib.sha256()
    if not path.is_dir():
        digest.update(path.read_bytes())
        return digest.hexdigest()
    for file in sorted(path.rglob("*.txt")):
        content = file.read_bytes()
        digest.update(f"{file.relative_to(path).as_posix()}\0{len(content)}\0".encode())
        digest.update(content)
    return digest.hexdigest()


@dataclass(frozen=True)
class QdrantCorpus:
    """``--corpus qdrant:PATH_OR_URL[#COLLECTION]``: a local Qdrant folder (absolute path)
    or a server URL, and the collection of passages."""

    location: str
    collection: str

    @property
    def remote(self) -> bool:
        from rag_gates._http import is_http_url

        return is_http_url(self.location)

    def __str__(self) -> str:
        return f"{QDRANT_PREFIX}{self.location}#{self.collection}"


def parse_corpus(text: str) -> Path | QdrantCorpus:
    """``--corpus``: a JSONL file or a folder of .txt files (a Path), or
    ``qdrant:PATH_OR_URL[#COLLECTION]`` (the collection defaults to ``passages``).

    Example:
        >>> parse_corpus("qdrant:http://localhost:6333#docs")
        QdrantCorpus(location='http://localhost:6333', collection='docs')
    """
    from rag_gates._http import (
        check_server_url,
        is_http_url,
        looks_like_server,
        redact_url,
        scrub_text,
    )

    if text[:len(QDRANT_PREFIX)].lower() != QDRANT_PREFIX:
        if looks_like_server(text):  # never a path: "does not exist" would show it
            raise ValueError(f"--corpus {scrub_text(redact_url(text), [])!r}: a Qdrant server "
                             f"is given as {QDRANT_SYNTAX} (qdrant:http://HOST:6333#COLLECTION),"
                             f" with the API key in {QDRANT_API_KEY_ENV}")
        return Path(text)
    location, hashed, collection = text[len(QDRANT_PREFIX):].partition("#")
    if not location or (hashed and not collection):
        shown = scrub_text(redact_url(text), [])
        raise ValueError(f"--corpus {shown!r}: give {QDRANT_SYNTAX}, e.g. "
                         "qdrant:indexes/qdrant#docs (a local Qdrant folder) or "
                         "qdrant:http://localhost:6333#docs (a server)")
    if is_http_url(location):
        check_server_url(location, f"the URL of {QDRANT_SYNTAX}",
                         f"Put the API key in the environment variable {QDRANT_API_KEY_ENV}")
    elif looks_like_server(location):
        # Never taken as a local path: a "no Qdrant folder at ..." error would show it.
        raise ValueError(
            f"--corpus qdrant:{redact_url(location)}: a server needs its scheme "
            f"(qdrant:http://HOST:6333#COLLECTION) and no credentials in the URL; put the "
            f"API key in the environment variable {QDRANT_API_KEY_ENV}. A local folder: "
            "give its path (./NAME for a folder whose name holds ':' or '@')")
    else:
        location = str(Path(location).expanduser().resolve())
    return QdrantCorpus(location, collection or QDRANT_COLLECTION)


@dataclass(frozen=True)
class QdrantCollection:
    """An opened ``--corpus qdrant:...``: its client (a private in-memory copy of a local
    folder's collection) and what the spec and the work directory say about it."""

    source: QdrantCorpus
    client: Any
    points: int
    vector_size: int
    distance: str

    @property
    def identity(self) -> dict[str, Any]:
        """The work directory's corpus identity: which collection, how big, which vectors."""
        from rag_gates.lm.defaults import DEFAULT_EMBEDDER_ID

        return {"qdrant": self.source.location, "collection": self.source.collection,
                "points": self.points, "vector_size": self.vector_size,
                "embedder": DEFAULT_EMBEDDER_ID}

    def describe(self, k: int) -> str:
        from rag_gates.lm.defaults import DEFAULT_EMBEDDER_ID

        return (f"dense ({DEFAULT_EMBEDDER_ID}) over Qdrant collection "
                f"{self.source.collection!r} at {self.source.location} ({self.points} points, "
                f"{self.vector_size}-d vectors, {self.distance}), k={k}")

    def check_embedder(self, embedder: Any) -> None:
        """The collection's vectors have the size the embedder gives (else it was embedded
        with another model, and a search would fail or mean nothing)."""
        from rag_gates.lm.defaults import DEFAULT_EMBEDDER_ID

        size = len(embedder.encode(["size probe"], normalize_embeddings=True)[0])
        if size != self.vector_size:
            raise ArtifactError(
                f"--corpus {self.source}: the collection holds {self.vector_size}-d vectors, "
                f"but {DEFAULT_EMBEDDER_ID} embeds in {size}-d: it was embedded with another "
                "model. Rebuild it with QdrantDenseRetriever.build(passages, path=... or "
                "url=..., collection=...), or give a JSONL corpus (BM25)")


def _local_collections(folder: Path) -> list[str]:
    """The collection names of a local Qdrant folder (its meta.json), for an error message.
    A damaged meta.json (not UTF-8, not JSON, nested too deep, not an object) raises
    :class:`~rag_gates.errors.ArtifactFileError` naming it."""
    from rag_gates._files import read_json
    from rag_gates.errors import ArtifactFileError

    meta = read_json(folder / "meta.json", expect=dict, error=ArtifactFileError,
                     fix="the Qdrant folder is damaged; rebuild it with "
                         "QdrantDenseRetriever.build(passages, path=..., collection=...)")
    collections = meta.get("collections")
    return sorted(str(name) for name in collections) if isinstance(
        collections, dict | list) else []


def _collection_names(client: Any) -> list[str]:
    """A server's collection names (for an error message); none when it will not say."""
    try:
        return sorted(c.name for c in client.get_collections().collections)
    except Exception:  # already asked once by connect_server; a later failure names none
        return []


def open_qdrant_corpus(source: QdrantCorpus) -> QdrantCollection:
    """Open ``--corpus qdrant:...`` and check it holds passages to search: the collection
    exists, has points, one unnamed vector, and a passage payload ({"text": ...}).

    Raises:
        ImportError: qdrant-client is not installed (names the extra).
        VectorStoreError: the server cannot be reached.
        ArtifactError: no Qdrant folder there, no such collection, no points, named
            vectors, or points that hold no passage.
    """
    from pydantic import ValidationError

    from rag_gates._optional import require
    from rag_gates.types import Passage

    require("qdrant_client", "qdrant")
    if source.remote:
        from rag_gates._qdrant import connect_server

        client = connect_server(
            source.location, api_key=os.environ.get(QDRANT_API_KEY_ENV), timeout=10,
            what=f"the URL of {QDRANT_SYNTAX}", error=VectorStoreError,
            hint=f"start it (e.g. docker run -p 6333:6333 qdrant/qdrant), check the URL and "
                 f"{QDRANT_API_KEY_ENV}, or give a local folder: qdrant:PATH#COLLECTION")
        names = _collection_names(client)
    else:
        from rag_gates.retrieval.dense import QdrantDenseRetriever

        folder = Path(source.location)
        if not (folder / "meta.json").is_file():
            raise ArtifactError(
                f"--corpus {source}: no Qdrant folder at {folder} (a local Qdrant folder holds "
                "meta.json); build one with QdrantDenseRetriever.build(passages, path=..., "
                "collection=...), or give a server: qdrant:http://HOST:6333#COLLECTION")
        names = _local_collections(folder)
        # A private in-memory copy: the folder is released at once (another process may
        # hold or serve it), and searches do not go back to disk.
        client = QdrantDenseRetriever.connect(str(folder), read_only=True,
                                              collection=source.collection)
    where = f"--corpus {source}: the collection {source.collection!r} at {source.location}"
    try:
        if not client.collection_exists(source.collection):
            raise ArtifactError(
                f"--corpus {source}: {source.location} has no collection "
                f"{source.collection!r} (collections: {', '.join(names) or 'none'}); name "
                "one after '#'")
        info = client.get_collection(source.collection)
        vectors = info.config.params.vectors
        if not hasattr(vectors, "size"):  # named vectors: a dict of them
            raise ArtifactError(
                f"{where} holds named vectors ({', '.join(vectors or {})}); calibrate "
                "searches one unnamed vector per point, as QdrantDenseRetriever.build writes")
        points = int(client.count(source.collection, exact=True).count)
        if points == 0:
            raise ArtifactError(f"{where} holds no points; add passages to it "
                                "(QdrantDenseRetriever.build)")
        sample = client.scroll(source.collection, limit=1, with_payload=True,
                               with_vectors=False)[0]
        try:
            Passage.model_validate(sample[0].payload)
        except ValidationError:
            raise ArtifactError(
                f"{where}: its points hold no passage (payload {sorted(sample[0].payload or {})}"
                "); each point's payload must be a passage, {\"text\": ..., \"title\": ...}, "
                "as QdrantDenseRetriever.build writes") from None
    except ArtifactError:
        client.close()
        raise
    except Exception as exc:  # the server refused or failed: its words, scrubbed of the key
        from rag_gates._qdrant import server_error

        client.close()
        raise VectorStoreError(f"{where}: the Qdrant server failed "
                               f"({server_error(exc, client)})") from None
    except BaseException:
        client.close()
        raise
    distance = getattr(vectors.distance, "value", vectors.distance)
    return QdrantCollection(source=source, client=client, points=points,
                            vector_size=int(vectors.size), distance=str(distance).lower())


def parse_gate_list(text: str) -> list[str] | None:
    """``auto`` -> None; else the comma-separated names, each one load_gate can build."""
    from rag_gates.registry import available_gates

    if text.strip() == "auto":
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = sorted(available_gates())
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        raise ValueError(f"--gates: unknown gate(s) {', '.join(unknown) or '(none given)'}; "
                         f"give 'auto' or a comma-separated list of {', '.join(known)}")
    return names


def check_model_spec(model: str) -> str:
    """``default``, a local model directory, or ``openai:URL[#model-name]`` (the prefix in
    any case); returns the spec with its prefix as written here. A server address without
    the prefix is refused, never taken for a directory (whose error would show it)."""
    from rag_gates._http import looks_like_server, redact_url, scrub_text

    if model == "default":
        return model
    if model[:len(SERVED_PREFIX)].lower() == SERVED_PREFIX:
        from rag_gates._http import check_served_spec

        served = SERVED_PREFIX + model[len(SERVED_PREFIX):]
        check_served_spec(served)
        return served
    if looks_like_server(model):
        raise ValueError(f"--model {scrub_text(redact_url(model), [])!r}: a served model is "
                         "given as openai:URL[#model-name], with the API key in "
                         "OPENAI_API_KEY (never in the URL)")
    if not Path(model).is_dir():
        raise ValueError(f"--model {model!r}: not a directory; give 'default' (the embedded "
                         "SmolLM2), a local Hugging Face model directory, or "
                         "openai:URL[#model-name] for a served model")
    return model


#: The requests one question of a served model's calibration sends at once: its gates
#: (``auto``: answer-logprob, first-token-logprob, sample-agreement) and its answer with
#: retrieval, decided together under ``--concurrency``.
REQUESTS_PER_QUESTION = 4


def read_chat_template(source: str) -> str:
    """``--chat-template``'s text: ``default`` (the embedded SmolLM2's), a template file, or a
    model directory (:func:`~rag_gates.lm.openai_compat.load_chat_template`), compiled once
    here so a template that is not Jinja is refused before the model loads.

    Raises:
        ValueError: no template there, or one that does not compile (names the source).
        ImportError: jinja2 is not installed (names the extra).

    Example:
        >>> template = read_chat_template("default")   # doctest: +SKIP
    """
    from rag_gates._optional import require
    from rag_gates.lm.openai_compat import _compile_template, load_chat_template

    jinja2 = require("jinja2", "api")
    try:
        template = load_chat_template(source)
    except ValueError as exc:
        raise ValueError(f"--chat-template: {exc}") from None
    try:
        _compile_template(template)
    except jinja2.TemplateError as exc:
        raise ValueError(f"--chat-template {source}: not a Jinja template ({exc}); give the "
                         "model's chat template (chat_template.jinja, a tokenizer_config.json "
                         "with one, or 'default')") from None
    return template


def load_model(model: str, threads: int | None, concurrency: int = 1,
               chat_template: str | None = None) -> Any:
    """The model that answers: in process, or behind an OpenAI-compatible server (which
    may take ``concurrency`` questions' requests at once, each question's
    :data:`REQUESTS_PER_QUESTION` together, and renders chat prompts with ``chat_template``,
    the template's text, when given)."""
    if model.startswith(SERVED_PREFIX):
        from rag_gates.lm.openai_compat import OpenAICompatibleLM

        return OpenAICompatibleLM.from_spec(
            model, chat_template=chat_template,
            max_concurrency=max(4, concurrency * REQUESTS_PER_QUESTION))
    if chat_template is not None:
        raise ValueError("--chat-template is for a served model (--model "
                         "openai:URL[#model-name]); an in-process model uses its tokenizer's "
                         "own template")
    from rag_gates.lm.defaults import load_lm

    return load_lm(model, num_threads=threads)


def _p_true_samples(options: dict[str, Any]) -> int:
    from rag_gates.p_true import SAMPLING_DEFAULT_SAMPLES

    return int(options.get("p_true_samples", SAMPLING_DEFAULT_SAMPLES))


#: The sampling gates ``auto`` leaves out in process (each sample is a generation), with how
#: many samples a question each draws under the run's options.
_SAMPLES_DRAWN: dict[str, Callable[[dict[str, Any]], int]] = {
    "sample-agreement": lambda options: int(options.get("samples", 5)),
    "p-true-sampling": _p_true_samples}

#: Gates that score a chat prompt by echo: on a served model they need ``--chat-template``.
CHAT_SCORED = frozenset({"p-true", "p-true-sampling"})


def _served_without_template(lm: Any) -> bool:
    """Whether ``lm`` is a served model whose client renders no chat template."""
    from rag_gates.lm.openai_compat import OpenAICompatibleLM

    return isinstance(lm, OpenAICompatibleLM) and lm.config.chat_template is None


def applicable_gates(lm: Any, requested: list[str] | None, options: dict[str, Any],
                     corpus_stats: Callable[[], Any] | None = None
                     ) -> tuple[dict[str, Any], dict[str, str]]:
    """Build the gates that apply to ``lm`` (``requested=None``: every one of
    :data:`AUTO_GATES` that does): ``(built, skipped with why)``. A requested gate that does
    not apply is an error. ``corpus_stats`` opens (or builds) the corpus statistics QuCo
    counts in; it raises ValueError or ImportError saying why there are none, and without
    it QuCo is skipped (:data:`QUCO_NOT_BUILT`)."""
    from rag_gates.calibration.load import GateContext, _build
    from rag_gates.errors import WhiteBoxRequiredError
    from rag_gates.lm.base import WhiteBoxLM

    ctx = GateContext(lm=lm, options=options)
    built: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for name in requested or AUTO_GATES:
        if requested is None and name == "first-token-logprob" and "first-token-prob" in built:
            skipped[name] = ("first-token-prob reads the same score from the logits, without "
                             "generating")
            continue
        if requested is None and name in _SAMPLES_DRAWN and isinstance(lm, WhiteBoxLM):
            skipped[name] = (f"draws {_SAMPLES_DRAWN[name](options)} sampled answers a "
                             "question from an in-process model; ask for it with --gates")
            continue
        if name == "quco":
            if corpus_stats is None:
                why = QUCO_NOT_BUILT
            else:
                try:
                    stats = corpus_stats()
                except (ValueError, ImportError, OSError) as exc:
                    why = str(exc).splitlines()[0]
                else:
                    built[name] = _build(name, GateContext(lm=lm, corpus=stats,
                                                           options=options), None)
                    continue
        else:
            try:
                built[name] = _build(name, ctx, None)
                continue
            except (WhiteBoxRequiredError, TypeError, ValueError, FileNotFoundError) as exc:
                # The first clause says why; the rest of these errors advise other gates.
                why = str(exc).splitlines()[0].split(";")[0]
                if name in CHAT_SCORED and _served_without_template(lm):
                    why += ("; give --chat-template (the model's chat template: 'default', a "
                            "file or a model directory) so its prompts are rendered here and "
                            "scored through the completions endpoint")
        if requested is not None:
            raise ValueError(f"--gates {name}: {why}")
        skipped[name] = why
    if not built:
        raise ValueError(f"no gate applies to this model: {skipped}")
    return built, skipped


def fixed_draws(built: dict[str, Any]) -> dict[str, Any]:
    """The spec options that fix the sampling gates' draws (how many, how hot, which seed),
    so a loaded spec scores as calibrate did: ``samples``, ``sample_temperature``, ... for
    ``sample-agreement``; ``p_true_samples``, ``p_true_temperature``, ``p_true_seed`` for
    ``p-true-sampling`` (its own: the two may draw differently in one run).

    Example:
        >>> fixed_draws({})
        {}
    """
    options: dict[str, Any] = {}
    sampler = built.get("sample-agreement")
    if sampler is not None:
        options.update({"samples": sampler.samples, "sample_temperature": sampler.temperature,
                        "sample_seed": sampler.seed, "sample_agreement": sampler.agreement})
    judge = built.get("p-true-sampling")
    if judge is not None:
        options.update({"p_true_samples": judge.samples, "p_true_temperature": judge.temperature,
                        "p_true_seed": judge.seed})
    return options


#: The documents calibrate indexes for QuCo: changes whenever their shape does.
_STATS_FORMAT = "calibrate-passages/title-newline-text/v1"


def corpus_stats_index(passages: Sequence[Any], corpus_sha: str) -> Path:
    """The corpus-statistics (infini-gram) index of ``--corpus``'s passages, built once and
    cached under ``$RAG_GATES_HOME/indexes/corpus-stats-calibrate-<hash>`` (the hash covers
    the corpus, the tokenizer and the build options): one document per passage, its title on
    the first line, so an entity named only in a title counts, as
    :func:`rag_gates.corpus.paragraphs.build_paragraph_stats` indexes QA paragraphs. Needs the
    ``corpus`` extra (infini-gram): without it, ImportError naming it."""
    from rag_gates._optional import require
    from rag_gates.corpus.index_format import MANIFEST_NAME
    from rag_gates.corpus.paragraphs import publish_stats_index, stats_options
    from rag_gates.corpus.tokenizer import CorpusTokenizer
    from rag_gates.lm.defaults import rag_gates_home

    require("infini_gram", "corpus")
    tok = CorpusTokenizer.resolve(None)
    options = stats_options(name="corpus-stats-calibrate")
    identity = {"format": _STATS_FORMAT, "corpus": corpus_sha, "tokenizer": tok.sha256(),
                "options": options.model_dump(exclude={"force", "progress", "name", "cpus",
                                                       "mem_gb", "ulimit", "batch_docs",
                                                       "verify"})}
    key = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    target = rag_gates_home() / "indexes" / f"corpus-stats-calibrate-{key}"
    if (target / MANIFEST_NAME).is_file():
        return target
    docs = [{"id": str(p.id), "title": p.title or "",
             "text": f"{p.title}\n{p.text}" if p.title else p.text} for p in passages]
    return publish_stats_index(docs, target, tok, options,
                               {"format": _STATS_FORMAT, "corpus_sha256": corpus_sha})


def open_corpus_stats(index_dir: Path) -> Any:
    """A :class:`~rag_gates.corpus.LocalInfiniGram` over ``index_dir`` (``--corpus-stats``, or
    the index calibrate built), or ValueError / ImportError saying why not."""
    from rag_gates._optional import require
    from rag_gates.corpus import CorpusError, LocalInfiniGram

    require("infini_gram", "corpus")
    try:
        return LocalInfiniGram(index_dir)
    except CorpusError as exc:
        raise ValueError(f"--corpus-stats {index_dir}: {exc}") from None


@dataclass(frozen=True)
class SkipPlot:
    """What :func:`plot_skip_curves` drew: the PNG (None without matplotlib), the series
    in the order drawn (the legend's labels), each row's (epsilon, skip rate) points, and
    the rows that could not be drawn, with why."""

    path: Path | None
    series: list[str]
    curves: dict[str, list[tuple[float, float]]]
    not_drawn: dict[str, str]


def skip_curves(records: Sequence[Any], report: Any,
                epsilons: Sequence[float] = PLOT_EPSILONS
                ) -> tuple[dict[str, list[tuple[float, float]]], dict[str, str]]:
    """Each row of ``report`` (a :class:`~rag_gates.calibration.CalibrationReport`):
    ``(epsilon, skip rate at the certified threshold)`` at ``epsilons`` and the report's
    own epsilon, certified as the row was: at the row's delta (its family-wise share), with
    the report's bound and seed, the composite fitted on its fitting half and certified on
    the other. Returns ``(curves, rows not drawn with why)``."""
    from rag_gates.calibration import CalibrationError, skip_curve

    # The composite's name and fit follow the order of its gates, which is the report's;
    # the records may hold the scores in another (the order the gates were asked for).
    composites = {report.composite_name, report.cascade_name}
    gates = [row.gate for row in report.rows if row.gate not in composites]
    ordered = [r.model_copy(update={"scores": {g: r.scores.get(g) for g in gates}})
               for r in records]
    xs = sorted({*map(float, epsilons), float(report.epsilon)})
    curves: dict[str, list[tuple[float, float]]] = {}
    why: dict[str, str] = {}
    for row in report.rows:
        try:
            curves[row.gate] = skip_curve(ordered, row.gate, xs, delta=row.delta,
                                          bound=report.bound, seed=report.seed)
        except CalibrationError as exc:
            why[row.gate] = str(exc)
    return curves, why


def plot_skip_curves(records: Sequence[Any], report: Any, out: Path) -> SkipPlot:
    """PNG of the certified skip rate against epsilon, one line per row of ``report`` (each
    gate and the composite, see :func:`skip_curves`); a row that cannot be drawn gets a
    line saying why, and without matplotlib no PNG (and a line saying so)."""
    curves, not_drawn = skip_curves(records, report)
    for gate, why in not_drawn.items():
        console.print(f"[yellow]not drawn[/] {gate}: {why}", highlight=False)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        console.print('no plot: matplotlib is missing (pip install "rag-gates[eval]")')
        return SkipPlot(None, [], curves, not_drawn)
    fig, ax = plt.subplots(figsize=(6, 4))
    for gate, curve in curves.items():
        ax.plot([e for e, _ in curve], [s for _, s in curve], marker="o", label=gate)
    series = [str(line.get_label()) for line in ax.get_lines()]
    ax.axvline(report.epsilon, color="grey", linestyle=":",
               label=f"--max-loss {report.epsilon:g}")
    ax.set_xlabel("epsilon (accuracy drop allowed against always retrieving)")
    ax.set_ylabel("share of retrievals skipped")
    family = (f", each of {report.family} rows at delta/{report.family}"
              if report.family > 1 else "")
    ax.set_title(f"Skip rate at the certified threshold (delta {report.delta:g}{family}, "
                 f"{report.bound})", fontsize=9)
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return SkipPlot(out, series, curves, not_drawn)


def _table(report: Any) -> Table:
    from rich import box

    table = Table(title=f"certified at epsilon {report.epsilon:g}, delta {report.delta:g} "
                        f"({report.bound}), {report.questions} questions", box=box.SIMPLE)
    table.add_column("gate", overflow="fold", min_width=16, max_width=24)
    for column in ("AUROC", "threshold", "certified\nskip rate", "observed\nskip rate",
                   "observed\ndrop", "n"):
        table.add_column(column, justify="right", no_wrap=True)
    for row in report.rows:
        table.add_row(
            row.gate, "-" if row.auroc is None else f"{row.auroc:.3f}",
            "none" if row.threshold is None else f"{row.threshold:.4g}",
            f"{100 * row.certified_skip_rate:.1f}%", f"{100 * row.observed_skip_rate:.1f}%",
            f"{100 * row.observed_drop:+.1f} pt", str(row.n))
    table.caption = ("threshold none: no threshold certified, always retrieve. Skip rates and "
                     "drop on the certification questions; certified = the interval's lower end")
    return table


def bound_choices() -> tuple[str, ...]:
    """``--bound`` values: ``auto`` and the bounds of :mod:`rag_gates.calibration.certify`
    (imported when asked: it loads numpy)."""
    from rag_gates.calibration.certify import BOUNDS

    return ("auto", *BOUNDS)


def resolve_bound(bound: str, n: int) -> Bound:
    """``auto``: the exact test where it is tabulated (up to ``EXACT_MAX_N`` questions; the
    tightest deterministic bound), the betting bound above; any other name as given."""
    from rag_gates.calibration.bounds import EXACT_MAX_N

    if bound == "auto":
        return "exact" if n <= EXACT_MAX_N else "wsr"
    return cast("Bound", bound)


def questions_needed(epsilon: float, delta: float) -> int:
    """The fewest certification questions with which a skip can be certified when no
    question's answer gets better by skipping (no help): even with no harm among them, the
    chance ``(1 - epsilon)^n`` of seeing none at the null's edge must be at most ``delta``,
    and every valid test's p-value is at least that chance."""
    return math.ceil(math.log(delta) / math.log1p(-epsilon))


def run_calibration(*, data: Path, corpus: Path | str, out: Path, model: str = "default",
                    gates: str = "auto", max_loss: float = 0.05, delta: float = 0.1,
                    bound: str = "auto", k: int = 3,
                    max_new_tokens: int = 32, limit: int | None = None,
                    threads: int | None = None, work_dir: Path | None = None,
                    seed: int = 0, no_labels: bool = False,
                    same_answer: str = "exact", by_group: bool = False,
                    abstain: float | None = None, concurrency: int = 1,
                    corpus_stats: Path | None = None,
                    chat_template: str | None = None) -> Any:
    """What ``rag-gates calibrate`` does; returns the :class:`CalibrationReport`. Every
    name and option, and the corpus (a Qdrant collection is opened and checked), is checked
    before the model loads. ``corpus``: a path, or ``qdrant:PATH_OR_URL[#COLLECTION]``.
    ``no_labels``: questions of ``data`` without gold answers are certified by whether
    their two replies are the same answer under ``same_answer`` (``exact`` or ``f1:CUT``;
    :mod:`rag_gates.calibration.judges`). ``by_group``: certify one threshold per ``group``
    of ``data`` (every line needs one; :mod:`rag_gates.calibration.groups`), and return a
    :class:`~rag_gates.calibration.GroupCalibrationReport`. ``abstain``: alpha, certify a
    three-way spec (answer closed book, retrieve, or abstain) whose share of questions
    answered wrongly is at most alpha (:mod:`rag_gates.calibration.abstain`), and return its
    :class:`~rag_gates.calibration.AbstentionReport`. ``concurrency``: questions answered at
    once, a served model only (``rag-gates bench``'s ``--concurrency``); the records are the
    same as a sequential run's, in the same order. ``corpus_stats``: an infini-gram index of
    the corpus for QuCo (default: calibrate indexes a JSONL or .txt folder corpus itself).
    ``chat_template``: a served model's chat template (``default``, a template file or a
    model directory; :func:`read_chat_template`), so chat prompts are rendered here and
    scored by the completions endpoint's echo (``p-true-sampling``); part of the work
    directory's identity."""
    from rag_gates.calibration.judges import parse_same_answer

    judge = parse_same_answer(same_answer) if no_labels else None
    if not no_labels and same_answer != "exact":
        raise ValueError("--same-answer judges unlabelled questions: pass it with --no-labels")
    if not 0 < max_loss < 1:
        raise ValueError(f"--max-loss must be in (0, 1), got {max_loss}")
    if not 0 < delta < 1:
        raise ValueError(f"--delta must be in (0, 1), got {delta}")
    if bound not in bound_choices():
        raise ValueError(f"--bound must be one of {', '.join(bound_choices())}, got {bound!r}")
    if abstain is not None:
        if not 0 < abstain < 1:
            raise ValueError(f"--abstain must be in (0, 1) (the share of questions that may "
                             f"get a wrong answer), got {abstain}")
        if by_group or no_labels:
            raise ValueError(f"--abstain certifies one policy on labelled questions: drop "
                             f"{'--by-group' if by_group else '--no-labels'}")
    requested = parse_gate_list(gates)
    model = check_model_spec(model)
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) \
            or not 1 <= concurrency <= MAX_CONCURRENCY:
        raise ValueError(f"--concurrency is a count in [1, {MAX_CONCURRENCY}], got "
                         f"{concurrency!r}")
    if concurrency > 1 and not model.startswith(SERVED_PREFIX):
        raise ValueError(
            f"--concurrency {concurrency} needs a served model (--model "
            "openai:URL[#model-name]): an in-process model runs one forward pass at a time, "
            "so questions would only wait for each other. Use --concurrency 1, or serve the "
            "model (e.g. vLLM's or llama.cpp's OpenAI-compatible server)")
    template = None
    if chat_template is not None:
        if not model.startswith(SERVED_PREFIX):
            raise ValueError(
                f"--chat-template {chat_template} is for a served model (--model "
                "openai:URL[#model-name]): chat prompts are then rendered here and sent to its "
                "completions endpoint. An in-process model uses its tokenizer's own template; "
                "drop --chat-template")
        template = read_chat_template(chat_template)
    if corpus_stats is not None and not (corpus_stats.is_dir()):
        raise ValueError(f"--corpus-stats {corpus_stats}: not a directory; give an "
                         "infini-gram index of the corpus (rag-gates index build)")
    source = parse_corpus(str(corpus)) if isinstance(corpus, str) else corpus
    if requested is not None and "quco" in requested:  # said now, not after the model loads
        if isinstance(source, QdrantCorpus) and corpus_stats is None:
            raise ValueError(f"--gates quco: {QUCO_NOT_BUILT}")
        import importlib.util

        if importlib.util.find_spec("infini_gram") is None:
            raise ValueError('--gates quco counts entities in an infini-gram index of the '
                             'corpus: pip install "rag-gates[corpus]"')
    every = read_questions(data, labels_optional=no_labels)
    questions = every[:limit]
    from rag_gates.calibration import MIN_QUESTIONS

    if len(questions) < MIN_QUESTIONS:
        raise ValueError(f"--data has {len(questions)} questions; calibration needs at least "
                         f"{MIN_QUESTIONS}")
    if by_group:
        ungrouped = [q.id for q in questions if q.group is None]
        if ungrouped:
            raise ValueError(f"--by-group: {len(ungrouped)} of the {len(questions)} questions "
                             f"have no 'group' (e.g. id {ungrouped[0]!r}); give every --data "
                             'line a "group" (a relation, a topic, a tenant)')
    if out.suffix != ".json":
        raise ValueError(f"--out {out}: give a .json path (the spec), e.g. gate.json")
    from rag_gates._io import output_path_problem

    for option, path, is_dir in (("--out", out, False), ("--work-dir", work_dir, True)):
        problem = None if path is None else output_path_problem(path, directory=is_dir)
        if problem is not None:
            raise ValueError(f"{option}: {problem}")
    if isinstance(source, QdrantCorpus):
        collection = open_qdrant_corpus(source)
        try:
            return _calibrate(every, questions, data, collection, out, model, requested,
                              max_loss, delta, bound, k, max_new_tokens, threads, work_dir, seed,
                              judge=judge, by_group=by_group, abstain=abstain,
                              concurrency=concurrency, corpus_stats=corpus_stats,
                              chat_template=template)
        finally:
            collection.client.close()
    return _calibrate(every, questions, data, source, out, model, requested, max_loss, delta,
                      bound, k, max_new_tokens, threads, work_dir, seed, judge=judge,
                      by_group=by_group, abstain=abstain, concurrency=concurrency,
                      corpus_stats=corpus_stats, chat_template=template)


def _calibrate(every: list[CalibrationQuestion], questions: list[CalibrationQuestion],
               data: Path, corpus: Path | QdrantCollection, out: Path, model: str,
               requested: list[str] | None, max_loss: float, delta: float,
               bound: str, k: int, max_new_tokens: int,
               threads: int | None, work_dir: Path | None, seed: int, *,
               judge: Any = None, by_group: bool = False,
               abstain: float | None = None, concurrency: int = 1,
               corpus_stats: Path | None = None, chat_template: str | None = None) -> Any:
    """:func:`run_calibration` once its input is checked: the work directory held (one
    run at a time) and checked, then load, answer, certify, write."""
    from rag_gates._io import append_locked

    work = work_dir or out.with_name(out.stem + "-work")
    created = not work.exists()
    work.mkdir(parents=True, exist_ok=True)
    try:
        with append_locked(work / WORK_LOCK, advice=(
                f"another rag-gates calibrate is using the work directory {work}: wait for it "
                "to finish, or give this run another --work-dir")):
            return _calibrate_in(work, every, questions, data, corpus, out, model, requested,
                                 max_loss, delta, bound, k, max_new_tokens, threads, seed,
                                 judge=judge, by_group=by_group, abstain=abstain,
                                 concurrency=concurrency, corpus_stats=corpus_stats,
                                 chat_template=chat_template)
    except BaseException:
        # A run refused before it wrote anything leaves no work directory behind.
        if created and [p.name for p in work.iterdir()] == [WORK_LOCK]:
            (work / WORK_LOCK).unlink()
            work.rmdir()
        raise


def _calibrate_in(work: Path, every: list[CalibrationQuestion],
                  questions: list[CalibrationQuestion], data: Path,
                  corpus: Path | QdrantCollection, out: Path, model: str,
                  requested: list[str] | None, max_loss: float, delta: float, bound: str,
                  k: int, max_new_tokens: int, threads: int | None, seed: int, *,
                  judge: Any = None, by_group: bool = False,
                  abstain: float | None = None, concurrency: int = 1,
                  corpus_stats: Path | None = None, chat_template: str | None = None) -> Any:
    """``chat_template``: the template's text (:func:`read_chat_template`), or None."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from rag_gates.calibration import ModelIdentity, calibrate

    passages = None
    corpus_identity: str | dict[str, Any]
    if isinstance(corpus, QdrantCollection):
        what = f"{corpus.source} ({corpus.points} points)"
        corpus_identity = corpus.identity
    else:
        passages = read_corpus(corpus)
        what = f"indexing {len(passages)} passages (BM25)"
        corpus_identity = _sha(corpus)
    early: dict[str, Any] = {"questions": question_set_sha(every), "corpus": corpus_identity,
                             "k": k, "max_new_tokens": max_new_tokens}
    model_files = model_files_fingerprint(model)
    if model_files is not None:
        early["model_files"] = model_files
    if judge is not None:  # agreement records depend on the judge
        early["same_answer"] = judge.name
    if chat_template is not None:  # it renders every chat prompt: the answers depend on it
        early["chat_template"] = chat_template_identity(chat_template)
    data_bytes_sha = _sha(data)
    _check_work_dir(work, early, data_bytes_sha=data_bytes_sha, before_load=True)
    records_file = work / "records.jsonl"
    if records_file.is_file() and records_file.stat().st_size:
        # A damaged records file is named now, not after the model loads (the work lock is
        # held: no other run is writing it).
        from rag_gates._io import drop_torn_tail
        from rag_gates.calibration import read_records

        drop_torn_tail(records_file)
        read_records(records_file)
    retriever: Any
    with console.status(f"loading {model}; {what}"):
        from rag_gates._console import quiet_transformers

        quiet_transformers()
        if isinstance(corpus, QdrantCollection):
            from rag_gates.lm.defaults import load_default_embedder
            from rag_gates.retrieval.dense import QdrantDenseRetriever

            embedder = load_default_embedder()
            corpus.check_embedder(embedder)  # before the model loads: a wrong index fails fast
            retriever = QdrantDenseRetriever(corpus.client, corpus.source.collection, embedder)
            description = corpus.describe(k)
        else:
            from rag_gates.retrieval.bm25 import BM25Retriever

            assert passages is not None and isinstance(corpus_identity, str)
            retriever = BM25Retriever.from_passages(passages)
            description = (f"bm25 over {corpus.name} ({len(passages)} passages, sha256 "
                           f"{corpus_identity[:12]}), k={k}")
        lm = load_model(model, threads, concurrency, chat_template)
        identity = ModelIdentity.of(lm)
    options: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    if abstain is not None and not getattr(lm, "supports_logprobs", False):
        raise ValueError(f"--abstain needs the answer's log-probabilities with the passages; "
                         f"{model} does not return them")
    opened: list[Any] = []

    def stats() -> Any:
        """QuCo's corpus statistics: --corpus-stats, or the index of --corpus (built once)."""
        from rag_gates.corpus import CorpusError

        if corpus_stats is None and passages is None:
            raise ValueError(QUCO_NOT_BUILT)
        try:
            if corpus_stats is None:
                assert passages is not None and isinstance(corpus_identity, str)
                with console.status(f"indexing {len(passages)} passages for QuCo's entity "
                                    "counts (infini-gram; cached)"):
                    index = corpus_stats_index(passages, corpus_identity)
            else:
                index = corpus_stats
            opened.append(open_corpus_stats(index))
        except CorpusError as exc:
            raise ValueError(f"the corpus statistics could not be built: {exc}") from None
        return opened[-1]

    built, skipped = applicable_gates(lm, requested, options, corpus_stats=stats)
    options.update(fixed_draws(built))
    for name, why in skipped.items():
        console.print(f"[yellow]skipped {name}[/]: {why}", highlight=False)
    after_load = {**early, "model": identity.fingerprint, "gates": sorted(built)}
    if opened and "quco" in built:  # QuCo's scores are counts in this index
        after_load["corpus_stats"] = opened[-1].index_key
    _check_work_dir(work, after_load, data_bytes_sha=data_bytes_sha)
    if concurrency > 1:
        console.print(f"answering {concurrency} questions at once", highlight=False)
    kept: list[int] = []
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeRemainingColumn(), console=console) as bar:
        task = bar.add_task("answering closed book and with retrieval", total=len(questions))
        records = collect_records(
            questions, lm, retriever, built, work / "records.jsonl", k=k,
            max_new_tokens=max_new_tokens,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
            known={q.id for q in every}, unused=kept.append, same_answer=judge,
            concurrency=concurrency)
    if kept and kept[0]:
        console.print(f"{kept[0]} records of questions beyond --limit kept in the work dir, "
                      f"not used ({len(questions)} of the {len(every)} questions of --data "
                      "used)", highlight=False)
    if by_group:
        return _certify_by_group(records, work, out, bound, max_loss, delta, identity,
                                 description, sorted(built), seed, options)
    chosen = resolve_bound(bound, len(records))
    if chosen != bound:
        console.print(f"bound: {chosen} ({len(records)} certification questions)",
                      highlight=False)
    if abstain is not None:
        return _certify_abstention(records, work, out, chosen, max_loss, abstain, delta,
                                   identity, description, sorted(built), seed, options)
    report = calibrate(records, max_loss=max_loss, delta=delta, bound=chosen, model=identity,
                       retriever=description, gates=sorted(built), seed=seed,
                       options=options)
    console.print(_table(report))
    spec = report.best
    spec.save(out)
    (work / "report.json").write_text(report.model_dump_json(indent=2))
    plot = plot_skip_curves(records, report, out.with_suffix(".png"))
    verdict = (f"{spec.gate} at threshold {spec.threshold:.4g}: skips "
               f"{100 * spec.skip_rate.observed:.1f}% of retrievals on the certification "
               f"questions, at least {100 * spec.skip_rate.lower:.1f}% on new ones like them"
               if spec.certified else f"{spec.gate}: no threshold certified: always retrieve")
    console.print(f"best: {verdict} -> {out}", highlight=False)
    if report.labels != "gold":
        unlabelled = sum(r.labels == "agreement" for r in records)
        console.print(f"{unlabelled} of {len(records)} questions had no gold answers: certified "
                      f"from the agreement of their two replies ({report.judge}), an upper "
                      "bound on the accuracy a skip costs", highlight=False)
    needed = questions_needed(report.epsilon, report.delta / report.family)
    if not spec.certified and len(records) < needed:
        console.print(
            f"too few questions? With no help among them, any bound needs at least {needed} "
            f"questions to certify a skip at --max-loss {report.epsilon:g} (delta "
            f"{report.delta:g} over {report.family} rows); you gave {len(records)}. Add "
            "questions, or raise --max-loss (docs/calibration.md, 'The three bounds')",
            highlight=False)
    console.print(f"records: {work / 'records.jsonl'}"
                  + (f"; plot: {plot.path}" if plot.path else ""), highlight=False)
    console.print(f'serve it: load_gate("{out}", lm=lm) (rag_gates.calibration)',
                  highlight=False)
    return report


def _certify_abstention(records: list[Any], work: Path, out: Path, bound: Bound,
                        max_loss: float, alpha: float, delta: float, identity: Any,
                        description: str, gates: list[str], seed: int,
                        options: dict[str, Any]) -> Any:
    """``--abstain``: certify the three-way policy, print the table, write the spec and the
    report."""
    from rag_gates.calibration import calibrate_abstention

    report = calibrate_abstention(records, max_loss=max_loss, max_error=alpha, delta=delta,
                                  bound=bound, model=identity, retriever=description,
                                  gates=gates, seed=seed, options=options)
    table = Table(title=f"three-way: skip costs <= {report.epsilon:g}, wrong answers <= "
                        f"{alpha:g} of questions, delta {report.delta:g} (n={report.questions})")
    for column in ("gate", "skip threshold", "skip %", "abstain threshold", "abstain %",
                   "wrong %", "wrong % of answered", "right %"):
        table.add_column(column)
    for row in report.rows:
        a = row.abstain
        table.add_row(row.gate, "-" if row.threshold is None else f"{row.threshold:.4g}",
                      f"{100 * row.observed_skip_rate:.1f}",
                      "all" if a.threshold is None else f"{a.threshold:.4g}",
                      f"{100 * a.abstain_rate.observed:.1f}", f"{100 * a.observed_error:.1f}",
                      "-" if a.observed_answered_error is None else
                      f"{100 * a.observed_answered_error:.1f}",
                      f"{100 * row.observed_accuracy:.1f}")
    console.print(table)
    spec = report.best
    spec.save(out)
    (work / "report.json").write_text(report.model_dump_json(indent=2))
    assert spec.abstain is not None
    if spec.abstain.threshold is None:
        console.print(f"[yellow]no answer after retrieval met --abstain {alpha:g}[/]: the spec "
                      "abstains after every retrieval; raise --abstain, or improve retrieval",
                      highlight=False)
    console.print(f"best: {spec.gate}: {spec.note} -> {out}", highlight=False)
    console.print(f'serve it: load_gate("{out}", lm=lm); after retrieval, '
                  "gate.after_retrieval(answer_with_passages(lm, q, passages).score)",
                  highlight=False)
    return report


def _certify_by_group(records: list[Any], work: Path, out: Path, bound: str, max_loss: float,
                      delta: float, identity: Any, description: str, gates: list[str],
                      seed: int, options: dict[str, Any]) -> Any:
    """``--by-group``: certify one threshold per group, print the table, write the spec and
    the report (no plot: a curve per gate and group would not be read)."""
    from collections import Counter

    from rag_gates.calibration import calibrate

    largest = max(Counter(r.group for r in records).values())
    chosen = resolve_bound(bound, largest)
    if chosen != bound:
        console.print(f"bound: {chosen} (at most {largest} certification questions in a "
                      "group)", highlight=False)
    report = calibrate(records, max_loss=max_loss, delta=delta, bound=chosen, model=identity,
                       retriever=description, gates=gates, seed=seed, options=options,
                       by_group=True)
    console.print(_group_table(report))
    spec = report.best
    spec.save(out)
    (work / "report.json").write_text(report.model_dump_json(indent=2))
    groups = spec.groups or []
    certified = [g for g in groups if g.certified]
    console.print(f"best: {spec.gate}, a threshold for {len(certified)} of {len(groups)} "
                  f"groups (each at delta {report.group_delta:.3g}: {report.delta:g} shared "
                  f"by {report.tested} groups x {report.family} gates, Bonferroni); skips "
                  f"{100 * spec.skip_rate.observed:.1f}% of retrievals on the certification "
                  f"questions -> {out}", highlight=False)
    for g in groups:
        if not g.certified:
            console.print(f"group {g.group!r}: {g.note}", highlight=False)
    console.print("a group the spec has not seen, or a question without a group, always "
                  "retrieves", highlight=False)
    console.print(f"records: {work / 'records.jsonl'}", highlight=False)
    console.print(f'serve it: load_gate("{out}", lm=lm).decide(question, group=...) '
                  "(rag_gates.calibration)", highlight=False)
    return report


def _group_table(report: Any) -> Table:
    """Each gate (all its questions), then each of its groups."""
    from rich import box

    share = f", each group at delta {report.group_delta:.3g}" if report.tested else ""
    table = Table(title=f"certified per group at epsilon {report.epsilon:g} within each group, "
                        f"delta {report.delta:g} for all at once{share} ({report.bound}), "
                        f"{report.questions} questions", box=box.SIMPLE)
    table.add_column("gate / group", overflow="fold", min_width=16, max_width=28)
    for column in ("threshold", "certified\nskip rate", "observed\nskip rate",
                   "observed\ndrop", "n"):
        table.add_column(column, justify="right", no_wrap=True)
    for row in report.rows:
        table.add_row(row.gate, "per group", f"{100 * row.certified_skip_rate:.1f}%",
                      f"{100 * row.observed_skip_rate:.1f}%",
                      f"{100 * row.observed_drop:+.1f} pt", str(row.n), style="bold")
        for g in row.groups:
            table.add_row(
                f"  {g.group}", "none" if g.threshold is None else f"{g.threshold:.4g}",
                f"{100 * (g.skip_rate.lower if g.certified else 0.0):.1f}%",
                f"{100 * g.skip_rate.observed:.1f}%", f"{100 * g.observed_drop:+.1f} pt",
                str(g.n), end_section=g is row.groups[-1])
    table.caption = ("threshold none: that group always retrieves. Skip rates and drop on the "
                     "certification questions; certified = the interval's lower end")
    return table


def calibrate_command(
    data: Annotated[Path, typer.Option(
        help='Your questions: JSONL, one {"question": ..., "answers": \\[gold, ...]} per line '
             '(optional "id").')],
    corpus: Annotated[str, typer.Option(
        help='What to retrieve from: JSONL with a "text" field (optional "title", "id") or a '
             "folder of .txt files, searched with BM25; or qdrant:PATH_OR_URL\\[#COLLECTION] "
             "(default collection: passages), a Qdrant collection (a local folder or a "
             "server; API key from QDRANT_API_KEY) of passages embedded with "
             "all-MiniLM-L6-v2, as QdrantDenseRetriever.build writes them.")],
    out: Annotated[Path, typer.Option(help="The spec to write (gate.json); a plot goes "
                                           "beside it (gate.png).")] = Path("gate.json"),
    model: Annotated[str, typer.Option(
        help="'default' (the embedded SmolLM2), a local Hugging Face model directory, or "
             "openai:URL\\[#model-name] (a served model: answer-logprob, first-token-logprob, "
             "sample-agreement and quco, from the replies' text and log-probabilities; "
             "p-true-sampling too with --chat-template).")
    ] = "default",
    gates: Annotated[str, typer.Option(
        help="'auto' (every gate that applies to the model) or a comma-separated list: "
             "answer-logprob, first-token-prob, first-token-logprob, sample-agreement, cbdr, "
             "p-true, p-true-sampling (P(True); the second with brainstormed samples), quco."
             )] = "auto",
    max_loss: Annotated[float, typer.Option(
        help="Epsilon: the accuracy drop against always retrieving you accept, in (0, 1).")
    ] = 0.05,
    delta: Annotated[float, typer.Option(
        help="The probability the guarantee fails, in (0, 1).")] = 0.1,
    bound: Annotated[str, typer.Option(
        help="auto (exact up to 600 certification questions, wsr above), exact (exact test "
             "on the counts of harms and helps; the tightest deterministic one), exact-random "
             "(its randomised version: tighter still, the threshold depends on --seed), wsr "
             "(betting bound on the signed loss) or binomial (exact tail on the harm count; "
             "conservative). docs/calibration.md compares them.")] = "auto",
    k: Annotated[int, typer.Option(min=1, max=50, help="Passages per retrieval.")] = 3,
    max_new_tokens: Annotated[int, typer.Option(min=1, max=1024,
                                                help="Answer length budget.")] = 32,
    limit: Annotated[int | None, typer.Option(
        min=1, help="Use the first N questions (the work dir keeps records of the others).")
    ] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads.")] = None,
    work_dir: Annotated[Path | None, typer.Option(
        help="Where the per-question records go (resumed if it exists, for the same "
             "question set in any order, model (and --chat-template), corpus and gates); "
             "default: OUT's name with -work.")] = None,
    seed: Annotated[int, typer.Option(min=0, help="Order of the betting test and the "
                                           "composite's fit/certify split.")] = 0,
    no_labels: Annotated[bool, typer.Option(
        "--no-labels", help="--data may leave out 'answers': such a question is certified by "
             "whether the closed-book reply and the reply with retrieval are the same answer "
             "(a skip counts as a loss when they differ: an upper bound on the accuracy it "
             "costs). Labelled questions still use their labels.")] = False,
    same_answer: Annotated[str, typer.Option(
        help="With --no-labels, the same-answer judge: 'exact' (equal after normalisation; "
             "always valid) or 'f1:CUT' (token F1 >= CUT; saves more, valid only as far as it "
             "never calls a right and a wrong reply the same).")] = "exact",
    by_group: Annotated[bool, typer.Option(
        "--by-group", help="Certify one threshold per 'group' of --data (every line needs "
             "one: a relation, a topic, a tenant), every group at once at --delta "
             "(Bonferroni), so that no group loses more than --max-loss; a group with too "
             "few questions, or one the spec has not seen, always retrieves.")] = False,
    abstain: Annotated[float | None, typer.Option(
        help="Alpha: also certify abstaining after retrieval, so that at most this share of "
             "questions gets a wrong answer (closed book or with passages), at --delta with "
             "--max-loss; the spec answers closed book, retrieves, or says it does not know. "
             "Needs gold answers and a model with log-probabilities.")] = None,
    concurrency: Annotated[int, typer.Option(
        min=1, max=MAX_CONCURRENCY,
        help="Questions answered at once (a served model only; the server batches them; "
             "the records are a sequential run's, in the same order). In-process models "
             "answer one at a time.")] = 1,
    corpus_stats: Annotated[Path | None, typer.Option(
        help="An infini-gram index of the corpus (rag-gates index build) for the quco gate; "
             "default: calibrate indexes a JSONL or .txt folder --corpus itself (cached; "
             "needs the corpus extra).")] = None,
    chat_template: Annotated[str | None, typer.Option(
        help="A served model's chat template (--model openai:URL only): 'default' (the "
             "embedded SmolLM2's), a template file or a model directory. Chat prompts are "
             "then rendered here and sent to the server's completions endpoint, whose echoed "
             "prompt log-probabilities score them: p-true-sampling applies. Part of the work "
             "directory's identity.")] = None,
) -> None:
    """Certify a gate threshold on your own questions: with probability >= 1 - delta the
    accuracy drop against always retrieving is at most --max-loss (for questions like these,
    the same model and corpus). Writes the best gate's spec; load it with load_gate."""
    from rag_gates.errors import CalibrationError, FileInUseError, ServerError

    try:
        run_calibration(data=data, corpus=corpus, out=out, model=model, gates=gates,
                        max_loss=max_loss, delta=delta,
                        bound=bound,  # checked inside
                        k=k, max_new_tokens=max_new_tokens, limit=limit, threads=threads,
                        work_dir=work_dir, seed=seed, no_labels=no_labels,
                        same_answer=same_answer, by_group=by_group, abstain=abstain,
                        concurrency=concurrency, corpus_stats=corpus_stats,
                        chat_template=chat_template)
    except (ValueError, CalibrationError, FileInUseError, ServerError, VectorStoreError,
            ImportError) as exc:
        console.print(error_line(exc), highlight=False, soft_wrap=True)
        raise typer.Exit(2) from exc
