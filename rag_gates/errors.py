"""Exceptions raised by rag-gates; each message says what to do about it."""

from __future__ import annotations

import os

__all__ = [
    "ArtifactError",
    "ArtifactFileError",
    "CalibrationError",
    "ContextLengthError",
    "ExtractionError",
    "FileInUseError",
    "InputFileError",
    "LogprobsMissingError",
    "ModelNotFoundError",
    "ProbeMismatchError",
    "RagGatesError",
    "ServerError",
    "ServerLogprobError",
    "ServerReplyError",
    "ServerRequestError",
    "ServerTimeoutError",
    "ServerUnavailableError",
    "SpecFileError",
    "SpecModelMismatchError",
    "StoreLockedError",
    "VectorStoreError",
    "WeightsFileError",
    "WhiteBoxRequiredError",
]


class RagGatesError(Exception):
    """Base class of every error rag-gates raises on purpose."""


class ContextLengthError(RagGatesError, ValueError):
    """A prompt does not fit the model's context window."""


class ExtractionError(RagGatesError, ValueError):
    """An extractor's model replied with text holding no usable item (neither items nor the
    empty list ``[]``): the input's entities are unknown, so a gate that needs them cannot
    decide and retrieves (QuCo's ``on_error``)."""


class ModelNotFoundError(RagGatesError, FileNotFoundError):
    """No model could be loaded from anything that was tried; the message lists the attempts."""


class WhiteBoxRequiredError(RagGatesError, TypeError):
    """A method needs logits or hidden states, and the model given is text-only."""


class ProbeMismatchError(RagGatesError, ValueError):
    """A trained probe was loaded against a model (or hidden size) it was not trained on."""


class ArtifactError(RagGatesError, ValueError):
    """A saved artifact (a probe, an index, a cache, a run directory) is damaged, incomplete
    or foreign; the message names the file and what to do (usually: rebuild or retrain it)."""


class CalibrationError(RagGatesError, ValueError):
    """Calibration input that cannot give a certified threshold (too few questions, one
    class, a bound outside (0, 1)), or a gate spec file that is damaged, edited by hand or
    incomplete; the message says which and what to do."""


class SpecModelMismatchError(CalibrationError):
    """A gate spec was calibrated for another model than the one it is loaded with: its
    guarantee does not transfer. Recalibrate, or pass ``allow_other_model=True``."""


class FileInUseError(ArtifactError):
    """A resumable output (a bench run, gate decisions, synthesized rows, labels) is being
    written by another process; a second writer would duplicate its rows."""


class StoreLockedError(FileInUseError):
    """A local Qdrant folder (an SR-RAG policy, a dense index) is open in another process:
    Qdrant's local mode admits one client per folder. The message names the two ways out:
    open it read-only (each process loads a private copy) or serve it from a Qdrant server."""


class VectorStoreError(RagGatesError, RuntimeError):
    """A vector store server (Qdrant) could not be reached or refused a request; the message
    names the URL (never an API key) and what to try."""


class ServerError(RagGatesError, RuntimeError):
    """A model server (OpenAI-compatible API) could not give an answer; the message names the
    endpoint (never the API key) and what to try."""


class ServerRequestError(ServerError, ValueError):
    """The server refused the request (HTTP 4xx other than 408/429): fix the request."""


class ServerReplyError(ServerError):
    """The server answered, but not in the OpenAI API's shape (a malformed reply)."""


class ServerLogprobError(ServerReplyError):
    """The server reported a log-probability that is not one (not finite, or above 0 by more
    than float rounding): a decision read from it would be wrong, so none is made (gates
    retrieve)."""


class LogprobsMissingError(ServerLogprobError, ValueError):
    """A model returned no usable token log-probabilities although they were requested (a
    server's reply without them or in another shape, a LangChain or LlamaIndex adapter over
    a provider that dropped or reshaped them): configure the model to return them. A gate
    reading them cannot decide and retrieves."""


class ServerUnavailableError(ServerError):
    """The server kept failing (connection errors, 429, 5xx) after every retry."""


class ServerTimeoutError(ServerError, TimeoutError):
    """No answer within the call's total timeout (retries included)."""


class InputFileError(RagGatesError, ValueError):
    """A file rag-gates reads (a spec, records, a work directory's config, ``--data``, a
    corpus, weights, a probe, a policy) is not what it should be: too large, nested too
    deep, not UTF-8, a binary file, not JSON, a non-finite number where a number must be
    finite, or not the shape expected. The message names the file (``FILE:LINE`` for a line
    of a JSON Lines file) and what to do; ``path`` and ``line`` (None for a whole file) say
    the same for code. Every file is read through :mod:`rag_gates._files`, which raises it.
    """

    def __init__(self, message: str, *, path: str | os.PathLike[str] | None = None,
                 line: int | None = None) -> None:
        super().__init__(message)
        self.path = None if path is None else os.fspath(path)
        self.line = line


class ArtifactFileError(InputFileError, ArtifactError):
    """An :class:`InputFileError` in a saved artifact (a probe, an index, a policy, a
    cache): also an :class:`ArtifactError`, so handlers of damaged artifacts see it."""


class SpecFileError(InputFileError, CalibrationError):
    """An :class:`InputFileError` in a gate spec file: also a :class:`CalibrationError`,
    as every other refusal of a spec file."""


class WeightsFileError(ArtifactFileError):
    """A ``weighted(FILE)`` weights file is not the JSON ``rag-gates fit-weighted`` writes (or
    names itself through its gates); the message names the file and the shape expected."""
