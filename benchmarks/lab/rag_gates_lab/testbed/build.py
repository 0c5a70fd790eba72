"""Build a knowledge-controlled testbed: choose PopQA facts, state each one a known number of
times in a training corpus mixed with Wikipedia paragraphs, and continue training the
embedded model on that corpus with :class:`transformers.Trainer`.

The output directory holds::

    config.json        the build configuration (a directory accepts only the same one again)
    manifest.jsonl     every fact: subject, relation, object, repetitions, split, question
    corpus.jsonl       the training corpus, one document per line (statements + paragraphs)
    passages.jsonl     the retrieval corpus: one passage per fact plus the paragraphs
    counterfactual.jsonl  per fact, a passage of the same form with a wrong object
    bridges.jsonl      the purpose-written second hops: a birthplace for the person a
                       calibration or evaluation fact's object names (``bridges=True``)
    twohop.jsonl       two-hop questions: "In what city was the director of X born?" over a
                       fact and its bridge, plus any facts that chain in PopQA itself
    checkpoints/       Trainer checkpoints while training (removed when the build completes)
    model/             the trained model: a normal HF directory (``load_lm(DIR / "model")``)
    training.json      the training record: steps, losses, tokens, seconds, tokens/s

Everything before training is a pure function of the configuration (and the shipped data);
training is seeded and resumes from its last checkpoint when the build is run again.

Example:
    >>> from rag_gates_lab.testbed import TestbedConfig, build_testbed
    >>> record = build_testbed(TestbedConfig(n_facts=120, ladder=[0, 2, 8, 32]),
    ...                        "~/.cache/rag-gates/testbeds/tb1")      # doctest: +SKIP
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rag_gates._io import write_text_atomic
from rag_gates.prompts import qa_prompt
from rag_gates.types import Passage
from rag_gates_lab.testbed.facts import (
    BRIDGE_QUESTIONS,
    SPLITS,
    Bridge,
    Fact,
    PopQAFact,
    _rng,
    check_split_fractions,
    load_popqa_facts,
    load_wiki_paragraphs,
    plan_bridges,
    plan_facts,
    render_fact,
)

__all__ = ["SKILL_FORMS", "UNKNOWN_VERBALIZATION", "TestbedConfig", "build_testbed",
           "document_words", "plan_figures", "practice_messages", "read_manifest",
           "skill_documents", "testbed_documents", "unknown_documents", "write_plan"]

logger = logging.getLogger(__name__)

# Where the x86 CPU's flags are read: bfloat16 autocast is fast only with these units.
CPUINFO = Path("/proc/cpuinfo")
BFLOAT16_UNITS = ("amx_bf16", "avx512_bf16", "amx_tile")
EMULATED_BFLOAT16 = (
    "--precision bf16 on a CPU whose flags list no bfloat16 unit (amx_bf16, avx512_bf16): "
    "bfloat16 is emulated there, and a training step measured 22 times slower than "
    "fp32 (135 s against 6.2 s on an AVX2-only AMD EPYC; benchmarks/results/testbed/"
    "train_precision_no_bf16.json). Build with --precision fp32 on this machine (a testbed "
    "of its own: precision is part of the identity), or on a CPU with AMX.")


def cpuinfo_values(key: str, cpuinfo: str | Path | None = None) -> list[str] | None:
    """The values of the ``key`` lines in ``/proc/cpuinfo`` (one per logical CPU), or
    ``None`` where it cannot be read (another OS)."""
    try:
        text = (Path(cpuinfo) if cpuinfo is not None else CPUINFO).read_text()
    except OSError:
        return None
    return [line.split(":", 1)[1].strip() for line in text.splitlines()
            if line.split(":", 1)[0].strip() == key and ":" in line]


def cpu_bfloat16_units(cpuinfo: str | Path | None = None) -> list[str] | None:
    """The bfloat16 units an x86 CPU lists among its flags (empty: none, so bfloat16 is
    emulated), or ``None`` where no x86 ``flags`` line can be read (another OS or
    architecture: unknown, not absent).

    Example:
        >>> cpu_bfloat16_units()  # doctest: +SKIP
        ['amx_bf16', 'amx_tile', 'avx512_bf16']
    """
    flags = cpuinfo_values("flags", cpuinfo)
    if not flags:
        return None
    return sorted({f for line in flags for f in line.split() if f in BFLOAT16_UNITS})


CONFIG, MANIFEST, CORPUS, PASSAGES, COUNTERFACTUAL, TWOHOP, BRIDGES, RECORD = (
    "config.json", "manifest.jsonl", "corpus.jsonl", "passages.jsonl", "counterfactual.jsonl",
    "twohop.jsonl", "bridges.jsonl", "training.json")
#: Configuration fields added after testbeds were built without them, with the value such a
#: testbed has (its config.json lacks the field).
_LEGACY = {"bridges": False, "recall_examples": 0, "recall_repetitions": 16, "skill_reading": 0,
           "skill_decomposition": 0, "skill_hop_repetitions": 8, "skill_verbalization": 0,
           "skill_twohop_reading": 0, "skill_unknown": 0, "precision": "fp32",
           "recall_question_repetitions": 1}
MODEL_DIR, CHECKPOINTS = "model", "checkpoints"
#: What the verbalization practice on untaught subjects (``skill_unknown``) writes.
UNKNOWN_VERBALIZATION = "There is no information about {subject}."


class TestbedConfig(BaseModel):
    """Everything that defines a testbed (``threads`` and ``keep_checkpoints`` aside)."""

    __test__ = False  # not a pytest class
    model_config = ConfigDict(frozen=True, extra="forbid")

    base_model: str = Field("default", description="'default' (the embedded SmolLM2) or an "
                                                   "HF directory to continue training.")
    n_facts: int = Field(96, ge=1, description="Facts chosen, over all rungs and splits.")
    ladder: list[int] = Field([0, 2, 8, 32], min_length=1,
                              description="Repetition counts; facts cycle through them.")
    split_fractions: list[float] = Field(
        [0.25, 0.15, 0.6], min_length=3, max_length=3,
        description="Shares of probe-training, calibration and evaluation facts.")
    relations: list[str] | None = Field(None, description="Relations to use (default: all "
                                                          "with templates).")
    general_paragraphs: int = Field(72, ge=0, description="Wikipedia paragraphs mixed in.")
    reading_examples: int = Field(
        120, ge=0, description="Questions answered from a context of passages, about facts "
                               "outside the manifest, in the chat format of the benchmark's "
                               "RAG prompt: they keep the model reading its context.")
    reading_passages: int = Field(3, ge=1, le=8, description="Passages per reading example "
                                                             "(one states the answer).")
    recall_examples: int = Field(
        0, ge=0, description="Facts outside the manifest, each stated recall_repetitions "
                             "times and asked closed-book (recall_question_repetitions "
                             "times) in the chat format of the "
                             "benchmark's no-context QA prompt: they teach the model to answer "
                             "a question from what statements taught it (knowledge "
                             "extraction), without asking about any manifest fact.")
    recall_repetitions: int = Field(16, ge=1, description="Statements per recall fact.")
    recall_question_repetitions: int = Field(
        1, ge=1, description="Times each recall fact's closed-book question is in the corpus "
                             "(the same document repeated): more practice at answering from "
                             "statements without more recall facts.")
    skill_reading: int = Field(
        0, ge=0, description="Reading practice per method prompt form (deeprag, "
                             "tokrag-reference, srrag, cbdr-paper; the benchmark's form, shared "
                             "by Tok-RAG's default, CBDR's rag-gates style and QuCo, is "
                             "reading_examples): questions about facts outside the manifest "
                             "answered from passages in the prompt each method renders, so the "
                             "model reads its context in every method's format.")
    skill_decomposition: int = Field(
        0, ge=0, description="Decomposition practice: two-hop questions over facts outside the "
                             "manifest (a fact whose object is a person, and a purpose-written "
                             "birthplace for that person), written as DeepRAG trajectories; "
                             "half answer both hops from memory, half retrieve one or both "
                             "hops from a Context: block.")
    skill_hop_repetitions: int = Field(
        8, ge=1, description="Statements of each decomposition hop answered from memory "
                             "(a retrieved hop is stated only in its Context: block).")
    skill_verbalization: int = Field(
        0, ge=0, description="Verbalization practice: SR-RAG's GenRead prompt for a recall "
                             "fact's question, answered with statements of the fact the corpus "
                             "teaches (at most recall_examples).")
    skill_twohop_reading: int = Field(
        0, ge=0, description="Two-hop reading practice: two-hop questions over facts outside "
                             "the manifest (as skill_decomposition's, other people) in the "
                             "benchmark's QA prompt, both hops' passages among fillers, "
                             "answered with the second hop's answer (tb12 answered the first "
                             "hop's person for 82 of its 85 wrong two-hop answers).")
    skill_unknown: int = Field(
        0, ge=0, description="Verbalization practice on untaught subjects: SR-RAG's GenRead "
                             "prompt for a question about a PopQA subject that appears nowhere "
                             "else in the corpus, answered "
                             f"'{UNKNOWN_VERBALIZATION.format(subject='SUBJECT')}' "
                             "(tb12 and tb13 verbalized a guess for facts never taught and the "
                             "answer read it: genread below closed book at r = 0).")
    bridges: bool = Field(True, description=(
        "Purpose-written second hops: a birthplace for the person each calibration or "
        "evaluation fact's object names (director, author, ...), stated a ladder count of "
        "times, and the two-hop questions over them (for DeepRAG)."))
    seed: int = 0
    epochs: float = Field(2.0, gt=0)
    learning_rate: float = Field(1.5e-4, gt=0, le=1e-2)
    batch_size: int = Field(2, ge=1)
    block_size: int = Field(256, ge=16, le=4096,
                            description="Tokens per packed training sequence (a reading "
                                        "example, about 150 tokens, must fit in one).")
    warmup_fraction: float = Field(0.05, ge=0, lt=1)
    save_steps: int = Field(10, ge=1, description="Checkpoint every this many steps.")
    precision: Literal["fp32", "bf16"] = Field("fp32", description=(
        "'fp32', or 'bf16': bfloat16 autocast over fp32 master weights (the saved model "
        "stays fp32). About 1.6 times faster a step on a CPU with AMX "
        "(benchmarks/testbed_train_precision.py); 22 times slower on one without bfloat16 "
        "units (measured on an AVX2-only AMD EPYC; the build warns there)."))
    popqa_path: str | None = Field(None, description="PopQA slice (default: shipped).")
    wiki_path: str | None = Field(None, description="Paragraph file (default: shipped).")
    threads: int | None = Field(None, ge=1, exclude=True,
                                description="torch threads (not part of the identity).")
    keep_checkpoints: bool = Field(False, exclude=True)
    compile: bool = Field(False, exclude=True, description=(
        "torch.compile the model for training (inductor; about 1.3 times faster a step on "
        "this machine after about 90 s of compiling: benchmarks/testbed_train_precision.py "
        "--compile). How it runs, not what it trains: not part of the identity, as threads."))

    @field_validator("ladder")
    @classmethod
    def _distinct(cls, ladder: list[int]) -> list[int]:
        if len(set(ladder)) != len(ladder) or any(r < 0 for r in ladder):
            raise ValueError(f"ladder must be distinct non-negative counts, got {ladder}")
        return ladder

    @field_validator("split_fractions")
    @classmethod
    def _shares(cls, fractions: list[float]) -> list[float]:
        return check_split_fractions(fractions)


def read_manifest(directory: str | Path) -> list[Fact]:
    """The facts of a built (or planned) testbed, in manifest order."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(f"{path} does not exist: build the testbed first "
                                f"(rag-gates testbed build --out {directory})")
    return [Fact.model_validate_json(line) for line in path.open(encoding="utf-8")
            if line.strip()]


