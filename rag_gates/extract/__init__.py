"""Entities of questions and (head, relation, tail) claims of sentences, for QuCo-RAG."""

from __future__ import annotations

from rag_gates.extract.base import BaseExtractor, Claim, Extractor

__all__ = ["BaseExtractor", "Claim", "Extractor"]
