"""The kNN source policy: labelled questions in a Qdrant collection, voting per question.

Each point is one training question: its vector is the question's key (the model's hidden
state of the last question token at a middle layer, :class:`HiddenStateKeys`; or a sentence
encoder's embedding, :class:`EmbeddingKeys`, for the SKR baseline), its payload the preferred
source from ``rag-gates srrag label`` plus the question, so the datastore can be inspected,
edited and grown in the Qdrant a user already runs. A lookup takes the ``k`` nearest
questions (cosine, k = 30 as in the paper) and gives ``p_D(retrieve) = votes / k``.

The collection records what made its keys (model id, layer, prompt digest, size) in its
metadata; opening it with another key function raises :class:`PolicyMismatchError`, so keys
of two models never mix. A datastore holding fewer than ``k`` questions answers from what is
there (``PolicyVote.found < k``, said in the gate's evidence); an empty one has no vote (the
gate then retrieves). A server that cannot be reached raises :class:`PolicyStoreError` naming
the URL. A key that is not finite (a model with a NaN weight), or a neighbour similarity out
of range, raises :class:`PolicyKeyError` rather than voting on NaN distances, and such a key is
never stored; ``k`` must be a positive int.

Local mode (``path=...`` or ``":memory:"``) is the embedded default; ``url=`` takes a server.
Qdrant's local mode admits one client per folder, so a local datastore has one writer; any
number of processes serve from it read-only (``read_only=True``, the default of
:meth:`SourcePolicy.open_existing`): each loads a private in-memory copy and releases the
folder at once. A writer that finds the folder held raises
:class:`~rag_gates.errors.StoreLockedError` naming both ways out.

Example:
    >>> keys = HiddenStateKeys(lm)                          # layer: the middle of the stack
    >>> policy = SourcePolicy.open(keys, path="~/.cache/rag-gates/srrag/policy")
    >>> policy.add_labels(labels)                           # from rag-gates srrag label
    >>> vote = policy.vote_question("Who wrote Hamlet?")
    >>> vote.p_retrieve, vote.retrieval, vote.found
    (0.7, 21, 30)
    >>> served = SourcePolicy.open_existing(lm, path="~/.cache/rag-gates/srrag/policy")
    >>> served.read_only                                   # a private copy: any process
    True
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from rag_gates._http import looks_like_server, redact_url
from rag_gates._optional import require
from rag_gates._qdrant import (
    DEFAULT_LOCK_WAIT_S,
    connect_server,
    open_local,
    read_only_copy,
    server_error,
)
from rag_gates.errors import RagGatesError
from rag_gates.gate import out_of_range
from rag_gates.srrag.labels import RETRIEVAL, Source, SourceLabel
from rag_gates.srrag.routing import RoutingPrompt, check_layer, default_layer, question_keys
from rag_gates.srrag.verbalizer import PARAMETRIC

__all__ = ["DEFAULT_COLLECTION", "DEFAULT_K", "SIMILARITY_TOLERANCE", "EmbeddingKeys",
           "HiddenStateKeys", "KeyFunction", "Neighbour", "PolicyEntry", "PolicyKeyError",
           "PolicyMismatchError", "PolicyReadOnlyError", "PolicyStoreError", "PolicyVote",
           "SourcePolicy", "check_k", "default_policy_path"]

logger = logging.getLogger(__name__)

DEFAULT_COLLECTION = "srrag-policy"
DEFAULT_K = 30
Distance = Literal["cosine", "euclid"]


def default_policy_path(keys: Literal["hidden", "embedding"] = "hidden") -> Path:
    """Where ``rag-gates srrag build-policy`` writes a local datastore by default:
    ``$RAG_GATES_HOME/srrag/policy`` (hidden-state keys) or ``.../srrag/skr-policy`` (the
    SKR baseline's sentence embeddings)."""
    from rag_gates.lm.defaults import rag_gates_home

    return rag_gates_home() / "srrag" / ("policy" if keys == "hidden" else "skr-policy")


class PolicyMismatchError(RagGatesError, ValueError):
    """The datastore was built with another key function (model, layer, prompt, encoder)."""


class PolicyStoreError(RagGatesError, ConnectionError):
    """The Qdrant holding the datastore cannot be reached or refused the request."""


class PolicyReadOnlyError(RagGatesError, PermissionError):
    """A write to a datastore opened read-only (a private copy: the write would be lost)."""


class PolicyKeyError(RagGatesError, ValueError):
    """A key the datastore cannot vote on or store (not finite, wrong size), or a vote whose
    similarities are not finite or out of range: no vote can be read from it."""


#: Cosine similarities are in [-1, 1]; float32 dot products of unit vectors overshoot by
#: rounding, so the check allows this much either side.
SIMILARITY_TOLERANCE = 1e-3


def check_k(k: object) -> int:
    """``k`` if it is a positive int (the neighbours that vote), else a ValueError."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an int >= 1 (the neighbours that vote), got {k!r}")
    return k


def _check_key(vector: Sequence[float], dim: int, what: str) -> None:
    if len(vector) != dim:
        raise PolicyKeyError(f"{what} has {len(vector)} dimensions; this datastore takes {dim}")
    bad = sum(1 for x in vector if out_of_range(x) is not None)
    if bad:
        raise PolicyKeyError(
            f"{what} is not finite ({bad} NaN/inf of {dim} values): the model's hidden state "
            "is broken (a NaN or inf weight or input), so no neighbour can be found for it")
    if not any(vector):
        # Cosine similarity with a zero vector is 0 for every stored key: the "nearest"
        # neighbours would be whichever the store lists first, a vote on nothing.
        raise PolicyKeyError(
            f"{what} is all zeros: it has no direction, so no neighbour is nearer than another "
            "(the model's hidden state is broken)")


class KeyFunction(Protocol):
    """Turns questions into datastore keys, and says what it is (the datastore identity)."""

    @property
    def identity(self) -> dict[str, JsonValue]: ...

    @property
    def dim(self) -> int: ...

    def keys(self, questions: Sequence[str]) -> Any: ...


class HiddenStateKeys:
    """SR-RAG's key: the model's hidden state of the last question token of the routing
    prompt at ``layer`` (default: the middle of the stack)."""

    def __init__(self, lm: Any, layer: int | None = None, prompt: RoutingPrompt | None = None,
                 *, batch_size: int = 16) -> None:
        from rag_gates.lm.base import require_white_box

        self.lm: Any = require_white_box(lm, "SR-RAG policy keys")
        self.layer = check_layer(self.lm, default_layer(self.lm) if layer is None else layer)
        self.prompt = prompt or RoutingPrompt()
        self.batch_size = batch_size

    @property
    def identity(self) -> dict[str, JsonValue]:
        return {"key": "hidden-state/last-question-token", "model_id": self.lm.model_id,
                "layer": self.layer, "num_layers": int(self.lm.num_layers),
                "prompt": self.prompt.sha, "dim": self.dim}

    @property
    def dim(self) -> int:
        return int(self.lm.hidden_size)

    def keys(self, questions: Sequence[str]) -> Any:
        return question_keys(self.lm, questions, self.prompt, self.layer,
                             batch_size=self.batch_size)


class EmbeddingKeys:
    """A sentence encoder's question embedding (the SKR baseline's key; default the
    embedded all-MiniLM-L6-v2)."""

    def __init__(self, embedder: Any | None = None, name: str | None = None) -> None:
        # The name is the datastore's identity: name a custom encoder explicitly.
        self.name = name or ("all-MiniLM-L6-v2" if embedder is None else type(embedder).__name__)
        if embedder is None:
            from rag_gates.lm.defaults import load_default_embedder

            embedder = load_default_embedder()
        self.embedder = embedder
        # sentence-transformers >= 6 renamed the method; older versions have only the first.
        measure = getattr(embedder, "get_embedding_dimension", None) or \
            embedder.get_sentence_embedding_dimension
        size = measure()
        self._dim = int(size) if size else len(embedder.encode(["dimension probe"])[0])

    @property
    def identity(self) -> dict[str, JsonValue]:
        return {"key": "sentence-embedding", "model_id": self.name, "dim": self.dim}

    @property
    def dim(self) -> int:
        return self._dim

    def keys(self, questions: Sequence[str]) -> Any:
        return self.embedder.encode(list(questions), normalize_embeddings=True,
                                    show_progress_bar=False)


class PolicyEntry(BaseModel):
    """One labelled question in the datastore."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    dataset: str = ""
    question: str
    source: Source


