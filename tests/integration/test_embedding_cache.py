"""examples/embedding_cache.py: each framework's embedding cache gives the vectors the embedded
MiniLM gives, and a later run reads them back instead of computing them."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from rag_gates.lm import default_embedder_path
from tests.integration.snippets import my_documents

pytestmark = pytest.mark.integration
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _embedding_cache() -> ModuleType:
    spec = importlib.util.spec_from_file_location("example_embedding_cache",
                                                  EXAMPLES / "embedding_cache.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def docs() -> list[dict[str, str]]:
    return my_documents()[:6]


def test_llama_index_nodes_are_what_from_documents_stores_and_a_second_run_embeds_nothing(
        tmp_path: Path, docs: list[dict[str, str]]) -> None:
    from llama_index.core import Document, VectorStoreIndex
    from llama_index.core.instrumentation import get_dispatcher
    from llama_index.core.instrumentation.event_handlers import BaseEventHandler
    from llama_index.core.instrumentation.events.embedding import EmbeddingStartEvent
    from llama_index.embeddings.huggingface import HuggingFaceEmbedding

    class Count(BaseEventHandler):
        calls: int = 0

        def handle(self, event: Any, **kwargs: Any) -> None:
            if isinstance(event, EmbeddingStartEvent):
                self.calls += 1

    def documents() -> list[Document]:  # new objects (and ids) each time, as in a new run
        return [Document(text=d["text"], metadata={"title": d["title"], "doc_id": d["id"]})
                for d in docs]

    embed_model = HuggingFaceEmbedding(model_name=str(default_embedder_path()), device="cpu")
    cache = _embedding_cache()
    counter = Count()
    dispatcher = get_dispatcher()
    dispatcher.add_event_handler(counter)
    try:
        first = cache.embedded_nodes(documents(), embed_model, cache_dir=tmp_path)
        embedded = counter.calls
        second = cache.embedded_nodes(documents(), embed_model, cache_dir=tmp_path)
        assert embedded > 0 and counter.calls == embedded  # the second run embedded nothing
        VectorStoreIndex(second, embed_model=embed_model)  # stores the vectors as they are
        assert counter.calls == embedded
        # Other settings are another key: unnormalised vectors are computed, not read back.
        other = HuggingFaceEmbedding(model_name=str(default_embedder_path()), device="cpu",
                                     normalize=False)
        unnormalised = cache.embedded_nodes(documents(), other, cache_dir=tmp_path)
        assert counter.calls > embedded
        assert [n.embedding for n in unnormalised] != [n.embedding for n in first]
    finally:
        dispatcher.event_handlers.remove(counter)
    assert [n.get_content() for n in second] == [n.get_content() for n in first]
    assert [n.embedding for n in second] == [n.embedding for n in first]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ingestion_cache.json"]  # no temp

    # What VectorStoreIndex.from_documents stores for the same documents: texts and vectors.
    index = VectorStoreIndex.from_documents(documents(), embed_model=embed_model)
    stored = index.vector_store.to_dict()["embedding_dict"]
    reference = sorted((index.docstore.get_node(i).get_content(), v) for i, v in stored.items())
    ours = sorted((n.get_content(), n.embedding) for n in first)
    assert [t for t, _ in ours] == [t for t, _ in reference]
    np.testing.assert_allclose([v for _, v in ours], [v for _, v in reference], atol=1e-5)


def test_langchain_cached_embeddings_store_each_text_and_read_it_back(
        tmp_path: Path, docs: list[dict[str, str]]) -> None:
    from langchain_huggingface import HuggingFaceEmbeddings

    def embeddings(normalize: bool) -> HuggingFaceEmbeddings:
        return HuggingFaceEmbeddings(model_name=str(default_embedder_path()),
                                     model_kwargs={"device": "cpu"},
                                     encode_kwargs={"normalize_embeddings": normalize})

    cache = _embedding_cache()
    texts = [d["text"] for d in docs]
    base = embeddings(normalize=True)
    cached = cache.cached_embeddings(base, cache_dir=tmp_path)
    np.testing.assert_allclose(cached.embed_documents(texts), base.embed_documents(texts),
                               atol=1e-5)
    assert len([p for p in tmp_path.rglob("*") if p.is_file()]) == len(texts)
    assert cached.embed_query(texts[0]) == base.embed_query(texts[0])  # queries: not cached

    # A later run reads the store, not the model: a vector planted for a text comes back.
    planted = [0.5] * len(cached.embed_documents(texts[:1])[0])
    cached.document_embedding_store.mset([(texts[0], planted)])
    again = cache.cached_embeddings(embeddings(normalize=True), cache_dir=tmp_path)
    assert again.embed_documents(texts[:2])[0] == planted
    assert again.embed_query(texts[0]) != planted  # a question is embedded, never read back
    assert len([p for p in tmp_path.rglob("*") if p.is_file()]) == len(texts)  # no partial
    # Other settings are another namespace: unnormalised vectors are not the planted one.
    other = cache.cached_embeddings(embeddings(normalize=False), cache_dir=tmp_path)
    unnormalised = other.embed_documents(texts[:1])[0]
    assert unnormalised != planted
    np.testing.assert_allclose(np.linalg.norm(unnormalised), np.linalg.norm(
        embeddings(normalize=False).embed_documents(texts[:1])[0]), rtol=1e-5)
