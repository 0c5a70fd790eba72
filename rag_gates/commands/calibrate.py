"""``rag-gates calibrate``: which gate, at which threshold, with a stated risk bound, on your
own questions.

It answers each question closed book and with retrieval (BM25 over ``--corpus``), scores
every gate that applies to the model, writes the per-question records (resumable, in
``--work-dir``), certifies a threshold per gate and for a fitted composite
(:func:`rag_gates.calibration.calibrate`), prints one table, and writes the best gate's spec
(``--out``, load it with :func:`rag_gates.calibration.load_gate`) and a plot of the certified
skip rate against epsilon for each gate.

``--data`` is JSON Lines, one question a line: ``{"question": "...", "answers": ["gold", "alias",
...]}`` with an optional ``"id"`` (default: the line number); other fields are ignored. An
answer counts as right when a gold answer occurs in it (normalised words, as the bench's
``accuracy``). ``--corpus`` is JSON Lines with ``"text"`` (optional ``"title"``, ``"id"``) or a
folder of ``.txt`` files (one passage each, titled by the file name).

Example:
    rag-gates calibrate --data examples/data/calibration_questions.jsonl \\
        --corpus examples/data/calibration_corpus.jsonl --out gate.json
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, cast

import typer
from rich.console import Console
from rich.table import Table

from rag_gates._console import error_line

__all__ = ["CalibrationQuestion", "calibrate_command", "collect_records", "read_corpus",
           "read_questions", "run_calibration"]

console = Console()

AUTO_GATES = ("answer-logprob", "first-token-prob", "cbdr", "quco")
"""What ``--gates auto`` tries, in order; each is kept only where it applies to the model."""
PLOT_EPSILONS = (0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2)
SERVED_PREFIX = "openai:"


@dataclass(frozen=True)
class CalibrationQuestion:
    """One question of ``--data`` with its gold answers."""

    id: str
    question: str
    answers: tuple[str, ...]


def _jsonl(path: Path, keys: Sequence[str], what: str, shape: str
           ) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) of a JSONL file whose rows are objects with ``keys``; a bad line
    is named, with the shape it should have."""
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                missing = [k for k in keys if k not in row]
            except (json.JSONDecodeError, TypeError) as exc:
                raise ValueError(f"{path}:{number}: not {what} ({exc}); each line is "
                                 f"{shape}") from None
            if not isinstance(row, dict) or missing:
                raise ValueError(f"{path}:{number}: not {what} (missing {missing}); each line "
                                 f"is {shape}")
            yield number, row


def read_questions(path: Path) -> list[CalibrationQuestion]:
    """Read ``--data``: JSONL with ``question`` and ``answers`` (optional ``id``), naming the
    line of any bad row."""
    if not path.is_file():
        raise ValueError(f"--data {path} does not exist; give a JSONL file of "
                         '{"question": ..., "answers": [...]} lines')
    out: list[CalibrationQuestion] = []
    seen: set[str] = set()
    for number, row in _jsonl(path, ("question", "answers"), "a calibration question",
                              '{"question": "...", "answers": ["..."]}'):
        question, answers = row["question"], row["answers"]
        if isinstance(answers, str):
            answers = [answers]
        if not isinstance(question, str) or not question.strip() or not isinstance(
                answers, list) or not answers or not all(isinstance(a, str) for a in answers):
            raise ValueError(f"{path}:{number}: 'question' must be a non-empty string and "
                             "'answers' a non-empty list of strings")
        qid = str(row.get("id") or number)
        if qid in seen:
            raise ValueError(f"{path}:{number}: id {qid!r} appears twice")
        seen.add(qid)
        out.append(CalibrationQuestion(id=qid, question=question, answers=tuple(answers)))
    if not out:
        raise ValueError(f"--data {path} has no questions")
    return out


def read_corpus(path: Path) -> list[Any]:
    """Read ``--corpus``: JSONL with ``text`` (optional ``title``, ``id``) or a folder of
    ``.txt`` files, as passages."""
    from rag_gates.types import Passage

    passages: list[Passage] = []
    if path.is_dir():
        for file in sorted(path.rglob("*.txt")):
            text = file.read_text(encoding="utf-8").strip()
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
            raise ValueError(f"{path}:{number}: 'text' must be a non-empty string")
        passages.append(Passage(id=str(row.get("id") or number), title=row.get("title"),
                                text=text))
    if not passages:
        raise ValueError(f"--corpus {path} has no passages")
    return passages


def _sha(path: Path) -> str:
    digest = hashlib.sha256()
    files = sorted(path.rglob("*.txt")) if path.is_dir() else [path]
    for file in files:
        digest.update(file.read_bytes())
    return digest.hexdigest()


