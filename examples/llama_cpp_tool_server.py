"""Serve the embedded SmolLM2 with tool calling over llama.cpp's OpenAI-compatible server.

The agent examples (``langchain_agent_verify.py``, ``llama_index_agent_verify.py``) and
``benchmarks/agent_verify.py`` need a model that calls tools through the OpenAI chat API.
This starts llama-cpp-python's server (``pip install "llama-cpp-python[server]"``) on the
embedded SmolLM2-135M-Instruct GGUF with a chat format of our own, ``smollm2-tools``:

    .venv/bin/python examples/llama_cpp_tool_server.py --port 8080
    # then: --base-url http://127.0.0.1:8080/v1 in the agent examples

Why not the server's own formats (llama-cpp-python 0.3.36, checked here): the GGUF's chat
template has no tools, so the default format ignores ``tools``; ``chatml-function-calling``
ignores them too unless ``tool_choice`` is set, with ``tool_choice="auto"`` it returns empty
text whenever the model chooses to answer (the grammar after ``message:`` only admits a tool
name or the end token), and it drops ``tool`` messages from the prompt, so the model never
reads a tool's result.

``smollm2-tools`` renders the conversation in SmolLM2's chat format with the tools listed in
the system turn in the JSON-in-tags style of SmolLM2's function-calling training data
(``<tools>...</tools>``; a call is ``<tool_call>[{"name": ..., "arguments": {...}}]</tool_call>``),
tool results as a user turn in ``<tool_response>`` tags, and generates freely: no grammar, so
what the model writes is what it chose. A reply whose ``<tool_call>`` body parses (a JSON
object or list of objects with a string ``name`` and object ``arguments``) becomes
``tool_calls``; anything else, including a malformed call, comes back as text, so a client can
count how often the model forms a valid call. ``tool_choice`` ``"none"`` hides the tools; a
named function starts the reply with that call's opening and constrains its arguments to the
function's JSON schema with a grammar (what llama.cpp's servers do for a forced call), so a
forced call is valid by construction.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CHAT_FORMAT = "smollm2-tools"
END = "<|im_end|>"
_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_SAMPLING = ("temperature", "top_p", "top_k", "min_p", "typical_p", "seed", "repeat_penalty",
             "presence_penalty", "frequency_penalty")
MAX_TOKENS = 256
"""Reply length when a request names none (OpenAI clients now send ``max_completion_tokens``,
which llama-cpp-python's server does not read); ``--max-tokens`` sets it."""


def _text(content: Any) -> str:
    """A message's content as text (a string, None, or a list of OpenAI content parts)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if isinstance(part, dict))


def tools_block(tools: list[dict[str, Any]]) -> str:
    """The system-turn text that lists the tools and says how to call them."""
    functions = [{"name": t["function"]["name"],
                  "description": t["function"].get("description", ""),
                  "parameters": t["function"].get("parameters", {})} for t in tools]
    return (
        "You can call functions. The functions, as JSON schemas, are inside <tools></tools>:\n"
        f"<tools>{json.dumps(functions)}</tools>\n\n"
        "To call functions, reply with only: "
        '<tool_call>[{"name": "function name", "arguments": {"argument name": "value"}}]'
        "</tool_call>\nTo reply to the user instead, write your reply as plain text.")


def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None) -> str:
    """The ChatML prompt of the conversation (SmolLM2's format), tools in the system turn."""
    turns: list[tuple[str, str]] = []
    for message in messages:
        role, text = message["role"], _text(message.get("content"))
        if role == "assistant" and message.get("tool_calls"):
            calls = [{"name": c["function"]["name"],
                      "arguments": json.loads(c["function"].get("arguments") or "{}")}
                     for c in message["tool_calls"]]
            text = f"{text}\n<tool_call>{json.dumps(calls)}</tool_call>".strip()
        elif role == "tool":
            role, text = "user", f"<tool_response>\n{text}\n</tool_response>"
        elif role == "developer":
            role = "system"
        turns.append((role, text))
    if tools:
        if turns and turns[0][0] == "system":
            turns[0] = ("system", f"{turns[0][1]}\n\n{tools_block(tools)}")
        else:
            turns.insert(0, ("system", tools_block(tools)))
    prompt = "".join(f"<|im_start|>{role}\n{text}{END}\n" for role, text in turns)
    return prompt + "<|im_start|>assistant\n"


def parse_reply(text: str) -> tuple[str, list[dict[str, Any]]]:
    """``(content, tool_calls)`` of a reply: the calls when its ``<tool_call>`` body parses,
    else the whole reply as content and no calls."""
    match = _CALL.search(text)
    if match is None:
        return text.strip(), []
    try:
        data, _ = json.JSONDecoder().raw_decode(match.group(1))
    except json.JSONDecodeError:
        return text.strip(), []
    items = data if isinstance(data, list) else [data]
    calls = []
    for item in items:
        if not (isinstance(item, dict) and isinstance(item.get("name"), str)
                and isinstance(item.get("arguments", {}), dict)):
            return text.strip(), []
        calls.append({"id": f"call_{uuid.uuid4().hex[:12]}", "type": "function",
                      "function": {"name": item["name"],
                                   "arguments": json.dumps(item.get("arguments", {}))}})
    if not calls:
        return text.strip(), []
    return text[:match.start()].strip(), calls


def smollm2_tools(llama: Any, messages: list[dict[str, Any]], *,
                  tools: list[dict[str, Any]] | None = None, tool_choice: Any = None,
                  functions: list[dict[str, Any]] | None = None, stream: bool = False,
                  stop: str | list[str] | None = None, default_max_tokens: int = MAX_TOKENS,
                  **kwargs: Any) -> Any:
    """The ``smollm2-tools`` chat handler (llama-cpp-python's handler signature)."""
    if functions and not tools:  # the legacy API
        tools = [{"type": "function", "function": f} for f in functions]
    shown = None if tool_choice == "none" else tools
    prompt = render(messages, shown)
    stops = [END] + ([stop] if isinstance(stop, str) else list(stop or []))
    sampling = {k: kwargs[k] for k in _SAMPLING if kwargs.get(k) is not None}
    sampling["max_tokens"] = kwargs.get("max_tokens") or default_max_tokens
    forced = _forced(tool_choice, shown)
    if forced is not None:
        # A named function: the reply opens with the call and its arguments follow the
        # function's JSON schema (a grammar, as llama.cpp's servers do for a forced call).
        from llama_cpp import llama_grammar

        name, parameters = forced
        prefix = f'<tool_call>[{{"name": {json.dumps(name)}, "arguments": '
        sampling["grammar"] = llama_grammar.LlamaGrammar.from_json_schema(
            json.dumps(parameters), verbose=False)
        completion = llama.create_completion(prompt=prompt + prefix, stop=stops, stream=False,
                                             **sampling)
        choice = completion["choices"][0]
        content, calls = parse_reply(f"{prefix}{choice['text']}}}]</tool_call>")
    else:
        completion = llama.create_completion(prompt=prompt, stop=stops, stream=False, **sampling)
        choice = completion["choices"][0]
        content, calls = parse_reply(choice["text"])
    message: dict[str, Any] = {"role": "assistant", "content": content or None}
    if calls:
        message["tool_calls"] = calls
    finish = "tool_calls" if calls else choice["finish_reason"]
    meta = {"id": f"chat{completion['id']}", "created": completion.get("created", int(time.time())),
            "model": completion["model"]}
    if not stream:
        return {**meta, "object": "chat.completion", "usage": completion["usage"],
                "choices": [{"index": 0, "message": message, "logprobs": None,
                             "finish_reason": finish}]}
    return _chunks(meta, message, finish)


def _forced(tool_choice: Any, tools: list[dict[str, Any]] | None
            ) -> tuple[str, dict[str, Any]] | None:
    """``(name, parameters schema)`` of the function ``tool_choice`` names, else None."""
    if not (isinstance(tool_choice, dict) and tools):
        return None
    name = tool_choice["function"]["name"]
    for tool in tools:
        if tool["function"]["name"] == name:
            return name, tool["function"].get("parameters") or {"type": "object"}
    raise ValueError(f"tool_choice names {name!r}, which is not among the tools")


def _chunks(meta: dict[str, Any], message: dict[str, Any], finish: str) -> Iterator[Any]:
    """The reply as a stream: one chunk with the message, one with the finish reason."""
    delta: dict[str, Any] = {"role": "assistant", "content": message["content"]}
    if "tool_calls" in message:
        delta["tool_calls"] = [{"index": i, **call}
                               for i, call in enumerate(message["tool_calls"])]
    for chunk_delta, reason in ((delta, None), ({}, finish)):
        yield {**meta, "object": "chat.completion.chunk",
               "choices": [{"index": 0, "delta": chunk_delta, "logprobs": None,
                            "finish_reason": reason}]}


class NullContentToEmpty:
    """ASGI wrapper: llama-cpp-python's server refuses a message whose ``content`` is null,
    which the OpenAI API allows beside ``tool_calls`` (LangChain and LlamaIndex send it);
    this turns the null into an empty string before the server reads the request."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or not scope["path"].endswith("/chat/completions"):
            await self.app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body += message.get("body", b"")
            more = message.get("more_body", False)
        with contextlib.suppress(ValueError, AttributeError, TypeError):
            data = json.loads(body)
            for item in data.get("messages", []):
                if item.get("content") is None:
                    item["content"] = ""
            body = json.dumps(data).encode()
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await self.app({**scope, "headers": headers}, replay, send)


def add_client_arguments(parser: argparse.ArgumentParser, free_help: str) -> None:
    """The agent examples' options: ``--base-url``, ``--model`` and ``--free``."""
    parser.add_argument("--base-url", help="an OpenAI-compatible server (default: start this "
                        "tool server with the embedded SmolLM2 in a child process)")
    parser.add_argument("--model", default="smollm2", help="the model name the server knows")
    parser.add_argument("--free", action="store_true", help=free_help)


SERVER_PACKAGES = {"llama_cpp.server": 'pip install "llama-cpp-python[server]"',
                   "uvicorn": 'pip install "llama-cpp-python[server]"'}


def _missing(packages: dict[str, str]) -> str | None:
    """The install line of the first module that is not installed (None: all are)."""
    import importlib.util

    for module, install in packages.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:  # a parent package is missing
            found = False
        if not found:
            return f"{module} is not installed: {install}"
    return None


def check_ready(argv: list[str], packages: dict[str, str]) -> None:
    """Before any model or index loads: the example's packages (module -> install line) and a
    server, either the one ``--base-url`` names (it must answer) or llama.cpp's server
    installed, to start here. Otherwise print one line saying what to install or start, and
    exit 2 (no traceback, no minutes of set-up first)."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--base-url")
    base_url = parser.parse_known_args(argv)[0].base_url
    problem = _missing(packages)
    if problem is None and base_url is None:
        problem = _missing(SERVER_PACKAGES)
        if problem is not None:
            problem = (f"this example starts llama.cpp's server with the embedded SmolLM2, and "
                       f"{problem} (or pass --base-url URL of a running OpenAI-compatible "
                       "server)")
    if problem is None and base_url is not None:
        import httpx

        try:
            httpx.get(f"{base_url.rstrip('/')}/models", timeout=5.0)
        except httpx.TransportError as error:
            problem = (f"no server answers at {base_url} ({type(error).__name__}): start one, "
                       "e.g. python examples/llama_cpp_tool_server.py --port 8080, and pass "
                       "--base-url http://127.0.0.1:8080/v1")
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(2)


@contextlib.contextmanager
def local_server(port: int | None = None, *, startup_s: float = 180.0,
                 extra_args: tuple[str, ...] = ()) -> Iterator[str]:
    """Run this server in a child process (one thread) and yield its base URL
    (``http://127.0.0.1:PORT/v1``); the child is stopped on exit (its log is quoted in the
    error if it exits or does not answer in ``startup_s`` seconds)."""
    from rag_gates.lm.llamacpp_server import child_server, free_port

    port = port or free_port()
    with child_server([sys.executable, __file__, "--port", str(port), *extra_args],
                      f"http://127.0.0.1:{port}/v1", startup_timeout=startup_s,
                      env={**os.environ, "OMP_NUM_THREADS": "1"}) as base_url:
        yield base_url


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=None,
                        help="GGUF file (default: the embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8080)
    parser.add_argument("--n-ctx", type=int, default=4096, help="context window in tokens")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (shared machines: 1)")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS,
                        help="reply length when a request names none")
    args = parser.parse_args(argv)
    try:
        import uvicorn
        from llama_cpp import llama_chat_format
        from llama_cpp.server.app import create_app
        from llama_cpp.server.settings import ModelSettings, ServerSettings

        from rag_gates.lm.defaults import default_gguf_path
    except ImportError as error:
        raise SystemExit(f'{error}; install the server: pip install "llama-cpp-python[server]"'
                         ) from error
    llama_chat_format.register_chat_completion_handler(CHAT_FORMAT)(
        functools.partial(smollm2_tools, default_max_tokens=args.max_tokens))
    model = args.model or default_gguf_path()
    app = create_app(
        server_settings=ServerSettings(host=args.host, port=args.port),
        model_settings=[ModelSettings(model=str(model), chat_format=CHAT_FORMAT,
                                      n_ctx=args.n_ctx, n_threads=args.threads,
                                      n_threads_batch=args.threads, verbose=False)])
    uvicorn.run(NullContentToEmpty(app), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
