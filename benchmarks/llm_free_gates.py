"""The LLM-free rows of the estimator table (issue 57, item 2): scores that decide whether to
retrieve without running the model, on the questions of a ``rag-gates calibrate --data`` file.

    .venv/bin/python benchmarks/llm_free_gates.py \\
        --data examples/data/calibration_questions.jsonl \\
        --corpus examples/data/calibration_corpus.jsonl \\
        --out benchmarks/results/polygraph/llm-free-popqa-calibration.jsonl

Every score is oriented like our gates: **higher = less confident = retrieve**.

* ``top-passage-similarity``: ``1 - cos(question, top passage)`` under the embedded
  all-MiniLM-L6-v2, searched by :class:`rag_gates.retrieval.QdrantDenseRetriever` (an
  in-memory Qdrant collection of the ``--corpus`` passages, embedded as ``title\\ntext`` as
  ``QdrantDenseRetriever.build`` embeds them). The similarity of the top node is what
  LlamaIndex's maintainers tell users to threshold (run-llama/llama_index#3870).
* ``bm25-top-score``: minus the top BM25 score of :class:`rag_gates.retrieval.BM25Retriever`
  over ``--corpus`` (the retriever ``rag-gates calibrate`` uses on a JSONL corpus); 0 when
  no passage shares a word with the question.
* ``entity-popularity`` (PopQA only): ``-log(1 + s_pop)``, the subject's monthly Wikipedia
  page views from PopQA (``--popularity``, read by question id ``popqa-ROW`` =
  ``popqa_row_index``; Marina et al., arXiv 2505.04253, and Mallen et al.'s PopQA). The
  shared PopQA file is a benchmark input, not something a user has: their question's
  popularity would cost a page-view lookup, not the dictionary lookup timed here.
* ``quco``: the entity corpus frequency, which *is* our ``quco`` gate: the heuristic entity
  extractor (:func:`rag_gates.extract.default_extractor`, no model) and the mean count of the
  entities in an infini-gram index of ``--corpus``, score ``1 / (1 + mean count)``, built
  exactly as ``rag-gates calibrate --gates quco`` builds it
  (:func:`rag_gates.commands.calibrate.applicable_gates` with
  :func:`~rag_gates.commands.calibrate.corpus_stats_index`; the index is cached under
  ``$RAG_GATES_HOME``). ``null`` when the gate could not decide (it would retrieve).

``seconds``: one decision's wall time, question by question, on one thread (the indexes are
built once before; their build times are in ``OUT.config.json``). Labels are not here: the
table (``benchmarks/polygraph_table.py --llm-free OUT``) joins these scores with
``rag-gates calibrate``'s records of the same questions by id.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import platform
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DATA = ROOT / "examples" / "data" / "calibration_questions.jsonl"
DEFAULT_CORPUS = ROOT / "examples" / "data" / "calibration_corpus.jsonl"
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "polygraph" / "llm-free-popqa-calibration.jsonl"
DEFAULT_POPULARITY = Path("/work/shared/data/popqa_dev.jsonl")
POPQA_ID = re.compile(r"popqa-(\d+)")
ROWS = ("top-passage-similarity", "bm25-top-score", "entity-popularity", "quco")

ORIENTATION = {
    "top-passage-similarity": "1 - cosine similarity of the question to the top passage "
                              "(all-MiniLM-L6-v2)",
    "bm25-top-score": "- top BM25 score (0 when no passage matches)",
    "entity-popularity": "-log(1 + s_pop), s_pop = the subject's monthly Wikipedia page views "
                         "(PopQA)",
    "quco": "1 / (1 + mean count of the question's entities in an infini-gram index of the "
            "corpus) (rag-gates' quco gate, heuristic extractor)",
}


def popularity_table(path: Path) -> dict[int, dict[str, Any]]:
    """PopQA rows by ``popqa_row_index`` (its question, subject and ``s_pop``); rows without
    an index (other sources' copies of PopQA questions) are not joinable and are left out."""
    table: dict[int, dict[str, Any]] = {}
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                if row.get("popqa_row_index") is None:
                    continue
                table[int(row["popqa_row_index"])] = {
                    "question": row["question"], "subj": row.get("subj"),
                    "s_pop": row["s_pop"]}
    return table


def popularity_rows(questions: list[Any], path: Path | None
                    ) -> tuple[dict[str, dict[str, Any]] | None, str | None]:
    """Each question's PopQA row (None with why not: not PopQA ids, no file). A question
    whose text differs from the PopQA row of its id is an error: the join would be wrong."""
    if path is None:
        return None, "no --popularity file"
    if not all(POPQA_ID.fullmatch(q.id or "") for q in questions):
        return None, "the questions are not PopQA rows (ids popqa-ROW)"
    if not path.is_file():
        return None, f"{path} not found"
    table = popularity_table(path)
    rows: dict[str, dict[str, Any]] = {}
    for q in questions:
        match = POPQA_ID.fullmatch(q.id)
        assert match is not None
        row = table.get(int(match.group(1)))
        if row is None or row["question"] != q.question:
            raise SystemExit(f"{q.id}: {path} has no row {match.group(1)} with the question "
                             f"{q.question!r}")
        rows[q.id] = row
    return rows, None


def shown(path: Path) -> str:
    """``path`` relative to the repository when it lies inside it (for the config file)."""
    resolved = path.resolve()
    return str(resolved.relative_to(ROOT)) if resolved.is_relative_to(ROOT) else str(path)


def timed(work: Callable[[], Any]) -> tuple[Any, float]:
    start = time.perf_counter()
    value = work()
    return value, time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help="calibrate --data JSONL (default: the shipped PopQA sample)")
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS,
                        help="calibrate --corpus JSONL (default: the shipped sample's corpus)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--popularity", default=str(DEFAULT_POPULARITY),
                        help="PopQA dev JSONL with popqa_row_index and s_pop ('none': no "
                             "popularity row); used only when every id is popqa-ROW")
    parser.add_argument("--rows", default=",".join(ROWS),
                        help=f"comma-separated subset of {', '.join(ROWS)}")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (embedder)")
    args = parser.parse_args(argv)
    wanted = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = sorted(set(wanted) - set(ROWS))
    if unknown:
        parser.error(f"--rows: unknown {unknown}; known: {', '.join(ROWS)}")

    import torch

    from rag_gates._io import write_text_atomic
    from rag_gates.commands.calibrate import (
        _score,
        _sha,
        applicable_gates,
        corpus_stats_index,
        open_corpus_stats,
        read_corpus,
        read_questions,
    )

    torch.set_num_threads(args.threads)
    questions = read_questions(args.data)
    passages = read_corpus(args.corpus)
    corpus_sha = _sha(args.corpus)
    config: dict[str, Any] = {
        "data": shown(args.data), "corpus": shown(args.corpus), "corpus_sha256": corpus_sha,
        "questions": len(questions), "passages": len(passages), "threads": args.threads,
        "orientation": "higher = less confident = retrieve",
        "rows": {}, "skipped": {}, "build_seconds": {},
        "python": platform.python_version(), "torch": torch.__version__,
        "command": (f"python benchmarks/llm_free_gates.py --data {shown(args.data)} "
                    f"--corpus {shown(args.corpus)} --out {shown(args.out)}"
                    + ("" if args.rows == ",".join(ROWS) else f" --rows {args.rows}")
                    + ("" if args.popularity == str(DEFAULT_POPULARITY)
                       else f" --popularity {args.popularity}"))}
    scorers: dict[str, Callable[[Any], tuple[float | None, dict[str, Any]]]] = {}

    if "top-passage-similarity" in wanted:
        from rag_gates.retrieval.dense import QdrantDenseRetriever

        dense, secs = timed(lambda: QdrantDenseRetriever.build(passages, path=":memory:"))
        config["build_seconds"]["top-passage-similarity"] = secs

        def similarity(q: Any) -> tuple[float | None, dict[str, Any]]:
            hits = dense.retrieve(q.question, k=1)
            if not hits:
                return None, {}
            return 1.0 - float(hits[0].score), {"top_similarity": float(hits[0].score),
                                                "top_dense_passage": hits[0].id}
        scorers["top-passage-similarity"] = similarity

    if "bm25-top-score" in wanted:
        from rag_gates.retrieval.bm25 import BM25Retriever

        bm25, secs = timed(lambda: BM25Retriever.from_passages(passages))
        config["build_seconds"]["bm25-top-score"] = secs

        def bm25_top(q: Any) -> tuple[float | None, dict[str, Any]]:
            hits = bm25.retrieve(q.question, k=1)
            top = float(hits[0].score) if hits else 0.0  # no shared word: nothing matches
            return -top, {"bm25_top": top, "top_bm25_passage": hits[0].id if hits else None}
        scorers["bm25-top-score"] = bm25_top

    if "entity-popularity" in wanted:
        path = None if args.popularity.lower() == "none" else Path(args.popularity)
        pop, why = popularity_rows(questions, path)
        if pop is None:
            config["skipped"]["entity-popularity"] = why
        else:
            table = pop

            def popularity(q: Any) -> tuple[float | None, dict[str, Any]]:
                row = table[q.id]
                return -math.log1p(max(float(row["s_pop"]), 0.0)), {
                    "subject": row["subj"], "s_pop": row["s_pop"]}
            scorers["entity-popularity"] = popularity

    if "quco" in wanted and importlib.util.find_spec("infini_gram") is None:
        # Only a missing extra skips the row; any other failure is raised, not hidden.
        config["skipped"]["quco"] = "needs the corpus extra (infini-gram)"
    elif "quco" in wanted:
        def stats() -> Any:
            return open_corpus_stats(corpus_stats_index(passages, corpus_sha))
        (built, _), secs = timed(lambda: applicable_gates(None, ["quco"], {},
                                                          corpus_stats=stats))
        gate = built["quco"]
        config["build_seconds"]["quco"] = secs
        config["quco_index"] = gate.stats.index_key

        def quco(q: Any) -> tuple[float | None, dict[str, Any]]:
            decision = gate.decide(q.question)
            return _score(decision), {"entities": decision.evidence.get("entities"),
                                      "entity_counts": decision.evidence.get("counts")}
        scorers["quco"] = quco

    config["rows"] = {name: ORIENTATION[name] for name in scorers}
    lines = []
    for q in questions:
        scores: dict[str, float | None] = {}
        seconds: dict[str, float] = {}
        evidence: dict[str, Any] = {}
        for name, scorer in scorers.items():
            start = time.perf_counter()
            score, ev = scorer(q)
            secs = time.perf_counter() - start
            scores[name], seconds[name] = score, secs
            evidence.update(ev)
        lines.append(json.dumps({"id": q.id, "question": q.question, "group": q.group,
                                 "scores": scores, "seconds": seconds,
                                 "evidence": evidence}))
    write_text_atomic(args.out, "\n".join(lines) + "\n")
    write_text_atomic(args.out.with_suffix(".config.json"), json.dumps(config, indent=2) + "\n")
    print(json.dumps({"out": str(args.out), "questions": len(lines), "rows": list(scorers),
                      "skipped": config["skipped"], "build_seconds": config["build_seconds"]}))


if __name__ == "__main__":
    main()
