"""Write a multi-hop development slice as ``rag-gates calibrate`` input: the questions the
method tables in docs/benchmarks.md use, and the corpus their benchmark retrieves from.

    .venv/bin/python benchmarks/make_dev_calibration_slice.py --dataset hotpotqa --n 200 \\
        --out-questions benchmarks/data/calibrate_hotpotqa_200.jsonl \\
        --out-corpus runs/corpora/hotpotqa_dev_paragraphs.jsonl

The questions are the first ``--n`` of the development file, loaded by the lab's loader
(``rag_gates_lab.datasets.load_dataset``, as ``rag-gates bench --dataset D --n N`` loads
them): ``id``, ``question``, ``answers`` (the gold answer and, for 2Wiki, its aliases) and
``group`` (the question type: bridge / comparison / ...; ``--by-group`` certifies one
threshold per type). The corpus is every distinct context paragraph of the whole file
(``rag_gates_lab.corpus.corpus_passages``, the bench's BM25 corpus), one ``{"id", "title",
"text"}`` line each. It is large (HotpotQA: about 11k paragraphs) and rebuilt by this
command, so it goes under ``runs/`` (ignored by git); the questions are committed. The
printed record carries both files' SHA-256.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

from rag_gates_lab.corpus import corpus_passages
from rag_gates_lab.datasets import load_dataset


def _write_jsonl(path: Path, rows: list[dict[str, object]]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                    encoding="utf-8")
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", choices=("hotpotqa", "2wiki"), required=True)
    parser.add_argument("--n", type=int, default=200)
    parser.add_argument("--out-questions", type=Path, required=True)
    parser.add_argument("--out-corpus", type=Path, required=True)
    args = parser.parse_args()

    examples = load_dataset(args.dataset, n=args.n).examples
    questions: list[dict[str, object]] = [
        {"id": e.id, "question": e.question, "answers": list(e.answers),
         "group": str(e.meta.get("type") or "unknown")} for e in examples]
    passages = corpus_passages(args.dataset)
    corpus: list[dict[str, object]] = [{"id": p.id, "title": p.title, "text": p.text}
                                       for p in passages]
    record = {
        "dataset": args.dataset, "questions": len(questions), "paragraphs": len(corpus),
        "sha256": {str(args.out_questions): _write_jsonl(args.out_questions, questions),
                   str(args.out_corpus): _write_jsonl(args.out_corpus, corpus)},
    }
    print(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
