"""What the replies of an OpenAI-compatible server say, read strictly: the first choice and
its fields, per-token log-probabilities in the completions and the chat shapes (every value
checked: finite and <= 0 within :data:`~rag_gates.gate.LOGPROB_TOLERANCE`, else
:class:`~rag_gates.errors.ServerLogprobError`), why generation ended, and an echoed prompt's
log-probabilities with the span of a continuation in it, read aligned or shifted by one
position (see :mod:`rag_gates.lm.openai_compat` for the probe that tells which).

Every function is pure: a reply (parsed JSON) in, checked values out, or a
:class:`~rag_gates.errors.ServerReplyError` naming the server and the field.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import BaseModel

from rag_gates.errors import LogprobsMissingError, ServerLogprobError, ServerReplyError
from rag_gates.gate import LOGPROB_TOLERANCE, logprob_problem
from rag_gates.lm.stops import find_stop
from rag_gates.types import TokenLogprob, TopLogprob

__all__ = ["Alignment", "Echo", "chat_logprobs", "checked_logprob", "completion_logprobs",
           "continuation_span", "finish_of", "first_choice", "read_echo", "read_span",
           "reply_field", "top_alternatives"]

Alignment = Literal["aligned", "shifted", "missing", "mismatch", "unprobed"]
"""How a server's echoed prompt log-probabilities line up with the tokens: ``aligned``,
``shifted`` by one position (corrected from the previous position's alternatives), none
(``missing``), neither reading (``mismatch``), or not probed."""


class Echo(BaseModel):
    """The echoed prompt of a completions reply: tokens with their log-probabilities."""

    text: str
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]


def first_choice(data: Any, url: str) -> dict[str, Any]:
    """``choices[0]`` of a reply from ``url``, or a ServerReplyError."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise ServerReplyError(f"{url} sent a reply without choices[0]; not an OpenAI reply: "
                               f"{str(data)[:200]}")
    return choices[0]


def reply_field(obj: dict[str, Any], url: str, *path: str, kind: type, nullable: bool = False,
                optional: bool = False) -> Any:
    """The value at ``path`` in a choice, of type ``kind`` (None where ``nullable`` and null,
    or ``optional`` and absent), or a ServerReplyError naming the field."""
    value: Any = obj
    for key in path:
        if not isinstance(value, dict) or key not in value:
            if optional:
                return None
            raise ServerReplyError(f"{url} sent a reply without choices[0].{'.'.join(path)}: "
                                   f"{str(obj)[:200]}")
        value = value[key]
    if value is None and nullable:
        return None
    if not isinstance(value, kind):
        raise ServerReplyError(f"{url}: choices[0].{'.'.join(path)} is "
                               f"{type(value).__name__}, expected {kind.__name__}")
    return value


def checked_logprob(value: Any, url: str, where: str) -> float:
    """``value`` as a log-probability (finite, <= 0 within :data:`LOGPROB_TOLERANCE`, clipped
    to 0), or a :class:`ServerLogprobError` naming the server and the entry."""
    problem = logprob_problem(float(value))
    if problem is not None:
        raise ServerLogprobError(
            f"{url} reported a log-probability that is not one ({where}: {problem}); "
            f"log-probabilities are finite and <= 0 (tolerance {LOGPROB_TOLERANCE:g}), so the "
            "server's logprobs are broken: no decision is read from them. Check the server "
            "(its logprobs option, its version) or use another one")
    return min(float(value), 0.0)


def top_alternatives(entries: Any, k: int, url: str, where: str) -> list[TopLogprob]:
    """The ``k`` likeliest of ``(token, log-probability)`` pairs, each value checked."""
    pairs = sorted(((str(t), checked_logprob(v, url, f"{where}, alternative {str(t)!r}"))
                    for t, v in entries), key=lambda p: -p[1])[:k]
    return [TopLogprob(token=t, logprob=v, bytes=list(t.encode())) for t, v in pairs]


def completion_logprobs(choice: dict[str, Any], url: str, k: int) -> list[TokenLogprob]:
    """The generated tokens' log-probabilities in the completions shape (``tokens``,
    ``token_logprobs``, ``top_logprobs``); none when the choice carries none."""
    lp = choice.get("logprobs")
    if lp is None:
        return []
    try:
        tokens, values = lp["tokens"], lp["token_logprobs"]
        tops = lp.get("top_logprobs") or [None] * len(tokens)
        return [TokenLogprob(token=t, logprob=checked_logprob(v, url, f"token {i} {t!r}"),
                             bytes=list(t.encode()),
                             top_logprobs=top_alternatives((top or {}).items(), k, url,
                                                           f"token {i}"))
                for i, (t, v, top) in enumerate(zip(tokens, values, tops, strict=True))]
    except (KeyError, TypeError, ValueError) as exc:
        raise LogprobsMissingError(
            f"{url}: choices[0].logprobs is not in the completions shape (tokens, "
            f"token_logprobs, top_logprobs): {str(lp)[:200]}") from exc


def chat_logprobs(choice: dict[str, Any], url: str, k: int) -> list[TokenLogprob]:
    """The generated tokens' log-probabilities in the chat shape (``content[]`` of token,
    logprob, top_logprobs); none when the choice carries none."""
    lp = choice.get("logprobs")
    if lp is None:
        return []
    try:
        return [TokenLogprob(token=item["token"],
                             logprob=checked_logprob(item["logprob"], url,
                                                     f"token {i} {item['token']!r}"),
                             bytes=item.get("bytes") or list(item["token"].encode()),
                             top_logprobs=top_alternatives(
                                 ((t["token"], t["logprob"])
                                  for t in item.get("top_logprobs") or []), k, url,
                                 f"token {i}"))
                for i, item in enumerate(lp["content"] or [])]
    except (KeyError, TypeError, ValueError) as exc:
        raise LogprobsMissingError(
            f"{url}: choices[0].logprobs is not in the chat shape "
            f"(content[].token/logprob/top_logprobs): {str(lp)[:200]}") from exc