class Neighbour(BaseModel):
    """A labelled question that voted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    dataset: str
    question: str
    source: Source
    similarity: float


class PolicyVote(BaseModel):
    """The k nearest labelled questions and what they vote for."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    k: int = Field(..., description="Neighbours asked for.")
    found: int = Field(..., description="Neighbours found (< k in a tiny datastore).")
    retrieval: int = Field(..., description="Neighbours labelled 'retrieval'.")
    parametric: int = Field(..., description="Neighbours labelled 'parametric'.")
    neighbours: list[Neighbour] = Field(default_factory=list)

    @property
    def p_retrieve(self) -> float | None:
        """``votes / k`` (over the neighbours found when fewer than k); None when empty."""
        return self.retrieval / self.found if self.found else None


def _point_id(dataset: str, question_id: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"rag-gates/srrag/{dataset}/{question_id}"))


class SourcePolicy:
    """The kNN datastore of labelled questions (see the module docstring).

    Build with :meth:`open`; add with :meth:`add_labels` / :meth:`add`, remove with
    :meth:`delete`, vote with :meth:`vote` (a key) or :meth:`vote_question` (a question).
    Serve with :meth:`open_existing` (read-only: a private copy, any number of processes).
    """

    def __init__(self, client: Any, collection: str, keys: KeyFunction, *, k: int = DEFAULT_K,
                 location: str = ":memory:", distance: Distance = "cosine",
                 cache: bool | None = None, read_only: bool = False) -> None:
        self.client = client
        self.collection = collection
        self.key_function = keys
        self.k = check_k(k)
        self.location = location
        self.distance = distance
        self.tau: float | None = None
        """The threshold calibrated for ``p_M * p_D`` on this policy's labels (set by
        :func:`~rag_gates.srrag.shipped.load_default_policy` from the labels' header): what
        a :class:`~rag_gates.srrag.gate.SelfRoutingGate` over it uses unless given a tau.
        None: not calibrated."""
        if cache is None:  # local mode admits one client, so a copy of it cannot go stale
            options = getattr(client, "init_options", None) or {}
            cache = options.get("url") is None and (
                options.get("path") is not None or options.get("location") == ":memory:")
        self.cache = bool(cache)
        """Search an in-process copy of the keys (one matrix product, as the paper's GPU
        index) instead of asking Qdrant: the default in local mode, whose own search
        re-normalises every stored vector per query; refreshed after this instance's edits,
        or by :meth:`refresh` after another client's."""
        self._matrix: tuple[Any, list[dict[str, Any]]] | None = None
        self.read_only = read_only
        """Writes are refused (:class:`PolicyReadOnlyError`): the instance serves a private
        copy of a local datastore, or was opened for queries only."""

    # ------------------------------------------------------------------ opening
    @classmethod
    def connect(cls, path: str | Path | None = None, url: str | None = None, *,
                api_key: str | None = None, timeout: int = 10, read_only: bool = False,
                collection: str = DEFAULT_COLLECTION,
                lock_wait_s: float = DEFAULT_LOCK_WAIT_S) -> Any:
        """A Qdrant client: a server ``url``, else local ``path`` (``None``/``":memory:"``:
        in memory). A server is asked for its collections once, so an unreachable URL fails
        here with :class:`PolicyStoreError` naming it.

        With ``read_only`` a local ``path`` gives a private in-memory copy of ``collection``
        (nothing is created; the folder is held only while it is read, and a writer holding
        it is waited for up to ``lock_wait_s`` seconds). Without it the client is the
        folder's one writer: a folder another process holds raises
        :class:`~rag_gates.errors.StoreLockedError`.
        """
        return cls._connect(path, url, api_key=api_key, timeout=timeout, read_only=read_only,
                            collection=collection, lock_wait_s=lock_wait_s)[0]

    @staticmethod
    def _connect(path: str | Path | None, url: str | None, *, api_key: str | None = None,
                 timeout: int = 10, read_only: bool = False,
                 collection: str = DEFAULT_COLLECTION,
                 lock_wait_s: float = DEFAULT_LOCK_WAIT_S) -> tuple[Any, list[Any] | None]:
        """:meth:`connect`, and the points of a read-only copy (None otherwise)."""
        qdrant_client = require("qdrant_client", "qdrant")
        if url is not None:
            return connect_server(url, api_key=api_key, timeout=timeout, what="url",
                                  error=PolicyStoreError,
                                  hint="start it, check the URL and API key, or pass path= "
                                       "for a local datastore"), None
        if path is None or str(path) == ":memory:":
            return qdrant_client.QdrantClient(location=":memory:"), None
        if looks_like_server(str(path)):
            # Not a folder to create (path is the first argument, where a URL is easily
            # put): a store silently local, named after the URL and any key in it.
            raise ValueError(f"path={redact_url(str(path))!r} is a server address, not a "
                             "local folder: pass it as url= (and the key as api_key=)")
        directory = Path(path).expanduser()
        if read_only:
            return read_only_copy(directory, collection, wait_s=lock_wait_s,
                                  what="SR-RAG datastore")
        directory.mkdir(parents=True, exist_ok=True)
        return open_local(directory, read_only_hint=(
            "SourcePolicy.open_existing(lm, path=...) or SourcePolicy.open(keys, path=..., "
            "read_only=True)")), None

    @classmethod
    def open(cls, keys: KeyFunction, *, path: str | Path | None = None, url: str | None = None,
             collection: str = DEFAULT_COLLECTION, k: int = DEFAULT_K,
             distance: Distance = "cosine", create: bool = True, client: Any = None,
             api_key: str | None = None, read_only: bool = False,
             lock_wait_s: float = DEFAULT_LOCK_WAIT_S) -> SourcePolicy:
        """Open (or, with ``create``, make) the datastore collection for ``keys``.

        A collection made by another key function (another model, layer, routing prompt or
        encoder) raises :class:`PolicyMismatchError`; a collection that is not an SR-RAG
        datastore raises it too. ``client``: an existing Qdrant client (path/url ignored).
        ``read_only``: serve a private copy of a local datastore (see :meth:`connect`;
        nothing is created, writes raise :class:`PolicyReadOnlyError`).
        """
        location = redact_url(url) if url else str(path or ":memory:")
        if client is not None:
            return cls._open(client, keys, collection, location, k, distance,
                             create and not read_only, read_only=read_only)
        own, points = cls._connect(path, url, api_key=api_key, read_only=read_only,
                                   collection=collection, lock_wait_s=lock_wait_s)
        try:
            policy = cls._open(own, keys, collection, location, k, distance,
                               create and not read_only, read_only=read_only)
        except BaseException:
            own.close()  # a local path stays locked while a client holds it
            raise
        policy._prime(points)
        return policy

    @classmethod
    def open_existing(cls, lm: Any, *, path: str | Path | None = None, url: str | None = None,
                      collection: str = DEFAULT_COLLECTION, k: int = DEFAULT_K,
                      prompt: RoutingPrompt | None = None, client: Any = None,
                      api_key: str | None = None, read_only: bool = True,
                      lock_wait_s: float = DEFAULT_LOCK_WAIT_S) -> SourcePolicy:
        """Open a built hidden-state datastore for ``lm`` at the layer it was built with
        (read from its metadata); a missing one raises FileNotFoundError naming the build
        command, one of another model :class:`PolicyMismatchError`.

        Read-only by default (for serving): a local ``path`` is loaded into a private
        in-memory copy and released at once, so every worker process of an app opens the
        same folder; writes raise :class:`PolicyReadOnlyError`. ``read_only=False`` makes
        this process the folder's one writer.

        Example:
            >>> policy = SourcePolicy.open_existing(lm, path="~/.cache/rag-gates/srrag/policy")
            >>> gate = SelfRoutingGate(lm, policy)       # in each of several worker processes
        """
        location = redact_url(url) if url else str(path or ":memory:")
        own = client is None
        points = None
        if client is None:
            client, points = cls._connect(path, url, api_key=api_key, read_only=read_only,
                                          collection=collection, lock_wait_s=lock_wait_s)
        try:
            layer = None
            if cls._call_at(location, collection, lambda: client.collection_exists(collection),
                            client):
                stored = cls._call_at(location, collection, lambda: client.get_collection(
                    collection).config.metadata) or {}
                layer = stored.get("layer") if isinstance(stored.get("layer"), int) else None
            policy = cls._open(client, HiddenStateKeys(lm, layer, prompt), collection,
                               location, k, "cosine", create=False, read_only=read_only)
        except BaseException:
            if own:
                client.close()
            raise
        policy._prime(points)
        return policy

    @staticmethod
    def _call_at(location: str, collection: str, call: Any, client: Any = None) -> Any:
        try:
            return call()
        except Exception as exc:  # the client raises transport-specific types
            raise PolicyStoreError(f"Qdrant at {location} failed on collection {collection!r} "
                                   f"({server_error(exc, client)})") from None

    @classmethod
    def _open(cls, client: Any, keys: KeyFunction, collection: str, location: str, k: int,
              distance: Distance, create: bool, *, read_only: bool = False) -> SourcePolicy:
        models = require("qdrant_client.models", "qdrant")
        identity = {"kind": "srrag-policy", **keys.identity, "distance": distance}

        def call(fn: Any) -> Any:
            return cls._call_at(location, collection, fn, client)

        if call(lambda: client.collection_exists(collection)):
            stored = call(lambda: client.get_collection(collection).config.metadata) or {}
        elif create:
            call(lambda: client.create_collection(
                collection, metadata=identity,
                vectors_config=models.VectorParams(
                    size=keys.dim, distance=models.Distance.COSINE if distance == "cosine"
                    else models.Distance.EUCLID)))
            stored = identity
        else:
            raise FileNotFoundError(
                f"no SR-RAG datastore {collection!r} at {location}; build one with: "
                "rag-gates srrag build-policy --labels LABELS.jsonl")
        if stored.get("kind") != "srrag-policy":
            raise PolicyMismatchError(
                f"collection {collection!r} at {location} is not an SR-RAG datastore (its "
                "metadata has no srrag-policy identity); choose another collection name")
        diff = {key: (stored.get(key), value) for key, value in identity.items()
                if stored.get(key) != value}
        if diff:
            said = "; ".join(f"{key}: datastore {was!r}, now {now!r}"
                             for key, (was, now) in diff.items())
            raise PolicyMismatchError(
                f"the datastore {collection!r} at {location} was built with other keys "
                f"({said}); rebuild it for this model and layer (rag-gates srrag build-policy "
                "--replace ...) or open another collection")
        return cls(client, collection, keys, k=k, location=location, distance=distance,
                   read_only=read_only)

    def _prime(self, points: list[Any] | None) -> None:
        """Index the points a read-only copy was made from (they need not be read again)."""
        if points is not None and self.cache:
            self._matrix = self._index([p.vector for p in points], [p.payload for p in points])

    @property
    def identity(self) -> dict[str, JsonValue]:
        """What made the keys (stored in the collection's metadata)."""
        return dict(self.key_function.identity)

    # ------------------------------------------------------------------ editing
    def add(self, entries: Sequence[PolicyEntry], keys: Any) -> int:
        """Insert (or replace, by dataset and id) labelled questions with their keys; a key
        of the wrong size or not finite raises :class:`PolicyKeyError` and nothing is
        stored."""
        self._check_writable("add to")
        models = require("qdrant_client.models", "qdrant")
        vectors = [list(map(float, row)) for row in keys]
        if len(vectors) != len(entries):
            raise ValueError(f"{len(entries)} entries but {len(vectors)} keys")
        for i, vector in enumerate(vectors):
            _check_key(vector, self.key_function.dim, f"key {i} ({entries[i].id!r})")
        self._matrix = None
        for lo in range(0, len(entries), 256):
            self._call("add to", lambda lo=lo: self.client.upsert(self.collection, points=[
                models.PointStruct(id=_point_id(e.dataset, e.id), vector=v,
                                   payload=e.model_dump(mode="json"))
                for e, v in zip(entries[lo: lo + 256], vectors[lo: lo + 256], strict=True)]))
        return len(entries)

    def add_questions(self, entries: Sequence[PolicyEntry]) -> int:
        """Insert labelled questions, computing their keys with the key function."""
        self._check_writable("add to")
        if not entries:
            return 0
        return self.add(entries, self.key_function.keys([e.question for e in entries]))

    def add_labels(self, labels: Iterable[SourceLabel]) -> int:
        """Insert the output of ``rag-gates srrag label`` (each question's ``source``)."""
        return self.add_questions([PolicyEntry(id=lb.id, dataset=lb.dataset,
                                               question=lb.question, source=lb.source)
                                   for lb in labels])

    def delete(self, ids: Sequence[str | tuple[str, str]]) -> None:
        """Remove questions by ``(dataset, id)`` (or ``id`` alone for dataset ``""``)."""
        self._check_writable("delete from")
        models = require("qdrant_client.models", "qdrant")
        points = [_point_id(*(i if isinstance(i, tuple) else ("", i))) for i in ids]
        self._matrix = None
        if points:
            self._call("delete from", lambda: self.client.delete(
                self.collection, points_selector=models.PointIdsList(points=points)))

    def _check_writable(self, what: str) -> None:
        if self.read_only:
            raise PolicyReadOnlyError(
                f"cannot {what} the SR-RAG datastore {self.collection!r} at {self.location}: "
                "it was opened read-only (a private copy, so the write would be lost). Write "
                "from the one process that opens it with read_only=False (rag-gates srrag "
                "build-policy does), or serve it from a Qdrant server (url=) to write from "
                "several processes")

    def __len__(self) -> int:
        result = self._call("count", lambda: self.client.count(self.collection, exact=True))
        return int(result.count)

    def entries(self, limit: int = 10_000) -> list[PolicyEntry]:
        """The labelled questions stored (for audit), up to ``limit``."""
        points, _ = self._call("read", lambda: self.client.scroll(
            self.collection, limit=limit, with_payload=True, with_vectors=False))
        return [PolicyEntry.model_validate(p.payload) for p in points]

    # ------------------------------------------------------------------ voting
    def vote(self, key: Any, k: int | None = None) -> PolicyVote:
        """The ``k`` nearest labelled questions to ``key`` and their votes.

        A key that is not finite or of the wrong size, or a neighbour whose similarity is
        not finite or out of range (a datastore holding broken keys), raises
        :class:`PolicyKeyError`: no vote is read from NaN distances (the gate then retrieves).

        Example:
            >>> policy.vote(policy.key_function.keys(["Who wrote Hamlet?"])[0], k=5).found
            5
        """
        k = self.k if k is None else check_k(k)
        vector = [float(x) for x in key]
        _check_key(vector, self.key_function.dim, "the key")
        if self.cache and self.distance == "cosine":
            hits = self._cached_search(vector, k)
        else:
            hits = [(h.payload, float(h.score)) for h in self._call(
                "search", lambda: self.client.query_points(
                    self.collection, query=vector, limit=k, with_payload=True).points)]
        neighbours = [Neighbour(id=payload["id"], dataset=payload.get("dataset", ""),
                                question=payload["question"], source=payload["source"],
                                similarity=score) for payload, score in hits]
        low, high = (-1.0, 1.0) if self.distance == "cosine" else (0.0, float("inf"))
        for n in neighbours:
            problem = out_of_range(n.similarity, low, high, tolerance=SIMILARITY_TOLERANCE)
            if problem is not None:
                raise PolicyKeyError(
                    f"the {self.distance} score of neighbour {n.id!r} in {self.collection!r} "
                    f"at {self.location}: {problem}; the datastore holds a broken key: rebuild "
                    "it (rag-gates srrag build-policy --replace ...)")
        retrieval = sum(1 for n in neighbours if n.source == RETRIEVAL)
        return PolicyVote(k=k, found=len(neighbours), retrieval=retrieval,
                          parametric=sum(1 for n in neighbours if n.source == PARAMETRIC),
                          neighbours=neighbours)

    def vote_question(self, question: str, k: int | None = None) -> PolicyVote:
        """:meth:`vote` with the key function's key for ``question``."""
        return self.vote(self.key_function.keys([question])[0], k)

    def refresh(self) -> None:
        """Drop the in-process copy of the keys; the next vote reads the collection again.
        A read-only copy of a local datastore does not see later writes: open it again."""
        self._matrix = None

    def _cached_search(self, vector: list[float], k: int) -> list[tuple[dict[str, Any], float]]:
        np = require("numpy", "qdrant")
        if self._matrix is None:
            rows: list[Any] = []
            payloads: list[dict[str, Any]] = []
            offset = None
            while True:
                points, offset = self._call("read", lambda o=offset: self.client.scroll(
                    self.collection, limit=1024, offset=o, with_payload=True,
                    with_vectors=True))
                rows.extend(p.vector for p in points)
                payloads.extend(p.payload for p in points)
                if offset is None:
                    break
            self._matrix = self._index(rows, payloads)
        matrix, payloads = self._matrix
        if not payloads:
            return []
        query = np.asarray(vector, dtype=np.float32)
        query /= max(float(np.linalg.norm(query)), 1e-12)
        scores = matrix @ query
        top = np.argpartition(-scores, min(k, len(scores)) - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(payloads[i], float(scores[i])) for i in top]

    def _index(self, rows: list[Any], payloads: list[dict[str, Any]]
               ) -> tuple[Any, list[dict[str, Any]]]:
        """The unit-normalised key matrix the in-process search multiplies with."""
        np = require("numpy", "qdrant")
        matrix = np.asarray(rows, dtype=np.float32).reshape(len(rows), self.key_function.dim)
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        return matrix / np.where(norms > 0, norms, 1.0), payloads

    def close(self) -> None:
        self.client.close()

    def _call(self, what: str, call: Any) -> Any:
        try:
            return call()
        except Exception as exc:  # the client raises transport-specific types
            raise PolicyStoreError(
                f"could not {what} the SR-RAG datastore {self.collection!r} at "
                f"{self.location} ({server_error(exc, self.client)})") from None
