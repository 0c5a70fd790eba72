"""The kNN source policy in Qdrant (local path and ':memory:'), keys from a tiny model."""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest

from rag_gates.srrag.policy import (
    HiddenStateKeys,
    PolicyEntry,
    PolicyMismatchError,
    PolicyStoreError,
    SourcePolicy,
)
from rag_gates.testing import tiny_lm

ENTRIES = [
    PolicyEntry(id="1", dataset="popqa", question="Who wrote Hamlet?", source="parametric"),
    PolicyEntry(id="2", dataset="popqa", question="What is the capital of France?",
                source="retrieval"),
    PolicyEntry(id="3", dataset="popqa", question="Where does the quick brown fox jump?",
                source="retrieval"),
    PolicyEntry(id="4", dataset="pubmedqa", question="Do scientists measure recall?",
                source="parametric"),
]


def test_round_trip_on_a_local_path(tiny: Any, tmp_path: Path) -> None:
    keys = HiddenStateKeys(tiny, layer=2)
    policy = SourcePolicy.open(keys, path=tmp_path / "policy", k=3)
    assert policy.add_questions(ENTRIES) == 4 and len(policy) == 4
    before = policy.vote_question("Who wrote Hamlet?")
    top = before.neighbours[0]
    assert (top.id, top.source) == ("1", "parametric") and top.similarity == pytest.approx(1.0)
    assert before.found == 3 and before.p_retrieve == before.retrieval / 3
    policy.close()
    again = SourcePolicy.open(keys, path=tmp_path / "policy", k=3)
    assert len(again) == 4
    after = again.vote_question("Who wrote Hamlet?")
    assert [(n.id, n.source) for n in after.neighbours] == \
        [(n.id, n.source) for n in before.neighbours]
    assert [n.similarity for n in after.neighbours] == \
        pytest.approx([n.similarity for n in before.neighbours], abs=1e-5)
    assert sorted(e.id for e in again.entries()) == ["1", "2", "3", "4"]
    # Re-adding a question replaces it (keyed by dataset and id), deleting removes it.
    again.add_questions([ENTRIES[0].model_copy(update={"source": "retrieval"})])
    assert len(again) == 4
    assert again.vote_question("Who wrote Hamlet?").neighbours[0].source == "retrieval"
    again.delete([("popqa", "1")])
    assert len(again) == 3 and "1" not in {n.id for n in again.vote_question("Hamlet?").neighbours}
    again.close()


def test_another_model_or_layer_is_refused(tiny: Any, tmp_path: Path) -> None:
    policy = SourcePolicy.open(HiddenStateKeys(tiny, layer=2), path=tmp_path / "p")
    policy.add_questions(ENTRIES[:2])
    client = policy.client
    with pytest.raises(PolicyMismatchError, match="layer: datastore 2, now 3"):
        SourcePolicy.open(HiddenStateKeys(tiny, layer=3), client=client)
    other = tiny_lm(seed=1)
    with pytest.raises(PolicyMismatchError, match="model_id: datastore 'tiny-llama-seed0', "
                                                  "now 'tiny-llama-seed1'"):
        SourcePolicy.open(HiddenStateKeys(other, layer=2), client=client)
    from qdrant_client import models

    client.create_collection("passages", vectors_config=models.VectorParams(
        size=64, distance=models.Distance.COSINE))
    with pytest.raises(PolicyMismatchError, match="not an SR-RAG datastore"):
        SourcePolicy.open(HiddenStateKeys(tiny, layer=2), client=client, collection="passages")
    with pytest.raises(FileNotFoundError, match="build-policy"):
        SourcePolicy.open(HiddenStateKeys(tiny, layer=2), client=client, collection="none",
                          create=False)
    policy.close()


