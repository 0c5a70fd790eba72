"""``rag-gates calibrate --model openai:URL``: every gate a served model's replies allow
(answer-logprob, first-token-logprob, sample-agreement, and QuCo over an index calibrate
builds of ``--corpus``), and ``--concurrency N``: the records of a sequential run, in the same
order, resumable after an interruption.

Against replies recorded from llama-cpp-python's server running the embedded SmolLM2 GGUF
(tests/lm/replay_server.py): a deterministic server. Re-record with
``RAG_GATES_RECORD_UPSTREAM=http://127.0.0.1:PORT/v1`` while such a server runs
(``python -m llama_cpp.server --model SmolLM2-135M-Instruct.Q4_1.gguf --logits_all true``;
rag_gates.lm.llamacpp_server starts one)."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from rag_gates.calibration import GateSpec, read_records
from rag_gates.cli import app
from rag_gates.commands.calibrate import (
    collect_records,
    read_corpus,
    read_questions,
    run_calibration,
)
from tests.lm.replay_server import ReplayServer

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = ROOT / "examples" / "data" / "calibration_questions.jsonl"
CORPUS = ROOT / "examples" / "data" / "calibration_corpus.jsonl"
RECORDING = Path(__file__).parent / "data" / "calibrate-llamacpp-0.3.36.json"
UPSTREAM = os.environ.get("RAG_GATES_RECORD_UPSTREAM")
N_QUESTIONS = 30
SERVED_GATES = {"answer-logprob", "first-token-logprob", "sample-agreement", "quco"}


@pytest.fixture(scope="module")
def server() -> Iterator[ReplayServer]:
    pytest.importorskip("infini_gram", reason='QuCo\'s index: pip install "rag-gates[corpus]"')
    with ReplayServer(RECORDING, upstream=UPSTREAM) as s:
        yield s


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The first questions of the shipped calibration slice."""
    path = tmp_path_factory.mktemp("data") / "questions.jsonl"
    path.write_text("".join(QUESTIONS.read_text().splitlines(keepends=True)[:N_QUESTIONS]))
    return path


def _args(server: ReplayServer, data: Path, out: Path, *extra: str) -> list[str]:
    return ["calibrate", "--data", str(data), "--corpus", str(CORPUS), "--out", str(out),
            "--model", f"openai:{server.url}", "--max-new-tokens", "8", "--k", "1",
            "--max-loss", "0.2", *extra]


