"""Peak memory of a client given an oversized reply: the served-model client with its bound
(``max_response_bytes``, 32 MiB by default) against reading the body whole, as the client did
before issue 32.

    .venv/bin/python benchmarks/bounded_replies.py --out benchmarks/results/bounded_replies.json

A local server on 127.0.0.1 (a child process) answers every POST with a body of ``--mb``
megabytes, generated as it is sent, either with a ``Content-Length`` or chunked without one
(then the client cannot know the size before reading). Each measurement runs in a fresh
child process and reports its peak resident set size (``ru_maxrss``) after the imports and
after the request:

- ``whole``: ``httpx.AsyncClient.send(stream=True)`` then ``aread()``: the old client's read;
- ``bounded``: ``OpenAICompatibleLM(...).generate(...)``, which raises ``ServerReplyError``.

Figures are medians over ``--repeats`` runs; ``growth_mb`` is peak minus the after-import peak.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SERVER = r"""
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SIZE = int(sys.argv[1]) * 1024 * 1024
BLOCK = b"x" * (1024 * 1024)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        chunked = "chunked" in self.path
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if chunked:
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(SIZE + 2))
        self.end_headers()
        try:
            self.wfile.write((b"2\r\n[\"\r\n" if chunked else b'["'))
            for _ in range(SIZE // len(BLOCK)):
                self.wfile.write(b"100000\r\n" + BLOCK + b"\r\n" if chunked else BLOCK)
            self.wfile.write(b"0\r\n\r\n" if chunked else b"")
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""

CLIENT = r"""
import asyncio, json, resource, sys

mode, url = sys.argv[1], sys.argv[2]
import httpx
from rag_gates.errors import ServerReplyError
from rag_gates.lm.openai_compat import OpenAICompatibleLM

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

before = peak_mb()
outcome = ""
if mode == "whole":
    async def whole():
        async with httpx.AsyncClient(timeout=120) as client:
            request = client.build_request("POST", url + "/completions", json={"prompt": "x"})
            response = await client.send(request, stream=True)
            body = await response.aread()
            await response.aclose()
            return len(body)
    outcome = f"read {asyncio.run(whole()):,} bytes"
else:
    lm = OpenAICompatibleLM(url, probe=False, model="m", timeout=120, attempt_timeout=120)
    try:
        lm.generate("x", max_new_tokens=1)
    except ServerReplyError as exc:
        outcome = f"ServerReplyError: {exc}"[:160]
    lm.close()
print(json.dumps({"before_mb": before, "peak_mb": peak_mb(), "outcome": outcome}))
"""


def measure(mode: str, url: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", CLIENT, mode, url], capture_output=True,
                          text=True, check=True, timeout=600)
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=300, help="Reply body size, MB.")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(args.mb)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        results: dict[str, Any] = {}
        for framing, path in (("content-length", "/v1"), ("chunked", "/v1/chunked")):
            url = f"http://127.0.0.1:{port}{path}"
            for mode in ("whole", "bounded"):
                runs = [measure(mode, url) for _ in range(args.repeats)]
                growth = [r["peak_mb"] - r["before_mb"] for r in runs]
                results[f"{framing}/{mode}"] = {
                    "before_mb": statistics.median(r["before_mb"] for r in runs),
                    "peak_mb": statistics.median(r["peak_mb"] for r in runs),
                    "growth_mb": statistics.median(growth), "runs": runs,
                    "outcome": runs[0]["outcome"]}
                print(f"{framing:15s} {mode:8s} peak {results[f'{framing}/{mode}']['peak_mb']:7.1f}"
                      f" MB (growth {statistics.median(growth):6.1f} MB)", flush=True)
        for framing in ("content-length", "chunked"):
            whole = results[f"{framing}/whole"]["growth_mb"]
            bounded = results[f"{framing}/bounded"]["growth_mb"]
            results[f"{framing}/growth_ratio_bounded_to_whole"] = bounded / whole
    finally:
        server.terminate()
        server.wait(10)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({
        "command": f"python benchmarks/bounded_replies.py --mb {args.mb} --repeats "
                   f"{args.repeats} --out {args.out}",
        "body_mb": args.mb, "max_response_bytes": 32 * 1024 * 1024,
        "python": platform.python_version(), "when": time.strftime("%Y-%m-%d %H:%M:%S"),
        "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