def parse_gate_list(text: str) -> list[str] | None:
    """``auto`` -> None; else the comma-separated names, each one load_gate can build."""
    from rag_gates.calibration import available_core_gates

    if text.strip() == "auto":
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    known = available_core_gates()
    unknown = [n for n in names if n not in known]
    if not names or unknown:
        raise ValueError(f"--gates: unknown gate(s) {', '.join(unknown) or '(none given)'}; "
                         f"give 'auto' or a comma-separated list of {', '.join(known)}")
    return names


def check_model_spec(model: str) -> None:
    """``default``, a local model directory, or ``openai:URL[#model-name]``."""
    if model == "default":
        return
    if model.startswith(SERVED_PREFIX):
        from rag_gates.eval.runner import check_served_spec

        check_served_spec(model)
        return
    if not Path(model).is_dir():
        raise ValueError(f"--model {model!r}: not a directory; give 'default' (the embedded "
                         "SmolLM2), a local Hugging Face model directory, or "
                         "openai:URL[#model-name] for a served model")


def load_model(model: str, threads: int | None) -> Any:
    """The model that answers: in process, or behind an OpenAI-compatible server."""
    if model.startswith(SERVED_PREFIX):
        from rag_gates.lm.openai_compat import OpenAICompatibleLM

        return OpenAICompatibleLM.from_spec(model)
    from rag_gates.lm.defaults import load_lm

    return load_lm(model, num_threads=threads)


def applicable_gates(lm: Any, requested: list[str] | None, options: dict[str, Any]
                     ) -> tuple[dict[str, Any], dict[str, str]]:
    """Build the gates that apply to ``lm`` (``requested=None``: every one of
    :data:`AUTO_GATES` that does): ``(built, skipped with why)``. A requested gate that does
    not apply is an error."""
    from rag_gates.calibration.load import GateContext, _build
    from rag_gates.errors import WhiteBoxRequiredError

    ctx = GateContext(lm=lm, options=options)
    built: dict[str, Any] = {}
    skipped: dict[str, str] = {}
    for name in requested or AUTO_GATES:
        if name == "quco":
            why = ("needs corpus statistics (an infini-gram index of the corpus), which "
                   "calibrate does not build")
        else:
            try:
                built[name] = _build(name, ctx, None)
                continue
            except (WhiteBoxRequiredError, TypeError, ValueError, FileNotFoundError) as exc:
                # The first clause says why; the rest of these errors advise other gates.
                why = str(exc).splitlines()[0].split(";")[0]
        if requested is not None:
            raise ValueError(f"--gates {name}: {why}")
        skipped[name] = why
    if not built:
        raise ValueError(f"no gate applies to this model: {skipped}")
    return built, skipped


def _score(decision: Any) -> float | None:
    from rag_gates.gate import UNDECIDED_SCORE

    if "undecided" in decision.evidence or not math.isfinite(decision.score) \
            or decision.score >= UNDECIDED_SCORE:
        return None
    return float(decision.score)


def collect_records(questions: Sequence[CalibrationQuestion], lm: Any, retriever: Any,
                    gates: dict[str, Any], path: Path, *, k: int, max_new_tokens: int,
                    progress: Callable[[int, int], None] | None = None) -> list[Any]:
    """Answer every question closed book and with retrieval, score every gate, and append
    one :class:`~rag_gates.calibration.CalibrationRecord` per question to ``path``
    (questions already there are kept: resumable). The closed-book answer of a gate that
    generated it with the same prompt and budget is reused, not generated again."""
    from rag_gates._io import append_locked, drop_torn_tail
    from rag_gates.answer_once import reusable_answer
    from rag_gates.answers import accuracy
    from rag_gates.calibration import CalibrationRecord, read_records
    from rag_gates.eval.methods import MethodContext, make_method
    from rag_gates.prompts import qa_prompt

    ctx = MethodContext(lm=lm, retriever=retriever, k=k, max_new_tokens=max_new_tokens)
    closed_book, single = make_method("no-rag", ctx), make_method("single", ctx)
    path.parent.mkdir(parents=True, exist_ok=True)
    with append_locked(path) as handle:
        drop_torn_tail(path)
        done = {r.id: r for r in read_records(path)} if path.stat().st_size else {}
        wanted = {q.id for q in questions}
        if set(done) - wanted:
            raise ValueError(f"{path} holds records of questions not in --data; use another "
                             "--work-dir for other questions")
        for i, q in enumerate(questions):
            if progress is not None:
                progress(i, len(questions))
            if q.id in done:
                continue
            decisions = {name: gate.decide(q.question) for name, gate in gates.items()}
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
            retrieved = single.answer(q.question).answer
            record = CalibrationRecord(
                id=q.id, question=q.question,
                closed_book_correct=accuracy(closed, q.answers) > 0,
                retrieved_correct=accuracy(retrieved, q.answers) > 0,
                scores={name: _score(d) for name, d in decisions.items()},
                closed_book_answer=closed)
            handle.write(record.model_dump_json() + "\n")
            handle.flush()
            done[q.id] = record
        if progress is not None:
            progress(len(questions), len(questions))
    return [done[q.id] for q in questions]