def _jsonl(path: Path, rows: Sequence[dict[str, Any]]) -> None:
    write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def testbed_documents(config: TestbedConfig) -> dict[str, list[dict[str, Any]]]:
    """Manifest, training corpus, retrieval passages, counterfactual passages and two-hop
    questions of a configuration (no model involved; deterministic)."""
    pool = load_popqa_facts(config.popqa_path)
    facts = plan_facts(pool, n_facts=config.n_facts, ladder=config.ladder, seed=config.seed,
                       split_fractions=config.split_fractions, relations=config.relations)
    wiki = load_wiki_paragraphs(config.wiki_path)
    order = list(range(len(wiki)))
    _rng(config.seed, "general").shuffle(order)
    general = [wiki[i] for i in sorted(order[: config.general_paragraphs])]
    corpus: list[dict[str, Any]] = []
    for f in facts:
        for k, text in enumerate(render_fact(f, f.repetitions, config.seed)):
            corpus.append({"id": f"{f.id}-{k}", "kind": "fact", "fact": f.id, "text": text})
    for i, p in enumerate(general):
        corpus.append({"id": f"wiki-{i}", "kind": "general", "title": p["title"],
                       "text": p["text"]})
    bridges = plan_bridges(facts, pool, ladder=config.ladder, seed=config.seed) \
        if config.bridges else []
    for b in bridges:
        for k, text in enumerate(render_fact(b, b.repetitions, config.seed)):
            corpus.append({"id": f"{b.id}-{k}", "kind": "bridge", "fact": b.id, "text": text})
    corpus += reading_documents(pool, facts, config)
    corpus += recall_documents(pool, facts, config)
    corpus += skill_documents(pool, facts, config)
    corpus += unknown_documents(pool, facts, bridges, corpus, config)
    _rng(config.seed, "corpus").shuffle(corpus)
    stated: list[Fact | Bridge] = [*facts, *bridges]
    passages = [{"id": f"{f.id}", "title": f.subj, "text": render_fact(f, 1, config.seed)[0],
                 "fact": f.id} for f in stated]
    passages += [{"id": f"wiki-{i}", "title": p["title"], "text": p["text"]}
                 for i, p in enumerate(general)]
    counterfactual = [{"id": f"{f.id}-cf", "fact": f.id, "title": f.subj,
                       "text": render_fact(f, 1, config.seed, obj=f.counterfactual)[0],
                       "object": f.counterfactual} for f in facts]
    return {"manifest": [f.model_dump() for f in facts], "corpus": corpus,
            "passages": passages, "counterfactual": counterfactual,
            "bridges": [b.model_dump() for b in bridges],
            "twohop": bridge_twohop(facts, bridges) + compose_twohop(facts)}


