"""Tiny random-weight models for plumbing tests (sub-second, offline, deterministic), and
:class:`VerifyReviseScript`, the scripted policy of the self-verifying agent tests.

Not for quality claims: the weights are random. Use the embedded SmolLM2 for those.

Example:
    >>> from rag_gates.testing import tiny_lm
    >>> lm = tiny_lm()
    >>> lm.generate("hello", max_new_tokens=4).completion_tokens
    4
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import JsonValue

from rag_gates._optional import require
from rag_gates.extract.sentences import split_sentences
from rag_gates.gate import BaseGate
from rag_gates.tools import SEARCH_DOCUMENTS_NAME, VERIFY_CLAIMS_NAME
from rag_gates.types import GateDecision

__all__ = [
    "TINY_CHAT_TEMPLATE",
    "ConstantGate",
    "NaNSkippingGate",
    "ScriptedTurn",
    "VerifyReviseScript",
    "check_exports",
    "exported_names",
    "loop_ticks",
    "model_load_threads",
    "save_tiny_lm",
    "tiny_lm",
    "tiny_model_and_tokenizer",
]

TINY_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

_TRAINING_TEXT = [
    "What is the capital of France? The capital of France is Paris.",
    "Who wrote Hamlet? William Shakespeare wrote Hamlet in London.",
    "Retrieval augmented generation reads passages before it answers a question.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Scientists measure accuracy, recall and precision on real data sets.",
    "Numbers like 1, 2, 3, 10, 42 and 1999 appear in many documents.",
]


def _tokenizer() -> Any:
    tokenizers = require("tokenizers", "hf")
    transformers = require("transformers", "hf")
    bpe = tokenizers.Tokenizer(tokenizers.models.BPE(unk_token=None))
    bpe.pre_tokenizer = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = tokenizers.decoders.ByteLevel()
    trainer = tokenizers.trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=tokenizers.pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_TRAINING_TEXT, trainer=trainer)
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        bos_token="<|im_start|>",
    )
    tok.chat_template = TINY_CHAT_TEMPLATE
    return tok


def tiny_model_and_tokenizer(
    seed: int = 0, *, num_layers: int = 4, hidden_size: int = 64, max_context: int = 256,
    extra_tokens: Sequence[str] = (),
) -> tuple[Any, Any]:
    """A random-weight Llama (grouped-query attention, rotary) and a tiny byte-level BPE.
    ``extra_tokens``: words added to the tokenizer as single tokens (``("True",)`` for
    P(True), which reads one token; the default model is unchanged)."""
    torch = require("torch", "hf")
    transformers = require("transformers", "hf")
    tok = _tokenizer()
    if extra_tokens:
        tok.add_tokens(list(extra_tokens))
    config = transformers.LlamaConfig(
        vocab_size=len(tok),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_context,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        tie_word_embeddings=True,
        # A wide init keeps random logits well separated, so greedy paths vary by prompt.
        initializer_range=0.3,
    )
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(config).eval()
    model.config._name_or_path = f"tiny-llama-seed{seed}"
    return model, tok


def tiny_lm(seed: int = 0, **kwargs: Any) -> Any:
    """An :class:`~rag_gates.lm.hf.HFWhiteBoxLM` over :func:`tiny_model_and_tokenizer`
    (``kwargs``: its options, ``extra_tokens=("True",)`` say)."""
    from rag_gates.lm.hf import HFWhiteBoxLM

    model, tok = tiny_model_and_tokenizer(seed, **kwargs)
    return HFWhiteBoxLM(model, tok, model_id=f"tiny-llama-seed{seed}")


def save_tiny_lm(directory: str | Path, seed: int = 0) -> Path:
    """Write a tiny model + tokenizer to ``directory`` (for tests that load from a path)."""
    model, tok = tiny_model_and_tokenizer(seed)
    path = Path(directory)
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path


@asynccontextmanager
async def loop_ticks(interval_s: float = 0.01) -> AsyncIterator[list[int]]:
    """Inside the block, count how often the event loop runs a coroutine that sleeps
    ``interval_s`` (``ticks[0]``): a test that an async call does not block the loop.

    Example:
        >>> async with loop_ticks() as ticks:  # doctest: +SKIP
        ...     await llm.acomplete("hi")       # 0.3 s of work
        >>> ticks[0] >= 10  # doctest: +SKIP
        True
    """
    ticks = [0]

    async def tick() -> None:
        while True:
            await asyncio.sleep(interval_s)
            ticks[0] += 1

    task = asyncio.create_task(tick())
    try:
        yield ticks
    finally:
        task.cancel()


@contextmanager
def model_load_threads() -> Iterator[list[threading.Thread]]:
    """Inside the block, record the thread of every ``HFWhiteBoxLM.from_pretrained`` call (the
    model still loads): a test that a component's first async call loads off the event loop.

    Example:
        >>> with model_load_threads() as threads:  # doctest: +SKIP
        ...     await chat.ainvoke("hi")
        >>> threads[0] is not threading.current_thread()  # doctest: +SKIP
        True
    """
    from rag_gates.lm.hf import HFWhiteBoxLM

    original = HFWhiteBoxLM.__dict__["from_pretrained"]
    threads: list[threading.Thread] = []

    def recording(cls: type, *args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread())
        return original.__func__(cls, *args, **kwargs)

    HFWhiteBoxLM.from_pretrained = classmethod(recording)  # type: ignore[assignment,method-assign]
    try:
        yield threads
    finally:
        HFWhiteBoxLM.from_pretrained = original  # type: ignore[method-assign]


@dataclass(frozen=True)
class ScriptedTurn:
    """One turn of :class:`VerifyReviseScript`: text, and the tool call it makes (if any)."""

    content: str
    tool: str | None = None
    args: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class VerifyReviseScript:
    """The policy of a scripted tool-calling model, for tests of self-verifying agents.

    A test fixture, not a model: a framework's chat-model subclass in a test asks it for the
    next turn given the tool results so far, so the agent loop, the tools and the verifier
    (all real) are exercised deterministically. The policy reacts to what the tools return:

    1. write ``draft`` and call ``verify_claims`` on it;
    2. if the verifier flags a claim (and fewer than ``max_searches`` searches were made),
       call ``search_documents`` with the verifier's first query;
    3. if the search retrieved documents, revise: the sentence of the flagged claim is
       replaced by the first sentence of the first document that names the claim's head
       (title or text; else the first document), then call ``verify_claims`` on the revision;
    4. otherwise (nothing flagged, the gate declined, or the searches are used up) answer
       with the current text.

    Example:
        >>> script = VerifyReviseScript(draft="Ed Wood was born in Paris.")
        >>> script.next_turn([]).args
        {'text': 'Ed Wood was born in Paris.'}
    """

    draft: str
    max_searches: int = 1
    verify_tool: str = VERIFY_CLAIMS_NAME
    search_tool: str = SEARCH_DOCUMENTS_NAME

    def answer(self, tool_results: Sequence[tuple[str, str]]) -> str:
        """The current text after these ``(tool name, content)`` results: the draft, revised
        once per search that retrieved documents after a flagged verification."""
        text, report = self.draft, None
        for name, content in tool_results:
            if name == self.verify_tool:
                report = json.loads(content)
            elif name == self.search_tool and report and report["flagged"]:
                found = json.loads(content)
                if found["retrieved"] and found["documents"]:
                    text = revise(text, report["flagged"][0], found["documents"])
        return text

    def next_turn(self, tool_results: Sequence[tuple[str, str]]) -> ScriptedTurn:
        """The next turn given every ``(tool name, content)`` result so far, in order."""
        text = self.answer(tool_results)
        if not tool_results:
            return ScriptedTurn(text, self.verify_tool, {"text": text})
        name, content = tool_results[-1]
        searches = sum(n == self.search_tool for n, _ in tool_results)
        if name == self.verify_tool:
            report = json.loads(content)
            if report["flagged"] and searches < self.max_searches:
                return ScriptedTurn("", self.search_tool, {"query": report["queries"][0]})
        elif name == self.search_tool and text != self.answer(tool_results[:-1]):
            return ScriptedTurn(text, self.verify_tool, {"text": text})
        return ScriptedTurn(text)


def revise(text: str, flag: dict[str, Any], documents: Sequence[dict[str, Any]]) -> str:
    """``text`` with the sentence of the flagged claim ``flag`` (``head``, ``tail``) replaced
    by the first sentence of the first document naming the head (see
    :class:`VerifyReviseScript`)."""
    head = str(flag["head"]).lower()
    tail = str(flag.get("tail") or "").lower()
    sentences = split_sentences(text) or [text]
    target = next((i for i, s in enumerate(sentences) if head in s.lower() and tail in s.lower()),
                  next((i for i, s in enumerate(sentences) if head in s.lower()),
                       len(sentences) - 1))
    source = next((d for d in documents
                   if head in f"{d.get('title') or ''} {d['text']}".lower()), documents[0])
    sentences[target] = (split_sentences(source["text"]) or [source["text"]])[0]
    return " ".join(sentences)


def exported_names(init_file: str | Path, package: str) -> set[str]:
    """The public names a package's ``__init__.py`` binds itself: imports from its own
    submodules (also those under ``if TYPE_CHECKING:``, which lazy packages resolve in
    ``__getattr__``), and its own definitions. A test compares them with ``__all__``, so a
    name added to the package but not exported (or exported but gone) fails.

    Example:
        >>> import rag_gates.srrag as srrag
        >>> exported_names(srrag.__file__, "rag_gates.srrag") == set(srrag.__all__)
        True
    """
    import ast

    tree = ast.parse(Path(init_file).read_text())
    names: set[str] = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.If):  # if TYPE_CHECKING: the lazy package's imports
                visit(node.body)
            elif isinstance(node, ast.ImportFrom):
                own = node.level > 0 or (node.module or "").startswith(package + ".")
                if own:
                    names.update(a.asname or a.name for a in node.names)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(t.id for t in targets if isinstance(t, ast.Name))

    visit(tree.body)
    return {n for n in names if not n.startswith("_")}


def check_exports(package: str) -> None:
    """Import ``package`` and fail (AssertionError) unless its ``__all__`` has no duplicate,
    equals :func:`exported_names`, and every name in it resolves."""
    import importlib

    module = importlib.import_module(package)
    public = list(module.__all__)
    assert len(public) == len(set(public)), f"{package}: duplicate names in __all__"
    bound = exported_names(str(module.__file__), package)
    assert bound == set(public), (
        f"{package}: not exported: {sorted(bound - set(public))}; "
        f"exported but not bound: {sorted(set(public) - bound)}")
    for name in public:  # a lazy package resolves each in __getattr__
        assert hasattr(module, name), f"{package}.{name} is in __all__ but does not resolve"


def tiny_gate_spec(lm: Any, path: str | Path, *, n: int = 40, max_new_tokens: int = 12,
                   max_loss: float = 0.2) -> Path:
    """A certified ``answer-logprob`` spec for ``lm`` (for framework tests that load one):
    the gate's real scores on ``n`` questions, labelled so that skipping never loses an
    answer below the median score and the closed book is wrong above it, then certified by
    :func:`rag_gates.calibration.calibrate` and saved to ``path``."""
    from rag_gates.calibration import CalibrationRecord, ModelIdentity, calibrate
    from rag_gates.confidence import AnswerLogprobGate

    gate = AnswerLogprobGate(lm, max_new_tokens=max_new_tokens)
    questions = [f"Who founded the company number {i}?" for i in range(n)]
    scores = [gate.decide(q).score for q in questions]
    median = sorted(scores)[n // 2]
    records = [CalibrationRecord(id=str(i), question=q, closed_book_correct=s < median,
                                 retrieved_correct=True, scores={"answer-logprob": s})
               for i, (q, s) in enumerate(zip(questions, scores, strict=True))]
    report = calibrate(records, max_loss=max_loss, model=ModelIdentity.of(lm),
                       retriever="none (test)", gates=["answer-logprob"], composite=False,
                       options={"max_new_tokens": max_new_tokens})
    return report.best.save(path)


def tiny_three_way_spec(lm: Any, path: str | Path, *, abstain_threshold: float | None,
                        max_new_tokens: int = 12) -> Path:
    """A three-way spec for ``lm`` (for framework plumbing tests): :func:`tiny_gate_spec`'s
    spec made to retrieve always, with an abstention certificate at ``abstain_threshold``
    (0.0: abstain after every retrieval, since a score is never below 0; a large value:
    never abstain). The certification itself is tested on real records elsewhere; this
    spec exercises the third outcome's path through the engines."""
    from rag_gates.calibration import AbstainCertificate, GateSpec, RateInterval

    spec = GateSpec.load(tiny_gate_spec(lm, path, max_new_tokens=max_new_tokens))
    certificate = AbstainCertificate(
        score="answer-logprob", threshold=abstain_threshold, max_error=0.5, closed_share=0.5,
        abstain_rate=RateInterval(observed=0.5, lower=0.3, upper=0.7), observed_error=0.2,
        note="test spec")
    three_way = spec.model_copy(update={"threshold": None, "certified": False,
                                        "abstain": certificate})
    return three_way.sealed().save(path)


