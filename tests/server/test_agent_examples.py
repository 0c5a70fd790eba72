"""The two self-verifying agent examples run offline against llama.cpp's server (each starts
its own tool-calling server with the embedded SmolLM2, examples/llama_cpp_tool_server.py),
and the tool contract holds on real calls: the first turn calls the claim verifier with a
draft, the verifier answers with its flags, and (LangChain's VerifyFirst) a flagged draft is
followed by a search with the flagged claim's query. What the 135M model then answers is not
asserted: docs/agents.md measures it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(script: str) -> str:
    pytest.importorskip("llama_cpp.server", reason="pip install 'llama-cpp-python[server]'")
    out = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True,
                         text=True, timeout=900, cwd=EXAMPLES,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout


def _verifier_turns(stdout: str) -> list[tuple[dict[str, str], dict[str, object]]]:
    calls = [json.loads(m) for m in re.findall(r"model -> verify_claims\((\{.*\})\)", stdout)]
    replies = [json.loads(m) for m in re.findall(r"verify_claims -> (\{.*\})", stdout)]
    return list(zip(calls, replies, strict=True))


@pytest.mark.parametrize("script", ["langchain_agent_verify.py", "llama_index_agent_verify.py"])
def test_agent_verifies_its_draft_first(script: str) -> None:
    stdout = _run(script)
    questions = stdout.count("\nQ: ") + stdout.startswith("Q: ")
    assert questions == 2 and stdout.count("  answer:") == 2, stdout
    turns = _verifier_turns(stdout)
    assert len(turns) >= 2, stdout  # every question's first turn is the verifier
    for call, reply in turns:
        assert call["text"].strip()
        assert {"flagged", "queries", "claims_checked"} <= set(reply)
    if script.startswith("langchain"):
        flagged = [reply for _, reply in turns if reply["flagged"]]
        searches = re.findall(r"model -> search_documents\((\{.*\})\)", stdout)
        assert len(searches) >= len(flagged)
        for reply, search in zip(flagged, searches, strict=False):
            assert json.loads(search)["query"] in reply["queries"]  # type: ignore[operator]
