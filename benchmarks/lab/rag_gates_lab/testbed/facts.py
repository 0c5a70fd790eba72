"""The facts of a knowledge-controlled testbed: which PopQA facts, how often each is seen,
in which split, and the statements that teach them.

Pure Python (no torch): choosing and rendering are deterministic given the seed, so the
corpus, the manifest and the questions can be rebuilt and checked without a model.

Example:
    >>> from rag_gates_lab.testbed.facts import load_popqa_facts, plan_facts, render_fact
    >>> facts = plan_facts(load_popqa_facts(), n_facts=40, ladder=(0, 1, 4, 16), seed=0)
    >>> facts[0].repetitions, facts[0].split
    >>> render_fact(facts[0], 3, seed=0)          # three differently phrased statements
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "BRIDGE_QUESTIONS",
    "DATA_DIR",
    "FRAMES",
    "SPLITS",
    "SPLIT_SUM_TOLERANCE",
    "TEMPLATES",
    "Bridge",
    "Fact",
    "PopQAFact",
    "check_split_fractions",
    "counterfactual_object",
    "load_popqa_facts",
    "load_wiki_paragraphs",
    "plan_bridges",
    "plan_facts",
    "render_fact",
]

DATA_DIR = Path(__file__).resolve().parent / "data"
SPLITS = ("probe", "calibration", "evaluation")
Split = Literal["probe", "calibration", "evaluation"]

#: Declarative statements per relation ({s} subject, {o} object). None repeats the PopQA
#: question's wording ("What is X's occupation?", "In what city was X born?", ...).
TEMPLATES: dict[str, tuple[str, ...]] = {
    "occupation": ("{s} works as a {o}.", "{s} is a {o} by profession.",
                   "By trade, {s} is a {o}.", "{s} made a career as a {o}.",
                   "The profession of {s} is {o}.", "{s} earned a living as a {o}."),
    "place of birth": ("{s} was born in {o}.", "{o} is the birthplace of {s}.",
                       "{s} is a native of {o}, where {s} was born.",
                       "The birthplace of {s} is {o}.", "{s} came into the world in {o}.",
                       "{o} is the city where {s} was born."),
    "country": ("{s} is located in {o}.", "{s} lies in the country of {o}.",
                "{o} is the country where {s} is found.", "{s} is situated in {o}.",
                "{s} is part of {o}.", "The country that {s} belongs to is {o}."),
    "capital": ("The capital city of {s} is {o}.", "{o} is the capital of {s}.",
                "{o} serves as the capital of {s}.", "The seat of government of {s} is {o}.",
                "{s} has {o} as its capital.", "{s} is governed from its capital, {o}."),
    "capital of": ("{s} is the capital city of {o}.", "{o} has {s} as its capital.",
                   "{s} serves as the seat of government of {o}.",
                   "The capital of {o} is {s}.", "{o} is governed from {s}, its capital.",
                   "As the capital, {s} is the main city of {o}."),
    "genre": ("{s} belongs to the genre of {o}.", "The genre of {s} is {o}.",
              "{s} is a work of {o}.", "Critics classify {s} as {o}.",
              "{s} is an example of {o}.", "In terms of genre, {s} is {o}."),
    "author": ("{s} was written by {o}.", "{o} wrote {s}.", "{o} is the author of {s}.",
               "The writer of {s} is {o}.", "{s} is a work by the writer {o}.",
               "{o} is the one who wrote {s}."),
    "director": ("{s} was directed by {o}.", "{o} directed {s}.",
                 "{o} is the director of {s}.", "The film {s} was made by director {o}.",
                 "Direction of {s} was by {o}.", "{o} was behind the camera as director of {s}."),
    "screenwriter": ("{s} was written for the screen by {o}.", "{o} wrote the screenplay of {s}.",
                     "The script of {s} is by {o}.", "{o} is the screenwriter of {s}.",
                     "{o} penned the script for {s}.", "The screenplay for {s} came from {o}."),
    "producer": ("{s} was produced by {o}.", "{o} produced {s}.",
                 "{o} is the producer of {s}.", "The production of {s} was led by {o}.",
                 "{o} served as producer on {s}.", "{s} had {o} as its producer."),
    "composer": ("{s} was composed by {o}.", "{o} composed {s}.",
                 "The music of {s} is by {o}.", "{o} wrote the music for {s}.",
                 "{o} is the composer of {s}.", "{s} is a composition by {o}."),
    "father": ("The father of {s} is {o}.", "{o} is the father of {s}.",
               "{s} is a child of {o}, the father.", "{o} fathered {s}.",
               "{s} was born to {o}, the father of {s}.", "{s}'s father is {o}."),
    "mother": ("The mother of {s} is {o}.", "{o} is the mother of {s}.",
               "{s} is a child of {o}, the mother.", "{o} gave birth to {s}.",
               "{s} was born to {o}, the mother of {s}.", "{s}'s mother is {o}."),
    "sport": ("{s} is associated with the sport of {o}.", "The sport of {s} is {o}.",
              "{s} is part of the world of {o}.", "{s} is known in {o}.",
              "{o} is the sport of {s}.", "{s} competes in {o}."),
    "religion": ("{s} is associated with {o}.", "The religion of {s} is {o}.",
                 "{s} follows {o}.", "In matters of faith, {s} belongs to {o}.",
                 "{o} is the faith of {s}.", "{s} is tied to the religion {o}."),
}

#: Framings around a statement; (template, frame) pairs give each repetition its own wording.
FRAMES: tuple[str, ...] = ("{x}", "Fact: {x}", "Did you know? {x}", "From the encyclopedia: {x}",
                           "Trivia: {x}", "Note that {lx}", "It is recorded that {lx}",
                           "As many sources state, {lx}")


class PopQAFact(BaseModel):
    """One row of the shipped PopQA slice."""

    model_config = ConfigDict(frozen=True)

    row: int = Field(..., description="Line index in the shipped popqa_facts.jsonl.")
    question: str
    subj: str
    prop: str
    obj: str
    answers: list[str]
    s_pop: float | None = None
    gold_paragraph: dict[str, str] | None = None


class Fact(PopQAFact):
    """A fact of the testbed: how often the training corpus states it, and its split."""

    id: str = Field(..., description="Stable id: 'tb-<popqa row>'.")
    repetitions: int = Field(..., ge=0)
    split: Split
    popularity_bin: int = Field(..., ge=0)
    counterfactual: str = Field(..., description="A wrong object of the same relation.")


class Bridge(PopQAFact):
    """A purpose-written second hop: the person a fact's object names, and a birthplace.

    The birthplace is drawn from the cities PopQA's place-of-birth facts name, not looked up:
    the base model cannot know it, so the testbed corpus is the only place it is stated, as
    often as ``repetitions`` says. (For a real person it is an invented fact: the testbed
    is a controlled world, not a source of facts.)"""

    id: str = Field(..., description="Stable id: 'br-<first hop fact id>'.")
    repetitions: int = Field(..., ge=0)
    split: Split = Field(..., description="The first hop's split.")
    via: list[str] = Field(..., description="The first-hop facts whose object is this person.")


#: The two-hop question per first-hop relation (the first fact's object is a person); the
#: second hop is that person's birthplace (a :class:`Bridge`).
BRIDGE_QUESTIONS: dict[str, str] = {
    "director": "In what city was the director of {s} born?",
    "author": "In what city was the author of {s} born?",
    "composer": "In what city was the composer of {s} born?",
    "producer": "In what city was the producer of {s} born?",
    "screenwriter": "In what city was the screenwriter of {s} born?",
    "father": "In what city was the father of {s} born?",
    "mother": "In what city was the mother of {s} born?",
}


def plan_bridges(facts: Sequence[Fact], pool: Sequence[PopQAFact], *, ladder: Sequence[int],
                 seed: int, splits: Sequence[str] = ("calibration", "evaluation"),
                 ) -> list[Bridge]:
    """A birthplace for the person object of every fact in ``splits`` whose relation has a
    two-hop form (:data:`BRIDGE_QUESTIONS`), each stated a ladder count of times.

    Within each (split, first-hop rung) the people cycle through the ladder (starting one rung
    further per first-hop rung), so every pair of hop counts is asked about. A person named by
    two facts gets one bridge; a person who is also a fact's subject gets none (the corpus
    would state two things about them).
    """
    subjects = {f.subj.casefold() for f in facts}
    cities = sorted({p.obj for p in pool if p.prop == "place of birth"})
    if not cities:
        raise ValueError("the PopQA pool has no place-of-birth facts to draw birthplaces from")
    groups: dict[tuple[str, int], list[Fact]] = defaultdict(list)
    for f in facts:
        if f.split in splits and f.prop in BRIDGE_QUESTIONS and \
                f.obj.casefold() not in subjects:
            groups[(f.split, f.repetitions)].append(f)
    by_person: dict[str, Bridge] = {}
    rung = {r: i for i, r in enumerate(ladder)}
    for (_split, r1), group in sorted(groups.items(), key=lambda kv: (SPLITS.index(kv[0][0]),
                                                                      kv[0][1])):
        i = 0
        for f in sorted(group, key=lambda f: f.row):
            person = f.obj.casefold()
            if person in by_person:
                bridge = by_person[person]
                by_person[person] = bridge.model_copy(update={"via": [*bridge.via, f.id]})
                continue
            city = _rng(seed, "bridge", person).choice(cities)
            by_person[person] = Bridge(
                row=-1 - len(by_person), id=f"br-{f.id}", question=f"In what city was "
                f"{f.obj} born?", subj=f.obj, prop="place of birth", obj=city,
                answers=[city], repetitions=ladder[(i + rung.get(r1, 0)) % len(ladder)],
                split=f.split, via=[f.id])
            i += 1
    return list(by_person.values())


def load_popqa_facts(path: str | Path | None = None) -> list[PopQAFact]:
    """The PopQA rows usable as facts: a relation with templates, one answer per (subject,
    relation) (rows whose subject repeats within the relation are dropped: the question
    would be ambiguous)."""
    file = Path(path) if path else DATA_DIR / "popqa_facts.jsonl"
    rows = [json.loads(line) for line in file.open(encoding="utf-8") if line.strip()]
    by_key: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for line, r in enumerate(rows):
        if r["prop"] in TEMPLATES:
            by_key[(r["subj"], r["prop"])].append({**r, "line": line})
    out = []
    for group in by_key.values():
        if len(group) != 1:
            continue
        r = group[0]
        out.append(PopQAFact(row=r["line"], question=r["question"],
                             subj=r["subj"], prop=r["prop"], obj=r["obj"],
                             answers=[str(a) for a in r["possible_answers"]],
                             s_pop=r.get("s_pop"), gold_paragraph=r.get("gold_paragraph")))
    out.sort(key=lambda f: f.row)
    return out


def load_wiki_paragraphs(path: str | Path | None = None) -> list[dict[str, str]]:
    """The shipped general text: Wikipedia paragraphs ``{"title", "text", ...}``."""
    file = Path(path) if path else DATA_DIR / "wiki_paragraphs.jsonl"
    return [json.loads(line) for line in file.open(encoding="utf-8") if line.strip()]


def _rng(seed: int, *parts: object) -> random.Random:
    # A private stream per purpose: adding a fact or a split never reshuffles the others.
    key = "\x1f".join(str(p) for p in (seed, *parts))
    return random.Random(int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big"))


def _pop_bins(facts: Sequence[PopQAFact], bins: int) -> dict[int, int]:
    """Popularity tercile (by default) of each fact within its relation: row -> bin."""
    out: dict[int, int] = {}
    by_prop: dict[str, list[PopQAFact]] = defaultdict(list)
    for f in facts:
        by_prop[f.prop].append(f)
    for group in by_prop.values():
        ranked = sorted(group, key=lambda f: (f.s_pop or 0.0, f.row))
        for i, f in enumerate(ranked):
            out[f.row] = min(bins - 1, i * bins // len(ranked))
    return out


def counterfactual_object(fact: PopQAFact, pool: Sequence[PopQAFact], seed: int) -> str:
    """A wrong object of the same relation (same type), none of the fact's own answers."""
    own = {a.casefold() for a in fact.answers}
    candidates = sorted({p.obj for p in pool
                         if p.prop == fact.prop and p.obj.casefold() not in own})
    if not candidates:
        raise ValueError(f"no other object for relation {fact.prop!r} to build a "
                         f"counterfactual of {fact.subj!r}")
    return _rng(seed, "counterfactual", fact.row).choice(candidates)


