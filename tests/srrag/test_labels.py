"""Source labelling on a tiny random-weight model over real PopQA questions (plumbing)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from rag_gates._io import append_locked
from rag_gates.errors import ArtifactError, FileInUseError
from rag_gates.lm.hf import HFWhiteBoxLM
from rag_gates.prompts import qa_prompt
from rag_gates.srrag.labels import (
    ContextScore,
    LabelConfig,
    answer_continuation,
    collect_labels,
    label_question,
    preferred_source,
    read_labels,
)
from rag_gates.srrag.verbalizer import VerbalizerConfig

SMALL = LabelConfig(n_retrieved=2, n_verbalized=2, verbalizer=VerbalizerConfig(max_new_tokens=4))


def ctx(source: str, p: float) -> ContextScore:
    return ContextScore(source=source, text="t", answer="a", mean_logprob=math.log(p),
                        tokens=1)  # type: ignore[arg-type]


def test_rules_sum_and_majority() -> None:
    # One very helpful passage against three fairly helpful verbalizations: the sums prefer
    # retrieval (0.99 > 0.9), the top 3 are mostly verbalizations.
    contexts = [ctx("retrieval", 0.95), ctx("retrieval", 0.02), ctx("retrieval", 0.02),
                ctx("parametric", 0.3), ctx("parametric", 0.3), ctx("parametric", 0.3)]
    assert preferred_source(contexts, "sum") == "retrieval"
    assert preferred_source(contexts, "top-n") == "parametric"
    # Unequal counts: five passages at 0.3 sum to more than one verbalization at 0.5, but
    # per context the verbalization helps more.
    unequal = [ctx("retrieval", 0.3)] * 5 + [ctx("parametric", 0.5)]
    assert preferred_source(unequal, "sum") == "parametric"
    assert preferred_source(unequal, "top-n") == "parametric"
    tie = [ctx("retrieval", 0.5), ctx("parametric", 0.5)]
    assert preferred_source(tie, "sum") == preferred_source(tie, "top-n") == "retrieval"
    assert preferred_source([ctx("parametric", 0.1)]) == "parametric"
    assert preferred_source([]) == "retrieval"
    with pytest.raises(ValueError, match="rule"):
        preferred_source(contexts, "max")  # type: ignore[arg-type]


def test_answer_continuation_follows_the_prompt_end(tiny: Any) -> None:
    assert tiny.render("Q?").endswith("\n")  # chat template: the assistant header
    assert answer_continuation(tiny, "Q?", " Paris ") == "Paris"
    plain = HFWhiteBoxLM(tiny.model, tiny.tokenizer, model_id="plain", chat_template=False)
    assert answer_continuation(plain, "Q?", "Paris") == " Paris"


def test_label_question_scores_every_context(tiny: Any, bm25: Any, popqa: list[Any]) -> None:
    example = popqa[0]
    label = label_question(tiny, bm25, example, SMALL)
    retrieved = bm25.retrieve(example.question, 2)  # BM25 may find fewer than asked
    assert [c.source for c in label.contexts] == ["retrieval"] * len(retrieved) + \
        ["parametric"] * 2
    assert [c.passage_id for c in label.contexts[:len(retrieved)]] == [p.id for p in retrieved]
    # The stored score is the best alias's mean log-probability under the QA prompt.
    first = label.contexts[0]
    prompt = qa_prompt(example.question, bm25.retrieve(example.question, 1), dataset="popqa")
    aliases = list(dict.fromkeys(example.answers))[:SMALL.max_answers]
    direct = tiny.score(prompt, [answer_continuation(tiny, prompt, a) for a in aliases])
    assert first.mean_logprob == pytest.approx(max(s.mean for s in direct), abs=1e-4)
    assert first.answer in aliases
    assert label.source == label.by_rule["sum"] == preferred_source(label.contexts, "sum")
    assert label.by_rule["top-n"] == preferred_source(label.contexts, "top-n")
    assert label.retrieval_likelihood == pytest.approx(
        sum(c.likelihood for c in label.contexts[:len(retrieved)]))


def test_collection_resumes_and_refuses_other_settings(tiny: Any, bm25: Any,
                                                       popqa: list[Any], tmp_path: Path) -> None:
    out = tmp_path / "labels.jsonl"
    first = collect_labels(tiny, bm25, popqa[:2], SMALL, out)
    assert len(out.read_text().splitlines()) == 3  # settings + 2 questions
    with out.open("a") as handle:
        handle.write('{"id": "torn')
    seen: list[tuple[int, int]] = []
    both = collect_labels(tiny, bm25, popqa[:3], SMALL, out,
                          progress=lambda done, total, r: seen.append((done, total)))
    assert both[:2] == first and seen == [(1, 3), (2, 3), (3, 3)]
    lines = out.read_text().splitlines()
    assert [json.loads(x)["id"] for x in lines[1:]] == [e.id for e in popqa[:3]]
    # The rule is recomputed from the stored scores: no relabelling, the file is unchanged.
    top_n = collect_labels(tiny, bm25, popqa[:3],
                           SMALL.model_copy(update={"rule": "top-n"}), out)
    assert [lb.source for lb in top_n] == [lb.by_rule["top-n"] for lb in both]
    assert out.read_text().splitlines() == lines
    header, read = read_labels(out, rule="top-n")
    assert header["model_id"] == "tiny-llama-seed0" and header["n_verbalized"] == 2
    assert read == top_n
    with pytest.raises(ArtifactError, match="other settings"):
        collect_labels(tiny, bm25, popqa[:1], SMALL.model_copy(update={"n_verbalized": 3}),
                       out)
    # Another process labelling into the same file: refused before reading or writing.
    with append_locked(out), pytest.raises(FileInUseError, match="another process"):
        collect_labels(tiny, bm25, popqa[:4], SMALL, out)
    assert out.read_text().splitlines() == lines
    collect_labels(tiny, bm25, popqa[:1], SMALL, out)  # the lock went with the refusal
    (tmp_path / "other.jsonl").write_text('{"x": 1}\n')
    with pytest.raises(ArtifactError, match="not an SR-RAG label file"):
        read_labels(tmp_path / "other.jsonl")
    with pytest.raises(FileNotFoundError, match="srrag label"):
        read_labels(tmp_path / "missing.jsonl")
