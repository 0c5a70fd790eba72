"""Does a testbed model have the skills the five methods assume? The validation shape of
issue 35, measured on a testbed's evaluation facts (``benchmarks/testbed_skills.py``, the
``skills`` step of ``benchmarks/testbed_steps.sh``).

Per evaluation fact, with the fact's own retrieval passage (``passages.jsonl``) and nothing
else, the model answers in every prompt form a method reads passages in (:data:`FORMS`),
each rendered by the method's own code, so the measurement cannot drift from the practice
the builder trains (:func:`rag_gates_lab.testbed.build.practice_messages`):

- ``qa``: the benchmark's ``single`` (QA prompt with the passage; also Tok-RAG's default
  stream prompt, CBDR's ``rag-gates`` style and QuCo's first call);
- ``deeprag`` / ``deeprag-paper``: the hop answer DeepRAG's engine writes after retrieving
  (:func:`rag_gates.deeprag.engine.retrieved_answer`: the subquery, the ``Context:`` block,
  ``Intermediate answer:``) in the bench's prompt for the model (instruction plus
  demonstration, or the model's ``deeprag.json``) and in the paper's prompt (what a
  DeepRAG-trained model carries);
- ``tokrag-reference-stream``: Tok-RAG's RAG stream with the authors' ``[Reference]:``
  passages, read by the model alone (the default stream's prompt is ``qa``'s);
- ``tokrag`` / ``tokrag-reference``: the real :class:`~rag_gates.tokrag.TokRAGDecoder`
  (the bench's ``tokrag``, and the authors' ``[Reference]:`` passages): Tok-RAG's own
  answer, reported beside the others but no criterion, since a precondition for judging a
  method cannot be the method's own output (tb12 held it to 80% until its skills step
  showed the decoder 20 points below the model reading the same stream);
- ``srrag``: SR-RAG's answer prompt after a verbalization whose text is the passage;
- ``cbdr-paper``: CBDR's ``paper`` RAG prompt.

Then closed book (``no-rag``) and GenRead (SR-RAG's verbalize-then-answer without
retrieval, the bench's ``genread``) per rung, and the two-hop questions over evaluation
facts answered by ``single`` with both hops' passages. :func:`criteria` turns the summary
into one pass/fail line per criterion of the shape; the thresholds are the constants below.

Every answer is appended to a :class:`~rag_gates._io.JsonlLog` whose header is the model,
the testbed's configuration and the settings; the same command resumes, and a larger ``n``
adds only what is missing.

Example:
    >>> from rag_gates_lab.testbed.skills import measure_skills
    >>> summary = measure_skills("~/.cache/rag-gates/testbeds/tb12", rows="rows.jsonl",
    ...                          n=10)                                     # doctest: +SKIP
    >>> [c["pass"] for c in summary["criteria"]]                          # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import json
import re
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rag_gates._optional import require
from rag_gates.answers import score_answer
from rag_gates.retrieval.base import BaseRetriever
from rag_gates.types import Passage, QAExample

__all__ = ["CLOSED_BOOK_R0_NEAR_BASE", "CLOSED_BOOK_TOP_RUNG", "DEEPRAG_CONTEXT",
           "DEEPRAG_FORMS", "FORMS", "SINGLE_FORMS", "TWOHOP_SINGLE", "GivenPassages",
           "accuracy_cell", "criteria", "form_answerers", "measure_skills",
           "paired_against_closed_book", "shape_table", "sign_test_p", "summarise"]

#: Reading forms, each the prompt a method answers from passages in.
FORMS = ("qa", "deeprag", "deeprag-paper", "tokrag", "tokrag-reference",
         "tokrag-reference-stream", "srrag", "cbdr-paper")
#: Forms held to `single`'s threshold, and DeepRAG's hop answers held to their own;
#: Tok-RAG's decoder answers ("tokrag", "tokrag-reference") are reported, not held to one.
SINGLE_FORMS = ("qa", "tokrag-reference-stream", "srrag", "cbdr-paper")
DEEPRAG_FORMS = ("deeprag", "deeprag-paper")
#: The validation shape (issue 35), in percent: closed book at the top rung at least this;
CLOSED_BOOK_TOP_RUNG = 60.0
#: closed book at r = 0 at most this many points above the base model's (its "near");
CLOSED_BOOK_R0_NEAR_BASE = 12.0
#: `single` with the fact's passage in every form of SINGLE_FORMS at least this;
SINGLE_EVERY_FORM = 80.0
#: DeepRAG's hop answer from its Context: block at least this;
DEEPRAG_CONTEXT = 70.0
#: genread at least closed book at every rung (no margin); two-hop `single` with both hops'
#: passages at least this.
TWOHOP_SINGLE = 50.0
CLOSED, GENREAD, TWOHOP = "no-rag", "genread", "twohop-single"


class GivenPassages(BaseRetriever):
    """A retriever that returns the passages set for the current question, so a method
    reads exactly the passages the measurement chooses."""

    name = "given"

    def __init__(self) -> None:
        self.passages: list[Passage] = []

    def retrieve(self, query: str, k: int = 3) -> list[Passage]:
        return list(self.passages[:k])


Answerer = Callable[[str, Sequence[Passage]], str]


def form_answerers(lm: Any, *, max_new_tokens: int = 24) -> dict[str, Answerer]:
    """One function per name of :data:`FORMS` plus ``no-rag``, ``genread`` and
    ``twohop-single``: ``(question, passages) -> reply``, each through the method's own
    code (bench methods where the bench has one)."""
    from rag_gates.cbdr.prompts import ProbePrompts
    from rag_gates.deeprag.engine import Executor, retrieved_answer
    from rag_gates.deeprag.trajectory import DeepRAGPrompt
    from rag_gates.methods import MethodContext, make_method
    from rag_gates.srrag.pipeline import answer_prompt
    from rag_gates.srrag.verbalizer import Verbalizer
    from rag_gates.tokrag.decoder import TokRAGConfig, TokRAGDecoder
    from rag_gates.tokrag.streams import stream_prompts
    from rag_gates.types import Generation, TraceRecorder
    from rag_gates_lab.plugins.deeprag import bench_prompt

    given = GivenPassages()
    # "testbed": the benchmark's default instruction, as `bench --dataset testbed:DIR`.
    ctx = MethodContext(lm=lm, retriever=given, dataset="testbed", k=2,
                        max_new_tokens=max_new_tokens)
    methods = {m: make_method(m, ctx) for m in ("single", "tokrag", CLOSED, GENREAD)}
    reference = TokRAGDecoder(lm, TokRAGConfig(passage_prefix=True), dataset="testbed")
    verbalizer = Verbalizer(lm)
    paper_cbdr = ProbePrompts(style="paper")

    def through(method: str) -> Answerer:
        def answer(question: str, passages: Sequence[Passage]) -> str:
            given.passages = list(passages)
            return str(methods[method].answer(question).answer)
        return answer

    def deeprag(prompt: DeepRAGPrompt) -> Answerer:
        def answer(question: str, passages: Sequence[Passage]) -> str:
            given.passages = list(passages)
            # The engine's retrieve-then-answer move for a first subquery that is the
            # question itself (the reading practice's one-subquery trajectory).
            _, text = Executor(lm, given, TraceRecorder()).run(retrieved_answer(
                prompt, question, "", question, len(passages), max_new_tokens))
            return text
        return answer

    def tokrag_reference(question: str, passages: Sequence[Passage]) -> str:
        return reference.generate(question, passages=list(passages),
                                  max_new_tokens=max_new_tokens).text

    def tokrag_reference_stream(question: str, passages: Sequence[Passage]) -> str:
        rag_prompt, _ = stream_prompts(question, passages, dataset="testbed",
                                       passage_format="reference")
        return lm.generate(rag_prompt, max_new_tokens=max_new_tokens).text

    def srrag(question: str, passages: Sequence[Passage]) -> str:
        # The passages' text as a finished verbalization: one untitled parametric passage.
        written = verbalizer.passage(question, Generation(
            text=" ".join(p.text for p in passages), finish_reason="eos"))
        return lm.generate(answer_prompt(question, [written], "testbed"),
                           max_new_tokens=max_new_tokens).text

    def cbdr_paper(question: str, passages: Sequence[Passage]) -> str:
        return lm.generate(paper_cbdr.rag(question, passages),
                           max_new_tokens=max_new_tokens).text

    return {"qa": through("single"), "deeprag": deeprag(bench_prompt(lm)),
            "deeprag-paper": deeprag(DeepRAGPrompt()), "tokrag": through("tokrag"),
            "tokrag-reference": tokrag_reference,
            "tokrag-reference-stream": tokrag_reference_stream, "srrag": srrag,
            "cbdr-paper": cbdr_paper,
            CLOSED: through(CLOSED), GENREAD: through(GENREAD), TWOHOP: through("single")}


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.open(encoding="utf-8") if line.strip()]


def _header(directory: Path, model: str, max_new_tokens: int) -> dict[str, Any]:
    config = (directory / "config.json").read_bytes()
    return {"testbed_config_sha256": hashlib.sha256(config).hexdigest(), "model": model,
            "max_new_tokens": max_new_tokens, "forms": list(FORMS),
            "passages": "the fact's own (twohop: both hops', in hop order)"}


def _grow_forms(path: Path, header: dict[str, Any]) -> None:
    """Rows written before a form was added hold valid answers for their forms: accept
    them by rewriting the header's form list (the only difference allowed) to ``header``'s,
    so the next run answers only the new forms. Any other difference is left for
    :class:`~rag_gates._io.JsonlLog` to refuse."""
    if not path.is_file():
        return
    with path.open(encoding="utf-8") as handle:  # the header line only, on every run
        first = handle.readline()
    try:
        old = json.loads(first)["header"]
    except (ValueError, KeyError, TypeError):
        return
    same = {k: v for k, v in old.items() if k != "forms"} == \
        {k: v for k, v in header.items() if k != "forms"}
    if same and set(old.get("forms", [])) < set(header["forms"]):
        from rag_gates._io import write_text_atomic

        rest = path.read_text(encoding="utf-8")[len(first):]
        write_text_atomic(path, json.dumps({"header": header}, ensure_ascii=False) + "\n" + rest)


def _plan(directory: Path, n: int | None, twohop_n: int | None
          ) -> list[tuple[str, QAExample, list[Passage]]]:
    from rag_gates_lab.testbed.dataset import load_testbed_dataset

    passages = {r["id"]: Passage(id=r["id"], title=r.get("title"), text=r["text"])
                for r in _rows(directory / "passages.jsonl")}
    facts = load_testbed_dataset(f"testbed:{directory}", n=n).examples
    plan = [(name, e, [passages[e.id]]) for e in facts for name in (*FORMS, CLOSED, GENREAD)]
    # The two-hop questions over evaluation facts whose hops both have a passage.
    twohop = load_testbed_dataset(f"testbed-twohop:{directory}", n=twohop_n).examples
    for e in twohop:
        hops = e.meta["hops"]
        if isinstance(hops, list) and all(str(h) in passages for h in hops):
            plan.append((TWOHOP, e, [passages[str(h)] for h in hops]))
    return plan


def shard_rows_path(rows: str | Path, index: int, count: int) -> Path:
    """Where shard ``index`` of ``count`` writes its answers: beside ``rows``
    (``skills-tb17-rows.jsonl`` -> ``skills-tb17-rows.shard-0-of-2.jsonl``)."""
    path = Path(rows)
    return path.with_name(f"{path.stem}.shard-{index}-of-{count}{path.suffix}")


def _check_shard(shard: tuple[int, int] | None) -> None:
    if shard is not None and not (shard[1] >= 1 and 0 <= shard[0] < shard[1]):
        raise ValueError(f"shard must be (index, count) with 0 <= index < count, got {shard}")


def _shard_of(plan: Sequence[tuple[str, QAExample, list[Passage]]], index: int, count: int
              ) -> list[tuple[str, QAExample, list[Passage]]]:
    """The ``index``-th of ``count`` shares of ``plan``: whole facts (every form of the j-th
    fact goes to share j % count) and whole two-hop questions (the t-th to t % count), so
    every share holds each form alike and keeps its items when ``n`` grows."""
    position: dict[tuple[bool, str], int] = {}
    seen = {False: 0, True: 0}  # facts, two-hop questions
    for form, example, _ in plan:
        key = (form == TWOHOP, example.id)
        if key not in position:
            position[key] = seen[key[0]]
            seen[key[0]] += 1
    return [item for item in plan
            if position[(item[0] == TWOHOP, item[1].id)] % count == index]


def _gather_shards(rows: Path, log: Any, done: list[dict[str, Any]],
                   header: dict[str, Any]) -> None:
    """Copy into ``log`` the rows of every shard file beside ``rows`` that it lacks. A shard
    still being written holds its lock, so this waits for none: it raises
    :class:`~rag_gates.errors.FileInUseError` naming the file; a shard written with other
    settings raises :class:`~rag_gates.errors.ArtifactError` (its header is never rewritten
    here: that could pull the file from under a running shard)."""
    import glob

    from rag_gates._io import JsonlLog

    have = {(r["form"], r["id"]) for r in done}
    pattern = f"{glob.escape(rows.stem)}.shard-*-of-*{glob.escape(rows.suffix)}"
    for path in sorted(rows.parent.glob(pattern)):
        with JsonlLog(path, header) as shard_log:
            for row in shard_log.open():
                if (row["form"], row["id"]) not in have:
                    have.add((row["form"], row["id"]))
                    log.append(row)
                    done.append(row)


def measure_skills(testbed: str | Path, rows: str | Path, *, lm: Any = None,
                   model: str | None = None, n: int | None = None,
                   twohop_n: int | None = None, max_new_tokens: int = 24,
                   base_closed_book_r0: float | None = None,
                   shard: tuple[int, int] | None = None,
                   progress: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Answer what ``rows`` (a resumable JSONL) lacks for the first ``n`` evaluation facts
    and ``twohop_n`` two-hop questions, then :func:`summarise` what is there.

    ``lm`` (any white-box model) or ``model`` (a path or ``"default"``; default the
    testbed's ``model/``) answers; ``model`` names it in the rows' header either way.
    ``base_closed_book_r0``: see :func:`summarise`.

    ``shard=(index, count)``: answer only every ``count``-th fact (all its forms) and
    two-hop question from the ``index``-th on, into :func:`shard_rows_path` (so ``count``
    processes, one thread each, share the work), and summarise those rows alone. A run
    without ``shard`` first copies every shard file's rows into ``rows``, then answers what
    none of them did.

    Example (two lanes, then the whole table)::

        measure_skills(tb, rows, shard=(0, 2))   # in one process
        measure_skills(tb, rows, shard=(1, 2))   # in another, at the same time
        summary = measure_skills(tb, rows)       # after both: no answer left to give
    """
    from rag_gates._io import JsonlLog

    _check_shard(shard)
    directory = Path(testbed).expanduser().resolve()
    name = model or str(directory / "model")
    plan = _plan(directory, n, twohop_n)
    if shard is not None:
        plan = _shard_of(plan, *shard)
    header = _header(directory, name, max_new_tokens)
    path = Path(rows) if shard is None else shard_rows_path(rows, *shard)
    _grow_forms(path, header)
    log = JsonlLog(path, header)
    with log:
        done = log.open()
        if shard is None:
            _gather_shards(path, log, done, header)
        have = {(r["form"], r["id"]) for r in done}
        todo = [(f, e, p) for f, e, p in plan if (f, e.id) not in have]
        if todo:
            if lm is None:
                from rag_gates.lm.defaults import load_lm

                lm = load_lm(name, num_threads=1)
            answerers = form_answerers(lm, max_new_tokens=max_new_tokens)
            start = time.perf_counter()
            for i, (form, example, passages) in enumerate(todo):
                t0 = time.perf_counter()
                reply = answerers[form](example.question, passages)
                row = {"form": form, "id": example.id, "rung": example.meta["repetitions"],
                       "answer": reply, "seconds": round(time.perf_counter() - t0, 3),
                       "accuracy": score_answer(reply, example.answers, "testbed")["accuracy"]}
                log.append(row)
                done.append(row)
                if progress and (i + 1) % 10 == 0:
                    progress(f"{i + 1}/{len(todo)} answers, "
                             f"{time.perf_counter() - start:.0f}s")
    wanted = {(f, e.id) for f, e, _ in plan}
    return summarise([r for r in done if (r["form"], r["id"]) in wanted],
                     base_closed_book_r0=base_closed_book_r0)