def reading_documents(pool: Sequence[PopQAFact], facts: Sequence[Fact],
                      config: TestbedConfig) -> list[dict[str, Any]]:
    """Reading-comprehension documents: a PopQA question about a fact *outside* the
    manifest, answered in the chat format from ``reading_passages`` passages of which one
    states the fact and the others state other reading facts.

    Continued training on bare statements alone teaches the model to answer from memory and
    to stop reading its prompt (tb3: retrieval stopped helping although the right passage was
    always retrieved). These documents keep the reading skill without teaching any manifest
    fact: their facts share no subject or object with a manifest fact's subject, so the
    manifest's repetition counts, and QuCo's counts of the manifest subjects, stay exact.
    """
    n = config.reading_examples
    if n == 0:
        return []
    candidates = _outside_manifest(pool, facts, config.seed)
    # Each example's distractors come from the candidates after the readers (the recall
    # facts among them), so no reading fact is stated more often than it is asked about plus
    # a few, and the reading examples do not depend on the recall examples.
    readers, fillers = candidates[:n], candidates[n:] or candidates[:n]
    if len(readers) < n:
        raise ValueError(f"only {len(readers)} PopQA facts remain outside the manifest for "
                         f"reading examples; ask for fewer (reading_examples={n})")
    out: list[dict[str, Any]] = []
    for i, fact in enumerate(readers):
        passages = _context([fact], fillers, config.reading_passages, config.seed,
                            _rng(config.seed, "reading", fact.row))
        prompt = qa_prompt(fact.question, passages)
        out.append({"id": f"read-{i}", "kind": "reading", "row": fact.row, "prompt": prompt,
                    "answer": fact.obj, "text": f"{prompt}\n{fact.obj}"})
    return out


def _outside_manifest(pool: Sequence[PopQAFact], facts: Sequence[Fact], seed: int
                      ) -> list[PopQAFact]:
    """PopQA facts sharing no row, and no subject or object with a manifest subject, in a
    seeded order: the first ones become reading examples, the next ones recall facts."""
    taken = {f.row for f in facts}
    subjects = {f.subj.casefold() for f in facts}
    candidates = [p for p in pool if p.row not in taken and p.subj.casefold() not in subjects
                  and p.obj.casefold() not in subjects]
    _rng(seed, "reading").shuffle(candidates)
    return candidates


def _recall_facts(pool: Sequence[PopQAFact], facts: Sequence[Fact], config: TestbedConfig
                  ) -> list[PopQAFact]:
    """The recall facts: the ``recall_examples`` outside-manifest facts after the reading
    examples' (fewer when the pool runs out)."""
    start = config.reading_examples
    return _outside_manifest(pool, facts, config.seed)[start: start + config.recall_examples]


def recall_documents(pool: Sequence[PopQAFact], facts: Sequence[Fact],
                     config: TestbedConfig) -> list[dict[str, Any]]:
    """Recall (knowledge-extraction) documents: ``recall_examples`` PopQA facts outside the
    manifest, each stated ``recall_repetitions`` times (``kind`` ``recall-statement``) and
    asked closed-book ``recall_question_repetitions`` times (``kind`` ``recall``: the
    benchmark's no-context QA prompt and the short answer, trained in the chat format).

    Why: a model trained on statements alone learns the objects but often cannot bind them
    to their subject when *asked* (tb5-tb7: at the top rung, most wrong closed-book answers
    are another taught name of the right type). Questions about other facts whose statements
    it also saw teach it to answer from those statements (Allen-Zhu & Li, "Physics of
    Language Models 3.1": QA on some individuals lets QA on others generalise). The recall
    facts are not the reading examples' questions (a few may be a reading example's
    distractor passage, one statement more) and, like them, share no subject or object
    with a manifest subject, so the manifest's repetition counts and QuCo's counts of its
    subjects stay exact; no manifest question is ever asked.
    """
    n = config.recall_examples
    if n == 0:
        return []
    recall = _recall_facts(pool, facts, config)
    if len(recall) < n:
        raise ValueError(f"only {len(recall)} PopQA facts remain outside the manifest and the "
                         f"reading examples for recall examples; ask for fewer "
                         f"(recall_examples={n})")
    out: list[dict[str, Any]] = []
    for i, fact in enumerate(recall):
        for k, text in enumerate(render_fact(fact, config.recall_repetitions, config.seed)):
            out.append({"id": f"recall-{i}-{k}", "kind": "recall-statement", "row": fact.row,
                        "text": text})
        prompt = qa_prompt(fact.question)
        for j in range(config.recall_question_repetitions):  # the first keeps its old id
            out.append({"id": f"recall-{i}" + (f"-ask-{j}" if j else ""), "kind": "recall",
                        "row": fact.row, "prompt": prompt, "answer": fact.obj,
                        "text": f"{prompt}\n{fact.obj}"})
    return out


