"""QuCoGate and ClaimVerifier against real counts from a local index of Wikipedia paragraphs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import JsonValue

from rag_gates.corpus import CorpusStats, HostedInfiniGram
from rag_gates.corpus.errors import CorpusError
from rag_gates.errors import ExtractionError
from rag_gates.extract.base import Claim
from rag_gates.gate import BaseGate
from rag_gates.quco import ClaimVerifier, QuCoGate, Verification
from rag_gates.types import GateDecision
from tests.quco.conftest import GazetteerExtractor


def test_gate_counts_entities_and_compares_the_mean_with_tau(stats: Any,
                                                             extractor: GazetteerExtractor
                                                             ) -> None:
    question = "Were Scott Derrickson and Ed Wood of the same nationality?"
    counts = {e: stats.count(e).value for e in ["Scott Derrickson", "Ed Wood"]}
    assert all(c > 0 for c in counts.values())
    mean = sum(counts.values()) / 2
    below = QuCoGate(stats, extractor, tau_entity=mean - 0.5).decide(question)
    at = QuCoGate(stats, extractor, tau_entity=mean).decide(question)
    assert below.retrieve is False and at.retrieve is True
    assert at.evidence["counts"] == counts and at.evidence["frequency"] == mean
    assert at.score == pytest.approx(1 / (1 + mean))
    assert "tau_entity" in at.reason and "retrieve" in at.reason
    assert GateDecision.model_validate_json(at.model_dump_json()) == at


def test_min_aggregate_lets_one_rare_entity_trigger(stats: Any,
                                                    extractor: GazetteerExtractor) -> None:
    question = "Did Zzyzx Quorvath work with Ed Wood?"
    assert stats.count("Zzyzx Quorvath").value == 0
    ed = stats.count("Ed Wood").value
    tau = ed / 2 - 1  # the mean ed/2 is above tau, the min (0) below
    assert QuCoGate(stats, extractor, tau_entity=tau).decide(question).retrieve is False
    d = QuCoGate(stats, extractor, tau_entity=tau, aggregate="min").decide(question)
    assert d.retrieve is True and d.evidence["frequency"] == 0


def test_no_entity_means_no_retrieval(stats: Any, extractor: GazetteerExtractor) -> None:
    d = QuCoGate(stats, extractor, tau_entity=1e12).decide("what is the meaning of it all?")
    assert d.retrieve is False and d.evidence["entities"] == [] and d.score == 0.0
    assert "no entity" in d.reason


def test_entity_with_and_is_one_literal_phrase(stats: Any,
                                               extractor: GazetteerExtractor) -> None:
    d = QuCoGate(stats, extractor, tau_entity=0).decide("Who drew Tom AND Jerry?")
    assert d.evidence["entities"] == ["Tom AND Jerry"]
    assert d.evidence["counts"] == {"Tom AND Jerry": stats.count("Tom AND Jerry").value}
    assert d.evidence["counts"]["Tom AND Jerry"] >= 1  # the literal text is in the corpus


def test_threshold_round_trips_to_tau(stats: Any, extractor: GazetteerExtractor) -> None:
    gate = QuCoGate(stats, extractor, tau_entity=99)
    assert QuCoGate.tau_from_threshold(gate.threshold) == pytest.approx(99)
    again = QuCoGate.from_threshold(stats, gate.threshold, extractor=extractor)
    assert again.tau_entity == pytest.approx(99)
    with pytest.raises(ValueError, match="tau_entity"):
        QuCoGate(stats, extractor, tau_entity=-1)
    with pytest.raises(ValueError, match="aggregate"):
        QuCoGate(stats, extractor, aggregate="median")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="on_error"):
        QuCoGate(stats, extractor, on_error="ignore")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="CorpusStats"):
        QuCoGate(object(), extractor)  # type: ignore[arg-type]


def test_verifier_flags_zero_cooccurrence_only(stats: Any,
                                               extractor: GazetteerExtractor) -> None:
    verifier = ClaimVerifier(stats, extractor)
    true_pair = stats.cooccurrence("Ed Wood", "Tim Burton").value
    false_pair = stats.cooccurrence("Scott Derrickson", "Tim Burton").value
    assert true_pair >= 1 and false_pair == 0
    report = verifier.verify("Ed Wood was directed by Tim Burton. "
                             "Scott Derrickson was married to Tim Burton.")
    assert [s.flagged for s in report.sentences] == [False, True]
    flagged = report.flagged
    assert len(flagged) == 1 and flagged[0].cooccurrence == 0
    assert flagged[0].claim == Claim(head="Scott Derrickson", relation="was married to",
                                     tail="Tim Burton")
    assert report.queries == ["Scott Derrickson was married to"]
    assert report.first_flagged == 1
    assert report.summary()["flagged"][0]["query"] == "Scott Derrickson was married to"
    assert Verification.model_validate_json(report.model_dump_json()) == report


def test_tau_cooc_above_one_is_stricter(stats: Any, extractor: GazetteerExtractor) -> None:
    n = stats.cooccurrence("Ed Wood", "Tim Burton").value
    text = "Ed Wood was directed by Tim Burton."
    assert not ClaimVerifier(stats, extractor, tau_cooc=n).verify(text).flagged
    assert ClaimVerifier(stats, extractor, tau_cooc=n + 1).verify(text).flagged


def test_partial_items_flag_rare_heads(stats: Any, extractor: GazetteerExtractor) -> None:
    rare = "Where was Zzyzx Quorvath born?"
    common = "Where was Ed Wood born?"
    v = ClaimVerifier(stats, extractor, min_head_count=1)
    assert v.verify(rare).flagged[0].head_count == 0
    assert not v.verify(common).flagged
    assert not ClaimVerifier(stats, extractor, check_partial=False).verify(rare).flagged


def test_reasoning_sentences_give_no_claims(stats: Any, extractor: GazetteerExtractor) -> None:
    report = ClaimVerifier(stats, extractor).verify("Thus, Ed Wood came before Tim Burton.")
    assert report.sentences[0].checks == () and not report.flagged


class FailingStats(CorpusStats):
    """A corpus backend whose every lookup times out, as a hosted index does under load."""

    backend_name = "failing"
    index_name = "none"  # type: ignore[assignment]
    index_key = "none"  # type: ignore[assignment]

    def count(self, phrase: str) -> Any:
        raise CorpusError(f"timed out counting {phrase!r}")

    def cooccurrence(self, a: str, b: str, scope: Any = "document") -> Any:
        raise CorpusError("timed out")


@pytest.mark.parametrize(("policy", "retrieve"), [("retrieve", True), ("skip", False)])
def test_gate_on_error_policies(extractor: GazetteerExtractor, policy: Any,
                                retrieve: bool) -> None:
    gate = QuCoGate(FailingStats(), extractor, tau_entity=10, on_error=policy)
    d = gate.decide("Were Scott Derrickson and Ed Wood of the same nationality?")
    assert d.retrieve is retrieve and "timed out" in str(d.evidence["error"])
    assert gate.errors == 1 and "on_error" in d.reason


def test_a_failed_lookup_makes_a_composite_retrieve_beside_a_confident_gate(
        extractor: GazetteerExtractor) -> None:
    """A corpus failure under on_error="retrieve" is "could not decide", so AllOf does not
    let a partner that would skip overrule it (quco&cbdr with a confident probe)."""
    from rag_gates.gate import AllOf, Weighted

    class Confident(BaseGate):
        name = "confident"

        def score(self, query: str, **signals: Any) -> tuple[float, dict[str, JsonValue]]:
            return 0.0, {}

    question = "Were Scott Derrickson and Ed Wood of the same nationality?"
    quco = QuCoGate(FailingStats(), extractor, tau_entity=10)
    alone = quco.decide(question)
    assert alone.retrieve and "undecided" in alone.evidence
    assert "corpus statistics failed" in alone.reason and "timed out" in alone.reason
    for composite in (AllOf(quco, Confident(0.5)), AllOf(Confident(0.5), quco, short_circuit=False),
                      Weighted([quco, Confident(0.5)], weights=[1.0, 1.0], bias=-5.0)):
        d = composite.decide(question)
        assert d.retrieve, d.reason
        assert d.evidence.get("undecided_gate") == "quco", d.evidence


def test_gate_on_error_raise(extractor: GazetteerExtractor) -> None:
    gate = QuCoGate(FailingStats(), extractor, on_error="raise")
    with pytest.raises(CorpusError, match="timed out"):
        gate.decide("Did Ed Wood know Tim Burton?")


class OneNaNCount(CorpusStats):
    """The real local index, except that one phrase's count (and every co-occurrence with
    it) comes back NaN, as from a backend that skips the result types' validation."""

    backend_name = "one-nan"
    index_name = "one-nan"  # type: ignore[assignment]
    index_key = "one-nan"  # type: ignore[assignment]

    def __init__(self, real: Any, broken: str) -> None:
        self.real, self.broken = real, broken

    def count(self, phrase: str) -> Any:
        result = self.real.count(phrase)
        if phrase != self.broken:
            return result
        return type(result).model_construct(**{**dict(result), "value": float("nan")})

    def cooccurrence(self, a: str, b: str, scope: Any = "document") -> Any:
        result = self.real.cooccurrence(a, b, scope)
        if self.broken not in (a, b):
            return result
        return type(result).model_construct(**{**dict(result), "value": float("nan")})