def test_tiny_and_empty_datastores(tiny: Any) -> None:
    policy = SourcePolicy.open(HiddenStateKeys(tiny, layer=2), path=":memory:")  # k = 30
    empty = policy.vote_question("Who wrote Hamlet?")
    assert (empty.found, empty.p_retrieve) == (0, None)
    policy.add_questions(ENTRIES)
    vote = policy.vote_question("Who wrote Hamlet?")
    assert (vote.k, vote.found, vote.retrieval, vote.parametric) == (30, 4, 2, 2)
    assert vote.p_retrieve == 0.5  # from the 4 that are there, not 2/30
    with pytest.raises(ValueError, match="64"):
        policy.add(ENTRIES[:1], [[0.0] * 5])
    policy.close()


def test_unreachable_server_names_the_url(tiny: Any) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(PolicyStoreError, match=f"cannot reach the Qdrant server at {url}"):
        SourcePolicy.open(HiddenStateKeys(tiny, layer=2), url=url)


def test_in_process_search_agrees_with_qdrant(tiny: Any) -> None:
    keys = HiddenStateKeys(tiny, layer=2)
    cached = SourcePolicy.open(keys, path=":memory:", k=3)
    assert cached.cache  # local mode: searched in process
    cached.add_questions(ENTRIES)
    plain = SourcePolicy(cached.client, cached.collection, keys, k=3, cache=False)
    for q in ["Who wrote Hamlet?", "Is Paris in France?", "Do scientists use recall?"]:
        a, b = cached.vote_question(q), plain.vote_question(q)
        assert [(n.id, n.source) for n in a.neighbours] == \
            [(n.id, n.source) for n in b.neighbours]
        assert [n.similarity for n in a.neighbours] == \
            pytest.approx([n.similarity for n in b.neighbours], abs=1e-5)
    # Another client's edit is seen after refresh(); this instance's own edits at once.
    plain.delete([("popqa", "1")])
    assert cached.vote_question("Who wrote Hamlet?").neighbours[0].id == "1"  # stale copy
    cached.refresh()
    assert "1" not in {n.id for n in cached.vote_question("Who wrote Hamlet?").neighbours}
    cached.close()


def test_non_finite_keys_and_bad_k_are_refused(tiny: Any) -> None:
    """Issue 32, item 2: an all-NaN key voted with five neighbours of NaN similarity and
    p = 0.4; k=-2 returned len - 2 neighbours. Both are refused with what to do."""
    from rag_gates.srrag.policy import PolicyKeyError

    policy = SourcePolicy.open(HiddenStateKeys(tiny, layer=2), path=":memory:", k=5)
    policy.add_questions(ENTRIES)
    nan_key = [float("nan")] * 64
    for cached in (True, False):  # the in-process search and Qdrant's own
        policy.cache = cached
        with pytest.raises(PolicyKeyError, match=r"key .*not finite \(64 NaN/inf"):
            policy.vote(nan_key)
        half = [1.0] * 63 + [float("inf")]
        with pytest.raises(PolicyKeyError, match="not finite"):
            policy.vote(half)
        # A zero key is as near to every stored key: its vote was the store's first k
        # (p 0.33 from the cache, 0.67 from Qdrant; audit s15 #5).
        with pytest.raises(PolicyKeyError, match="all zeros"):
            policy.vote([0.0] * 64)
    for k in (-2, 0, 1.5, True, "3"):
        with pytest.raises(ValueError, match=r"k must be an int >= 1"):
            policy.vote_question("Who wrote Hamlet?", k=k)  # type: ignore[arg-type]
    assert policy.vote_question("Who wrote Hamlet?", k=2).found == 2
    # A non-finite key never enters the datastore (it would poison every later vote).
    with pytest.raises(PolicyKeyError, match=r"key 0 .*not finite"):
        policy.add([PolicyEntry(id="9", question="Poisoned?", source="parametric")],
                   [nan_key])
    with pytest.raises(PolicyKeyError, match=r"key 0 .*all zeros"):
        policy.add([PolicyEntry(id="9", question="Empty?", source="parametric")], [[0.0] * 64])
    assert len(policy) == 4
    policy.close()


