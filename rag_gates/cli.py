"""The ``rag-gates`` command line: ``info`` and ``demo`` (later issues add more commands)."""

from __future__ import annotations

import json
import math
import os
import platform
import time
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from rag_gates._console import error_line, quiet_transformers
from rag_gates.commands._help import TidyGroup
from rag_gates.eval.names import (
    check_dataset,
    check_gate_names,
    check_methods,
    check_retriever,
    names_help,
)
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

from rag_gates.commands.cbdr import cbdr_app  # noqa: E402  (typer + rich only; no heavy imports)
from rag_gates.corpus.cli import index_app  # noqa: E402  (typer + rich only; no heavy imports)

app.add_typer(index_app, name="index")
app.add_typer(cbdr_app, name="cbdr")
from rag_gates.commands.deeprag import deeprag_app  # noqa: E402  (typer + rich only)

app.add_typer(deeprag_app, name="deeprag")
from rag_gates.eval.testbed.cli import testbed_app  # noqa: E402  (typer + rich only)

app.add_typer(testbed_app, name="testbed")
from rag_gates.commands.srrag import srrag_app  # noqa: E402  (typer + rich only)

app.add_typer(srrag_app, name="srrag")
from rag_gates.commands.models import models_app  # noqa: E402  (typer + rich only)

app.add_typer(models_app, name="models")
from rag_gates.commands.calibrate import calibrate_command  # noqa: E402  (typer + rich only)

app.command("calibrate")(calibrate_command)

_EXAMPLE_DATA = Path(__file__).resolve().parent.parent / "examples" / "data"
DEMO_DATA = _EXAMPLE_DATA / "hotpotqa_dev_sample.jsonl"
POPQA_DEMO_DATA = _EXAMPLE_DATA / "popqa_dev_sample.jsonl"
#: torch threads, for every command that loads a model.
ThreadsOption = Annotated[int | None, typer.Option(
    min=1, help="torch threads (default: torch's choice).")]
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
    from rag_gates.eval.corpus import load_corpus_stats
    from rag_gates.eval.plugins.quco import BENCH_TAU_ENTITY
    from rag_gates.quco import ClaimVerifier, QuCoGate

    with console.status("opening the corpus-statistics index (the first run builds it)"):
        stats = load_corpus_stats()
    gate = QuCoGate(stats, tau_entity=BENCH_TAU_ENTITY)
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


