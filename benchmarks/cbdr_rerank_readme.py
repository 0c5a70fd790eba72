"""CBDR's zero-shot confidence-gain reranker on the README's own six documents, in both
frameworks: which three of the six it keeps for the README's question.

The application is the README's "your app" block, executed as written (taken from README.md by
tests/install/run_readme.py, not copied here); the reranker is the one the README's "Drop it
in" showed before it moved to docs/methods/cbdr.md: the shipped probe on the embedded
SmolLM2, ``top_n=3``, over all six documents the store returns.

    python benchmarks/cbdr_rerank_readme.py --out benchmarks/results/cbdr_rerank_readme.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "install"))

from run_readme import snippets  # noqa: E402

QUESTION = "Were Scott Derrickson and Ed Wood of the same nationality?"
RELEVANT = ["derrickson", "edwood"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    app = snippets(ROOT / "README.md")[0]
    if "# Your app" not in app.code:
        raise SystemExit("README.md's first Python block is not the 'your app' block")
    namespace: dict[str, Any] = {}
    exec(compile(app.code, f"README.md:{app.line}", "exec"), namespace)
    index, vectorstore = namespace["index"], namespace["vectorstore"]
    n = len(namespace["TEXTS"])

    from llama_index.core import QueryBundle
    from llama_index.postprocessor.rag_gates import ConfidenceGainReranker as LIReranker

    from langchain_rag_gates import ConfidenceGainReranker as LCReranker
    from rag_gates.cbdr import load_default_probe
    from rag_gates.lm import load_default_lm

    lm = load_default_lm()
    probe = load_default_probe(lm)
    results: dict[str, Any] = {}
    start = time.perf_counter()
    nodes = index.as_retriever(similarity_top_k=n).retrieve(QUESTION)
    kept = LIReranker.from_probe(lm, probe, top_n=3).postprocess_nodes(
        nodes, query_bundle=QueryBundle(QUESTION))
    results["llama_index"] = {
        "retrieved": [x.node.metadata["title"] for x in nodes],
        "kept": [x.node.metadata["title"] for x in kept],
        "inc": [round(float(x.score or 0.0), 5) for x in kept],
        "seconds": round(time.perf_counter() - start, 2)}
    start = time.perf_counter()
    docs = vectorstore.as_retriever(search_kwargs={"k": n}).invoke(QUESTION)
    compressed = LCReranker.from_probe(lm, probe, top_n=3).compress_documents(docs, QUESTION)
    results["langchain"] = {
        "retrieved": [d.metadata["title"] for d in docs],
        "kept": [d.metadata["title"] for d in compressed],
        "seconds": round(time.perf_counter() - start, 2)}
    for framework in ("llama_index", "langchain"):
        kept_titles = results[framework]["kept"]
        results[framework]["relevant_kept"] = [t for t in RELEVANT if t in kept_titles]
    record = {"command": "python " + " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"),
              "machine": platform.machine(), "model": "SmolLM2-135M-Instruct (embedded)",
              "probe": str(probe.config.model_id), "question": QUESTION,
              "relevant": RELEVANT, "documents": list(namespace["TEXTS"]), "top_n": 3,
              "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