@pytest.mark.parametrize("aggregate", ["min", "mean"])
def test_a_nan_count_anywhere_makes_the_gate_retrieve(stats: Any, extractor: GazetteerExtractor,
                                                      aggregate: Any) -> None:
    """``min([1e6, nan])`` is 1e6: before every count was checked, a NaN in second place
    let the gate skip on the first entity's count alone."""
    question = "Were Scott Derrickson and Ed Wood of the same nationality?"
    assert extractor.entities(question) == ["Scott Derrickson", "Ed Wood"]
    healthy = QuCoGate(stats, extractor, tau_entity=0, aggregate=aggregate).decide(question)
    assert healthy.retrieve is False  # both names are in the corpus: a confident skip
    for broken in ("Scott Derrickson", "Ed Wood"):
        gate = QuCoGate(OneNaNCount(stats, broken), extractor, tau_entity=0,
                        aggregate=aggregate)
        d = gate.decide(question)
        assert d.retrieve is True and "undecided" in d.evidence, d.reason
        assert "invalid count" in d.reason and repr(broken) in d.reason
        assert gate.errors == 1


def test_a_nan_count_flags_the_claim(stats: Any, extractor: GazetteerExtractor) -> None:
    sentence = "Ed Wood was directed by Tim Burton."
    assert not ClaimVerifier(stats, extractor, tau_cooc=1).verify(sentence).flagged
    report = ClaimVerifier(OneNaNCount(stats, "Tim Burton"), extractor,
                           tau_cooc=1).verify(sentence)
    check = report.sentences[0].checks[0]
    assert check.flagged and report.errors == 1 and "invalid count" in str(check.error)