#: Two-hop question forms: (first relation, second relation) -> question about the first
#: subject whose answer is the second fact's object.
_TWOHOP = {
    ("country", "capital"): "What is the capital of the country where {s} is located?",
    ("place of birth", "country"): "In what country is the city where {s} was born?",
    ("capital of", "capital"): "What is the capital of the place whose capital is {s}?",
}


def bridge_twohop(facts: Sequence[Fact], bridges: Sequence[Bridge]) -> list[dict[str, Any]]:
    """One question per (fact, bridge) pair: the fact's object is the bridge's person. Each
    row names both hops, their repetition counts, the first hop's split, and each hop's own
    question and answers (the subqueries a decomposition should ask)."""
    by_id = {f.id: f for f in facts}
    out = []
    for b in bridges:
        for first in (by_id[i] for i in b.via):
            out.append({"id": f"{first.id}+{b.id}",
                        "question": BRIDGE_QUESTIONS[first.prop].format(s=first.subj),
                        "answers": b.answers, "hops": [first.id, b.id],
                        "repetitions": [first.repetitions, b.repetitions],
                        "splits": [first.split, b.split],
                        "subqueries": [{"question": first.question, "answers": first.answers},
                                       {"question": b.question, "answers": b.answers}]})
    return out


def compose_twohop(facts: Sequence[Fact]) -> list[dict[str, Any]]:
    """Questions that chain two facts: the first fact's object is the second's subject."""
    by_subject: dict[tuple[str, str], Fact] = {(f.prop, f.subj.casefold()): f for f in facts}
    out = []
    for first in facts:
        for (p1, p2), form in _TWOHOP.items():
            second = by_subject.get((p2, first.obj.casefold())) if first.prop == p1 else None
            if second is None or second.id == first.id:
                continue
            out.append({"id": f"{first.id}+{second.id}", "question": form.format(s=first.subj),
                        "answers": second.answers, "hops": [first.id, second.id],
                        "repetitions": [first.repetitions, second.repetitions],
                        "splits": [first.split, second.split]})
    return out


def _identity(config: TestbedConfig) -> dict[str, Any]:
    return config.model_dump()


def _prepare(out: Path, config: TestbedConfig) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / CONFIG
    now = _identity(config)
    if path.is_file():
        before = json.loads(path.read_text())
        diff = {k: (before.get(k, _LEGACY.get(k)), v) for k, v in now.items()
                if before.get(k, _LEGACY.get(k)) != v}
        if diff:
            raise ValueError(f"{out} holds a testbed built with another configuration (was, "
                             f"now): {diff}. Use a new --out directory.")
        return
    write_text_atomic(path, json.dumps(now, indent=2))


def _base_model_dir(name: str) -> Path:
    if name == "default":
        from rag_gates.lm.defaults import default_lm_dir, load_default_tokenizer

        load_default_tokenizer()  # converts the shipped GGUF once if needed
        return default_lm_dir()
    path = Path(name).expanduser()
    if not path.is_dir():
        raise FileNotFoundError(f"base model directory {path} does not exist; pass "
                                "base_model='default' or an HF model directory")
    return path


def pack_blocks(texts: Sequence[str], tokenizer: Any, block_size: int,
                splittable: Sequence[bool] | None = None) -> list[list[int]]:
    """Token blocks of at most ``block_size``, documents (each ending in EOS) packed in order.

    A statement is never split across blocks (a fact cut in two teaches nothing), unless it
    is longer than a block; a ``splittable`` document (general text) fills the rest of the
    current block and continues in the next, so blocks carry almost no padding.
    """
    eos = tokenizer.eos_token_id
    flags = list(splittable) if splittable is not None else [False] * len(texts)
    blocks: list[list[int]] = []
    current: list[int] = []
    for text, split_ok in zip(texts, flags, strict=True):
        ids = [*tokenizer(text, add_special_tokens=False)["input_ids"], eos]
        if split_ok:
            while ids:
                room = block_size - len(current)
                current, ids = current + ids[:room], ids[room:]
                if len(current) == block_size:
                    blocks.append(current)
                    current = []
            continue
        for piece in (ids[i:i + block_size] for i in range(0, len(ids), block_size)):
            if current and len(current) + len(piece) > block_size:
                blocks.append(current)
                current = []
            current = current + piece
    if current:
        blocks.append(current)
    return blocks


class _Blocks:
    """A map-style dataset of packed blocks, padded per batch by :func:`_collate`."""

    def __init__(self, blocks: list[list[int]]) -> None:
        self.blocks = blocks

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> dict[str, list[int]]:
        return {"input_ids": self.blocks[i]}


