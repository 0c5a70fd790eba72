"""LM-Polygraph's uncertainty estimators as rag-gates gates (:class:`PolygraphGate`).

`LM-Polygraph <https://github.com/IINemo/lm-polygraph>`_ (``lm-polygraph``, MIT) implements
about thirty uncertainty estimators over a Hugging Face model: maximum sequence probability,
perplexity, mean token entropy, pointwise mutual information, P(True), Monte-Carlo sequence
entropy, lexical similarity, the degree matrix, semantic entropy, CCP, SAR, ... A
:class:`PolygraphGate` scores a question closed book with one of them, over the model object
an :class:`~rag_gates.lm.hf.HFWhiteBoxLM` already holds (no second load), and retrieves when
the uncertainty is at or above its threshold.

The score is lm-polygraph's own number, unchanged: its estimators are oriented
"higher = less confident", which is rag-gates' "higher = more need to retrieve". It is
computed as ``lm_polygraph.estimate_uncertainty`` computes it (the same stat calculators,
registered by ``register_default_stat_calculators``, on the same input text), except that
the model's attention weights and hidden states are asked for only when the estimator reads
them.

Estimators that need another model (semantic entropy, the NLI variants of the degree matrix
and eccentricity, CCP: ``microsoft/deberta-large-mnli``; SAR: a cross-encoder) load it from
the Hugging Face hub or its cache when the gate is built. Those that need training data
(Mahalanobis distance, RDE) or a claim extractor are refused with the reason.

Example:
    >>> from rag_gates.lm import load_default_lm
    >>> from rag_gates.peers import PolygraphGate
    >>> gate = PolygraphGate(load_default_lm(), "MaximumSequenceProbability", threshold=2.0)
    >>> d = gate.decide("Who wrote Hamlet?")                       # doctest: +SKIP
    >>> d.evidence["estimator"], d.evidence["uncertainty"], d.retrieve  # doctest: +SKIP
"""

from __future__ import annotations

import difflib
import inspect
import math
import re
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pydantic import JsonValue

from rag_gates._optional import require
from rag_gates.gate import BaseGate
from rag_gates.prompts import check_prompt_dataset, qa_prompt

__all__ = ["ATTENTION_STATS", "PolygraphGate", "polygraph_estimator", "register_polygraph_gate"]

#: Statistics lm-polygraph computes from attention weights: transformers returns them only
#: under eager attention.
ATTENTION_STATS = frozenset({"attention_all", "forwardpass_attention_weights",
                             "attention_weights_eliciting_prompt"})
_HIDDEN_STATS = frozenset({"embeddings"})
#: Always computed, as lm_polygraph's UEManager does: the greedy answer and its tokens.
_GREEDY_STATS = ("greedy_texts", "greedy_tokens")
_SAMPLERS = ("SamplingGenerationCalculator",)


def _polygraph() -> Any:
    return require("lm_polygraph", "polygraph")


def _sequence_estimators(estimators: Any, base: type) -> list[str]:
    """Names of lm-polygraph's sequence-level estimator classes that build without
    arguments (for error messages)."""
    names = []
    for name, cls in sorted(vars(estimators).items()):
        if not (inspect.isclass(cls) and issubclass(cls, base) and cls is not base):
            continue
        try:
            if getattr(cls(), "level", None) == "sequence":
                names.append(name)
        except Exception:  # needs arguments, or a model name: not listed
            continue
    return names


def polygraph_estimator(estimator: Any) -> Any:
    """``estimator`` as an lm-polygraph ``Estimator``: an instance is checked, a name is the
    class name in ``lm_polygraph.estimators`` built with its defaults
    (``"MaximumSequenceProbability"``, ``"PTrue"``, ``"LexicalSimilarity"``). Raises
    ValueError (an unknown name, with the closest ones; a class that needs arguments; a
    token- or claim-level estimator) or TypeError, each saying what to pass instead.

    Example:
        >>> polygraph_estimator("Perplexity")                        # doctest: +SKIP
        <lm_polygraph.estimators.perplexity.Perplexity object at ...>
    """
    _polygraph()
    estimators = require("lm_polygraph.estimators", "polygraph")
    base = estimators.Estimator
    if isinstance(estimator, str):
        cls = getattr(estimators, estimator, None)
        if not (inspect.isclass(cls) and issubclass(cls, base)):
            known = _sequence_estimators(estimators, base)
            close = difflib.get_close_matches(estimator, known, n=3, cutoff=0.5)
            hint = f"did you mean {', '.join(close)}? " if close else ""
            raise ValueError(
                f"lm-polygraph has no estimator class {estimator!r}: {hint}give a class name "
                f"from lm_polygraph.estimators ({', '.join(known)}) or an Estimator instance")
        try:
            estimator = cls()
        except TypeError as exc:
            raise ValueError(
                f"lm-polygraph's {estimator} needs arguments ({exc}): build it yourself and "
                f"pass the instance, e.g. estimator=lm_polygraph.estimators.{estimator}(...)"
            ) from exc
    if not isinstance(estimator, base):
        raise TypeError(f"estimator must be an lm_polygraph.estimators.Estimator or the name "
                        f"of one, got {type(estimator).__name__}")
    if estimator.level != "sequence":
        raise ValueError(
            f"lm-polygraph's {estimator} is a {estimator.level}-level estimator (one number "
            "per token or claim); a gate needs one number per question: use a sequence-level "
            "estimator (MaximumSequenceProbability, Perplexity, MeanTokenEntropy, ...)")
    return estimator