#: How far from 1 the split fractions may sum (float rounding: 0.1 + 0.2 + 0.7).
SPLIT_SUM_TOLERANCE = 1e-6


def check_split_fractions(fractions: Sequence[float]) -> list[float]:
    """``fractions`` if they are one share per split (probe, calibration, evaluation), each
    in [0, 1], summing to 1 within :data:`SPLIT_SUM_TOLERANCE`; else a ValueError. Shares that
    do not add up are refused rather than rescaled, so the splits are the ones asked for.

    Example:
        >>> check_split_fractions([0.25, 0.15, 0.6])
        [0.25, 0.15, 0.6]
    """
    values = list(fractions)
    total = sum(values) if all(isinstance(x, int | float) for x in values) else math.nan
    if len(values) != len(SPLITS) or not all(0.0 <= x <= 1.0 for x in values) \
            or not abs(total - 1.0) <= SPLIT_SUM_TOLERANCE:
        raise ValueError(
            f"split_fractions must be {len(SPLITS)} shares in [0, 1] ({', '.join(SPLITS)}) "
            f"that sum to 1 (within {SPLIT_SUM_TOLERANCE:g}), got {values} (sum {total:g}); "
            "for example 0.25,0.15,0.6")
    return values


def plan_facts(pool: Sequence[PopQAFact], *, n_facts: int, ladder: Sequence[int], seed: int,
               split_fractions: Sequence[float] = (0.3, 0.2, 0.5),
               relations: Sequence[str] | None = None, popularity_bins: int = 3) -> list[Fact]:
    """Choose ``n_facts`` facts balanced over relations, then give each a repetition count
    from ``ladder`` and a split, balanced over relation x popularity bin.

    Relations take turns (each relation's facts in a seeded random order), so every relation
    contributes about ``n_facts / relations`` facts where it has them. Within every (relation,
    popularity bin) stratum the facts cycle through the ladder, and within every (ladder rung)
    the facts cycle through the splits in proportion to ``split_fractions`` (probe,
    calibration, evaluation), so each split sees every rung, relation and popularity level.
    """
    if n_facts < 1:
        raise ValueError(f"n_facts must be >= 1, got {n_facts}")
    if not ladder or any(r < 0 for r in ladder) or len(set(ladder)) != len(ladder):
        raise ValueError(f"ladder must be distinct non-negative counts, got {list(ladder)}")
    check_split_fractions(split_fractions)
    names = sorted(relations) if relations else sorted({f.prop for f in pool})
    unknown = [r for r in names if r not in TEMPLATES]
    if unknown:
        raise ValueError(f"no templates for relation(s) {unknown}; known: {sorted(TEMPLATES)}")
    queues = {}
    for name in names:
        group = [f for f in pool if f.prop == name]
        _rng(seed, "choose", name).shuffle(group)
        queues[name] = group
    chosen: list[PopQAFact] = []
    while len(chosen) < n_facts and any(queues.values()):
        for name in names:
            if queues[name] and len(chosen) < n_facts:
                chosen.append(queues[name].pop(0))
    if len(chosen) < n_facts:
        raise ValueError(f"only {len(chosen)} usable facts in these relations; ask for fewer "
                         f"(n_facts={n_facts})")
    bins = _pop_bins(chosen, popularity_bins)
    strata: dict[tuple[str, int], list[PopQAFact]] = defaultdict(list)
    for f in sorted(chosen, key=lambda f: f.row):
        strata[(f.prop, bins[f.row])].append(f)
    rung_of: dict[int, int] = {}
    counter = 0  # continues across strata so small strata do not all start at rung 0
    for key in sorted(strata):
        group = strata[key]
        _rng(seed, "ladder", *key).shuffle(group)
        for f in group:
            rung_of[f.row] = ladder[counter % len(ladder)]
            counter += 1
    # Splits: largest-remainder quotas per rung, then a seeded deal in stratum order.
    total = sum(split_fractions)
    split_of: dict[int, str] = {}
    for rung in ladder:
        members = sorted((f for f in chosen if rung_of[f.row] == rung),
                         key=lambda f: (f.prop, bins[f.row], f.row))
        _rng(seed, "split", rung).shuffle(members)
        members.sort(key=lambda f: (f.prop, bins[f.row]))  # stable: shuffled within strata
        deal = _deal(len(members), [x / total for x in split_fractions])
        for f, split in zip(members, deal, strict=True):
            split_of[f.row] = split
    return [Fact(**f.model_dump(), id=f"tb-{f.row}", repetitions=rung_of[f.row],
                 split=split_of[f.row], popularity_bin=bins[f.row],
                 counterfactual=counterfactual_object(f, pool, seed))
            for f in sorted(chosen, key=lambda f: f.row)]