def _collator(pad_id: int) -> Callable[[list[dict[str, list[int]]]], dict[str, Any]]:
    import torch

    def collate(batch: list[dict[str, list[int]]]) -> dict[str, Any]:
        width = max(len(b["input_ids"]) for b in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, b in enumerate(batch):
            ids[i, : len(b["input_ids"])] = torch.tensor(b["input_ids"])
            mask[i, : len(b["input_ids"])] = 1
        labels = ids.masked_fill(mask == 0, -100)  # no loss on padding
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    return collate


def _last_checkpoint(directory: Path) -> Path | None:
    found = [p for p in directory.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()]
    return max(found, key=lambda p: int(p.name.split("-")[-1])) if found else None


def build_testbed(config: TestbedConfig, out_dir: str | Path, *,
                  callbacks: Sequence[Any] = (), progress: bool = True) -> dict[str, Any]:
    """Build (or resume, or return the record of) the testbed in ``out_dir``.

    ``callbacks``: extra :class:`transformers.TrainerCallback` objects. ``progress``: the
    Trainer's progress bar on stderr. Returns the training record (``training.json``).
    """
    out = Path(out_dir).expanduser()
    _prepare(out, config)
    if (out / RECORD).is_file() and (out / MODEL_DIR).is_dir():
        logger.info("testbed %s is complete; nothing to do", out)
        record: dict[str, Any] = json.loads((out / RECORD).read_text())
        return record
    if config.precision == "bf16" and cpu_bfloat16_units() == []:
        warnings.warn(EMULATED_BFLOAT16, RuntimeWarning, stacklevel=2)
    write_plan(config, out)
    corpus = [json.loads(line) for line in (out / CORPUS).open(encoding="utf-8")]
    return _train(config, out, corpus, callbacks, progress)


def write_plan(config: TestbedConfig, out_dir: str | Path) -> dict[str, int]:
    """Write the manifest and the corpora of ``config`` (no training); facts per split."""
    out = Path(out_dir).expanduser()
    _prepare(out, config)
    docs = testbed_documents(config)
    for name, key in ((MANIFEST, "manifest"), (CORPUS, "corpus"), (PASSAGES, "passages"),
                      (COUNTERFACTUAL, "counterfactual"), (TWOHOP, "twohop"),
                      (BRIDGES, "bridges")):
        _jsonl(out / name, docs[key])
    counts = {split: sum(1 for f in docs["manifest"] if f["split"] == split) for split in SPLITS}
    logger.info("testbed %s: %d facts (%s), %d corpus documents, %d two-hop questions", out,
                len(docs["manifest"]), counts, len(docs["corpus"]), len(docs["twohop"]))
    return counts


def _tokenizer(config: TestbedConfig) -> Any:
    from rag_gates._optional import require

    transformers = require("transformers", "hf")
    return transformers.AutoTokenizer.from_pretrained(_base_model_dir(config.base_model),
                                                      local_files_only=True)


def _pack(config: TestbedConfig, corpus: Sequence[dict[str, Any]], tokenizer: Any
          ) -> list[list[int]]:
    return pack_blocks([training_text(d, tokenizer) for d in corpus], tokenizer,
                       config.block_size, [d["kind"] == "general" for d in corpus])


def plan_figures(config: TestbedConfig) -> dict[str, Any]:
    """What training ``config`` costs, before training: documents (and per kind), packed
    blocks, tokens per epoch, optimizer steps, and the documents longer than a block (split
    by :func:`pack_blocks`), per kind. Needs the base model's tokenizer, no model.

    Example:
        >>> plan_figures(TestbedConfig(n_facts=40))["tokens_per_epoch"]   # doctest: +SKIP
    """
    corpus = testbed_documents(config)["corpus"]
    tokenizer = _tokenizer(config)
    kinds: dict[str, int] = {}
    longer: dict[str, int] = {}
    for d in corpus:
        kind = d["kind"] + (f"/{d['form']}" if "form" in d else "")
        kinds[kind] = kinds.get(kind, 0) + 1
        if d["kind"] != "general" and len(tokenizer(training_text(d, tokenizer),
                                                     add_special_tokens=False)["input_ids"]
                                           ) + 1 > config.block_size:
            longer[kind] = longer.get(kind, 0) + 1
    blocks = _pack(config, corpus, tokenizer)
    steps = max(1, round(-(-len(blocks) // config.batch_size) * config.epochs))
    return {"documents": len(corpus), "by_kind": dict(sorted(kinds.items())),
            "blocks": len(blocks), "tokens_per_epoch": sum(len(b) for b in blocks),
            "steps": steps, "longer_than_block": dict(sorted(longer.items()))}


def document_words(document: dict[str, Any]) -> str:
    """The words a corpus document puts before the model, without any chat markup: its
    ``text``, or a skill-practice document's turns (``messages``) one per line. What the
    corpus statistics count (QuCo's "what the model saw"): the chat template's tokens are
    not words of the world the testbed teaches.

    >>> document_words({"id": "d", "messages": [{"role": "user", "content": "Q?"},
    ...                                           {"role": "assistant", "content": "A."}]})
    'Q?\nA.'
    """
    if "text" in document:
        return str(document["text"])
    if "messages" in document:
        return "\n".join(str(m["content"]) for m in document["messages"])
    raise ValueError(f"testbed corpus document {document.get('id')!r} has neither 'text' nor "
                     "'messages': the corpus.jsonl is not one `rag-gates testbed build` wrote")


def training_text(document: dict[str, Any], tokenizer: Any) -> str:
    """The text a corpus document is trained as: a reading or recall example in the
    tokenizer's chat format (the format the benchmark prompts the model in), anything else
    as it is."""
    if "messages" in document:  # skill practice: the method's own chat turns
        return str(tokenizer.apply_chat_template(document["messages"], tokenize=False))
    if document["kind"] not in ("reading", "recall"):
        return str(document["text"])
    return str(tokenizer.apply_chat_template(
        [{"role": "user", "content": document["prompt"]},
         {"role": "assistant", "content": document["answer"]}], tokenize=False))


def _train(config: TestbedConfig, out: Path, corpus: list[dict[str, Any]],
           callbacks: Sequence[Any], progress: bool) -> dict[str, Any]:
    from rag_gates._optional import require

    torch = require("torch", "hf")
    transformers = require("transformers", "hf")
    if config.threads:
        torch.set_num_threads(config.threads)
    base = _base_model_dir(config.base_model)
    tokenizer = _tokenizer(config)
    blocks = _pack(config, corpus, tokenizer)
    tokens = sum(len(b) for b in blocks)
    transformers.set_seed(config.seed)
    model = transformers.AutoModelForCausalLM.from_pretrained(
        base, local_files_only=True, dtype=torch.float32)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None \
        else tokenizer.eos_token_id
    steps_per_epoch = -(-len(blocks) // config.batch_size)
    total_steps = max(1, round(steps_per_epoch * config.epochs))
    args = transformers.TrainingArguments(
        output_dir=str(out / CHECKPOINTS), per_device_train_batch_size=config.batch_size,
        num_train_epochs=config.epochs, learning_rate=config.learning_rate,
        lr_scheduler_type="cosine", warmup_steps=int(config.warmup_fraction * total_steps),
        weight_decay=0.0, logging_steps=max(1, min(10, total_steps // 20)),
        save_strategy="steps", save_steps=config.save_steps, save_total_limit=1,
        seed=config.seed, data_seed=config.seed, use_cpu=True, report_to=[],
        disable_tqdm=not progress, dataloader_num_workers=0, logging_first_step=True,
        remove_unused_columns=False, bf16=config.precision == "bf16",
        torch_compile=config.compile)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=_Blocks(blocks),
                                   data_collator=_collator(pad), callbacks=list(callbacks))
    if not progress:  # without the bar the Trainer prints every log line to stdout instead
        trainer.remove_callback(transformers.PrinterCallback)
    resume = _last_checkpoint(out / CHECKPOINTS)
    if resume is not None:
        logger.info("resuming the testbed training from %s", resume)
    started = time.perf_counter()
    result = trainer.train(resume_from_checkpoint=str(resume) if resume else None)
    seconds = time.perf_counter() - started
    done_steps = trainer.state.global_step - (int(resume.name.split("-")[-1]) if resume else 0)
    target = out / MODEL_DIR
    staging = out / f".{MODEL_DIR}.partial"
    shutil.rmtree(staging, ignore_errors=True)
    model.config._name_or_path = f"testbed:{out.name}"
    model.save_pretrained(staging)  # not trainer.save_model: it adds a pickled args file
    tokenizer.save_pretrained(staging)
    shutil.rmtree(target, ignore_errors=True)
    os.rename(staging, target)
    trained_tokens = tokens * config.epochs
    record = {
        "config": config.model_dump(), "base_model_dir": str(base),
        "documents": len(corpus), "blocks": len(blocks), "tokens_per_epoch": tokens,
        "steps": trainer.state.global_step, "steps_this_run": done_steps,
        "resumed_from": resume.name if resume else None,
        "train_loss": result.training_loss, "log_history": trainer.state.log_history,
        "seconds_this_run": seconds, "threads": torch.get_num_threads(),
        "torch_compile": config.compile,
        "tokens_per_second": (tokens * config.epochs * done_steps / max(1, trainer.state.max_steps))
        / seconds if seconds > 0 else None,
        "trained_tokens": trained_tokens,
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
    }
    write_text_atomic(out / RECORD, json.dumps(record, indent=2))
    if not config.keep_checkpoints:
        shutil.rmtree(out / CHECKPOINTS, ignore_errors=True)
    logger.info("testbed model saved to %s (%d steps, %.0f s)", target,
                trainer.state.global_step, seconds)
    return record


# ----------------------------------------------------------------------- skill practice
#: The prompt forms of the reading practice (``skill_reading`` examples each), each rendered
#: by the method's own code. The benchmark's QA prompt is the reading examples' form
#: (``reading_examples``) and is shared, so not repeated here, by Tok-RAG's default stream
#: prompt ("list" passages), CBDR's ``rag-gates`` probe style, SR-RAG's answer after a
#: retrieval and QuCo's first call (``continue_prompt`` with nothing written yet).
#: ``deeprag``: a one-subquery trajectory retrieving its ``Context:`` block, after the
#: benchmark's DeepRAG prompt for a model without ``deeprag.json`` (instruction plus
#: demonstration); ``tokrag-reference``: Tok-RAG's stream prompt with the authors'
#: ``[Reference]: `` passages (``passage_prefix=True``); ``srrag``: SR-RAG's answer prompt
#: after a verbalization (one untitled passage); ``cbdr-paper``: CBDR's ``paper`` probe style.
SKILL_FORMS = ("deeprag", "tokrag-reference", "srrag", "cbdr-paper")


def _messages(prompt: Any, answer: str) -> list[dict[str, str]]:
    """A rendered prompt (text, or chat messages) and its answer as chat turns."""
    turns = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else \
        [{"role": m.role, "content": m.content} for m in prompt]
    return [*turns, {"role": "assistant", "content": answer}]


def deeprag_trajectory_messages(question: str, hops: Sequence[tuple[str, str,
                                                                   Sequence[Passage] | None]],
                                answer: str, prompt: Any) -> list[dict[str, str]]:
    """A DeepRAG trajectory as chat turns, rendered by :func:`rag_gates.deeprag.export.
    sft_example` (what DeepRAG's own SFT trains on): ``hops`` are (subquery, intermediate
    answer, passages or None for an answer from memory); ``prompt`` a DeepRAGPrompt."""
    from rag_gates.deeprag.export import sft_example
    from rag_gates.deeprag.gates import MarkerGate
    from rag_gates.deeprag.trajectory import Step, Trajectory

    gate = MarkerGate(name="deeprag-text")  # the decisions Trajectory.parse reads back
    steps = tuple(Step(subquery=q, answer=a, passages=None if p is None else tuple(p),
                       decision=gate.decide(q, written="direct" if p is None else "retrieve"))
                  for q, a, p in hops)
    example = sft_example(Trajectory(question=question, steps=steps, final_answer=answer),
                          prompt)
    return _messages(example.prompt, example.completion)


def practice_messages(form: str, question: str, passages: Sequence[Passage], answer: str
                      ) -> list[dict[str, str]]:
    """The chat turns of one reading-practice example in ``form`` (:data:`SKILL_FORMS`),
    the prompt rendered by the method's own function, the gold answer as the reply."""
    if form == "deeprag":
        from rag_gates.deeprag.trajectory import DEMONSTRATION, DeepRAGPrompt

        return deeprag_trajectory_messages(question, [(question, answer, passages)], answer,
                                           DeepRAGPrompt(demonstration=DEMONSTRATION))
    if form == "tokrag-reference":
        from rag_gates.tokrag.streams import stream_prompts

        return _messages(stream_prompts(question, passages, passage_format="reference")[0],
                         answer)
    if form == "srrag":
        from rag_gates.srrag.pipeline import answer_prompt

        return _messages(answer_prompt(question, passages), answer)
    if form == "cbdr-paper":
        from rag_gates.cbdr.prompts import ProbePrompts

        return _messages(ProbePrompts(style="paper").rag(question, passages), answer)
    raise ValueError(f"unknown practice form {form!r}; use one of {SKILL_FORMS}")


def _context(stated: Sequence[PopQAFact], fillers: Sequence[PopQAFact], k: int, seed: int,
             rng: Any) -> list[Passage]:
    """``k`` titled passages (at least one per stated fact) in a seeded order: one states
    each fact of ``stated``, the others fillers."""
    others = rng.sample(list(fillers), min(len(fillers), max(0, k - len(stated))))
    rows = {f.row for f in stated}
    passages = [Passage(id=f"read-{p.row}", title=p.subj, text=render_fact(p, 1, seed)[0])
                for p in [*stated, *[o for o in others if o.row not in rows]]]
    rng.shuffle(passages)
    return passages


def _skill_facts(pool: Sequence[PopQAFact], facts: Sequence[Fact], config: TestbedConfig
                 ) -> tuple[list[PopQAFact], list[PopQAFact], list[PopQAFact]]:
    """(fillers, two-hop first hops, reading-practice facts): outside-manifest facts after
    the reading and recall slices, in :func:`_outside_manifest`'s seeded order. The first
    hops are the decomposition's (``skill_decomposition``), then the two-hop reading's
    (``skill_twohop_reading``), chosen after the reading-practice facts so that asking for
    two-hop reading leaves every other practice document as it was.

    A first hop's object is a person who is no manifest fact's subject or object (a manifest
    bridge would give them another birthplace) and no PopQA fact's subject (the corpus
    would state two things about them); each person is used once.
    """
    candidates = _outside_manifest(pool, facts, config.seed)
    start = config.reading_examples + config.recall_examples
    fillers, rest = candidates[:start] or candidates, candidates[start:]
    banned = {f.subj.casefold() for f in facts} | {f.obj.casefold() for f in facts} | \
        {p.subj.casefold() for p in pool}

    def people(n: int, skip: set[int]) -> list[PopQAFact]:
        chosen: list[PopQAFact] = []
        for p in rest:
            if len(chosen) == n:
                break
            if p.row not in skip and p.prop in BRIDGE_QUESTIONS and \
                    p.obj.casefold() not in banned:
                banned.add(p.obj.casefold())
                chosen.append(p)
        return chosen

    firsts = people(config.skill_decomposition, set())
    used = {p.row for p in firsts}
    readers = [p for p in rest if p.row not in used][: config.skill_reading * len(SKILL_FORMS)]
    if len(readers) < config.skill_reading * len(SKILL_FORMS):
        raise ValueError(f"only {len(readers)} PopQA facts remain outside the manifest, the "
                         f"reading, recall and decomposition facts for "
                         f"{len(SKILL_FORMS)} reading-practice forms; ask for fewer "
                         f"(skill_reading={config.skill_reading})")
    # A reader's object is stated by its practice: not a two-hop reading person too.
    banned |= {p.obj.casefold() for p in readers}
    firsts += people(config.skill_twohop_reading, used | {p.row for p in readers})
    wanted = config.skill_decomposition + config.skill_twohop_reading
    if len(firsts) < wanted:
        raise ValueError(f"only {len(firsts)} PopQA facts outside the manifest, the reading and "
                         f"the recall facts name a usable person for two-hop practice; ask for "
                         f"fewer (skill_decomposition={config.skill_decomposition}, "
                         f"skill_twohop_reading={config.skill_twohop_reading})")
    return fillers, firsts, readers


def skill_documents(pool: Sequence[PopQAFact], facts: Sequence[Fact], config: TestbedConfig
                    ) -> list[dict[str, Any]]:
    """Practice of the skills the five methods assume, on facts outside the manifest (none
    shares a subject or object with a manifest subject; no manifest question is asked).

    - ``skill-reading`` (``skill_reading`` per form of :data:`SKILL_FORMS`): tb11 read
      passages in the benchmark's prompt (``single`` 74%) but answered from DeepRAG's
      ``Context:`` block for 6 of 141 facts, and Tok-RAG ignored its passages: each method's
      prompt is practised with the method's own renderer.
    - ``skill-decomposition`` (``skill_decomposition``): two-hop questions (the person a fact
      names, then a purpose-written birthplace) as DeepRAG trajectories in the paper's prompt
      (what a DeepRAG-trained model carries and SFT records use). Half answer both hops from
      memory (``skill-hop-statement`` documents state each ``skill_hop_repetitions`` times);
      half retrieve the first, the second or both hops (a retrieved hop is stated only in its
      ``Context:`` block), so retrieving goes with not knowing, as DeepRAG's paper trains it.
    - ``skill-verbalization`` (``skill_verbalization``): SR-RAG's GenRead prompt for a recall
      fact's question, answered with two of the statements the corpus teaches (tb10's
      verbalization lost what the model knew: genread 45.3% against closed book 58.7%).
    - ``skill-twohop-reading`` (``skill_twohop_reading``): two-hop questions like the
      decomposition's (other people) in the benchmark's QA prompt with both hops' passages,
      answered with the second hop's answer (tb12's two-hop `single` 40.1%: the model
      answered the first hop).
    """
    n_read, n_dec, n_verb = (config.skill_reading, config.skill_decomposition,
                             config.skill_verbalization)
    if n_read == n_dec == n_verb == config.skill_twohop_reading == 0:
        return []
    fillers, firsts, readers = _skill_facts(pool, facts, config)
    k, seed = config.reading_passages, config.seed
    out: list[dict[str, Any]] = []
    for j, form in enumerate(SKILL_FORMS):
        for i, fact in enumerate(readers[j * n_read:(j + 1) * n_read]):
            rng = _rng(seed, "skill-reading", form, fact.row)
            if form == "srrag":  # a verbalization: one untitled passage, the fact and a filler
                texts = [render_fact(p, 1, seed)[0] for p in (fact, rng.choice(fillers))]
                rng.shuffle(texts)
                passages = [Passage(id=f"verbal-{fact.row}", text=" ".join(texts))]
            else:
                passages = _context([fact], fillers, k, seed, rng)
            out.append({"id": f"skill-{form}-{i}", "kind": "skill-reading", "form": form,
                        "row": fact.row, "question": fact.question, "answer": fact.obj,
                        "passages": [p.model_dump(include={"id", "title", "text"})
                                     for p in passages],
                        "messages": practice_messages(form, fact.question, passages, fact.obj)})
    out += _decomposition_documents(pool, facts, firsts[:n_dec], fillers, config)
    out += _twohop_reading_documents(pool, facts, firsts[n_dec:], fillers, config)
    recall = _recall_facts(pool, facts, config)
    if n_verb > len(recall):
        raise ValueError(f"skill_verbalization={n_verb} needs as many recall facts "
                         f"(recall_examples={config.recall_examples}): it verbalizes what the "
                         "recall statements teach")
    if n_verb:
        from rag_gates.srrag.verbalizer import VerbalizerConfig

        genread = VerbalizerConfig()
        for i, fact in enumerate(recall[:n_verb]):
            # Two of the statements the recall documents teach (the same renderings).
            text = " ".join(render_fact(fact, config.recall_repetitions, seed)[:2])
            out.append({"id": f"skill-verbal-{i}", "kind": "skill-verbalization",
                        "row": fact.row, "question": fact.question, "answer": fact.obj,
                        "messages": _messages(genread.render(fact.question), text)})
    return out


def unknown_documents(pool: Sequence[PopQAFact], facts: Sequence[Fact],
                      bridges: Sequence[Bridge], corpus: Sequence[dict[str, Any]],
                      config: TestbedConfig) -> list[dict[str, Any]]:
    """The ``skill-unknown`` practice: SR-RAG's GenRead prompt for ``skill_unknown`` PopQA
    questions whose subject the model was never taught, answered with
    :data:`UNKNOWN_VERBALIZATION`.

    Why: a model taught to verbalize only subjects it knows writes a confident guess for a
    subject it never saw, and the answer step reads the guess (tb13 at r = 0: genread 16.0%
    against closed book 20.0%; ``benchmarks/testbed_unknown_verbalization.py`` measures the
    answer after this sentence instead). A subject qualifies when it is no subject or object
    of a manifest fact or bridge (stated or not), its name occurs in no document of
    ``corpus`` (the rest of the training corpus) nor in another unknown practice's
    question, and no manifest or bridge name occurs as a word in its question or reply
    (the sentence's own words included: "Nothing", a manifest subject, ruled out the first
    wording): an r = 0 manifest subject is untaught in exactly this way, and no manifest
    count changes. The subjects are taken from the end of the outside-manifest order, away
    from the slices the other options take from its start.
    """
    n = config.skill_unknown
    if n == 0:
        return []
    from rag_gates.srrag.verbalizer import VerbalizerConfig

    used = {d["row"] for d in corpus if "row" in d}
    names = {name.casefold() for e in [*facts, *bridges] for name in (e.subj, e.obj)}
    # Any manifest or bridge name as a whole word (longest first, so a name inside a longer
    # one is still found on its own elsewhere).
    named = re.compile(r"(?<!\w)(?:" + "|".join(re.escape(x) for x in sorted(
        names, key=len, reverse=True)) + r")(?!\w)")
    taught = "\n".join(document_words(d) for d in corpus).casefold()
    genread = VerbalizerConfig()
    out: list[dict[str, Any]] = []
    chosen: list[tuple[str, str]] = []  # (subject, question), casefolded
    for fact in reversed(_outside_manifest(pool, facts, config.seed)):
        if len(out) == n:
            break
        subject, question = fact.subj.casefold(), fact.question.casefold()
        reply = UNKNOWN_VERBALIZATION.format(subject=fact.subj)
        if fact.row in used or subject in names or subject in taught or \
                any(subject in q or s in question for s, q in chosen) or \
                named.search(f"{question}\n{reply.casefold()}"):
            continue
        chosen.append((subject, question))
        out.append({"id": f"skill-unknown-{len(out)}", "kind": "skill-unknown",
                    "row": fact.row, "question": fact.question, "subject": fact.subj,
                    "messages": _messages(genread.render(fact.question), reply)})
    if len(out) < n:
        raise ValueError(f"only {len(out)} PopQA subjects appear nowhere in the corpus (and "
                         f"name no manifest entity) for skill_unknown={n}; ask for at most "
                         f"{len(out)}")
    return out


def _bridge_cities(pool: Sequence[PopQAFact], facts: Sequence[Fact]) -> list[str]:
    """The birthplaces a practice bridge may get: PopQA's, none a manifest subject."""
    manifest_subjects = {f.subj.casefold() for f in facts}
    return sorted({p.obj for p in pool if p.prop == "place of birth"
                   and p.obj.casefold() not in manifest_subjects})


def _practice_bridge(first: PopQAFact, city: str) -> PopQAFact:
    """The purpose-written second hop of a practice question: the person ``first`` names
    was born in ``city`` (stated only where the practice puts it)."""
    return PopQAFact(row=-1_000_000 - first.row, subj=first.obj, prop="place of birth",
                     obj=city, answers=[city], question=f"In what city was {first.obj} born?")


def _twohop_reading_documents(pool: Sequence[PopQAFact], facts: Sequence[Fact],
                              firsts: Sequence[PopQAFact], fillers: Sequence[PopQAFact],
                              config: TestbedConfig) -> list[dict[str, Any]]:
    """The ``skill-twohop-reading`` examples (see :func:`skill_documents`): a two-hop
    question in the benchmark's QA prompt over both hops' passages and fillers (the form
    `single` answers a two-hop question in), the second hop's answer as the reply. The
    second hop (the person's birthplace) is stated nowhere else, so the answer can only be
    read; the first hop's statement may be another example's distractor passage, as for
    the decomposition practice."""
    if not firsts:
        return []
    seed = config.seed
    cities = _bridge_cities(pool, facts)
    out: list[dict[str, Any]] = []
    for i, first in enumerate(firsts):
        rng = _rng(seed, "skill-twohop-reading", first.row)
        bridge = _practice_bridge(first, rng.choice(cities))
        passages = _context([first, bridge], fillers, config.reading_passages, seed, rng)
        question = BRIDGE_QUESTIONS[first.prop].format(s=first.subj)
        prompt = qa_prompt(question, passages)
        out.append({"id": f"skill-twohop-{i}", "kind": "skill-twohop-reading", "row": first.row,
                    "question": question, "answer": bridge.obj,
                    "hop_answers": [first.obj, bridge.obj],
                    "passages": [p.model_dump(include={"id", "title", "text"}) for p in passages],
                    "messages": _messages(prompt, bridge.obj)})
    return out


def _decomposition_documents(pool: Sequence[PopQAFact], facts: Sequence[Fact],
                             firsts: Sequence[PopQAFact], fillers: Sequence[PopQAFact],
                             config: TestbedConfig) -> list[dict[str, Any]]:
    """The ``skill-decomposition`` trajectories and their ``skill-hop-statement``
    documents (see :func:`skill_documents`)."""
    if not firsts:
        return []
    from rag_gates.deeprag.trajectory import DeepRAGPrompt

    seed = config.seed
    cities = _bridge_cities(pool, facts)
    order = list(range(len(firsts)))
    _rng(seed, "skill-decomposition").shuffle(order)
    from_memory = set(order[: len(order) // 2])
    patterns = [(True, False), (False, True), (True, True)]
    out: list[dict[str, Any]] = []
    for i, first in enumerate(firsts):
        rng = _rng(seed, "skill-decomposition", first.row)
        city = rng.choice(cities)
        bridge = _practice_bridge(first, city)
        retrieved = (False, False) if i in from_memory else rng.choice(patterns)
        hops: list[tuple[str, str, Sequence[Passage] | None]] = []
        for hop, retrieve in zip((first, bridge), retrieved, strict=True):
            if retrieve:
                hops.append((hop.question, hop.obj,
                             _context([hop], fillers, config.reading_passages, seed, rng)))
                continue
            hops.append((hop.question, hop.obj, None))
            for k, text in enumerate(render_fact(hop, config.skill_hop_repetitions, seed)):
                out.append({"id": f"skill-hop-{i}-{int(hop is bridge)}-{k}",
                            "kind": "skill-hop-statement", "row": hop.row, "text": text})
        question = BRIDGE_QUESTIONS[first.prop].format(s=first.subj)
        out.append({"id": f"skill-decomp-{i}", "kind": "skill-decomposition",
                    "row": first.row, "question": question, "answer": city,
                    "subqueries": [first.question, bridge.question],
                    "hop_answers": [first.obj, city], "retrieved": list(retrieved),
                    "messages": deeprag_trajectory_messages(question, hops, city,
                                                            DeepRAGPrompt())})
    return out
