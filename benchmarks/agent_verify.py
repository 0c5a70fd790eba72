"""Agents verifying themselves with a real tool-calling model (issue 18): how often the model
forms a valid tool call, how often a flagged claim leads to a revision, accuracy before/after.

Runs the agent of ``examples/langchain_agent_verify.py`` (``create_agent`` with
``verify_claims`` and ``search_documents`` over the shipped HotpotQA sample's 491 paragraphs)
on the sample's 50 questions, against a served model: by default the embedded SmolLM2-135M
behind llama.cpp's server with the ``smollm2-tools`` chat format
(``examples/llama_cpp_tool_server.py``, started here, one thread), greedy decoding.

Two modes:

* ``free``: the model chooses its tools (``tool_choice`` left to the model): does a 135M
  model decide to call a tool, and is the call it writes valid?
* ``guided``: ``VerifyFirst`` sets ``tool_choice`` each turn (verify first, search after a
  flagged verification, then answer without tools). A forced call's arguments follow the
  tool's JSON schema by grammar, so those calls are valid by construction; what is measured
  is what the model writes in them (its draft, its query) and whether it revises.

Per mode: ``tool_calls`` (calls the model formed, ``valid`` = the tool ran, i.e. a known
tool with arguments its schema accepts), ``malformed`` (replies that opened a
``<tool_call>`` the server could not parse), ``first_turn_call`` (questions whose first reply
is a tool call), ``flagged`` (questions whose verification flagged a claim), ``searched`` and
``retrieved`` (of those, a search followed / the gate retrieved), ``revised`` (of those, the
final answer differs from the draft; ``revised_and_unflagged``: and the verifier flags
nothing in it), and accuracy (containment, as ``rag-gates bench``) and
F1 of the draft (the ``text`` of the first ``verify_claims`` call, else the first reply) and
of the final answer.

    .venv/bin/python benchmarks/agent_verify.py --out benchmarks/results/agent_verify.json
    .venv/bin/python benchmarks/agent_verify.py --base-url http://127.0.0.1:8080/v1 --n 5
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage

from rag_gates._io import write_text_atomic
from rag_gates.answers import accuracy, f1, normalize_answer
from rag_gates.tools import SEARCH_DOCUMENTS_NAME, VERIFY_CLAIMS_NAME
from rag_gates_lab.datasets import load_dataset

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))

from langchain_agent_verify import (  # noqa: E402
    SYSTEM_PROMPT,
    build_agent,
    chat_model,
    verification_tools,
)
from llama_cpp_tool_server import CHAT_FORMAT, local_server  # noqa: E402
from my_documents import SAMPLE, my_documents  # noqa: E402

MODES = ("free", "guided")


def _json(content: Any) -> dict[str, Any] | None:
    try:
        value = json.loads(str(content))
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def analyse(messages: list[BaseMessage], golds: list[str], verifier: Any) -> dict[str, Any]:
    """One question's conversation reduced to what the benchmark counts (``verifier``
    checks the final answer too)."""
    replies = [m for m in messages if isinstance(m, AIMessage)]
    results = {m.tool_call_id: m for m in messages if isinstance(m, ToolMessage)}
    calls = [(c, results.get(str(c["id"]))) for m in replies for c in m.tool_calls]
    valid = [(c, r) for c, r in calls if r is not None and r.status != "error"]
    malformed = sum("<tool_call>" in str(m.content) and not m.tool_calls for m in replies)
    verify = [(c, r) for c, r in valid if c["name"] == VERIFY_CLAIMS_NAME]
    reports = [_json(r.content) for _, r in verify]
    flagged_at = next((i for i, rep in enumerate(reports) if rep and rep.get("flagged")), None)
    searches = [(c, _json(r.content)) for c, r in valid if c["name"] == SEARCH_DOCUMENTS_NAME]
    if verify:
        draft = str(verify[0][0]["args"].get("text", ""))
    else:
        draft = str(replies[0].content) if replies else ""
    final = str(replies[-1].content).strip() if replies and not replies[-1].tool_calls else ""
    flagged = flagged_at is not None
    searched = flagged and bool(searches)
    return {
        "draft": draft, "final": final,
        "tool_calls": len(calls), "valid_calls": len(valid), "malformed": malformed,
        "first_turn_call": bool(replies and replies[0].tool_calls),
        "calls": [{"name": c["name"], "args": c["args"],
                   "status": None if r is None else r.status} for c, r in calls],
        "verified": bool(verify), "flagged": flagged,
        "flags": reports[flagged_at]["flagged"] if flagged_at is not None else [],  # type: ignore[index]
        "searched": searched,
        "retrieved": searched and any(s and s.get("retrieved") for _, s in searches),
        "revised": flagged and bool(final)
        and normalize_answer(final) != normalize_answer(draft),
        "final_flags": verifier.verify(final).summary()["flagged"] if final else [],
        "acc_before": accuracy(draft, golds), "acc_after": accuracy(final or draft, golds),
        "f1_before": f1(draft, golds), "f1_after": f1(final or draft, golds),
        "turns": len(replies),
    }


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    ok = [{**r, "revised_clean": r["revised"] and not r["final_flags"]}
          for r in rows if "error" not in r]
    n = len(ok)
    flagged = [r for r in ok if r["flagged"]]

    def mean(key: str, over: list[dict[str, Any]]) -> float | None:
        return round(sum(float(r[key]) for r in over) / len(over), 4) if over else None

    calls = sum(r["tool_calls"] for r in ok)
    return {
        "questions": len(rows), "errors": len(rows) - n,
        "tool_calls": calls, "valid_calls": sum(r["valid_calls"] for r in ok),
        "valid_call_rate": round(sum(r["valid_calls"] for r in ok) / calls, 4) if calls else None,
        "malformed_replies": sum(r["malformed"] for r in ok),
        "first_turn_call_rate": mean("first_turn_call", ok),
        "verified_rate": mean("verified", ok),
        "flagged": len(flagged),
        "searched_given_flagged": mean("searched", flagged),
        "retrieved_given_flagged": mean("retrieved", flagged),
        "revised_given_flagged": mean("revised", flagged),
        "revised_and_unflagged_given_flagged": mean("revised_clean", flagged),
        "accuracy_before": mean("acc_before", ok), "accuracy_after": mean("acc_after", ok),
        "f1_before": mean("f1_before", ok), "f1_after": mean("f1_after", ok),
        "median_turns": sorted(r["turns"] for r in ok)[n // 2] if ok else None,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/agent_verify.json"))
    parser.add_argument("--n", type=int, default=50, help="questions (the sample has 50)")
    parser.add_argument("--modes", default=",".join(MODES), help="free,guided")
    parser.add_argument("--base-url", help="an OpenAI-compatible server with tool calling "
                        "(default: start examples/llama_cpp_tool_server.py)")
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--recursion-limit", type=int, default=16,
                        help="LangGraph steps per question (a model that loops is cut here)")
    args = parser.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise SystemExit(f"--modes takes {', '.join(MODES)}, got {args.modes!r}")
    examples = load_dataset("hotpotqa", SAMPLE, n=args.n).examples
    out: dict[str, Any] = {
        "command": "python " + " ".join([Path(sys.argv[0]).as_posix(), *sys.argv[1:]]),
        "dataset": f"hotpotqa, {len(examples)} questions of {SAMPLE.relative_to(EXAMPLES.parent)}"
                   " (retrieval and corpus statistics over its 491 paragraphs)",
        "model": args.model,
        "server": args.base_url or f"llama-cpp-python {metadata.version('llama-cpp-python')}, "
                                   f"chat format {CHAT_FORMAT}, embedded SmolLM2-135M Q4_1 GGUF",
        "decoding": {"temperature": 0, "max_tokens": args.max_tokens},
        "system_prompt": SYSTEM_PROMPT,
        "platform": platform.platform(), "modes": {},
    }
    with contextlib.ExitStack() as stack:
        base_url = args.base_url or stack.enter_context(local_server())
        tools = stack.enter_context(verification_tools(my_documents()))
        llm = chat_model(base_url, args.model, max_tokens=args.max_tokens)
        for mode in modes:
            agent = build_agent(llm, tools, guided=mode == "guided")
            rows: list[dict[str, Any]] = []
            started = time.perf_counter()
            for i, example in enumerate(examples):
                t0 = time.perf_counter()
                try:
                    state = agent.invoke({"messages": [HumanMessage(example.question)]},
                                         config={"recursion_limit": args.recursion_limit})
                    row = analyse(state["messages"], list(example.answers), tools[0].verifier)
                except Exception as error:  # a model that loops or a server fault: counted
                    row = {"error": f"{type(error).__name__}: {str(error)[:300]}"}
                row = {"id": example.id, "question": example.question,
                       "answers": list(example.answers), **row,
                       "wall_s": round(time.perf_counter() - t0, 2)}
                rows.append(row)
                print(f"[{mode} {i + 1}/{len(examples)}] calls={row.get('valid_calls')}/"
                      f"{row.get('tool_calls')} flagged={row.get('flagged')} "
                      f"revised={row.get('revised')} {row.get('error', '')}", flush=True)
                out["modes"][mode] = {"summary": summarise(rows),
                                      "wall_s": round(time.perf_counter() - started, 1),
                                      "rows": rows}
                args.out.parent.mkdir(parents=True, exist_ok=True)
                write_text_atomic(args.out, json.dumps(out, indent=1, ensure_ascii=False) + "\n")
    for mode, result in out["modes"].items():
        print(mode, json.dumps(result["summary"]))


if __name__ == "__main__":
    main()