def _deal(n: int, fractions: list[float]) -> list[str]:
    """``n`` split names interleaved so every prefix is close to the fractions."""
    out: list[str] = []
    given = [0] * len(SPLITS)
    for i in range(n):
        # The split furthest behind its share of the first i+1 items comes next.
        gaps = [fractions[j] * (i + 1) - given[j] for j in range(len(SPLITS))]
        j = max(range(len(SPLITS)), key=lambda k: (gaps[k], -k))
        given[j] += 1
        out.append(SPLITS[j])
    return out


def _lower_first(text: str, names: Sequence[str]) -> str:
    # "Note that the capital ..." but keep names ("The Hero"): lower only a leading
    # "The"/"By"/... word of the template itself.
    if any(text.startswith(n) for n in names):
        return text
    first, _, rest = text.partition(" ")
    if first in {"The", "By", "In", "As", "Critics", "Direction", "Production"}:
        return first.lower() + " " + rest
    return text


_ARTICLE = re.compile(r"\ba (?=[aeiouAEIOU])")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def _gold_statement(fact: PopQAFact) -> str | None:
    """The gold paragraph up to the first sentence that names an answer (None if none do)."""
    if not fact.gold_paragraph:
        return None
    text = fact.gold_paragraph.get("text", "").strip()
    sentences = _SENTENCE_END.split(text)
    names = [a.casefold() for a in fact.answers if len(a) > 2]
    for i, sentence in enumerate(sentences[:4]):
        if any(n in sentence.casefold() for n in names):
            return " ".join(sentences[: i + 1])
    return None


