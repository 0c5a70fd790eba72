"""The per-question records of ``rag-gates calibrate`` (:mod:`rag_gates.commands.calibrate`).

:func:`collect_records` answers each question closed book and with retrieval, scores every
gate and appends one :class:`~rag_gates.calibration.CalibrationRecord` per question to the
work directory (resumable, in question order at any ``--concurrency``: :func:`in_order`);
:func:`_check_work_dir` and :func:`model_files_fingerprint` tie a work directory to one
model (with ``--chat-template``: and the chat template rendered here), question set, corpus
and gate set (its ``config.json``), and :data:`WORK_LOCK` names
the lock a run holds on it. Everything here is re-exported by
:mod:`rag_gates.commands.calibrate`.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import math
import threading
from collections.abc import Callable, Collection, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from rich.console import Console

console = Console()

SERVED_PREFIX = "openai:"


@dataclass(frozen=True)
class CalibrationQuestion:
    """One question of ``--data`` with its gold answers."""

    id: str
    question: str
    answers: tuple[str, ...]
    group: str | None = None


def _score(decision: Any) -> float | None:
    from rag_gates.gate import UNDECIDED_SCORE

    if "undecided" in decision.evidence or not math.isfinite(decision.score) \
            or decision.score >= UNDECIDED_SCORE:
        return None
    return float(decision.score)


#: Gates that decide one question at a time under ``--concurrency``.
_SERIAL_GATES = frozenset({"quco"})

T = TypeVar("T")
R = TypeVar("R")


def in_order(items: Sequence[T], work: Callable[[T], R], concurrency: int
             ) -> Iterator[tuple[T, R]]:
    """``(item, work(item))`` in the order of ``items``, ``concurrency`` computed at once
    (threads; at most twice that many started ahead of the one awaited). An error or an
    interruption starts nothing new and is raised for the first item it hit, in order."""
    if concurrency <= 1:
        for item in items:
            yield item, work(item)
        return
    import concurrent.futures
    from collections import deque

    with concurrent.futures.ThreadPoolExecutor(
            concurrency, thread_name_prefix="rag-gates-calibrate") as pool:
        window: deque[tuple[T, concurrent.futures.Future[R]]] = deque()
        try:
            for item in items:
                window.append((item, pool.submit(work, item)))
                if len(window) >= 2 * concurrency:  # a bounded read-ahead
                    first, future = window.popleft()
                    yield first, future.result()
            while window:
                first, future = window.popleft()
                yield first, future.result()
        finally:  # start nothing new; the pool waits for the ones running
            for _, future in window:
                future.cancel()


def _decide(gate: Any, question: str, lock: threading.Lock | None) -> Any:
    if lock is None:
        return gate.decide(question)
    with lock:
        return gate.decide(question)


def collect_records(questions: Sequence[CalibrationQuestion], lm: Any, retriever: Any,
                    gates: dict[str, Any], path: Path, *, k: int, max_new_tokens: int,
                    progress: Callable[[int, int], None] | None = None,
                    known: Collection[str] = (),
                    unused: Callable[[int], None] | None = None,
                    same_answer: Any = None, concurrency: int = 1) -> list[Any]:
    """Answer every question closed book and with retrieval, score every gate, and append
    one :class:`~rag_gates.calibration.CalibrationRecord` per question to ``path``
    (questions already there are kept: resumable); return the records of ``questions``, in
    their order. The closed-book answer of a gate that generated it with the same prompt
    and budget is reused, not generated again.

    ``known``: ids of other questions of the same ``--data`` (those beyond ``--limit``):
    their records stay in ``path``, unused, and ``unused`` is told how many there are. A
    record of any other question raises ValueError. A question without gold answers gets an
    agreement record judged by ``same_answer`` (``--no-labels``;
    :meth:`CalibrationRecord.from_agreement`). Every record returned carries its question's
    ``group`` as ``--data`` gives it now (a record written before keeps its line).

    ``concurrency``: questions answered at once (threads; a served model's client bounds
    the requests in flight, so the server can batch them); the records are written in the
    order of ``questions`` all the same."""
    from rag_gates._io import append_locked, drop_torn_tail
    from rag_gates.answer_once import reusable_answer
    from rag_gates.answers import accuracy
    from rag_gates.calibration import CalibrationRecord, read_records
    from rag_gates.calibration.abstain import PASSAGE_SCORE
    from rag_gates.confidence import answer_with_passages
    from rag_gates.methods import MethodContext, make_method
    from rag_gates.prompts import qa_prompt

    ctx = MethodContext(lm=lm, retriever=retriever, k=k, max_new_tokens=max_new_tokens)
    closed_book, single = make_method("no-rag", ctx), make_method("single", ctx)
    with_passages_score = bool(getattr(lm, "supports_logprobs", False))
    path.parent.mkdir(parents=True, exist_ok=True)
    with append_locked(path) as handle:
        drop_torn_tail(path)
        done = {r.id: r for r in read_records(path)} if path.stat().st_size else {}
        wanted = {q.id for q in questions}
        strangers = sorted(set(done) - wanted - set(known))
        if strangers:
            raise ValueError(f"{path} holds records of {len(strangers)} questions not in "
                             f"--data (e.g. id {strangers[0]!r}); use another --work-dir for "
                             "other questions")
        if unused is not None:
            unused(len(set(done) - wanted))

        def retrieved_of(q: CalibrationQuestion) -> tuple[str, dict[str, float | None]]:
            if not with_passages_score:
                return single.answer(q.question).answer, {}
            # One generation gives the answer and its with-passages score (what --abstain
            # certifies on): the single method's prompt, retriever and budget.
            passage_answer = answer_with_passages(
                lm, q.question, retriever.retrieve(q.question, k), max_new_tokens=max_new_tokens)
            score = passage_answer.score if math.isfinite(passage_answer.score) else None
            return passage_answer.answer, {PASSAGE_SCORE: score}

        def record_of(q: CalibrationQuestion) -> Any:
            if inner is None:
                decisions = {name: _decide(gate, q.question, serial.get(name))
                             for name, gate in gates.items()}
                retrieved, retrieved_scores = retrieved_of(q)
            else:
                # A question's gates and its answer with retrieval do not depend on each
                # other: sent together, a batching server gets more requests per question.
                pending = {name: inner.submit(_decide, gate, q.question, serial.get(name))
                           for name, gate in gates.items()}
                with_retrieval = inner.submit(retrieved_of, q)
                decisions = {name: future.result() for name, future in pending.items()}
                retrieved, retrieved_scores = with_retrieval.result()
            closed = None
            for d in decisions.values():
                reuse = reusable_answer(d.model_copy(update={"retrieve": False}), lm=lm,
                                        prompt=qa_prompt(q.question),
                                        max_new_tokens=max_new_tokens)
                if reuse.answer is not None:
                    closed = reuse.answer
                    break
            if closed is None:
                closed = closed_book.answer(q.question).answer
            scores = {name: _score(d) for name, d in decisions.items()}
            if not q.answers:
                if same_answer is None:
                    raise ValueError(f"question {q.id!r} has no gold answers: pass "
                                     "--no-labels to certify from agreement")
                return CalibrationRecord.from_agreement(
                    id=q.id, question=q.question, closed_book_answer=closed,
                    retrieved_answer=retrieved, judge=same_answer, scores=scores,
                    retrieved_scores=retrieved_scores).model_copy(update={"group": q.group})
            return CalibrationRecord(
                id=q.id, question=q.question,
                closed_book_correct=accuracy(closed, q.answers) > 0,
                retrieved_correct=accuracy(retrieved, q.answers) > 0,
                scores=scores, closed_book_answer=closed, retrieved_answer=retrieved,
                retrieved_scores=retrieved_scores, group=q.group)

        # Gates whose lookups are not known to be thread-safe (QuCo's corpus engine and
        # extractor) decide one question at a time; the model's requests overlap.
        serial = {name: threading.Lock() for name in gates if name in _SERIAL_GATES}
        todo = [q for q in questions if q.id not in done]
        finished = len(questions) - len(todo)
        if progress is not None:
            progress(finished, len(questions))
        # Written in question order whatever order they finish in, so a run at any
        # concurrency writes the lines of a sequential one (and an interrupted one a prefix).
        inner: concurrent.futures.ThreadPoolExecutor | None = None
        if concurrency > 1:
            inner = concurrent.futures.ThreadPoolExecutor(
                concurrency * (len(gates) + 1), thread_name_prefix="rag-gates-calibrate-gate")
        try:
            for q, record in in_order(todo, record_of, concurrency):
                handle.write(record.dump_json() + "\n")
                handle.flush()
                done[q.id] = record
                finished += 1
                if progress is not None:
                    progress(finished, len(questions))
        finally:
            if inner is not None:
                inner.shutdown(wait=True, cancel_futures=True)
    return [done[q.id] if done[q.id].group == q.group else
            done[q.id].model_copy(update={"group": q.group}) for q in questions]


_IDENTITY_NAMES = {"questions": "question set (--data: ids, questions and answers)",
                   "corpus_stats": "--corpus-stats index (QuCo's counts)",
                   "model_files": "model (its files differ)",
                   "same_answer": "--same-answer judge (or --no-labels)",
                   "chat_template": "--chat-template (the served model's chat template, "
                                    "rendered here)"}


#: The work directory's lock file: held by one calibrate run for its whole length.
WORK_LOCK = ".calibrate.lock"
#: Identity entries known only once the model is loaded (checked after it loads).
_AFTER_LOAD = ("model", "gates", "corpus_stats")


def _check_work_dir(work_dir: Path, identity: dict[str, Any], *, data_bytes_sha: str,
                    before_load: bool = False) -> None:
    """The work directory's records belong to one model, question set, corpus and gate set.

    Called twice: ``before_load`` (the model not loaded yet) compares every entry but
    :data:`_AFTER_LOAD` (and ``model_files``, a cheap fingerprint of the model's files, when
    the work directory has one), so a wrong work directory is refused in a second, not
    after the model loads; then with the whole identity, which is written.

    A work directory made before question-set identities names ``--data`` by the SHA-256 of
    its bytes (``"data"``): with the same file byte for byte its config is upgraded (same
    bytes, same questions); with any other the questions cannot be told apart from another
    set (the old config does not hold them), so it is refused with what to do."""
    from rag_gates._files import read_json
    from rag_gates._io import write_text_atomic

    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / "config.json"
    if not path.is_file():
        if path.exists() or path.is_symlink():
            raise ValueError(f"{path} is not a file; delete it, or use another --work-dir")
        if not before_load:
            write_text_atomic(path, json.dumps(identity, indent=2))
        return
    before = read_json(path, expect=dict, fix="delete the work directory (its records are "
                       "re-made), or use another --work-dir")
    legacy = "questions" not in before and "data" in before
    if legacy:
        if before["data"] != data_bytes_sha:
            raise ValueError(
                f"{work_dir} was made by an older rag-gates that identified --data by its "
                "bytes, and this --data is not that file byte for byte (edited or reordered "
                "since?): run once with the file as it was, which upgrades the work dir (any "
                "order resumes after that), or use another --work-dir")
        before = {**{k: v for k, v in before.items() if k != "data"},
                  "questions": identity["questions"]}
    # model_files came later: a work directory without it is checked by the weights alone.
    keys = set(before) | set(identity)
    if "model_files" not in before or "model_files" not in identity:
        keys.discard("model_files")
    if before_load:
        keys -= set(_AFTER_LOAD)
    diff = sorted(_IDENTITY_NAMES.get(k, k) + _was_now(k, before.get(k), identity.get(k))
                  for k in keys if before.get(k) != identity.get(k))
    if diff:
        raise ValueError(f"{work_dir} holds records made with another {', '.join(diff)}; "
                         "use another --work-dir (or delete this one)")
    if before_load:
        return
    if legacy or "model_files" not in before:
        write_text_atomic(path, json.dumps(identity, indent=2))
    if legacy:
        console.print(f"upgraded {path}: --data is now identified by its question set (ids, "
                      "questions, answers), so reordering it resumes", highlight=False)


def chat_template_identity(template: str) -> str:
    """The work directory's ``chat_template`` entry for ``--chat-template``: the SHA-256 of
    the template's text (what renders the prompts; a file edited since is another template).
    A run without ``--chat-template`` has no such entry, as a work directory made before the
    option has none, so either resumes the other.

    Example:
        >>> chat_template_identity("{{ messages[0]['content'] }}")[:12]
        'e2ce372d1e09'
    """
    return hashlib.sha256(template.encode("utf-8")).hexdigest()


def _was_now(key: str, before: Any, now: Any) -> str:
    """What differs, for an identity entry whose two values say something readable (the
    chat template: none, or which one); empty for the others (hashes and sizes)."""
    if key != "chat_template":
        return ""

    def shown(value: Any) -> str:
        return "none" if value is None else f"sha256 {str(value)[:12]}"

    return f" (was: {shown(before)}; now: {shown(now)})"


def model_files_fingerprint(model: str) -> str | None:
    """A fingerprint of ``--model`` computed without loading it (milliseconds): for a
    served model its spec; for a local directory (``default``: the embedded model's) each
    weights and config file's name, size and first and last MiB. None when the files are
    not there yet (the embedded model is converted on its first load). The weights'
    fingerprint, after loading, stays the identity that decides."""
    if model.startswith(SERVED_PREFIX):
        return hashlib.sha256(model.encode("utf-8")).hexdigest()
    if model == "default":
        from rag_gates.lm.defaults import default_lm_dir

        folder = default_lm_dir()
    else:
        folder = Path(model)
    files = sorted(f for f in folder.glob("*") if f.is_file() and (
        f.suffix in (".safetensors", ".bin") or f.name == "config.json"))
    if not any(f.suffix in (".safetensors", ".bin") for f in files):
        return None
    digest = hashlib.sha256()
    chunk = 1 << 20
    for file in files:
        size = file.stat().st_size
        digest.update(f"{file.name}\0{size}\0".encode())
        with file.open("rb") as handle:
            digest.update(handle.read(chunk))
            if size > chunk:
                handle.seek(max(chunk, size - chunk))
                digest.update(handle.read(chunk))
    return digest.hexdigest()
