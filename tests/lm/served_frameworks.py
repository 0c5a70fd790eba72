"""What the tests of a served model inside LangChain and LlamaIndex share
(``integrations/*/tests/test_l?_served_gates.py``, and ``docs/scaling.md``'s section "A served
model in LangChain / LlamaIndex" in ``tests/integration/test_docs_snippets.py``).

The served model is llama-cpp-python's server running the embedded SmolLM2 GGUF, replayed
from recordings (:mod:`tests.lm.replay_server`): ``rag-gates calibrate --model openai:URL``'s
requests (``tests/calibration/data/calibrate-llamacpp-0.3.36.json``: the first 30 shipped
calibration questions, every served gate at 8 answer tokens) and, per framework, the
requests of that framework's own client of the same server (``ChatOpenAI``, ``OpenAILike``:
``integrations/*/tests/data/``). Re-record a framework's file with
``RAG_GATES_RECORD_UPSTREAM=http://127.0.0.1:PORT/v1`` while such a server runs
(:func:`rag_gates.lm.llamacpp_server.llamacpp_server`).

The reference decisions are the core's, computed here without the registry or a framework:
each gate class on :class:`~rag_gates.lm.OpenAICompatibleLM`, its threshold between the
middle scores (so the questions split), and a composite's decision from its gates'.
The integration tests load this file by path (``tests`` is no package there) and take its
fixtures (``server``, ``stats``, ``asked``, ``refs``) by assigning them to module names.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = ROOT / "examples" / "data" / "calibration_questions.jsonl"
CORPUS = ROOT / "examples" / "data" / "calibration_corpus.jsonl"
CALIBRATE_RECORDING = ROOT / "tests" / "calibration" / "data" / "calibrate-llamacpp-0.3.36.json"
#: The same server's replies to LangChain's ChatOpenAI and LlamaIndex's OpenAILike.
CHATOPENAI_RECORDING = (ROOT / "integrations" / "langchain" / "tests" / "data"
                        / "served-chatopenai-llamacpp-0.3.36.json")
OPENAILIKE_RECORDING = (ROOT / "integrations" / "llama-index" / "tests" / "data"
                        / "served-openailike-llamacpp-0.3.36.json")
#: The questions the calibrate recording holds (the slice's first ones).
N_QUESTIONS = 30
#: The answer budget the recording was made with: every gate and the spec use it.
MAX_NEW_TOKENS = 8
OPTIONS: dict[str, Any] = {"max_new_tokens": MAX_NEW_TOKENS}
#: The gates a served model's replies allow (rag-gates calibrate --model openai:URL).
SERVED_GATES = ("answer-logprob", "first-token-logprob", "sample-agreement", "quco")
#: Those that read the model (quco reads the corpus only), in the order calibrate decides
#: them: a framework client's requests recorded in that order get calibrate's replies
#: (llama-cpp-python's server reads a prompt it has just read slightly differently: it
#: re-reads only its last token).
MODEL_GATES = ("answer-logprob", "first-token-logprob", "sample-agreement")
#: The questions a framework client's requests are recorded for (calibrate's first ones).
N_FRAMEWORK_QUESTIONS = 12
#: What a malformed reply makes a served gate say: undecided, so it retrieves.
MALFORMED = b'{"choices": "not a list"}'


def load_by_path(path: Path, name: str) -> ModuleType:
    """The module at ``path`` (imported once, under ``name``)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def replay_server_class() -> Any:
    """:class:`tests.lm.replay_server.ReplayServer`, loaded by path."""
    return load_by_path(Path(__file__).with_name("replay_server.py"),
                        "rag_gates_tests_replay_server").ReplayServer


def replay_every_client() -> Any:
    """A ReplayServer (not started) answering what every recording holds: calibrate's,
    ChatOpenAI's and OpenAILike's requests to the one server."""
    server = replay_server_class()(CALIBRATE_RECORDING)
    for path in (CHATOPENAI_RECORDING, OPENAILIKE_RECORDING):
        server.replies.update(json.loads(path.read_text(encoding="utf-8"))["replies"])
    return server


def questions(n: int = N_QUESTIONS) -> list[str]:
    """The first ``n`` questions of the shipped calibration slice."""
    lines = QUESTIONS.read_text(encoding="utf-8").splitlines()[:n]
    return [str(json.loads(line)["question"]) for line in lines]


def calibrate(url: str, work: Path, gates: str = "auto") -> Path:
    """``rag-gates calibrate --model openai:URL`` on the recorded questions (BM25 top 1 over
    the shipped corpus, 8 answer tokens, epsilon 0.2): the spec file it writes."""
    from rag_gates.commands.calibrate import run_calibration

    work.mkdir(parents=True, exist_ok=True)
    data = work / "questions.jsonl"
    data.write_text("".join(QUESTIONS.read_text(encoding="utf-8")
                            .splitlines(keepends=True)[:N_QUESTIONS]), encoding="utf-8")
    out = work / "gate.json"
    run_calibration(data=data, corpus=str(CORPUS), out=out, model=f"openai:{url}",
                    gates=gates, max_new_tokens=MAX_NEW_TOKENS, k=1, max_loss=0.2)
    return out


def corpus_stats() -> Any:
    """The corpus-statistics index ``calibrate`` builds of ``--corpus`` (cached under
    ``$RAG_GATES_HOME/indexes``), open: what a served spec naming quco loads with."""
    from rag_gates.commands.calibrate import (
        _sha,
        corpus_stats_index,
        open_corpus_stats,
        read_corpus,
    )

    return open_corpus_stats(corpus_stats_index(read_corpus(CORPUS), _sha(CORPUS)))