class ConstantGate(BaseGate):
    """A gate whose score is always ``score``: ``ConstantGate(1.0)`` retrieves at its
    threshold 0.5, ``ConstantGate(0.0)`` never does.

    Example:
        >>> ConstantGate(1.0).decide("Who wrote Hamlet?").retrieve
        True
    """

    name = "constant"

    def __init__(self, score: float, threshold: float = 0.5) -> None:
        super().__init__(threshold)
        self.constant = score

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        return self.constant, {}


class NaNSkippingGate:
    """A gate that follows the :class:`~rag_gates.gate.Gate` protocol without ``BaseGate``
    (a remote scoring service, say) and decides "no retrieval" on the NaN its service
    answered: what the framework wrappers must fail closed on.

    Example:
        >>> from rag_gates.gate import fail_closed
        >>> fail_closed(NaNSkippingGate().decide("Who wrote Hamlet?")).retrieve
        True
    """

    name, threshold = "remote", 0.5
    said = "nan against 0.5"

    def decide(self, query: str, **signals: Any) -> GateDecision:
        return GateDecision(gate=self.name, retrieve=False, score=float("nan"),
                            threshold=self.threshold, reason=self.said)

    async def adecide(self, query: str, **signals: Any) -> GateDecision:
        return self.decide(query)

    def decide_batch(self, queries: Sequence[str], **signals: Any) -> list[GateDecision]:
        return [self.decide(q) for q in queries]