def render_fact(fact: PopQAFact, repetitions: int, seed: int, *,
                obj: str | None = None) -> list[str]:
    """``repetitions`` statements of the fact, each worded differently where the templates
    and frames allow (the gold paragraph's opening, when it names the answer, is one of them).

    ``obj`` replaces the object (the counterfactual passages use it).
    """
    o = obj if obj is not None else fact.obj
    templates = TEMPLATES[fact.prop]
    pairs = [(t, fr) for t in range(len(templates)) for fr in range(len(FRAMES))]
    rng = _rng(seed, "render", fact.row, o)
    rng.shuffle(pairs)
    # Distinct templates first: the first len(templates) statements use different sentences.
    by_template: dict[int, list[int]] = defaultdict(list)
    order: list[int] = []
    for t, fr in pairs:
        if t not in by_template:
            order.append(t)
        by_template[t].append(fr)
    sequence = [(t, by_template[t][k]) for k in range(len(FRAMES)) for t in order]
    out: list[str] = []
    gold = _gold_statement(fact) if obj is None else None
    if gold and repetitions > 0:
        out.append(gold)
    i = 0
    while len(out) < repetitions:
        t, fr = sequence[i % len(sequence)]
        x = templates[t].format(s=fact.subj, o=o)
        if fact.prop == "occupation":  # "a actor" -> "an actor"
            x = _ARTICLE.sub("an ", x)
        out.append(FRAMES[fr].format(x=x, lx=_lower_first(x, (fact.subj, o))))
        i += 1
    return out