@pytest.mark.parametrize(("policy", "retrieve"), [("retrieve", True), ("skip", False)])
def test_an_unreadable_extractor_reply_is_not_no_entity(stats: Any, policy: Any,
                                                         retrieve: bool) -> None:
    """The model's own "[]" means no entity (no retrieval, as the paper); prose from the
    extractor's model means the entities are unknown: the on_error policy applies."""
    from rag_gates.extract import LLMExtractor
    from tests.extract.test_llm import CannedLM

    question = "Who directed Jaws?"
    none = QuCoGate(stats, LLMExtractor(CannedLM("[]")), tau_entity=1e12).decide(question)
    assert none.retrieve is False and "no entity" in none.reason
    gate = QuCoGate(stats, LLMExtractor(CannedLM("Sure! The entity is Jaws.")),
                    tau_entity=1e12, on_error=policy)
    d = gate.decide(question)
    assert d.retrieve is retrieve and gate.errors == 1, d.reason
    assert "entity extraction failed" in d.reason and "ExtractionError" in d.reason
    assert ("undecided" in d.evidence) is retrieve
    with pytest.raises(ExtractionError):
        QuCoGate(stats, LLMExtractor(CannedLM("Sure!")), on_error="raise").decide(question)


def test_an_unreadable_claim_reply_flags_the_sentence(stats: Any) -> None:
    from rag_gates.extract import LLMExtractor
    from tests.extract.test_llm import CannedLM

    sentence = "Ed Wood was directed by Tim Burton."
    verifier = ClaimVerifier(stats, LLMExtractor(CannedLM("I am not sure.")))
    report = verifier.verify(sentence)
    assert report.first_flagged == 0 and report.errors == 1 and verifier.errors == 1
    assert report.queries == [sentence] and report.flagged == []
    assert "no item" in str(report.sentences[0].unreadable)
    assert report.summary()["unreadable"][0]["sentence"] == sentence
    skipped = ClaimVerifier(stats, LLMExtractor(CannedLM("I am not sure.")), on_error="skip")
    assert skipped.verify(sentence).first_flagged is None
    with pytest.raises(ExtractionError):
        ClaimVerifier(stats, LLMExtractor(CannedLM("?")), on_error="raise").verify(sentence)