def finish_of(text: str, tokens: list[TokenLogprob] | None, stops: tuple[str, ...],
              choice: dict[str, Any]
              ) -> tuple[str, list[TokenLogprob] | None, Literal["stop", "length", "eos"]]:
    """Cut at a stop string the server left in (or was not sent), keep the log-probabilities
    of the tokens up to the one that completed it (as HFWhiteBoxLM and llama.cpp do), and
    name why generation ended."""
    found = find_stop(text, stops)
    if found is not None:
        text = text[: found[0]]
        if tokens is not None:
            kept, offset = [], 0
            for t in tokens:
                if offset >= found[1]:
                    break
                kept.append(t)
                offset += len(t.token)
            tokens = kept
        return text, tokens, "stop"
    reason = choice.get("finish_reason")
    if reason == "length":
        return text, tokens, "length"
    # vLLM names the stop string that matched (None at end-of-sequence); llama.cpp's server
    # says stop_type "word" or "eos". Others do not say: a stop with stop strings given is
    # read as a stop string.
    if "stop_reason" in choice:
        return text, tokens, "stop" if isinstance(choice["stop_reason"], str) else "eos"
    if "stop_type" in choice:
        return text, tokens, "stop" if choice["stop_type"] == "word" else "eos"
    return text, tokens, "stop" if stops and reason == "stop" else "eos"


def read_echo(data: Any, url: str) -> Echo:
    """The echoed prompt of a completions reply (``echo`` with ``logprobs``), every value
    checked as a log-probability; no tokens when the reply carries none."""
    choice = first_choice(data, url)
    lp = choice.get("logprobs")
    reply_text = reply_field(choice, url, "text", kind=str)
    if not isinstance(lp, dict):
        return Echo(text=reply_text, tokens=[], token_logprobs=[], top_logprobs=[])
    try:
        echo = Echo(text=reply_text, tokens=lp.get("tokens") or [],
                    token_logprobs=lp.get("token_logprobs") or [],
                    top_logprobs=lp.get("top_logprobs") or [])
    except ValueError as exc:
        raise ServerReplyError(f"{url} returned echoed log-probabilities that are not in "
                               f"the completions shape: {str(lp)[:200]}") from exc
    # The first prompt token has no value (None); every value given must be one.
    for i, value in enumerate(echo.token_logprobs):
        if value is not None:
            echo.token_logprobs[i] = checked_logprob(value, url, f"echoed token {i}")
    for i, top_entry in enumerate(echo.top_logprobs):
        if top_entry is not None:
            echo.top_logprobs[i] = {t: checked_logprob(v, url, f"echoed token {i}, alternative "
                                               f"{t!r}") for t, v in top_entry.items()}
    return echo


def continuation_span(echo: Echo, prompt: str, continuation: str) -> tuple[int, int]:
    """Token positions ``[a, b)`` of ``continuation`` in an echo of prompt+continuation."""
    full = prompt + continuation
    if not echo.text.startswith(full):
        raise ServerReplyError("the server's echo does not start with the prompt it was "
                               "sent; it does not echo prompts")
    generated = echo.text[len(full):]
    joined = "".join(echo.tokens)
    end = len(echo.tokens)
    if not generated and echo.tokens and not joined.endswith(continuation) \
            and joined[: len(joined) - len(echo.tokens[-1])].endswith(continuation):
        # vLLM leaves a generated special token (<|im_end|>) out of the echoed text but not
        # out of its tokens: the last token is the generated one.
        end -= 1
    elif generated and joined.endswith(continuation + generated):
        tail = ""
        while end > 0 and len(tail) < len(generated):
            end -= 1
            tail = echo.tokens[end] + tail
        if tail != generated:
            raise ServerReplyError("the echoed tokens do not end at the generated token")
    elif not joined.endswith(continuation):
        raise ServerReplyError("the echoed tokens do not end with the continuation "
                               f"{continuation!r}")
    start, got = end, ""
    while start > 0 and len(got) < len(continuation):
        start -= 1
        got = echo.tokens[start] + got
    if got != continuation:
        raise ValueError(
            f"the continuation {continuation!r} does not begin at a token boundary on this "
            f"server (token {echo.tokens[start]!r} spans the end of the prompt); end the "
            "prompt with whitespace or begin the continuation with a space")
    return start, end


def read_span(echo: Echo, span: tuple[int, int], alignment: Alignment
               ) -> list[float | None]:
    """Log-probabilities of the tokens in ``span`` under an alignment (None: not there)."""
    out: list[float | None] = []
    for i in range(*span):
        if alignment == "aligned":
            value = echo.token_logprobs[i] if i < len(echo.token_logprobs) else None
        else:  # shifted: token i's value is in the previous entry's alternatives
            prev = echo.top_logprobs[i - 1] if 0 < i <= len(echo.top_logprobs) else None
            # The previous entry's own token was written into it with a wrong value.
            same = i > 0 and echo.tokens[i - 1] == echo.tokens[i]
            value = None if prev is None or same else prev.get(echo.tokens[i])
        out.append(None if value is None or not math.isfinite(value) else float(value))
    return out