# ------------------------------------------------------------ one folder, several clients
def _built(tiny: Any, where: Path) -> list[Any]:
    """A closed datastore at ``where``, and the votes its writer gave."""
    writer = SourcePolicy.open(HiddenStateKeys(tiny, layer=2), path=where, k=3)
    writer.add_questions(ENTRIES)
    votes = [writer.vote_question(q) for q in QUESTIONS]
    writer.close()
    return votes


QUESTIONS = ["Who wrote Hamlet?", "Is Paris in France?", "Do scientists use recall?"]


def test_read_only_copies_share_the_folder_and_release_it(tiny: Any, tmp_path: Path) -> None:
    from rag_gates._qdrant import READERS_LOCK

    where = tmp_path / "policy"
    votes = _built(tiny, where)
    # Two read-only copies at once (qdrant-client alone refuses the second client), each
    # checked against the stored identity: the layer comes from the metadata.
    first = SourcePolicy.open_existing(tiny, path=where, k=3)
    second = SourcePolicy.open(HiddenStateKeys(tiny, layer=2), path=where, k=3,
                               read_only=True)
    for policy in (first, second):
        assert policy.read_only and policy.key_function.layer == 2 and len(policy) == 4
        for q, vote in zip(QUESTIONS, votes, strict=True):
            got = policy.vote_question(q)
            assert [(n.id, n.source) for n in got.neighbours] == \
                [(n.id, n.source) for n in vote.neighbours]
            assert [n.similarity for n in got.neighbours] == \
                pytest.approx([n.similarity for n in vote.neighbours], abs=1e-5)
    # The folder was released at once: its one writer opens it while both copies serve.
    writer = SourcePolicy.open(HiddenStateKeys(tiny, layer=2), path=where, k=3)
    writer.delete([("popqa", "1")])
    assert len(writer) == 3 and len(first) == 4  # a copy does not see later writes
    writer.close()
    assert sorted(p.name for p in where.iterdir() if p.name.startswith(".")) == \
        [".lock", READERS_LOCK]
    with pytest.raises(PolicyMismatchError, match="layer: datastore 2, now 3"):
        SourcePolicy.open(HiddenStateKeys(tiny, layer=3), path=where, read_only=True)
    first.close()
    second.close()


def test_a_read_only_copy_refuses_writes(tiny: Any, tmp_path: Path) -> None:
    from rag_gates.srrag.policy import PolicyReadOnlyError

    _built(tiny, tmp_path / "policy")
    policy = SourcePolicy.open_existing(tiny, path=tmp_path / "policy")
    for write in (lambda: policy.add_questions(ENTRIES[:1]),
                  lambda: policy.add(ENTRIES[:1], [[0.0] * 64]),
                  lambda: policy.delete(["1"])):
        with pytest.raises(PolicyReadOnlyError, match=r"opened read-only .* read_only=False"):
            write()
    assert len(policy) == 4


def test_a_second_writer_gets_a_typed_error_naming_both_ways_out(tiny: Any,
                                                                  tmp_path: Path) -> None:
    from rag_gates.errors import FileInUseError, StoreLockedError

    where = tmp_path / "policy"
    _built(tiny, where)
    writer = SourcePolicy.open(HiddenStateKeys(tiny, layer=2), path=where)
    with pytest.raises(StoreLockedError, match=r"is open in another process.*read-only "
                       r"\(SourcePolicy.open_existing.*url=http://HOST:6333") as caught:
        SourcePolicy.open(HiddenStateKeys(tiny, layer=2), path=where)
    assert isinstance(caught.value, FileInUseError)
    # A reader waits for the writer, then says why it gave up.
    with pytest.raises(StoreLockedError, match=r"a writer.*close the writer's client"):
        SourcePolicy.open_existing(tiny, path=where, lock_wait_s=0.2)
    writer.close()
    assert len(SourcePolicy.open_existing(tiny, path=where, lock_wait_s=0.2)) == 4


def test_a_missing_datastore_is_not_created_by_a_reader(tiny: Any, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="build-policy"):
        SourcePolicy.open_existing(tiny, path=tmp_path / "none")
    assert not (tmp_path / "none").exists()