@pytest.mark.parametrize(("policy", "flagged"), [("retrieve", True), ("skip", False)])
def test_verifier_on_error_policies(extractor: GazetteerExtractor, policy: Any,
                                    flagged: bool) -> None:
    verifier = ClaimVerifier(FailingStats(), extractor, on_error=policy)
    report = verifier.verify("Ed Wood was directed by Tim Burton.")
    check = report.sentences[0].checks[0]
    assert check.flagged is flagged and check.error and report.errors == 1
    with pytest.raises(CorpusError):
        ClaimVerifier(FailingStats(), extractor, on_error="raise").verify("Ed Wood met Tim Burton.")


def test_hosted_backend_agrees_then_times_out_by_policy(wiki_index: Path, stats: Any,
                                                         extractor: GazetteerExtractor) -> None:
    from tests.corpus.protocol_server import ProtocolServer

    question = "Were Scott Derrickson and Ed Wood of the same nationality?"
    local = QuCoGate(stats, extractor, tau_entity=10).decide(question)
    with ProtocolServer(wiki_index, "test-index") as server, HostedInfiniGram(
            "test-index", tokenizer=wiki_index / "tokenizer.json", url=server.url,
            trust_env=False, timeout=0.6, attempt_timeout=0.25, max_retries=1,
            backoff_base=0.01) as hosted:
        remote = QuCoGate(hosted, extractor, tau_entity=10).decide(question)
        assert remote.evidence["counts"] == local.evidence["counts"]
        server.default_fault = ("sleep", 2.0)  # the API stops answering in time
        slow = QuCoGate(hosted, extractor, tau_entity=10, on_error="retrieve").decide(question)
    # Retries time out one by one ("attempt timed out"), or, on a loaded machine, the whole
    # budget runs out first (HostedTimeoutError): both are the timeout this policy handles.
    error = str(slow.evidence["error"])
    assert slow.retrieve is True
    assert "timed out" in error or error.startswith("HostedTimeoutError"), error


def test_verifier_refuses_a_lone_surrogate_naming_its_position(
        stats: Any, extractor: GazetteerExtractor) -> None:
    """Issue 32, item 9b: the surrogate made the corpus lookup fail, which the on_error
    policy turned into "nothing flagged". Text is checked where it enters, like a query."""
    import asyncio

    verifier = ClaimVerifier(stats, extractor, on_error="skip")
    bad = "Scott Derrickson was married to Tim\ud800 Burton."  # position 35
    with pytest.raises(ValueError, match=r"^text .*position 35 \(U\+D800"):
        verifier.verify(bad)
    with pytest.raises(ValueError, match=r"^text .*position 35"):
        asyncio.run(verifier.averify(bad))
    with pytest.raises(ValueError, match=r"^sentence 1 .*position 35"):
        verifier.verify_sentences(["Ed Wood was directed by Tim Burton.", bad])
    with pytest.raises(ValueError, match=r"^claim 0 tail .*position 3"):
        verifier.check_claims([Claim(head="Scott Derrickson", relation="was married to",
                                     tail="Tim\ud800")])
    assert verifier.errors == 0  # refused before any lookup