def core_gate(name: str, lm: Any, stats: Any, threshold: float) -> Any:
    """The core gate class ``name`` stands for, built directly (not through the registry)."""
    from rag_gates.confidence import AnswerLogprobGate, FirstTokenLogprobGate
    from rag_gates.quco import QuCoGate
    from rag_gates.sample_agreement import SampleAgreementGate

    if name == "quco":
        return QuCoGate.from_threshold(stats, threshold)
    classes = {"answer-logprob": AnswerLogprobGate, "first-token-logprob": FirstTokenLogprobGate,
               "sample-agreement": SampleAgreementGate}
    return classes[name](lm, threshold=threshold, max_new_tokens=MAX_NEW_TOKENS)


def split_threshold(scores: Sequence[float]) -> float:
    """A threshold between the middle distinct scores: some questions retrieve, some not."""
    distinct = sorted(set(scores))
    assert len(distinct) >= 2, f"every question scored {distinct}: nothing to split"
    middle = len(distinct) // 2
    return (distinct[middle - 1] + distinct[middle]) / 2


#: The composites the tests build over the served gates, by label: AllOf binds tighter than
#: AnyOf; a cascade's second gate decides where the first's score is in its band.
ANY_OF = "quco&answer-logprob|sample-agreement"
CASCADE = "cascade(first-token-logprob,answer-logprob)"
LABELS = (*SERVED_GATES, ANY_OF, CASCADE)


@dataclass(frozen=True)
class Reference:
    """One gate expression and the core's decisions on the questions."""

    expression: str
    #: The name the built gate's decisions carry (a composite's names its gates).
    name: str
    retrieve: tuple[bool, ...]
    #: The gate's own score per question (None for a composite: its score is its own).
    scores: tuple[float, ...] | None


def core_references(lm: Any, stats: Any, asked: Sequence[str]) -> dict[str, Reference]:
    """Each served gate at a threshold that splits ``asked``, and the composites over them
    (:data:`LABELS`), with the core's decisions; each holds the gate expression that builds
    it through the registry (``NAME:THRESHOLD``, ``A&B|C``, ``cascade(A,B,LO,HI)``)."""
    scores = {name: [core_gate(name, lm, stats, 0.5).decide(q).score for q in asked]
              for name in SERVED_GATES}
    refs: dict[str, Reference] = {}
    leaf: dict[str, str] = {}
    said: dict[str, list[bool]] = {}
    for name in SERVED_GATES:
        threshold = split_threshold(scores[name])
        leaf[name] = f"{name}:{threshold!r}"
        said[name] = [s >= threshold for s in scores[name]]
        refs[name] = Reference(leaf[name], name, tuple(said[name]), tuple(scores[name]))
    refs[ANY_OF] = Reference(
        f"{leaf['quco']}&{leaf['answer-logprob']}|{leaf['sample-agreement']}",
        "((quco&answer-logprob)|sample-agreement)",
        tuple((q and a) or s for q, a, s in zip(said["quco"], said["answer-logprob"],
                                                said["sample-agreement"], strict=True)), None)
    first = scores["first-token-logprob"]
    low, high = sorted(first)[len(first) // 4], 1.0  # the cheap gate passes most questions on
    refs[CASCADE] = Reference(
        f"cascade({leaf['first-token-logprob']},{leaf['answer-logprob']},{low!r},{high!r})",
        f"cascade(first-token-logprob,answer-logprob,{low:g},{high:g})",
        tuple(said["answer-logprob"][i] if low <= first[i] <= high
              else said["first-token-logprob"][i] for i in range(len(asked))), None)
    for label, ref in refs.items():
        assert 0 < sum(ref.retrieve) < len(asked), f"{label} decides alike on every question"
    return refs


def framework_decisions(lm: Any, refs: dict[str, Reference], asked: Sequence[str]
                        ) -> dict[str, list[Any]]:
    """The model gates at the references' thresholds, built through the registry on ``lm``
    (a framework's client of the server): their decisions on the first
    :data:`N_FRAMEWORK_QUESTIONS` questions, each question's gates in :data:`MODEL_GATES`'
    order, so a recording made by this call holds the replies calibrate's holds."""
    from rag_gates.registry import GateContext, make_gate

    gates = {name: make_gate(refs[name].expression, GateContext(lm=lm, options=OPTIONS))
             for name in MODEL_GATES}
    decisions: dict[str, list[Any]] = {name: [] for name in MODEL_GATES}
    for question in asked[:N_FRAMEWORK_QUESTIONS]:
        for name, gate in gates.items():
            decisions[name].append(gate.decide(question))
    return decisions


# ---------------------------------------------------------------- fixtures the tests share


@pytest.fixture(scope="module")
def server() -> Iterator[Any]:
    """llama-cpp-python's server as calibrate's recording has it (replay only)."""
    pytest.importorskip("infini_gram", reason='QuCo\'s index: pip install "rag-gates[corpus]"')
    with replay_server_class()(CALIBRATE_RECORDING) as s:
        yield s


@pytest.fixture(scope="module")
def stats(server: Any) -> Iterator[Any]:
    """The corpus index calibrate builds of ``--corpus`` (:func:`corpus_stats`)."""
    index = corpus_stats()
    yield index
    index.close()


@pytest.fixture(scope="module")
def asked() -> list[str]:
    """The recorded questions."""
    return questions()


@pytest.fixture(scope="module")
def refs(server: Any, stats: Any, asked: list[str]) -> dict[str, Reference]:
    """The core's decisions, by label (:data:`LABELS`)."""
    from rag_gates.lm.openai_compat import OpenAICompatibleLM

    return core_references(OpenAICompatibleLM(server.url), stats, asked)