def _check_work_dir(work_dir: Path, identity: dict[str, Any]) -> None:
    """The work directory's records belong to one model, data, corpus and gate set."""
    from rag_gates._io import write_text_atomic

    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / "config.json"
    if path.is_file():
        before = json.loads(path.read_text())
        if before != identity:
            diff = sorted(k for k in set(before) | set(identity)
                          if before.get(k) != identity.get(k))
            raise ValueError(f"{work_dir} holds records made with another {', '.join(diff)}; "
                             "use another --work-dir (or delete this one)")
        return
    write_text_atomic(path, json.dumps(identity, indent=2))


def plot_skip_curves(records: Sequence[Any], gates: Sequence[str], out: Path, *,
                     delta: float, bound: Literal["wsr", "binomial"], max_loss: float,
                     ) -> Path | None:
    """PNG of the certified skip rate against epsilon, one line per gate; None (and a line
    saying so) without matplotlib."""
    from rag_gates.calibration import CalibrationError, skip_curve

    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        console.print('no plot: matplotlib is missing (pip install "rag-gates[eval]")')
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    for gate in gates:
        try:
            curve = skip_curve(records, gate, PLOT_EPSILONS, delta=delta, bound=bound)
        except CalibrationError:
            continue
        ax.plot([e for e, _ in curve], [s for _, s in curve], marker="o", label=gate)
    ax.axvline(max_loss, color="grey", linestyle=":", label=f"--max-loss {max_loss:g}")
    ax.set_xlabel("epsilon (accuracy drop allowed against always retrieving)")
    ax.set_ylabel("share of retrievals skipped")
    ax.set_title(f"Skip rate at the certified threshold (delta {delta:g}, {bound})")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


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


