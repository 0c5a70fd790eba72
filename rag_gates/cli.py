"""The ``rag-gates`` command line: the user's commands (``info``, ``demo``, ``calibrate``,
``index``, ``models``); installed distributions add theirs through the ``rag_gates.cli`` entry
points (the lab, ``benchmarks/lab``, adds ``bench``, ``eval-gate``, ``report``, ...)."""

from __future__ import annotations

import json
import math
import os
import platform
import time
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rag_gates._console import quiet_transformers
from rag_gates.commands._help import ThreadsOption, TidyGroup
from rag_gates.prompts import qa_prompt
from rag_gates.types import Generation, Passage

app = typer.Typer(
    cls=TidyGroup,  # help without stray line breaks or '<bool>' after flags
    rich_markup_mode="rich",  # help texts escape brackets as \[
    help="rag-gates: decide when to retrieve and which retrieved text to trust.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()

from rag_gates.corpus.cli import index_app  # noqa: E402  (typer + rich only; no heavy imports)

app.add_typer(index_app, name="index")
from rag_gates.commands.models import models_app  # noqa: E402  (typer + rich only)

app.add_typer(models_app, name="models")
from rag_gates.commands.calibrate import calibrate_command  # noqa: E402  (typer + rich only)

app.command("calibrate")(calibrate_command)
from rag_gates.commands.audit import audit_command  # noqa: E402  (typer + rich only)

app.command("audit")(audit_command)

#: Other distributions add commands here: each entry point is ``register(app)``, given the
#: root app (the lab, ``rag-gates-lab``, adds bench, eval-gate, report, testbed, ...).
CLI_ENTRY_POINT_GROUP = "rag_gates.cli"


def _register_plugins() -> None:
    from importlib.metadata import entry_points

    for ep in entry_points(group=CLI_ENTRY_POINT_GROUP):
        ep.load()(app)


_EXAMPLE_DATA = Path(__file__).resolve().parent.parent / "examples" / "data"
DEMO_DATA = _EXAMPLE_DATA / "hotpotqa_dev_sample.jsonl"
POPQA_DEMO_DATA = _EXAMPLE_DATA / "popqa_dev_sample.jsonl"
#: QuCo's corpus in the demo: the paragraphs of the shipped HotpotQA and 2Wiki slices.
DEMO_CORPUS_FILES = (("hotpotqa", DEMO_DATA),
                     ("2wiki", _EXAMPLE_DATA / "2wikimultihopqa_dev_sample.jsonl"))
_PACKAGES = ("rag-gates", "torch", "transformers", "sentence-transformers", "llama-index-core",
             "langchain-core", "llama-index-rag-gates", "langchain-rag-gates")


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


@app.command()
def info(
    load: Annotated[bool, typer.Option(help="Load the default models and time the loads.")] = True,
    threads: ThreadsOption = None,
) -> None:
    """Versions, threads, where the default models are, and how long they take to load."""
    from rag_gates.lm import defaults

    table = Table(title="rag-gates info", show_header=False)
    table.add_row("python", platform.python_version())
    for package in _PACKAGES:
        table.add_row(package, _version(package))
    table.add_row("RAG_GATES_HOME", str(defaults.rag_gates_home()))
    lm_dir, emb_dir = defaults.default_lm_dir(), defaults.default_embedder_dir()
    for label, directory, missing in (("default LM copy", lm_dir, "not converted yet"),
                                      ("default embedder", emb_dir, "not extracted yet")):
        state = "ready" if defaults._is_complete(directory) else missing
        table.add_row(label, f"{directory} ({state})")
    for module, label in ((defaults._LM_MODULE, "LM wheel"),
                          (defaults._EMBEDDER_MODULE, "embedder wheel")):
        wheel_dir = defaults._package_dir(module)
        table.add_row(label, str(wheel_dir) if wheel_dir else "not installed")
    try:
        import torch

        if threads is not None:  # as the model load would set them (process-wide)
            torch.set_num_threads(threads)
        table.add_row("torch threads", str(torch.get_num_threads()))
    except ImportError:
        table.add_row("torch threads", Text('torch not installed: pip install "rag-gates[hf]"'))
    if load:
        quiet_transformers()
        start = time.perf_counter()
        lm = defaults.load_default_lm(num_threads=threads)
        shape = f"{lm.num_layers} layers, hidden {lm.hidden_size}, context {lm.max_context}"
        table.add_row("default LM load", f"{time.perf_counter() - start:.2f} s ({shape})")
        start = time.perf_counter()
        embedder = defaults.load_default_embedder()
        dim = (getattr(embedder, "get_embedding_dimension", None)
               or embedder.get_sentence_embedding_dimension)()
        table.add_row("default embedder load", f"{time.perf_counter() - start:.2f} s ({dim}-d)")
    console.print(table)


def _confidence_text(generation: Generation) -> Text:
    """The answer with each token coloured by its probability (green sure, red unsure)."""
    text = Text()
    for item in generation.logprobs or []:
        p = math.exp(item.logprob)
        style = "green" if p >= 0.7 else "yellow" if p >= 0.3 else "red"
        text.append(item.token, style=style)
    return text


def _mean_probability(generation: Generation) -> float:
    items = generation.logprobs or []
    return sum(math.exp(i.logprob) for i in items) / len(items) if items else float("nan")


def load_hotpotqa_rows(path: Path, n: int) -> list[dict[str, Any]]:
    """Read the first ``n`` HotpotQA rows of a JSONL file, naming the line of any bad row."""
    rows: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if len(rows) >= n:
                break
            try:
                row = json.loads(line)
                _ = row["question"], row["answer"], row["context"], row["supporting_facts"]
            except (json.JSONDecodeError, KeyError, TypeError) as exc:
                raise typer.BadParameter(f"{path}:{number}: not a HotpotQA row ({exc})") from exc
            rows.append(row)
    return rows


def gold_passages(row: dict[str, Any]) -> list[Passage]:
    """The paragraphs a HotpotQA row's supporting facts point to."""
    titles = {title for title, _ in row["supporting_facts"]}
    return [Passage(id=title, title=title, text="".join(sentences))
            for title, sentences in row["context"] if title in titles]


@app.command()
def demo(
    n: Annotated[int, typer.Option(min=1, help="How many questions to answer.")] = 3,
    max_new_tokens: Annotated[int, typer.Option(min=1, max=512)] = 32,
    data: Annotated[Path, typer.Option(help="HotpotQA JSONL file.")] = DEMO_DATA,
    threads: ThreadsOption = None,
) -> None:
    """Answer HotpotQA questions with the embedded model, with and without the gold passages,
    showing per-token confidence."""
    if not data.is_file():
        raise typer.BadParameter(f"{data} does not exist; pass --data path/to/hotpotqa.jsonl")
    from rag_gates.lm import load_default_lm

    quiet_transformers()
    with console.status("loading the embedded SmolLM2 (the first run converts it, ~20 s)"):
        start = time.perf_counter()
        lm = load_default_lm(num_threads=threads)
    console.print(f"[bold]model[/] {lm.model_id}: loaded in {time.perf_counter() - start:.1f} s, "
                  f"{lm.num_layers} layers, {torch_threads()} threads")
    console.print("token colours: [green]p >= 0.7[/] [yellow]p >= 0.3[/] [red]p < 0.3[/]\n")
    rows = load_hotpotqa_rows(data, n)
    closed_book: list[str] = []
    for row in rows:
        table = Table(title=row["question"], title_justify="left", show_lines=True)
        table.add_column("setting")
        table.add_column("answer (coloured by token probability)")
        table.add_column("mean p", justify="right")
        table.add_column("tokens", justify="right")
        table.add_column("s", justify="right")
        for label, passages in (("closed book", None), ("gold passages", gold_passages(row))):
            g = lm.generate(qa_prompt(row["question"], passages),
                            max_new_tokens=max_new_tokens, logprobs=0)
            table.add_row(label, _confidence_text(g), f"{_mean_probability(g):.2f}",
                          str(g.completion_tokens), f"{g.latency_ms / 1000:.1f}")
            if passages is None:
                closed_book.append(g.text)
        table.caption = f"gold answer: {row['answer']}"
        console.print(table)
    _demo_quco([row["question"] for row in rows], closed_book)
    _demo_cbdr(lm, rows)
    _demo_tokrag(lm, rows, max_new_tokens)
    _demo_deeprag(lm, rows[0])
    _demo_srrag(lm, POPQA_DEMO_DATA)


def shipped_srrag_gate(lm: Any) -> Any:
    """The demo's SR-RAG gate: the shipped policy (not ``$RAG_GATES_SRRAG_POLICY``) at the
    tau calibrated with it, as ``SelfRoutingGate(lm, load_default_policy(lm))`` builds it."""
    from rag_gates.srrag import SelfRoutingGate
    from rag_gates.srrag.shipped import DEFAULT_POLICY_LABELS, load_default_policy

    return SelfRoutingGate(lm, load_default_policy(lm, labels=DEFAULT_POLICY_LABELS))


def _demo_srrag(lm: Any, data: Path) -> None:
    """SR-RAG on PopQA questions, the most and the least popular subjects first: the shipped
    policy (the model's own source labels on training rows, keyed by its hidden states) and
    the routing word's probability decide; questions are routed until one has gone each way,
    and those two are shown with their neighbours and answers."""
    from rag_gates.retrieval.bm25 import BM25Retriever
    from rag_gates.srrag import SRRAGPipeline
    from rag_gates.srrag.shipped import read_policy_labels

    if not data.is_file():
        console.print(f"[yellow]SR-RAG skipped: {data} is missing[/]")
        return
    # The most and the least popular subjects (PopQA's s_pop) first, alternating: where a
    # policy should differ.
    ranked = sorted((json.loads(line) for line in data.read_text().splitlines()),
                    key=lambda r: -float(r.get("s_pop") or 0))
    rows = [r for pair in zip(ranked, reversed(ranked), strict=True) for r in pair
            ][: len(ranked)]
    header, _ = read_policy_labels()
    with console.status(f"keying the shipped policy's {header.questions} labelled questions"):
        gate = shipped_srrag_gate(lm)
    policy, tau = gate.policy, gate.tau
    assert policy is not None
    chosen = (f"the paper's {tau:g}, not calibrated for this model" if header.tau is None else
              f"{tau:.3g}, calibrated leave-one-out on the labelled questions: routes agree "
              f"with {100 * header.calibration.get('agreement', math.nan):.0f}% of their "
              "labels, always retrieving with "
              f"{100 * header.calibration.get('labelled_retrieval_share', math.nan):.0f}%")
    console.print(f"\n[bold]SR-RAG[/]: retrieve when p_M x p_D >= tau ({chosen}), else the "
                  "model writes what it knows and answers from that. p_D: the "
                  f"{policy.k} nearest of {len(policy)} labelled training questions (the "
                  "model's own likelihoods chose each label; hidden state of layer "
                  f"{gate.layer}); p_M: the routing word's probability")
    passages = [Passage(id=p["title"], title=p["title"], text=p["text"])
                for row in rows for p in row.get("gold_paragraphs", [])]
    pipeline = SRRAGPipeline(lm, BM25Retriever.from_passages(passages), gate, k=1,
                             max_new_tokens=16, dataset="popqa")
    shown: set[bool] = set()
    decisions = []
    with console.status("routing PopQA questions until one goes each way"):
        for row in rows:
            decisions.append((row, gate.decide(row["question"])))
            if len({d.retrieve for _, d in decisions}) == 2:
                break
    for row, d in decisions:
        if d.retrieve in shown:
            continue
        shown.add(d.retrieve)
        with console.status("retrieving and answering" if d.retrieve else "verbalizing"):
            result = pipeline.answer(row["question"])
        table = Table(title=row["question"], title_justify="left", show_lines=True)
        for column in ("neighbour (cosine)", "its label"):
            table.add_column(column)
        neighbours = d.evidence.get("neighbours")
        for n in neighbours if isinstance(neighbours, list) else []:
            assert isinstance(n, dict)
            table.add_row(f"{n['question']} ({n['similarity']:.3f})", str(n["source"]))
        used = result.passages[0]
        source = ("verbalized: " + used.text[:160].replace("\n", " ") + "..."
                  if used.metadata.get("source") == "parametric" else f"retrieved: {used.title}")
        table.caption = (f"{'RETRIEVE' if d.retrieve else 'VERBALIZE'}: {d.reason}\n{source}\n"
                         f"answer: {result.answer.strip()!r} (gold: "
                         f"{', '.join(row['possible_answers'][:3])})")
        console.print(table)
    if len(shown) < 2:
        way = "retrieval" if True in shown else "verbalization"
        console.print(f"all {len(decisions)} questions were routed to {way} at tau {tau:.3g}")


def _demo_deeprag(lm: Any, row: dict[str, Any]) -> None:
    """DeepRAG on the first question, over BM25 on its ten paragraphs: each subquery with its
    retrieve-or-answer decision (likelihood mode: the markers' log-probabilities)."""
    from rag_gates.deeprag import DEMONSTRATION, DeepRAG, DeepRAGConfig, DeepRAGPrompt
    from rag_gates.retrieval.bm25 import BM25Retriever

    passages = [Passage(id=title, title=title, text="".join(sentences))
                for title, sentences in row["context"]]
    config = DeepRAGConfig(mode="likelihood", max_steps=3, max_step_tokens=40,
                           max_answer_tokens=20,
                           prompt=DeepRAGPrompt(demonstration=DEMONSTRATION))
    agent = DeepRAG(lm, BM25Retriever.from_passages(passages), config,
                    name="deeprag-likelihood")
    console.print("\n[bold]DeepRAG[/]: step by step, each subquery retrieved for or answered "
                  "from memory (retrieve when log p(search marker) - log p(answer marker) >= "
                  f"{config.threshold:g}; the untrained model, one-shot prompt, 3 steps at most)")
    with console.status("running the loop"):
        start = time.perf_counter()
        result = agent.run(row["question"])
    table = Table(title=row["question"], title_justify="left", show_lines=True)
    for column in ("step", "subquery", "decision (score)", "retrieved", "intermediate answer"):
        table.add_column(column)
    for i, step in enumerate(result.trajectory.steps, 1):
        d = step.decision
        # A decision the gate could not take retrieves (fail closed) and carries no score.
        score = "undecided" if "undecided" in d.evidence else f"{d.score:.2f}"
        table.add_row(str(i), step.subquery,
                      f"{'RETRIEVE' if d.retrieve else 'answer from memory'} ({score})",
                      ", ".join(p.title or p.id or "?" for p in step.passages or ()) or "-",
                      step.answer)
    t = result.trajectory
    table.caption = (f"final answer: {t.final_answer!r} (gold: {row['answer']}); ended: "
                     f"{t.stop_reason}; {time.perf_counter() - start:.1f} s")
    console.print(table)


def _demo_quco(questions: list[str], answers: list[str]) -> None:
    """QuCo-RAG's gate on each question and its claim check on the closed-book answer."""
    from rag_gates.corpus.cache import CachedCorpusStats
    from rag_gates.corpus.local import LocalInfiniGram
    from rag_gates.corpus.paragraphs import QA_PARAGRAPHS_TAU_ENTITY, build_paragraph_stats
    from rag_gates.quco import ClaimVerifier, QuCoGate

    with console.status("opening the corpus-statistics index (the first run builds it)"):
        stats = CachedCorpusStats(LocalInfiniGram(build_paragraph_stats(DEMO_CORPUS_FILES)))
    gate = QuCoGate(stats, tau_entity=QA_PARAGRAPHS_TAU_ENTITY)
    verifier = ClaimVerifier(stats, gate.extractor)
    console.print(f"\n[bold]QuCo-RAG[/]: entity counts in the index {stats.index_name!r} "
                  f"(Wikipedia paragraphs of the QA datasets), tau_entity {gate.tau_entity:g}")
    table = Table(show_lines=True)
    for column in ("question", "entity counts", "gate decision", "closed-book claims flagged"):
        table.add_column(column)
    for question, answer in zip(questions, answers, strict=True):
        d = gate.decide(question)
        counts = d.evidence.get("counts") or {}
        assert isinstance(counts, dict)
        report = verifier.verify(answer) if answer.strip() else None
        flagged = "\n".join(c.reason for c in report.flagged) if report else ""
        checked = sum(len(s.checks) for s in report.sentences) if report else 0
        table.add_row(question, "\n".join(f"{e}: {c}" for e, c in counts.items()) or "(none)",
                      f"{'RETRIEVE' if d.retrieve else 'no retrieval'}\n{d.reason}",
                      flagged or f"none of {checked} claims")
    console.print(table)


def _demo_cbdr(lm: Any, rows: list[dict[str, Any]]) -> None:
    """CBDR's probe gate on each question, and its confidence-gain ranking of the first
    question's ten paragraphs (the two gold ones marked)."""
    from rag_gates.cbdr import CBDRGate, ConfidenceGainReranker, load_default_probe

    probe = load_default_probe(lm)
    gate = CBDRGate(lm, probe)  # the beta calibrated with the probe (probe.json)
    console.print(f"\n[bold]CBDR[/]: probe on hidden state {probe.layer} of {lm.model_id} "
                  f"(dev AUROC {probe.config.metrics.get('dev_auroc', float('nan')):.3f}), "
                  f"skip retrieval when confidence > beta {gate.beta:g}")
    table = Table(show_lines=True)
    for column in ("question", "confidence", "gate decision"):
        table.add_column(column)
    for d, row in zip(gate.decide_batch([r["question"] for r in rows]), rows, strict=True):
        table.add_row(row["question"], f"{d.evidence['confidence']:.3f}",
                      f"{'RETRIEVE' if d.retrieve else 'no retrieval'}\n{d.reason}")
    console.print(table)
    row = rows[0]
    gold = {title for title, _ in row["supporting_facts"]}
    passages = [Passage(id=title, title=title, text="".join(sentences))
                for title, sentences in row["context"]]
    with console.status("ranking 10 paragraphs by the confidence each adds"):
        result = ConfidenceGainReranker(lm, probe).rerank(row["question"], passages)
    ranking = Table(title=f"confidence gain ranking: {row['question']}", title_justify="left")
    for column in ("rank", "paragraph", "Inc = Conf(q + c) - Conf(q)", "gold"):
        ranking.add_column(column)
    for rank, scored in enumerate(result.ranked, start=1):
        ranking.add_row(str(rank), scored.passage.title or "", f"{scored.score:+.3f}",
                        "yes" if scored.passage.title in gold else "")
    ranking.caption = (f"Conf(q) = {result.evidence['question_confidence']:.3f}; "
                       f"{result.latency_ms / 1000:.1f} s for {result.candidates} paragraphs")
    console.print(ranking)


def _demo_tokrag(lm: Any, rows: list[dict[str, Any]], max_new_tokens: int) -> None:
    """Tok-RAG on the first question (gold paragraphs plus two distractors) whose two streams
    disagree, the answer's tokens coloured by the side kept."""
    from rag_gates.tokrag import TokRAGDecoder

    decoder = TokRAGDecoder(lm)
    console.print("\n[bold]Tok-RAG[/]: the answer written with and without the passages in "
                  "lockstep; where they disagree, the side the passages support is kept")
    console.print("token colours: agreed, [blue]kept from the stream with passages[/], "
                  "[magenta]kept from the stream without them[/]")
    for row in rows:
        gold = {title for title, _ in row["supporting_facts"]}
        distractors = [Passage(title=t, text="".join(s)) for t, s in row["context"]
                       if t not in gold][:2]
        with console.status("decoding two streams"):
            g = decoder.generate(row["question"], passages=gold_passages(row) + distractors,
                                 max_new_tokens=max_new_tokens)
        if not g.disagreements:
            continue
        styles = {"agree": "", "rag": "bold blue", "llm": "bold magenta", "fused": "yellow"}
        text = Text()
        for choice in g.choices[: g.completion_tokens]:
            text.append(choice.token, style=styles[choice.side])
        table = Table(title=row["question"], title_justify="left", show_lines=True)
        for column in ("#", "with passages", "without", "kept", "score", "l*"):
            table.add_column(column)
        for c in g.disagreements:
            table.add_row(str(c.position), repr(c.rag_token), repr(c.llm_token), c.side,
                          f"{c.score:+.3f}" if c.score is not None else "", str(c.layer))
        console.print(text)
        table.caption = (f"gold answer: {row['answer']}; {len(g.disagreements)} of "
                         f"{len(g.choices)} steps disagreed; {g.latency_ms / 1000:.1f} s")
        console.print(table)
        return
    console.print("the two streams agreed on every token of these answers")


_register_plugins()


def torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
