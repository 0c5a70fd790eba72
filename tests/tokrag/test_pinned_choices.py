"""The two-stream decoders' outputs, pinned: every chosen token, every TokenChoice and the
judge's intermediate values on tiny random-weight Llamas, against a fixture written by the
decoder as it was before the streams were made cheap (unpadded no-passage stream, last
position only). A change to how the streams run must leave the decoding as it was: greedy
tokens and sides exactly, scores and log-probabilities within 1e-4 (relative above 1).

The fixture (``data/pinned_choices.json``) is written by::

    OMP_NUM_THREADS=1 .venv/bin/python tests/tokrag/test_pinned_choices.py --write

Rewrite it only for an intended change of behaviour, and say so in the commit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

FIXTURE = Path(__file__).parent / "data" / "pinned_choices.json"
# float32 kernels differ between CPUs: the fixture, written on one machine, reads up to 2.3e-5
# (relative) off on another with AVX-512 and AMX (same tokens, same sides); a change to how
# the streams run moves these values far more.
TOL = 1e-4

PASSAGES = {
    "france": [
        {"title": "France", "text": "The capital of France is Paris."},
        {"text": "Who wrote Hamlet? William Shakespeare wrote Hamlet in London."},
    ],
    "three": [
        {"title": "Fox", "text": "The quick brown fox jumps over the lazy dog near the river."},
        {"text": "Numbers like 1, 2, 3, 10, 42 and 1999 appear in many documents."},
        {"title": "RAG", "text": "Retrieval augmented generation reads passages first."},
    ],
    # Cut to fit the context (the truncation path feeds the RAG stream).
    "long": [
        {"text": "Paris is the capital. " * 6},
        {"title": "Words", "text": "London words and the river bank " * 60},
    ],
}

# (model, question, passages, decoder, max_new_tokens)
CASES: list[tuple[str, str, str, str, int]] = [
    ("seed0", "What is the capital of France?", "france", "tokrag", 16),
    ("seed0", "What is the capital of France?", "france", "tokrag-layer2", 16),
    ("seed0", "What is the capital of France?", "france", "tokrag-renormalised", 16),
    ("seed0", "Who jumps over the dog?", "three", "tokrag", 16),
    ("seed0", "Who jumps over the dog?", "three", "cad", 12),
    ("seed0", "Who jumps over the dog?", "three", "adacad", 12),
    ("seed0", "What is the capital?", "long", "tokrag", 10),
    ("seed1-6l", "Who wrote Hamlet?", "france", "tokrag", 16),
    ("seed1-6l", "Who wrote Hamlet?", "three", "tokrag-search3", 16),
    ("seed1-6l", "Who wrote Hamlet?", "three", "cad", 12),
]


def _lm(name: str) -> Any:
    from rag_gates.testing import tiny_lm

    return tiny_lm(seed=0) if name == "seed0" else tiny_lm(seed=1, num_layers=6)


def _decoder(lm: Any, name: str) -> Any:
    from rag_gates.tokrag import AdaCADDecoder, CADDecoder, TokRAGConfig, TokRAGDecoder

    if name == "cad":
        return CADDecoder(lm, 0.5)
    if name == "adacad":
        return AdaCADDecoder(lm)
    # The fixture pins the paper's judge (written before the authors' judge existed) and
    # its layer rule as it was then (issue 55 made layer_rule="authors" the default).
    paper = "paper"
    rule = "paper-jsd"
    config = {"tokrag": TokRAGConfig(judge=paper, layer_rule=rule),
              "tokrag-layer2": TokRAGConfig(judge=paper, fusion_layer=2, layer_rule=rule),
              "tokrag-renormalised": TokRAGConfig(judge=paper, pr_form="renormalised",
                                                  layer_rule=rule),
              "tokrag-search3": TokRAGConfig(judge=paper, search_layers=3,
                                             layer_rule=rule)}[name]
    return TokRAGDecoder(lm, config)


def _passages(key: str) -> list[Any]:
    from rag_gates.types import Passage

    return [Passage(**p) for p in PASSAGES[key]]


def _run(models: dict[str, Any], case: tuple[str, str, str, str, int]) -> dict[str, Any]:
    model, question, passages, name, budget = case
    lm = models.setdefault(model, _lm(model))
    decoder = _decoder(lm, name)
    g = decoder.generate(question, passages=_passages(passages), max_new_tokens=budget,
                         logprobs=2)
    out: dict[str, Any] = {
        "text": g.text, "finish_reason": g.finish_reason,
        "prompt_tokens": g.prompt_tokens, "truncated_tokens": g.truncated_tokens,
        "choices": [c.model_dump(mode="json") for c in g.choices],
        "logprobs": [[lp.logprob] + [a.logprob for a in lp.top_logprobs]
                     for lp in g.logprobs or []],
    }
    if name.startswith("tokrag"):
        # The judge's pieces on the freshly opened streams and after two forced tokens.
        streams = decoder.open(question, _passages(passages), max_new_tokens=budget)
        judged = []
        for forced in ([], [g.choices[0].rag_token_id, g.choices[1].llm_token_id]):
            for token in forced:
                streams.group.advance(token)
            verdict = decoder.judge(streams)
            judged.append({"score_literal": verdict.score_literal,
                           "score_renormalised": verdict.score_renormalised,
                           "layer": verdict.layer, "rising_token": verdict.rising_token,
                           "cos_ir": verdict.cos_ir, "cos_llm": verdict.cos_llm})
            if decoder.config.fusion_layer is None:
                layer, curves = decoder.fusion_layer(streams)
                judged[-1].update(searched_layer=layer, f=curves["f"], g=curves["g"])
        out["judged"] = judged
    return out


def _close(got: Any, want: Any, where: str) -> None:
    if isinstance(want, float) or isinstance(got, float):
        assert got is not None and want is not None, f"{where}: {got!r} != {want!r}"
        assert abs(float(got) - float(want)) <= TOL * max(1.0, abs(float(want))), (
            f"{where}: {got!r} != {want!r}")
    elif isinstance(want, dict):
        assert set(got) == set(want), f"{where}: keys {sorted(got)} != {sorted(want)}"
        for key in want:
            _close(got[key], want[key], f"{where}.{key}")
    elif isinstance(want, list):
        assert len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            _close(a, b, f"{where}[{i}]")
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


@pytest.fixture(scope="module")
def pinned() -> list[dict[str, Any]]:
    data: list[dict[str, Any]] = json.loads(FIXTURE.read_text())
    return data


@pytest.mark.parametrize("index", range(len(CASES)), ids=["-".join(map(str, c[:4]))
                                                          for c in CASES])
def test_decoding_matches_the_pinned_run(pinned: list[dict[str, Any]], index: int) -> None:
    assert pinned[index]["case"] == list(CASES[index])
    want = pinned[index]["result"]
    got = _run(_MODELS, CASES[index])
    # Greedy tokens and sides first: the clearest message when a path changes.
    assert [c["token_id"] for c in got["choices"]] == [c["token_id"] for c in want["choices"]]
    assert [c["side"] for c in got["choices"]] == [c["side"] for c in want["choices"]]
    _close(got, want, CASES[index][3])


def test_the_pinned_cases_disagree_somewhere(pinned: list[dict[str, Any]]) -> None:
    # The fixture exercises the judge: most Tok-RAG cases went to the judge at least once.
    judged = [sum(c["side"] != "agree" for c in p["result"]["choices"])
              for p in pinned if p["case"][3].startswith("tokrag")]
    assert sum(n > 0 for n in judged) >= len(judged) - 1


_MODELS: dict[str, Any] = {}


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
    torch.set_num_threads(1)
    records = [{"case": list(case), "result": _run(_MODELS, case)} for case in CASES]
    FIXTURE.parent.mkdir(exist_ok=True)
    FIXTURE.write_text(json.dumps(records, indent=1) + "\n")
    print(f"wrote {FIXTURE}: {len(records)} cases")