def _said(error: BaseException) -> str:
    """``Type: message``; for an error without a message (a bare ``assert``), where it was
    raised and the line's text instead."""
    text = str(error)
    if not text:
        frames = traceback.extract_tb(error.__traceback__)
        if frames:
            last = frames[-1]
            text = f"at {Path(last.filename).name}:{last.lineno} ({(last.line or '').strip()})"
    return f"{type(error).__name__}: {text[:300]}"


def _gate_name(estimator: Any) -> str:
    """``polygraph-`` and the estimator's name, without the characters a gate name cannot
    hold (spaces, ``()&|,:``)."""
    return "polygraph-" + re.sub(r"[^A-Za-z0-9_.=-]+", "", str(estimator))


class PolygraphGate(BaseGate):
    """Retrieve when an LM-Polygraph uncertainty estimator says the model is unsure.

    Score: the estimator's uncertainty for the greedy closed-book answer to the QA prompt
    (:func:`~rag_gates.prompts.qa_prompt`, in the model's chat template when it has one), as
    lm-polygraph returns it: higher = less confident. It retrieves when the score is at or
    above ``threshold``. The scale is the estimator's own (``MaximumSequenceProbability``:
    ``-sum log p`` of the answer's tokens, from 0 up; ``PTrue``: ``-log p("True")``;
    ``LexicalSimilarity``: minus the mean ROUGE-L between samples, in [-1, 0]), so the
    threshold is calibrated per estimator (``rag-gates calibrate`` after
    :func:`register_polygraph_gate`).

    Fail closed: an estimator that raises (its statistics or the estimator itself) or
    returns a number that is not finite leaves the gate undecided: it retrieves, and the
    reason and ``evidence["undecided"]`` say why (``evidence["error"]`` holds the error).

    Args:
        lm: an :class:`~rag_gates.lm.hf.HFWhiteBoxLM`; lm-polygraph runs on its model and
            tokenizer objects (not a copy), under its lock.
        estimator: an ``lm_polygraph.estimators.Estimator`` (sequence-level) or its class
            name, built with its defaults.
        threshold: retrieve when the uncertainty is ``>= threshold`` (the estimator's scale).
        dataset: picks the QA prompt's answer instruction, as for the other gates.
        max_new_tokens: the budget of the greedy answer and of each sample (default 32, as
            :class:`~rag_gates.confidence.AnswerLogprobGate`).
        samples: answers sampled for the sampling-based estimators (lexical similarity,
            Monte-Carlo entropy, the degree matrix, semantic entropy, ...); default 10,
            lm-polygraph's. Ignored by the others.
        seed: torch's generator is seeded with it for each decision, inside a fork of its
            state (the process's random state is left as it was), so a sampling-based
            estimator decides the same question the same way every time. None: draw from
            the process's generator.
        calculator_options: keyword arguments for lm-polygraph's
            ``register_default_stat_calculators`` (``hf_cache``, ``language``,
            ``deberta_batch_size``).

    Setup:
        ``pip install "rag-gates[polygraph]"`` (lm-polygraph 0.7.0; with the white-box extra)

    Instantiate:
        >>> from rag_gates.lm import load_default_lm
        >>> from rag_gates.peers import PolygraphGate
        >>> lm = load_default_lm()                                        # doctest: +SKIP
        >>> msp = PolygraphGate(lm, "MaximumSequenceProbability", threshold=2.0)  # doctest: +SKIP
        >>> from lm_polygraph.estimators import DegMat
        >>> degmat = PolygraphGate(lm, DegMat(similarity_score="Jaccard_score"),
        ...                        threshold=0.5, samples=5)              # doctest: +SKIP

    Invoke:
        >>> d = msp.decide("Who wrote Hamlet?")                           # doctest: +SKIP
        >>> d.retrieve, d.score, d.evidence["estimator"], d.evidence["greedy_answer"]
        >>> await msp.adecide("Who wrote Hamlet?")                        # doctest: +SKIP
        >>> msp.decide_batch(["Who wrote Hamlet?", "Who directed Ed Wood?"])  # doctest: +SKIP
    """

    name = "polygraph"

    def __init__(self, lm: Any, estimator: Any, threshold: float, *,
                 dataset: str | None = None, max_new_tokens: int = 32, samples: int = 10,
                 seed: int | None = 0,
                 calculator_options: Mapping[str, Any] | None = None) -> None:
        polygraph = _polygraph()
        from lm_polygraph.defaults.register_default_stat_calculators import (
            register_default_stat_calculators,
        )
        from lm_polygraph.utils.builder_enviroment_stat_calculator import (
            BuilderEnvironmentStatCalculator,
        )
        from lm_polygraph.utils.dataset import Dataset
        from lm_polygraph.utils.generation_parameters import GenerationParameters

        from rag_gates.lm.hf import HFWhiteBoxLM

        self.estimator = polygraph_estimator(estimator)
        self.name = _gate_name(self.estimator)
        super().__init__(threshold)
        if not isinstance(lm, HFWhiteBoxLM):
            raise TypeError(
                f"PolygraphGate needs an HFWhiteBoxLM (lm-polygraph runs transformers' "
                f"generate on its model and tokenizer), got {type(lm).__name__}: load one with "
                "rag_gates.lm.load_default_lm() or HFWhiteBoxLM.from_pretrained(...)")
        for what, value, low in (("max_new_tokens", max_new_tokens, 1),
                                 ("samples", samples, 2)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{what} must be an integer >= {low}, got {value!r}")
        if max_new_tokens > 1024:
            raise ValueError(f"max_new_tokens must be <= 1024, got {max_new_tokens}")
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
            raise ValueError(f"seed must be an integer or None, got {seed!r}")
        check_prompt_dataset(dataset)
        self.lm = lm
        self.dataset = dataset
        self.max_new_tokens = max_new_tokens
        self.samples = samples
        self.seed = seed
        options = dict(calculator_options or {})

        containers = register_default_stat_calculators("Whitebox", **options)
        self.needed_stats = self._needed(containers)
        producers = {stat: c.name for c in containers for stat in c.stats}
        #: Whether the estimator reads sampled answers (``samples`` of them per question).
        self.samples_answers = any(producers[s] in _SAMPLERS for s in self.needed_stats)
        attention = bool(self.needed_stats & ATTENTION_STATS)
        implementation = getattr(lm.model.config, "_attn_implementation", None)
        if attention and implementation != "eager":
            raise ValueError(
                f"lm-polygraph's {self.estimator} reads attention weights, which transformers "
                f"returns only under eager attention, and this model runs {implementation!r}: "
                "load it with attn_implementation='eager' (HF from_pretrained), or pick an "
                "estimator that does not read attention")
        containers = register_default_stat_calculators(
            "Whitebox", **{"output_attentions": attention,
                           "output_hidden_states": bool(self.needed_stats & _HIDDEN_STATS),
                           **options})
        self.model = polygraph.WhiteboxModel(
            lm.model, lm.tokenizer, model_path=lm.model_id, model_type="CausalLM",
            generation_parameters=GenerationParameters(max_new_tokens=max_new_tokens),
            instruct=bool(lm.chat_template))
        try:
            self._manager = polygraph.UEManager(
                Dataset([""], [""], batch_size=1), self.model, [self.estimator],
                builder_env_stat_calc=BuilderEnvironmentStatCalculator(self.model),
                available_stat_calculators=containers, generation_metrics=[], ue_metrics=[],
                processors=[], ignore_exceptions=False, verbose=False,
                max_new_tokens=max_new_tokens)
        except Exception as exc:
            raise RuntimeError(
                f"could not build lm-polygraph's statistics for {self.estimator} "
                f"({type(exc).__name__}: {exc}). A model they load (an NLI or cross-encoder "
                "model from the Hugging Face hub) must be reachable or in the cache "
                "(calculator_options={'hf_cache': ...}); else pick an estimator that reads the "
                "LM alone, such as MaximumSequenceProbability") from exc
        for calculator in self._manager.stat_calculators:
            if type(calculator).__name__ in _SAMPLERS:
                calculator.samples_n = samples

    @property
    def calculators(self) -> tuple[str, ...]:
        """The lm-polygraph stat calculators one decision runs, in order (their class names):
        what a decision costs, besides the estimator itself."""
        return tuple(type(c).__name__ for c in self._manager.stat_calculators)

    @property
    def manager(self) -> Any:
        """The ``lm_polygraph.UEManager`` that holds the built stat calculators (built once,
        with the gate; a decision runs them through its ``calculate``)."""
        return self._manager

    def _needed(self, containers: list[Any]) -> frozenset[str]:
        """Every statistic the estimator needs, through the calculators' dependencies;
        ValueError for one that no calculator computes from the model alone."""
        producers = {stat: c for c in containers for stat in c.stats}
        needed: set[str] = set()
        todo = [*self.estimator.stats_dependencies, *_GREEDY_STATS]
        while todo:
            stat = todo.pop()
            if stat in needed or stat in ("input_texts", "target_texts"):
                continue
            if stat not in producers:
                raise ValueError(
                    f"lm-polygraph's {self.estimator} needs the statistic {stat!r}, which no "
                    "default stat calculator computes from the model and the question alone "
                    "(it comes from training data or a claim extractor): pick another "
                    "estimator, such as MaximumSequenceProbability or PTrue")
            needed.add(stat)
            todo.extend(producers[stat].dependencies)
        return frozenset(needed)

    @contextmanager
    def _random_state(self) -> Iterator[None]:
        import torch

        if self.seed is None:
            yield
            return
        device = self.lm.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(self.seed)
            yield

    def prompt_text(self, query: str) -> Any:
        """What lm-polygraph is given for ``query``: the QA prompt (the model wrapper puts it
        in the chat template when the model has one, as the rag-gates model does)."""
        prompt = qa_prompt(query, dataset=self.dataset)
        return prompt if self.lm.chat_template else self.lm.render(prompt)

    def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
        from rag_gates.lm.hooks import locked

        text = self.prompt_text(query)
        evidence: dict[str, JsonValue] = {"estimator": str(self.estimator),
                                          "max_new_tokens": self.max_new_tokens}
        if self.samples_answers:
            evidence["samples"] = self.samples
        stats: dict[str, Any] = {"input_texts": [text], "target_texts": [""],
                                 "model": self.model}
        step = "its statistics"
        try:
            with locked(self.lm), self._random_state():
                for calculator in self._manager.stat_calculators:
                    step = type(calculator).__name__
                    stats = self._manager.calculate(stats, [calculator], [text])
                step = "the estimator"
                values = [float(v) for v in self.estimator(stats)]
        except Exception as exc:  # lm-polygraph's failure: undecided, so retrieve
            return math.nan, {**evidence, "error": f"{step} raised {_said(exc)}"}
        greedy = stats.get("greedy_texts")
        if isinstance(greedy, list | tuple) and greedy:
            evidence["greedy_answer"] = str(greedy[0])
        if len(values) != 1:
            return math.nan, {**evidence, "error": f"the estimator returned {len(values)} "
                                                   "values for one question"}
        evidence["uncertainty"] = values[0]
        return values[0], evidence

    def score_label(self, evidence: dict[str, JsonValue]) -> str:
        return f"lm-polygraph {evidence.get('estimator')} uncertainty"

    def undecided(self, score: float, evidence: dict[str, JsonValue]) -> str:
        if "error" in evidence:
            return f"lm-polygraph's {evidence.get('estimator')} failed: {evidence['error']}"
        return f"lm-polygraph's {evidence.get('estimator')} returned {score!r}"


def register_polygraph_gate(estimator: Any, **options: Any) -> str:
    """Register a :class:`PolygraphGate` over ``estimator`` under its gate name
    (``polygraph-MaximumSequenceProbability``), so ``load_gate``, gate expressions and
    ``rag-gates calibrate --gates`` (run in this process) build it; returns the name.
    ``options`` go to :class:`PolygraphGate` (``samples``, ``seed``, ...); the model, dataset
    and answer budget come from the gate context. A spec without a threshold builds it at 0.

    Example:
        >>> name = register_polygraph_gate("PTrue")                     # doctest: +SKIP
        >>> name
        'polygraph-PTrue'
    """
    from rag_gates.registry import GateContext, register_gate

    name = _gate_name(polygraph_estimator(estimator))

    def factory(ctx: GateContext, threshold: float | None) -> PolygraphGate:
        return PolygraphGate(ctx.need_lm(name), estimator,
                             0.0 if threshold is None else threshold, dataset=ctx.dataset,
                             max_new_tokens=ctx.max_new_tokens, **options)

    register_gate(name, factory)
    return name