def run_calibration(*, data: Path, corpus: Path, out: Path, model: str = "default",
                    gates: str = "auto", max_loss: float = 0.05, delta: float = 0.1,
                    bound: Literal["wsr", "binomial"] = "wsr", k: int = 3,
                    max_new_tokens: int = 32, limit: int | None = None,
                    threads: int | None = None, work_dir: Path | None = None,
                    seed: int = 0) -> Any:
    """What ``rag-gates calibrate`` does; returns the :class:`CalibrationReport`. Every
    name and option is checked before the model loads."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    if not 0 < max_loss < 1:
        raise ValueError(f"--max-loss must be in (0, 1), got {max_loss}")
    if not 0 < delta < 1:
        raise ValueError(f"--delta must be in (0, 1), got {delta}")
    if bound not in ("wsr", "binomial"):
        raise ValueError(f"--bound must be wsr or binomial, got {bound!r}")
    requested = parse_gate_list(gates)
    check_model_spec(model)
    questions = read_questions(data)[:limit]
    passages = read_corpus(corpus)
    from rag_gates.calibration import MIN_QUESTIONS

    if len(questions) < MIN_QUESTIONS:
        raise ValueError(f"--data has {len(questions)} questions; calibration needs at least "
                         f"{MIN_QUESTIONS}")
    if out.suffix != ".json":
        raise ValueError(f"--out {out}: give a .json path (the spec), e.g. gate.json")
    work = work_dir or out.with_name(out.stem + "-work")

    from rag_gates.calibration import ModelIdentity, calibrate
    from rag_gates.retrieval.bm25 import BM25Retriever

    with console.status(f"loading {model} and indexing {len(passages)} passages (BM25)"):
        from rag_gates.cli import _quiet_transformers  # at run time: cli imports this module

        _quiet_transformers()
        lm = load_model(model, threads)
        retriever = BM25Retriever.from_passages(passages)
        identity = ModelIdentity.of(lm)
    options: dict[str, Any] = {"max_new_tokens": max_new_tokens}
    built, skipped = applicable_gates(lm, requested, options)
    for name, why in skipped.items():
        console.print(f"[yellow]skipped {name}[/]: {why}", highlight=False)
    description = (f"bm25 over {corpus.name} ({len(passages)} passages, sha256 "
                   f"{_sha(corpus)[:12]}), k={k}")
    _check_work_dir(work, {"model": identity.fingerprint, "data": _sha(data),
                           "corpus": _sha(corpus), "gates": sorted(built), "k": k,
                           "max_new_tokens": max_new_tokens})
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeRemainingColumn(), console=console) as bar:
        task = bar.add_task("answering closed book and with retrieval", total=len(questions))
        records = collect_records(
            questions, lm, retriever, built, work / "records.jsonl", k=k,
            max_new_tokens=max_new_tokens,
            progress=lambda done, total: bar.update(task, completed=done, total=total))
    report = calibrate(records, max_loss=max_loss, delta=delta, bound=bound, model=identity,
                       retriever=description, gates=sorted(built), seed=seed,
                       options=options)
    console.print(_table(report))
    spec = report.best
    spec.save(out)
    (work / "report.json").write_text(report.model_dump_json(indent=2))
    plot = plot_skip_curves(records, [r.gate for r in report.rows], out.with_suffix(".png"),
                            delta=delta, bound=bound, max_loss=max_loss)
    verdict = (f"{spec.gate} at threshold {spec.threshold:.4g}: skips "
               f"{100 * spec.skip_rate.observed:.1f}% of retrievals on the certification "
               f"questions, at least {100 * spec.skip_rate.lower:.1f}% on new ones like them"
               if spec.certified else f"{spec.gate}: no threshold certified: always retrieve")
    console.print(f"best: {verdict} -> {out}", highlight=False)
    console.print(f"records: {work / 'records.jsonl'}" + (f"; plot: {plot}" if plot else ""),
                  highlight=False)
    console.print(f'serve it: load_gate("{out}", lm=lm) (rag_gates.calibration)',
                  highlight=False)
    return report


def calibrate_command(
    data: Annotated[Path, typer.Option(
        help='Your questions: JSONL, one {"question": ..., "answers": \\[gold, ...]} per line '
             '(optional "id").')],
    corpus: Annotated[Path, typer.Option(
        help='What to retrieve from: JSONL with a "text" field (optional "title", "id") or a '
             "folder of .txt files; searched with BM25.")],
    out: Annotated[Path, typer.Option(help="The spec to write (gate.json); a plot goes "
                                           "beside it (gate.png).")] = Path("gate.json"),
    model: Annotated[str, typer.Option(
        help="'default' (the embedded SmolLM2), a local Hugging Face model directory, or "
             "openai:URL\\[#model-name] (a served model: text-only and log-probability gates "
             "only).")] = "default",
    gates: Annotated[str, typer.Option(
        help="'auto' (every gate that applies to the model) or a comma-separated list: "
             "answer-logprob, first-token-prob, cbdr.")] = "auto",
    max_loss: Annotated[float, typer.Option(
        help="Epsilon: the accuracy drop against always retrieving you accept, in (0, 1).")
    ] = 0.05,
    delta: Annotated[float, typer.Option(
        help="The probability the guarantee fails, in (0, 1).")] = 0.1,
    bound: Annotated[str, typer.Option(
        help="wsr (betting bound on the signed loss; tighter) or binomial (exact tail on the "
             "harm count; conservative).")] = "wsr",
    k: Annotated[int, typer.Option(min=1, max=50, help="Passages per retrieval.")] = 3,
    max_new_tokens: Annotated[int, typer.Option(min=1, max=1024,
                                                help="Answer length budget.")] = 32,
    limit: Annotated[int | None, typer.Option(min=1, help="Use the first N questions.")
    ] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="torch threads.")] = None,
    work_dir: Annotated[Path | None, typer.Option(
        help="Where the per-question records go (resumed if it exists); default: OUT's name "
             "with -work.")] = None,
    seed: Annotated[int, typer.Option(help="Order of the betting test and the composite's "
                                           "fit/certify split.")] = 0,
) -> None:
    """Certify a gate threshold on your own questions: with probability >= 1 - delta the
    accuracy drop against always retrieving is at most --max-loss (for questions like these,
    the same model and corpus). Writes the best gate's spec; load it with load_gate."""
    from rag_gates.errors import CalibrationError, FileInUseError, ServerError

    try:
        run_calibration(data=data, corpus=corpus, out=out, model=model, gates=gates,
                        max_loss=max_loss, delta=delta,
                        bound=cast(Literal["wsr", "binomial"], bound),  # checked inside
                        k=k, max_new_tokens=max_new_tokens, limit=limit, threads=threads,
                        work_dir=work_dir, seed=seed)
    except (ValueError, CalibrationError, FileInUseError, ServerError) as exc:
        console.print(error_line(exc), highlight=False, soft_wrap=True)
        raise typer.Exit(2) from exc