def accuracy_cell(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """``{"n", "accuracy"}`` of answer rows (accuracy in %, one decimal; None if no row)."""
    mean = statistics.fmean(r["accuracy"] for r in rows) if rows else None
    return {"n": len(rows), "accuracy": None if mean is None else round(100 * mean, 1)}


def _seconds(rows: Sequence[dict[str, Any]]) -> float | None:
    """The median seconds per answer (what a full run costs), where rows record it."""
    timed = [float(r["seconds"]) for r in rows if "seconds" in r]
    return round(statistics.median(timed), 2) if timed else None


def summarise(rows: Sequence[dict[str, Any]], *,
              base_closed_book_r0: float | None = None) -> dict[str, Any]:
    """Accuracy per form, overall and per rung, over the facts answered in every fact form
    (a fact interrupted halfway counts once finished); the two-hop questions by their pair
    of rungs; then :func:`criteria`. ``base_closed_book_r0``: the base model's closed-book
    accuracy at r = 0 on the same facts (the validate step's), for the one criterion this
    measurement cannot make alone."""
    fact_forms = (*FORMS, CLOSED, GENREAD)
    by_id: dict[str, set[str]] = {}
    for r in rows:
        by_id.setdefault(r["id"], set()).add(r["form"])
    complete = {i for i, forms in by_id.items() if set(fact_forms) <= forms}
    facts = [r for r in rows if r["form"] in fact_forms and r["id"] in complete]
    rungs = sorted({int(r["rung"]) for r in facts})
    table: dict[str, Any] = {}
    for form in fact_forms:
        mine = [r for r in facts if r["form"] == form]
        table[form] = {**accuracy_cell(mine), "seconds_median": _seconds(mine), "by_rung": {
            str(k): accuracy_cell([r for r in mine if int(r["rung"]) == k]) for k in rungs}}
    twohop = [r for r in rows if r["form"] == TWOHOP]
    pairs = sorted({tuple(r["rung"]) for r in twohop})
    table[TWOHOP] = {**accuracy_cell(twohop), "seconds_median": _seconds(twohop), "by_rungs": {
        f"{a}/{b}": accuracy_cell([r for r in twohop if tuple(r["rung"]) == (a, b)])
        for a, b in pairs}}
    summary = {"facts_complete": len(complete), "rungs": rungs, "table": table,
               "base_closed_book_r0": base_closed_book_r0,
               "genread_against_closed_book": paired_against_closed_book(facts, GENREAD)}
    summary["criteria"] = criteria(summary)
    return summary


def sign_test_p(lost: int, gained: int) -> float:
    """Exact two-sided sign test over the facts two forms disagree on (scipy's
    ``binomtest`` at even odds): the probability of a split at least as uneven."""
    if lost + gained == 0:
        return 1.0
    stats = require("scipy.stats", "eval")
    return float(stats.binomtest(lost, lost + gained, 0.5).pvalue)


def paired_against_closed_book(facts: Sequence[dict[str, Any]], form: str
                               ) -> dict[str, dict[str, Any]]:
    """Per rung, the facts closed book answers right and ``form`` wrong (``lost``), the
    reverse (``gained``), and :func:`sign_test_p`: whether a rung's gap is more than the
    few facts a retrained model moves (benchmarks/results/testbed/LOG.md, tb13 and tb14)."""
    right: dict[tuple[str, str], bool] = {(r["form"], r["id"]): r["accuracy"] == 1.0
                                          for r in facts}
    rung_of = {r["id"]: int(r["rung"]) for r in facts if r["form"] == form}
    out: dict[str, dict[str, Any]] = {}
    for k in sorted(set(rung_of.values())):
        ids = [i for i, rung in rung_of.items() if rung == k and (CLOSED, i) in right]
        lost = sum(right[(CLOSED, i)] and not right[(form, i)] for i in ids)
        gained = sum(right[(form, i)] and not right[(CLOSED, i)] for i in ids)
        out[str(k)] = {"facts": len(ids), "lost": lost, "gained": gained,
                       "sign_test_p": round(sign_test_p(lost, gained), 4)}
    return out


def _line(name: str, rule: str, measured: float | None, ok: bool | None) -> dict[str, Any]:
    return {"criterion": name, "rule": rule, "measured": measured,
            "pass": ok if measured is not None else None}


def criteria(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """One line per criterion of the validation shape: the rule (the thresholds of this
    module), what was measured, and ``pass`` (None where nothing was measured)."""
    table, rungs = summary["table"], summary["rungs"]
    closed = table[CLOSED]["by_rung"]
    lines = []
    top = closed[str(rungs[-1])]["accuracy"] if rungs else None
    lines.append(_line("closed book at the top rung", f">= {CLOSED_BOOK_TOP_RUNG}", top,
                       top is not None and top >= CLOSED_BOOK_TOP_RUNG))
    base = summary.get("base_closed_book_r0")
    r0 = closed["0"]["accuracy"] if "0" in closed else None
    gap = None if base is None or r0 is None else round(r0 - base, 1)
    lines.append(_line("closed book at r = 0 near the base model's (points above it)",
                       f"<= {CLOSED_BOOK_R0_NEAR_BASE}", gap,
                       gap is not None and gap <= CLOSED_BOOK_R0_NEAR_BASE))
    for form in SINGLE_FORMS:
        acc = table[form]["accuracy"]
        lines.append(_line(f"single in the {form} form", f">= {SINGLE_EVERY_FORM}", acc,
                           acc is not None and acc >= SINGLE_EVERY_FORM))
    for form in DEEPRAG_FORMS:
        acc = table[form]["accuracy"]
        lines.append(_line(f"DeepRAG's hop answer from Context: ({form})",
                           f">= {DEEPRAG_CONTEXT}", acc,
                           acc is not None and acc >= DEEPRAG_CONTEXT))
    for k in rungs:
        g, c = table[GENREAD]["by_rung"][str(k)]["accuracy"], closed[str(k)]["accuracy"]
        gap = None if g is None or c is None else round(g - c, 1)
        lines.append(_line(f"genread minus closed book at r = {k}", ">= 0", gap,
                           gap is not None and gap >= 0))
    acc = table[TWOHOP]["accuracy"]
    lines.append(_line("two-hop single with both hops' passages", f">= {TWOHOP_SINGLE}", acc,
                       acc is not None and acc >= TWOHOP_SINGLE))
    return lines


def _row_label(names: Sequence[str]) -> str:
    """One label for a criterion's names across builds: the name, or, where builds differ
    only in a rung's count (the top rung of 64 against 128), the counts joined by " / "."""
    if len(set(names)) == 1:
        return names[0]
    stems = {re.sub(r"r = \d+", "r = #", name) for name in names}
    if len(stems) != 1:
        raise ValueError(f"the builds' criteria differ in more than a rung's count: {names}")
    counts = dict.fromkeys(m[1] for name in names if (m := re.search(r"r = (\d+)", name)))
    return stems.pop().replace("#", " / ".join(counts))


def _cell(line: dict[str, Any]) -> str:
    if line["measured"] is None:
        return "not measured"
    return f"{line['measured']} pass" if line["pass"] else f"**{line['measured']} fail**"


def shape_table(reports: dict[str, dict[str, Any]]) -> str:
    """The validation shape of several builds side by side, as a Markdown table: a row per
    criterion (the rule, then each build's measured figure and pass or fail) and a last row
    counting the lines each build meets.

    ``reports`` maps a build's name to its skills report (``skills-tbN.json``, the
    ``criteria`` list :func:`criteria` writes), in the order of the columns. Builds whose
    criteria are not the same lines in the same order are refused.

    Example:
        >>> import json
        >>> reports = {tb: json.load(open(f"benchmarks/results/testbed/skills-{tb}.json"))
        ...            for tb in ("tb13", "tb15")}                          # doctest: +SKIP
        >>> print(shape_table(reports))                                     # doctest: +SKIP
    """
    if not reports:
        raise ValueError("shape_table needs at least one build's skills report")
    lines = {name: report["criteria"] for name, report in reports.items()}
    counts = {len(criteria_) for criteria_ in lines.values()}
    if len(counts) != 1:
        raise ValueError(f"the builds have different numbers of criteria: "
                         f"{ {name: len(c) for name, c in lines.items()} }")
    out = ["| criterion | rule | " + " | ".join(lines) + " |",
           "| --- | --- |" + " ---: |" * len(lines)]
    for rows in zip(*lines.values(), strict=True):
        rules = {row["rule"] for row in rows}
        if len(rules) != 1:
            raise ValueError(f"the builds hold {rows[0]['criterion']!r} to different rules: "
                             f"{sorted(rules)}")
        label = _row_label([row["criterion"] for row in rows])
        out.append(f"| {label} | {rules.pop()} | " + " | ".join(_cell(r) for r in rows) + " |")
    met = [f"{sum(r['pass'] is True for r in c)} of {len(c)}" for c in lines.values()]
    out.append("| lines met | | " + " | ".join(met) + " |")
    return "\n".join(out)
