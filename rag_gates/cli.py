"""The ``rag-gates`` command line: ``info`` and ``demo`` (later issues add more commands)."""

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

from rag_gates.types import Generation, Passage

app = typer.Typer(
    help="rag-gates: decide when to retrieve and which retrieved text to trust.",
    no_args_is_help=True,
    add_completion=False,
)
console = Console()

_EXAMPLE_DATA = Path(__file__).resolve().parent.parent / "examples" / "data"
DEMO_DATA = _EXAMPLE_DATA / "hotpotqa_dev_sample.jsonl"
_PACKAGES = ("rag-gates", "torch", "transformers", "sentence-transformers", "llama-index-core",
             "langchain-core", "llama-index-rag-gates", "langchain-rag-gates")


def _quiet_transformers() -> None:
    """transformers' per-load progress bars would interleave with the CLI's own output."""
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()


def _version(package: str) -> str:
    try:
        return version(package)
    except PackageNotFoundError:
        return "not installed"


@app.command()
def info(
    load: Annotated[bool, typer.Option(help="Load the default models and time the loads.")] = True,
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

        table.add_row("torch threads", str(torch.get_num_threads()))
    except ImportError:
        table.add_row("torch threads", 'torch not installed: pip install "rag-gates[hf]"')
    if load:
        _quiet_transformers()
        start = time.perf_counter()
        lm = defaults.load_default_lm()
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


def qa_prompt(question: str, passages: list[Passage] | None = None) -> str:
    """The demo's question-answering prompt, with or without passages."""
    if not passages:
        return f"Answer the question in a few words.\nQuestion: {question}"
    context = "\n".join(f"- {p.title}: {p.text}" for p in passages)
    return (f"Answer the question in a few words, using the context.\nContext:\n{context}\n"
            f"Question: {question}")


@app.command()
def demo(
    n: Annotated[int, typer.Option(min=1, help="How many questions to answer.")] = 3,
    max_new_tokens: Annotated[int, typer.Option(min=1, max=512)] = 32,
    data: Annotated[Path, typer.Option(help="HotpotQA JSONL file.")] = DEMO_DATA,
) -> None:
    """Answer HotpotQA questions with the embedded model, with and without the gold passages,
    showing per-token confidence."""
    if not data.is_file():
        raise typer.BadParameter(f"{data} does not exist; pass --data path/to/hotpotqa.jsonl")
    from rag_gates.lm import load_default_lm

    _quiet_transformers()
    with console.status("loading the embedded SmolLM2 (the first run converts it, ~20 s)"):
        start = time.perf_counter()
        lm = load_default_lm()
    console.print(f"[bold]model[/] {lm.model_id}: loaded in {time.perf_counter() - start:.1f} s, "
                  f"{lm.num_layers} layers, {torch_threads()} threads")
    console.print("token colours: [green]p >= 0.7[/] [yellow]p >= 0.3[/] [red]p < 0.3[/]\n")
    for row in load_hotpotqa_rows(data, n):
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
        table.caption = f"gold answer: {row['answer']}"
        console.print(table)


def torch_threads() -> int:
    import torch

    return int(torch.get_num_threads())


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