@pytest.fixture(scope="module")
def sequential(server: ReplayServer, data: Path,
               tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One sequential run with --gates auto: the work dir and the output."""
    out = tmp_path_factory.mktemp("sequential") / "gate.json"
    result = CliRunner().invoke(app, _args(server, data, out))
    assert result.exit_code == 0, result.output
    return out.with_name("gate-work"), " ".join(result.output.split())


def test_a_served_model_gets_every_gate_its_replies_allow(sequential: tuple[Path, str]
                                                          ) -> None:
    work, output = sequential
    records = read_records(work / "records.jsonl")
    assert len(records) == N_QUESTIONS
    assert set(records[0].scores) == SERVED_GATES
    # The white-box gates are skipped, each with why; P(True) says what it needs.
    assert "skipped first-token-prob" in output and "skipped cbdr" in output
    assert "skipped p-true-sampling" in output and "give --chat-template" in output
    for gate in ("first-token-logprob", "sample-agreement", "answer-logprob"):
        assert all(r.scores[gate] is not None for r in records), gate
    # sample-agreement spreads: some questions' samples agree with the greedy answer more.
    assert len({r.scores["sample-agreement"] for r in records}) > N_QUESTIONS // 4
    # QuCo counts the question's entities in the index calibrate built of --corpus: the
    # shipped corpus holds every question's subject page, so some are counted, not all rare.
    quco = [r.scores["quco"] for r in records]
    assert all(s is not None and 0.0 <= s <= 1.0 for s in quco)
    assert min(quco) < 0.5
    report = json.loads((work / "report.json").read_text())
    rows = {row["gate"]: row for row in report["rows"]}
    assert set(rows) >= SERVED_GATES
    assert rows["quco"]["auroc"] is not None
    # The spec fixes sample-agreement's draw, so a loaded spec samples as calibrate did.
    assert report["options"] == {"max_new_tokens": 8, "samples": 5,
                                 "sample_temperature": 0.7, "sample_seed": 0,
                                 "sample_agreement": "f1"}


def test_a_chat_template_lets_a_served_model_score_p_true() -> None:
    """load_model builds the served model with --chat-template's text, so chat prompts are
    rendered here, probed (llama-cpp-python's echo of them is aligned) and scored by echo:
    --gates auto then builds p-true-sampling, which without the template it skips, saying
    what to give. Against the replies recorded for tests/lm (the probe with the embedded
    model's chat template)."""
    from rag_gates.commands.calibrate import applicable_gates, load_model
    from rag_gates.lm.openai_compat import OpenAICompatibleLM

    with ReplayServer() as recorded:  # tests/lm's recording: it holds the chat probe
        assert recorded.chat_template is not None
        spec = f"openai:{recorded.url}"
        lm = load_model(spec, None, 1, recorded.chat_template)
        assert isinstance(lm, OpenAICompatibleLM)
        assert lm.config.chat_template == recorded.chat_template
        assert lm.alignment == {"raw": "shifted", "chat": "aligned"}
        built, skipped = applicable_gates(lm, None, {"max_new_tokens": 8})
        assert "p-true-sampling" in built and "p-true-sampling" not in skipped
        assert built["p-true-sampling"].samples == 10
        built, _ = applicable_gates(lm, ["p-true-sampling", "p-true"], {"max_new_tokens": 8})
        assert set(built) == {"p-true-sampling", "p-true"}

        plain = load_model(spec, None, 1)
        assert "chat" not in plain.alignment
        built, skipped = applicable_gates(plain, None, {"max_new_tokens": 8})
        assert "p-true-sampling" not in built
        assert "the chat endpoint echoes no prompt; give --chat-template" in \
            skipped["p-true-sampling"]
        with pytest.raises(ValueError, match=r"--gates p-true: .*give --chat-template"):
            applicable_gates(plain, ["p-true"], {"max_new_tokens": 8})


def test_a_served_work_dir_without_a_template_resumes_and_refuses_one(
        server: ReplayServer, data: Path, sequential: tuple[Path, str], tmp_path: Path
        ) -> None:
    """A served run's work directory made without --chat-template (as every one made before
    the option was) holds no chat_template entry: it resumes without one, as it was, and a
    run with one is refused before the model loads, saying what differs."""
    import shutil

    from tests.lm.replay_server import RECORDING as LM_RECORDING

    work = tmp_path / "work"
    shutil.copytree(sequential[0], work)
    config = (work / "config.json").read_text()
    records = (work / "records.jsonl").read_text()
    assert "chat_template" not in json.loads(config)
    out = tmp_path / "gate.json"
    result = CliRunner().invoke(app, _args(server, data, out, "--work-dir", str(work)))
    assert result.exit_code == 0, result.output
    assert (work / "config.json").read_text() == config
    assert (work / "records.jsonl").read_text() == records  # resumed: nothing answered again
    template = tmp_path / "chat_template.jinja"
    template.write_text(json.loads(LM_RECORDING.read_text())["chat_template"])
    requests = len(server.requests)
    result = CliRunner().invoke(app, _args(server, data, out, "--work-dir", str(work),
                                           "--chat-template", str(template)))
    assert result.exit_code == 2, result.output
    said = " ".join(result.output.split())
    assert "holds records made with another --chat-template" in said
    assert "(was: none; now: sha256 " in said
    assert len(server.requests) == requests  # refused before the model was asked anything
    assert (work / "config.json").read_text() == config


def test_quco_is_certified_by_calibrate_and_its_spec_loads_with_the_index(
        server: ReplayServer, data: Path, tmp_path: Path) -> None:
    """--gates quco alone: the threshold is certified on the index calibrate built, and the
    spec loads with that index (rag_gates.calibration.load_gate)."""
    from rag_gates.calibration import load_gate
    from rag_gates.commands.calibrate import _sha, corpus_stats_index, open_corpus_stats
    from rag_gates.lm.openai_compat import OpenAICompatibleLM

    out = tmp_path / "quco.json"
    run_calibration(data=data, corpus=str(CORPUS), out=out, model=f"openai:{server.url}",
                    gates="quco", max_new_tokens=8, k=1, max_loss=0.2)
    spec = GateSpec.load(out)
    assert spec.gate == "quco" and spec.certified and spec.skip_rate.lower > 0
    index = corpus_stats_index(read_corpus(CORPUS), _sha(CORPUS))  # cached: the same index
    lm = OpenAICompatibleLM(server.url)
    gate = load_gate(out, lm=lm, corpus=open_corpus_stats(index))
    decision = gate.decide("In what city was Koudai Tsukakoshi born?")
    assert decision.evidence["entities"]
    config = json.loads((tmp_path / "quco-work" / "config.json").read_text())
    assert config["corpus_stats"].startswith("local:")


def test_concurrency_writes_the_records_of_a_sequential_run(
        server: ReplayServer, data: Path, sequential: tuple[Path, str], tmp_path: Path
        ) -> None:
    out = tmp_path / "gate.json"
    server.max_in_flight = 0
    server.faults.extend([("sleep", 0.05)] * 40)  # slow answers: questions must overlap
    result = CliRunner().invoke(app, _args(server, data, out, "--concurrency", "4"))
    assert result.exit_code == 0, result.output
    assert "answering 4 questions at once" in result.output
    assert server.max_in_flight >= 2
    assert (tmp_path / "gate-work" / "records.jsonl").read_text() == \
        (sequential[0] / "records.jsonl").read_text()


class Interrupt(Exception):
    pass


def test_an_interrupted_concurrent_run_resumes_to_the_sequential_records(
        server: ReplayServer, data: Path, sequential: tuple[Path, str], tmp_path: Path
        ) -> None:
    from rag_gates.commands.calibrate import (
        _sha as corpus_sha,
    )
    from rag_gates.commands.calibrate import (
        applicable_gates,
        corpus_stats_index,
        open_corpus_stats,
    )
    from rag_gates.lm.openai_compat import OpenAICompatibleLM
    from rag_gates.retrieval.bm25 import BM25Retriever

    questions = read_questions(data)
    passages = read_corpus(CORPUS)
    lm = OpenAICompatibleLM(server.url, max_concurrency=8)
    gates, _ = applicable_gates(lm, None, {"max_new_tokens": 8}, corpus_stats=lambda: (
        open_corpus_stats(corpus_stats_index(passages, corpus_sha(CORPUS)))))
    retriever = BM25Retriever.from_passages(passages)
    path = tmp_path / "records.jsonl"

    def stop(done: int, total: int) -> None:
        if done == 7:
            raise Interrupt

    with pytest.raises(Interrupt):
        collect_records(questions, lm, retriever, gates, path, k=1, max_new_tokens=8,
                        progress=stop, concurrency=4)
    expected = (sequential[0] / "records.jsonl").read_text().splitlines(keepends=True)
    # Written in question order: what an interruption leaves is a prefix.
    assert path.read_text() == "".join(expected[:7])
    collect_records(questions, lm, retriever, gates, path, k=1, max_new_tokens=8,
                    concurrency=4)
    assert path.read_text() == "".join(expected)


def test_the_sample_agreement_gate_on_real_replies(server: ReplayServer) -> None:
    """The score is 1 - the mean token F1 of the samples with the greedy answer, on the
    server's own replies; the greedy answer is the reply a skip gives (reused, not generated again);
    llama.cpp's server answers the API's n with one choice, so the samples are drawn one
    request each, seeded seed + i, and the same call draws the same samples."""
    from rag_gates.answer_once import reusable_answer
    from rag_gates.answers import f1, normalize_answer
    from rag_gates.lm.openai_compat import OpenAICompatibleLM
    from rag_gates.prompts import qa_prompt
    from rag_gates.registry import GateContext, make_gate

    lm = OpenAICompatibleLM(server.url)
    gate = make_gate("sample-agreement", GateContext(lm=lm, options={"max_new_tokens": 8}))
    question = json.loads(QUESTIONS.read_text().splitlines()[0])["question"]
    decision = gate.decide(question)
    samples = decision.evidence["samples"]
    greedy = decision.evidence["closed_book_answer"]
    assert isinstance(samples, list) and len(samples) == 5
    mean_f1 = sum(1.0 if normalize_answer(str(s)) == normalize_answer(str(greedy))
                  else f1(str(s), [str(greedy)]) for s in samples) / 5
    assert decision.score == pytest.approx(1 - mean_f1)
    assert 0 < decision.score < 1  # some words shared, not all: a graded score
    assert lm.batched_samples is False
    assert lm.generate(qa_prompt(question), max_new_tokens=8).text == greedy
    skip = decision.model_copy(update={"retrieve": False})  # as a skip would
    assert reusable_answer(skip, lm=lm, prompt=qa_prompt(question),
                           max_new_tokens=8).answer == greedy
    assert gate.decide(question).evidence["samples"] == samples


def test_sample_agreement_fails_closed_on_a_malformed_reply(server: ReplayServer) -> None:
    from rag_gates.lm.openai_compat import OpenAICompatibleLM
    from rag_gates.sample_agreement import SampleAgreementGate

    lm = OpenAICompatibleLM(server.url, max_retries=0)
    gate = SampleAgreementGate(lm, max_new_tokens=8, threshold=0.9)
    question = json.loads(QUESTIONS.read_text().splitlines()[0])["question"]
    server.faults.append(("body", b'{"choices": "not a list"}'))
    decision = gate.decide(question)
    assert decision.retrieve and "could not be read" in decision.reason


def test_concurrency_needs_a_served_model(data: Path, tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["calibrate", "--data", str(data), "--corpus",
                                      str(CORPUS), "--out", str(tmp_path / "g.json"),
                                      "--concurrency", "4"])
    assert result.exit_code == 2
    assert "--concurrency 4 needs a served model" in " ".join(result.output.split())
    assert not (tmp_path / "g-work").exists()


def test_sample_agreement_on_an_in_process_model_is_seeded(tmp_path: Path) -> None:
    """White-box too: the samples are seeded generations, so the score repeats."""
    from rag_gates.sample_agreement import SampleAgreementGate
    from rag_gates.testing import tiny_lm

    gate = SampleAgreementGate(tiny_lm(), samples=3, max_new_tokens=4)
    first, again = gate.decide("Who wrote Hamlet?"), gate.decide("Who wrote Hamlet?")
    assert first.evidence["samples"] == again.evidence["samples"]
    assert first.score == again.score
    assert len(first.evidence["samples"]) == 3
    with pytest.raises(ValueError, match="temperature must be > 0"):
        SampleAgreementGate(tiny_lm(), temperature=0)


def test_auto_gates_for_an_in_process_model_skip_the_reply_gates_with_why() -> None:
    from rag_gates.commands.calibrate import applicable_gates
    from rag_gates.testing import tiny_lm

    built, skipped = applicable_gates(tiny_lm(), None, {"max_new_tokens": 4})
    assert {"answer-logprob", "first-token-prob"} <= set(built)
    assert "same score from the logits" in skipped["first-token-logprob"]
    assert "--gates" in skipped["sample-agreement"]
    assert "--corpus-stats" in skipped["quco"]
    built, _ = applicable_gates(tiny_lm(), ["sample-agreement"], {"max_new_tokens": 4,
                                                                   "samples": 2})
    assert built["sample-agreement"].samples == 2


class _MeetingGate:
    """A gate that decides only once every other gate of the same question is deciding too
    (a barrier): collect_records passes only if it sends a question's gates at once."""

    def __init__(self, name: str, barrier: threading.Barrier) -> None:
        self.name, self.barrier = name, barrier

    def decide(self, question: str) -> Any:
        from rag_gates.types import GateDecision

        self.barrier.wait()  # raises BrokenBarrierError after its timeout if alone
        return GateDecision(gate=self.name, retrieve=True, score=0.5, threshold=0.4,
                            reason="met the other gate")


def test_concurrency_decides_a_questions_gates_at_once(server: ReplayServer, data: Path,
                                                        tmp_path: Path) -> None:
    from rag_gates.lm.openai_compat import OpenAICompatibleLM
    from rag_gates.retrieval.bm25 import BM25Retriever

    question = read_questions(data)[:1]  # one question: the gates can meet only each other
    lm = OpenAICompatibleLM(server.url, max_concurrency=8)
    retriever = BM25Retriever.from_passages(read_corpus(CORPUS))

    def gates(timeout: float) -> dict[str, Any]:
        barrier = threading.Barrier(2, timeout=timeout)
        return {name: _MeetingGate(name, barrier) for name in ("first", "second")}

    records = collect_records(question, lm, retriever, gates(30.0), tmp_path / "a.jsonl",
                              k=1, max_new_tokens=8, concurrency=2)
    assert records[0].scores == {"first": 0.5, "second": 0.5}
    # The control: one at a time, the first gate waits alone and the barrier breaks.
    with pytest.raises(threading.BrokenBarrierError):
        collect_records(question, lm, retriever, gates(0.5), tmp_path / "b.jsonl",
                        k=1, max_new_tokens=8, concurrency=1)