@app.command()
def bench(
    dataset: Annotated[str, typer.Option(help=names_help("dataset"))],
    out: Annotated[Path, typer.Option(help="Run directory (created; resumed if it exists).")],
    methods: Annotated[str, typer.Option(help=names_help("method"))] = "no-rag,single",
    n: Annotated[int, typer.Option(min=1, help="Number of questions.")] = 200,
    offset: Annotated[int, typer.Option(min=0, help="Questions skipped first.")] = 0,
    model: Annotated[str, typer.Option(
        help="'default', an HF path/id (in process), or openai:URL\\[#model-name] (a model "
             "behind an OpenAI-compatible server; API key from $OPENAI_API_KEY).")
    ] = "default",
    retriever: Annotated[str, typer.Option(help="bm25 or dense.")] = "bm25",
    k: Annotated[int, typer.Option(min=1, max=50, help="Passages per retrieval.")] = 3,
    max_new_tokens: Annotated[int, typer.Option(min=1, max=1024)] = 48,
    data: Annotated[Path | None, typer.Option(help="Dataset file or directory.")] = None,
    threads: ThreadsOption = None,
    prefix_cache_mb: Annotated[float, typer.Option(
        min=0, help="In-process models: MB of recent prompts' keys and values kept, so a "
                    "prompt that extends one prefills only its new tokens (DeepRAG, FLARE); "
                    "0: off. Log-probabilities equal an uncached run's up to float rounding "
                    "(about 1e-5), so a greedy near-tie may differ.")] = 0,
    concurrency: Annotated[int, typer.Option(
        min=1, max=64, help="Questions answered at once (a served model only; the server "
                            "batches them). In-process models answer one at a time.")] = 1,
    request_timeout: Annotated[float, typer.Option(
        min=1, max=3600, help="Seconds a served model may take for one request, retries "
                              "included (questions queue at a server that answers one at a "
                              "time).")] = 600.0,
    chat_template: Annotated[str | None, typer.Option(
        help="A served model's chat template: 'default' (the embedded SmolLM2's), a template "
             "file or a model directory. Chat prompts are then rendered here, so score() "
             "(deeprag-likelihood) and assistant prefill (deeprag) work through the server's "
             "completions endpoint.")] = None,
) -> None:
    """Run methods over a dataset: one JSON line per answer, resumable, summary at the end."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from rag_gates.errors import ServerError, WhiteBoxRequiredError
    from rag_gates.eval.methods import split_method_list
    from rag_gates.eval.runner import BenchConfig, ConfigMismatchError, run_bench

    try:
        config = BenchConfig(dataset=dataset, methods=split_method_list(methods),
                             n=n, offset=offset, model=model, retriever=retriever, k=k,
                             max_new_tokens=max_new_tokens,
                             data_path=str(data) if data else None, threads=threads,
                             prefix_cache_mb=prefix_cache_mb,
                             concurrency=concurrency, chat_template=chat_template,
                             request_timeout=request_timeout)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    _check_names(lambda: check_dataset(dataset), lambda: check_retriever(retriever),
                 lambda: check_methods(config.methods))
    _check_output_dir(out)
    quiet_transformers()  # after the checks: importing transformers takes a second or two
    # Transient: an error (or the summary) is printed where the bar was, not under it.
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeRemainingColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task("starting", total=None)

        def progress(done: int, total: int, running: dict[str, dict[str, float]]) -> None:
            accs = "  ".join(f"{m} {s['accuracy']:.0f}%" for m, s in running.items())
            bar.update(task, completed=done, total=total, description=f"acc: {accs}")

        try:
            summary = run_bench(config, out, progress=progress)
        except (ValueError, FileNotFoundError, ConfigMismatchError, WhiteBoxRequiredError,
                ServerError) as exc:
            console.print(error_line(exc), highlight=False, soft_wrap=True)
            raise typer.Exit(2) from exc
    console.print((out / "summary.md").read_text())
    console.print(f"results: {out / 'results.jsonl'}; summary: {out / 'summary.json'}")
    _ = summary


@app.command("eval-gate")
def eval_gate(
    gate: Annotated[str, typer.Option(help=names_help("gate"))],
    dataset: Annotated[str, typer.Option(help=names_help("dataset"))],
    out: Annotated[Path, typer.Option(help="Output directory.")],
    n: Annotated[int, typer.Option(min=2)] = 200,
    offset: Annotated[int, typer.Option(min=0)] = 0,
    model: Annotated[str, typer.Option()] = "default",
    retriever: Annotated[str, typer.Option(help="bm25 or dense (for the single-retrieval "
                                                "labels).")] = "bm25",
    k: Annotated[int, typer.Option(min=1, max=50)] = 3,
    max_new_tokens: Annotated[int, typer.Option(min=1, max=1024)] = 32,
    target_rate: Annotated[float | None, typer.Option(
        min=0.0, max=1.0, help="Calibrate for this retrieval rate (default: best accuracy)."
    )] = None,
    data: Annotated[Path | None, typer.Option()] = None,
    labels: Annotated[Path | None, typer.Option(
        help="Bench directory with (or to hold) the no-rag and single runs of these questions; "
             "it must exist unless --create-labels is given."
    )] = None,
    create_labels: Annotated[bool, typer.Option(
        "--create-labels", help="Create the --labels directory if it does not exist.")] = False,
    threads: ThreadsOption = None,
) -> None:
    """Score a gate against 'the model answers wrong without retrieval': AUROC, accuracy and
    retrieval rate at every threshold, a calibrated threshold saved in OUT/gate.json. A gate
    that reads text only (quco) scored against finished --labels loads no model."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from rag_gates.eval.gate_eval import GateEvalConfig, evaluate_gate

    try:
        config = GateEvalConfig(gate=gate, dataset=dataset, n=n, offset=offset, model=model,
                                retriever=retriever, k=k, max_new_tokens=max_new_tokens,
                                target_retrieval_rate=target_rate,
                                data_path=str(data) if data else None,
                                labels_dir=str(labels) if labels else None,
                                create_labels=create_labels, threads=threads)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from exc
    _check_names(lambda: check_gate_names(gate), lambda: check_dataset(dataset),
                 lambda: check_retriever(retriever))
    _check_output_dir(out)
    quiet_transformers()
    with Progress("[progress.description]{task.description}", BarColumn(),
                  MofNCompleteColumn(), TimeRemainingColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task("starting", total=None)

        def progress(stage: str, done: int, total: int) -> None:
            bar.update(task, description=stage, completed=done, total=total)

        try:
            report = evaluate_gate(config, out, progress=progress)
        except (ValueError, FileNotFoundError, TypeError) as exc:  # incl. ConfigMismatchError
            console.print(error_line(exc))
            raise typer.Exit(2) from exc
    c = report.calibrated
    console.print(f"[bold]{gate}[/] on {dataset} ({report.questions} questions): "
                  f"AUROC {report.auroc:.3f}; closed book {100 * report.closed_book_accuracy:.1f}%"
                  f", single retrieval {100 * report.single_retrieval_accuracy:.1f}%")
    console.print(f"calibrated threshold {c.threshold:.4g}: accuracy {100 * c.accuracy:.1f}% at "
                  f"retrieval rate {100 * c.retrieval_rate:.1f}% -> {out / 'gate.json'}")
    if report.popularity_spearman is not None:
        console.print(f"Spearman(score, s_pop) = {report.popularity_spearman:.3f}")


@app.command("fit-weighted")
def fit_weighted_command(
    run: Annotated[list[Path], typer.Option(help="An eval-gate output directory, one per "
                                                 "gate (repeat; calibration rows).")],
    labels: Annotated[Path, typer.Option(help="Bench directory with the no-rag and single "
                                              "runs of the same questions.")],
    out: Annotated[Path, typer.Option(help="JSON to write: use it as weighted(OUT).")],
    target_rate: Annotated[float | None, typer.Option(
        min=0.0, max=1.0, help="Calibrate for this retrieval rate (default: best accuracy)."
    )] = None,
) -> None:
    """Fit a Weighted gate (logistic regression of 'closed-book answer wrong' on the gates'
    scores) from eval-gate decisions on calibration rows; use it as weighted(OUT)."""
    from rag_gates._io import write_text_atomic
    from rag_gates.eval.compose import fit_weighted_from_runs

    try:
        fitted = fit_weighted_from_runs(run, labels, target_rate=target_rate)
    except (ValueError, FileNotFoundError) as exc:
        console.print(error_line(exc))
        raise typer.Exit(2) from exc
    write_text_atomic(out, json.dumps(fitted, indent=2))
    weights = ", ".join(f"{g} {w:+.3f}" for g, w in zip(fitted["gates"], fitted["weights"],
                                                         strict=True))
    console.print(f"weights {weights}, bias {fitted['bias']:+.3f}, threshold "
                  f"{fitted['threshold']:.3f} on {fitted['fitted_on']['rows']} rows -> {out}")
    console.print(f'use it as --gate "weighted({out})" or selective@weighted({out})')


@app.command()
def report(
    runs: Annotated[list[Path], typer.Argument(help="Bench and/or eval-gate directories.")],
    out: Annotated[Path, typer.Option(help="Report directory.")] = Path("report"),
    title: Annotated[str, typer.Option()] = "rag-gates report",
    doc: Annotated[Path | None, typer.Option(
        help="Also put the report into this markdown page, between its "
             "'<!-- BEGIN rag-gates report' and '<!-- END rag-gates report -->' lines "
             "(the rest of the page is kept).")] = None,
    paired: Annotated[bool, typer.Option(
        help="Report each dataset's bench runs on the questions that every method of every "
             "run on it answered: a run stopped part-way compares with the others on the "
             "same questions.")] = False,
) -> None:
    """Write a markdown report with a table and PNG plots for bench/eval-gate directories."""
    from rag_gates.eval.report import update_document, write_report

    try:
        path = write_report(runs, out, title=title, paired=paired)
        if doc is not None:
            console.print(f"updated {update_document(doc, path)}")
    except (FileNotFoundError, ValueError) as exc:
        console.print(error_line(exc))
        raise typer.Exit(2) from exc
    console.print(f"wrote {path}")


def _check_output_dir(out: Path) -> None:
    """--out must be a directory that can be made: said before any model loads."""
    from rag_gates._io import output_path_problem

    problem = output_path_problem(out, directory=True)
    if problem is not None:
        raise typer.BadParameter(problem, param_hint="'--out'")


def _check_names(*checks: Callable[[], None]) -> None:
    """Run the name checks before anything loads: an unknown name ends the command with the
    valid ones (exit 2), in seconds rather than after the model has answered."""
    try:
        for check in checks:
            check()
    except (ValueError, OSError) as exc:  # OSError: weighted(FILE) without its file
        console.print(error_line(exc), highlight=False, soft_wrap=True)
        raise typer.Exit(2) from exc


def torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
