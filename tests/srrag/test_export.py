"""SR-RAG's training-data export on PopQA label rows: what each record trains and masks, the
DPO pairs, the skips, and ``rag-gates srrag export`` end to end (tiny random-weight model;
the tokenisation is real)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from rag_gates.lm.hf import HFWhiteBoxLM
from rag_gates.srrag.export import (
    ExportFormat,
    export_stage1,
    export_stage2_dpo,
    stage1_example,
    stage2_pair,
    tokenize_stage1,
)
from rag_gates.srrag.labels import (
    ContextScore,
    LabelConfig,
    SourceLabel,
    collect_labels,
    preferred_source,
    read_labels,
)
from rag_gates.srrag.routing import RoutingPrompt, _option_ids
from rag_gates.srrag.verbalizer import VerbalizerConfig
from rag_gates.testing import tiny_lm, tiny_model_and_tokenizer
from rag_gates_lab.commands.srrag import srrag_app

QUESTION = "What is Henry Feilden's occupation?"
ANSWERS = ["politician", "political leader", "political figure", "polit.", "pol"]
FEILDEN = ("Henry Feilden (Conservative politician)",
           "Henry Master Feilden (21 February 1818 – 5 September 1875) was an English "
           "Conservative Party politician.")
POLITICIAN = ("Politician",
              "A politician  is a person who participates in policy-making processes, usually "
              "holding a position in government. Politicians represent the people, make "
              "decisions, and influence the formulation of public policy.")
GOOD = ("Henry Master Feilden was an English politician of the Conservative Party. He sat in "
        "the House of Commons for Blackburn from 1869.")
WEAK = "Henry Feilden was a British Army officer and naturalist who travelled in the Arctic."
WORST = "Feilden is a surname of English origin. Notable people with the surname include:"
runner = CliRunner()


@pytest.fixture(scope="module")
def lm() -> Any:
    """The tiny model with room for PopQA paragraphs (its tokenizer has 320 tokens)."""
    return tiny_lm(seed=0, max_context=4096)


def passage(title_text: tuple[str, str], logprob: float) -> ContextScore:
    title, text = title_text
    return ContextScore(source="retrieval", passage_id=title, title=title, text=text,
                        answer="politician", mean_logprob=logprob, tokens=3)


def verbalized(text: str, logprob: float, answer: str = "politician") -> ContextScore:
    return ContextScore(source="parametric", passage_id=f"parametric-{len(text)}", text=text,
                        answer=answer, mean_logprob=logprob, tokens=3)


def label(contexts: list[ContextScore], id: str = "popqa-2", answers: list[str] | None = None,
          source: str | None = None) -> SourceLabel:
    """A label row as ``rag-gates srrag label`` writes it (source by the sum rule)."""
    by_rule = {rule: preferred_source(contexts, rule) for rule in ("sum", "top-n")}
    return SourceLabel(
        id=id, dataset="popqa", question=QUESTION, answers=ANSWERS if answers is None else answers,
        source=source or by_rule["sum"], by_rule=by_rule,
        retrieval_likelihood=sum(c.likelihood for c in contexts if c.source == "retrieval"),
        parametric_likelihood=sum(c.likelihood for c in contexts if c.source == "parametric"),
        contexts=contexts, seconds=31.5)


def parametric_label() -> SourceLabel:
    # The verbalizations beat the passages; the best one is the second.
    return label([passage(FEILDEN, -2.9), passage(POLITICIAN, -3.4),
                  verbalized(WEAK, -1.6, answer="political figure"), verbalized(GOOD, -0.4),
                  verbalized(WORST, -4.2)])


def retrieval_label() -> SourceLabel:
    # The passages win; the better one (c_e+) is the second retrieved.
    return label([passage(POLITICIAN, -2.2), passage(FEILDEN, -0.3),
                  verbalized(WEAK, -2.5), verbalized(WORST, -3.9)], id="popqa-3")


def split(row: SourceLabel, lm: Any) -> tuple[dict[str, list[int]], int, str, str]:
    """The stage-1 record of ``row``, its prompt length, and the decoded masked text after
    the prompt and trained text; the prompt is the routing pass's, token for token, all
    masked."""
    record = tokenize_stage1(stage1_example(row, lm), lm)
    prompt_ids = lm.encode(RoutingPrompt().text(QUESTION))
    n = len(prompt_ids)
    ids, labels = record["input_ids"], record["labels"]
    assert ids[:n] == prompt_ids and labels[:n] == [-100] * n and len(ids) == len(labels)
    assert all(lab in (-100, i) for i, lab in zip(ids, labels, strict=True))
    decode = lm.tokenizer.decode
    assert decode(prompt_ids) == lm.render(RoutingPrompt().text(QUESTION))
    masked = decode([i for i, lab in zip(ids[n:], labels[n:], strict=True) if lab == -100])
    trained = decode([i for i, lab in zip(ids, labels, strict=True) if lab != -100])
    return record, n, masked, trained


# ---------------------------------------------------------------- stage 1
def test_parametric_label_trains_source_word_best_verbalization_and_answer(lm: Any) -> None:
    assert parametric_label().source == "parametric"
    record, n, masked, trained = split(parametric_label(), lm)
    assert masked == ""
    # L_src + L_verb (c_i+ and its end marker) + L_ans on the FIRST gold answer + eos.
    assert trained == f"Memory\n- {GOOD}\nAnswer: politician<|im_end|>"
    assert WEAK not in trained and "political figure" not in trained
    # The first trained token is one p_M reads as "parametric" after the same prompt.
    first = record["input_ids"][n]
    retrieve_ids, parametric_ids = _option_ids(lm, RoutingPrompt())
    assert first in parametric_ids and first not in retrieve_ids


def test_retrieval_label_trains_no_passage_token(lm: Any) -> None:
    assert retrieval_label().source == "retrieval"
    record, n, masked, trained = split(retrieval_label(), lm)
    # c_e+ (the better passage, not the first) and the end marker are context: masked.
    assert masked == f"- {FEILDEN[0]}: {FEILDEN[1]}\nAnswer:"
    assert trained == "Search\n politician<|im_end|>"
    assert record["input_ids"][n] in _option_ids(lm, RoutingPrompt())[0]
    # Not one passage token carries a label.
    passage_ids = lm.token_ids(f"- {FEILDEN[0]}: {FEILDEN[1]}")
    ids, labels = record["input_ids"], record["labels"]
    start = next(i for i in range(len(ids)) if ids[i:i + len(passage_ids)] == passage_ids)
    assert labels[start:start + len(passage_ids)] == [-100] * len(passage_ids)


def test_plain_prompts_and_other_markers(lm: Any) -> None:
    plain = HFWhiteBoxLM(lm.model, lm.tokenizer, model_id="plain", chat_template=False)
    fmt = ExportFormat(routing=RoutingPrompt(retrieve_words=("Wiki",),
                                             parametric_words=("Self",)),
                       end_of_knowledge="\nSo the answer is: ")
    example = stage1_example(parametric_label(), plain, fmt)
    # No chat template: the prompt ends with the question, so the source word takes a space.
    assert example.parts == [(" Self\n", True), (f"- {GOOD}", True),
                             ("\nSo the answer is: ", True), ("politician", True)]
    record = tokenize_stage1(example, plain)
    prompt_ids = plain.encode(example.prompt)
    assert lm.tokenizer.decode(record["input_ids"][len(prompt_ids):]) == \
        f" Self\n- {GOOD}\nSo the answer is: politician<|im_end|>"


# ---------------------------------------------------------------- stage 2
def test_dpo_pair_is_best_over_worst_verbalization(lm: Any, tmp_path: Path) -> None:
    pair = stage2_pair(parametric_label(), lm)
    assert pair is not None
    assert pair.prompt == lm.render(RoutingPrompt().text(QUESTION)) + "Memory\n"
    assert (pair.chosen, pair.rejected) == (f"- {GOOD}\nAnswer:", f"- {WORST}\nAnswer:")
    assert stage2_pair(retrieval_label(), lm) is None
    counts = export_stage2_dpo([parametric_label(), retrieval_label()], lm,
                               tmp_path / "sub" / "dpo.jsonl")
    assert (counts.labels, counts.records) == (2, 1)
    assert counts.skipped == {"retrieval_preferred": 1}
    (line,) = (tmp_path / "sub" / "dpo.jsonl").read_text().splitlines()
    assert json.loads(line) == pair.model_dump()
    assert sorted(json.loads(line)) == ["chosen", "prompt", "rejected"]


def test_labels_without_a_pair_or_a_record_are_skipped_and_counted(lm: Any,
                                                                   tmp_path: Path) -> None:
    one = label([passage(FEILDEN, -3.0), verbalized(GOOD, -0.2)], id="one")
    tied = label([passage(FEILDEN, -3.0), verbalized(GOOD, -0.2), verbalized(GOOD, -0.2)],
                 id="tied")
    no_answer = label([passage(FEILDEN, -0.1)], id="blank", answers=["  "])
    empty = label([], id="empty")  # nothing retrieved or verbalized: "retrieval", no context
    rows = [parametric_label(), one, tied, retrieval_label(), no_answer, empty]
    dpo = export_stage2_dpo(rows, lm, tmp_path / "dpo.jsonl")
    assert dpo.records == 1
    assert dpo.skipped == {"one_verbalization": 1, "tied_verbalizations": 1,
                           "retrieval_preferred": 3}
    stage1 = export_stage1(rows, lm, tmp_path / "stage1.jsonl")
    assert stage1.records == 4 and stage1.skipped == {"no_gold_answer": 1, "no_context": 1}
    lines = [json.loads(x) for x in (tmp_path / "stage1.jsonl").read_text().splitlines()]
    assert [sorted(x) for x in lines] == [["input_ids", "labels"]] * 4
    assert lines[0] == tokenize_stage1(stage1_example(parametric_label(), lm), lm)
    # A passage longer than the model's context gives no record (256 tokens here).
    short = tiny_lm(seed=0)
    assert export_stage1([retrieval_label().model_copy(update={"contexts": [
        passage(POLITICIAN, -0.1)] * 2})], short, tmp_path / "s.jsonl").skipped == \
        {"too_long": 1}


def test_arguments_are_checked(lm: Any, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"read_labels\(path\)\[1\]"):
        export_stage1(str(tmp_path / "labels.jsonl"), lm, tmp_path / "x.jsonl")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="SourceLabel"):
        export_stage1([42], lm, tmp_path / "x.jsonl")  # type: ignore[list-item]
    with pytest.raises(TypeError, match="HFWhiteBoxLM"):
        export_stage1([parametric_label()], lm.tokenizer, tmp_path / "x.jsonl")
    same_start = ExportFormat(routing=RoutingPrompt(retrieve_words=("<Wiki>",),
                                                    parametric_words=("<Self>",)))
    with pytest.raises(ValueError, match="start differently"):
        export_stage2_dpo([parametric_label()], lm, tmp_path / "x.jsonl", same_start)
    with pytest.raises(ValidationError, match="visible text"):
        ExportFormat(end_of_knowledge="\n ")
    assert not (tmp_path / "x.jsonl").exists()
    # Dicts (JSON label rows) are read as labels.
    counts = export_stage1([parametric_label().model_dump(mode="json")], lm,
                           tmp_path / "d.jsonl")
    assert counts.records == 1


def test_labels_written_by_the_label_code_export(lm: Any, bm25: Any, popqa: list[Any],
                                                 tmp_path: Path) -> None:
    config = LabelConfig(n_retrieved=2, n_verbalized=2,
                         verbalizer=VerbalizerConfig(max_new_tokens=6))
    labels = collect_labels(lm, bm25, popqa[:3], config, tmp_path / "labels.jsonl")
    _, rows = read_labels(tmp_path / "labels.jsonl")
    assert rows == labels
    assert {r.source for r in rows} == {"parametric", "retrieval"}  # seed 0: both branches
    stage1 = export_stage1(rows, lm, tmp_path / "stage1.jsonl")
    assert stage1.records == 3 and stage1.skipped == {}
    for row, line in zip(rows, (tmp_path / "stage1.jsonl").read_text().splitlines(),
                         strict=True):
        record = json.loads(line)
        n = len(lm.encode(RoutingPrompt().text(row.question)))
        trained = lm.tokenizer.decode([i for i, lab in zip(record["input_ids"][n:],
                                                           record["labels"][n:], strict=True)
                                       if lab != -100])
        best = max((c for c in row.contexts if c.source == row.source),
                   key=lambda c: c.mean_logprob)
        if row.source == "parametric":
            assert trained == f"Memory\n- {best.text}\nAnswer: {row.answers[0]}<|im_end|>"
        else:
            assert trained == f"Search\n {row.answers[0]}<|im_end|>"
    dpo = export_stage2_dpo(rows, lm, tmp_path / "dpo.jsonl")
    assert dpo.records + sum(dpo.skipped.values()) == 3
    assert dpo.skipped.get("retrieval_preferred", 0) == sum(r.source == "retrieval"
                                                           for r in rows)


# ---------------------------------------------------------------- CLI
def test_cli_exports_both_stages(tmp_path: Path) -> None:
    model = tmp_path / "tiny"  # save_tiny_lm's, with room for a PopQA paragraph
    weights, tokenizer = tiny_model_and_tokenizer(0, max_context=4096)
    weights.save_pretrained(model)
    tokenizer.save_pretrained(model)
    labels = tmp_path / "labels.jsonl"
    header = {"kind": "srrag-labels", "model_id": str(model), "retriever": "bm25",
              "n_retrieved": 2, "n_verbalized": 3}
    short = [label([passage(FEILDEN, -2.9), verbalized(GOOD, -0.4), verbalized(WORST, -4.2),
                    verbalized(WEAK, -1.0)]),
             label([passage(FEILDEN, -0.3), verbalized(WORST, -3.9)], id="popqa-3"),
             label([passage(FEILDEN, -2.0), verbalized(WEAK, -0.5)], id="popqa-7")]
    labels.write_text("\n".join([json.dumps({"header": header}),
                                 *(r.model_dump_json() for r in short)]) + "\n")
    stage1, dpo = tmp_path / "out" / "stage1.jsonl", tmp_path / "out" / "dpo.jsonl"
    args = ["export", "--labels", str(labels), "--model", str(model)]
    result = runner.invoke(srrag_app, [*args, "--stage1", str(stage1), "--dpo", str(dpo)])
    assert result.exit_code == 0, result.output
    assert "stage 1: 3 records from 3 labels (skipped: none)" in result.output
    assert "DPO: 1 records from 3 labels (skipped: 1 one verbalization, 1 retrieval " \
           "preferred)" in " ".join(result.output.split())
    assert len(stage1.read_text().splitlines()) == 3
    (pair,) = [json.loads(x) for x in dpo.read_text().splitlines()]
    assert pair["chosen"] == f"- {GOOD}\nAnswer:" and pair["rejected"] == f"- {WORST}\nAnswer:"
    nothing = runner.invoke(srrag_app, args)
    assert nothing.exit_code == 1 and "--stage1 FILE and/or --dpo FILE" in nothing.output
    missing = runner.invoke(srrag_app, ["export", "--labels", str(tmp_path / "no.jsonl"),
                                        "--model", str(model), "--dpo", str(dpo)])
    assert missing.exit_code == 1 and "srrag label" in missing.output
    foreign = tmp_path / "foreign.jsonl"
    foreign.write_text(labels.read_text().replace(str(model), "someone-else"))
    refused = runner.invoke(srrag_app, ["export", "--labels", str(foreign), "--model",
                                        str(model), "--dpo", str(dpo)])
    assert refused.exit_code == 1 and "preferences of 'someone-else'" in refused.output
    assert len(dpo.read_text().splitlines()) == 1
