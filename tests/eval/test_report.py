"""The report's figures and generated-page update, on the committed evaluation results."""

from __future__ import annotations

from itertools import combinations
from pathlib import Path
from typing import Any

import pytest

from rag_gates_lab.gate_eval import threshold_curve
from rag_gates_lab.report import (
    BEGIN_MARK,
    END_MARK,
    RANDOM_GATE_GID,
    accuracy_figure,
    collect,
    common_questions,
    gain_over_random,
    roc_figure,
    update_document,
    write_report,
)
from rag_gates_lab.runner import read_records, summarize

EVAL = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "eval"
BENCH_RUNS = ["hotpotqa-200", "hotpotqa-200-flare", "2wiki-200", "2wiki-200-flare",
              "popqa-500", "popqa-200-cbdr"]
GATE_RUNS = ["gate-first-token-prob-popqa", "gate-first-token-prob-hotpotqa",
             "gate-cbdr-hotpotqa", "gate-quco-popqa", "gate-quco-hotpotqa", "gate-quco-2wiki"]


@pytest.fixture(scope="module")
def committed() -> Any:
    return collect([EVAL / name for name in BENCH_RUNS + GATE_RUNS])


@pytest.fixture(scope="module")
def figure(committed: Any) -> Any:
    import matplotlib.pyplot as plt

    fig = accuracy_figure(committed)
    yield fig
    plt.close(fig)


def _panels(fig: Any) -> dict[str, Any]:
    """Drawn axes by the dataset in their title (the legend's spare cell has no axis)."""
    return {ax.get_title().split(" ")[0]: ax for ax in fig.axes if ax.axison}


def test_one_panel_per_dataset(figure: Any) -> None:
    panels = _panels(figure)
    assert sorted(panels) == ["2wiki", "hotpotqa", "popqa"]
    assert panels["popqa"].get_title() == "popqa (500 / 200 questions)"


def test_random_gate_runs_from_no_rag_to_single(figure: Any) -> None:
    """Each panel's reference lines join (0, no-rag accuracy) and (1, single accuracy) of
    every question set of that dataset, read here straight from the runs' records."""
    expected: dict[str, set[tuple[float, float, float, float]]] = {}
    for name in BENCH_RUNS:
        summary = summarize(read_records(EVAL / name))
        if "no-rag" in summary and "single" in summary:
            expected.setdefault(name.split("-")[0], set()).add(
                (0.0, round(summary["no-rag"]["accuracy"], 6), 1.0,
                 round(summary["single"]["accuracy"], 6)))
    for dataset, ax in _panels(figure).items():
        lines = {(float(line.get_xdata()[0]), round(float(line.get_ydata()[0]), 6),
                  float(line.get_xdata()[1]), round(float(line.get_ydata()[1]), 6))
                 for line in ax.get_lines() if line.get_gid() == RANDOM_GATE_GID}
        assert lines == expected[dataset], dataset
    assert len(expected["popqa"]) == 2  # 500 and 200 questions: two different lines


def test_every_method_is_labelled_and_no_labels_overlap(figure: Any) -> None:
    for dataset, ax in _panels(figure).items():
        texts = [t for t in ax.texts if t.get_text()]
        labelled = {name.split(" (n=")[0] for t in texts for name in t.get_text().split(" = ")}
        methods = {m for name in BENCH_RUNS if name.startswith(dataset)
                   for m in summarize(read_records(EVAL / name))}
        assert labelled == methods, dataset
        boxes = [t.get_window_extent() for t in texts]
        for a, b in combinations(boxes, 2):
            assert not a.overlaps(b), dataset
        inside = ax.get_window_extent()
        assert all(inside.contains(b.x0, b.y0) and inside.contains(b.x1, b.y1) for b in boxes)


def test_gate_curves_share_colours_across_panels_and_figures(committed: Any,
                                                             figure: Any) -> None:
    import matplotlib.pyplot as plt

    def colours(fig: Any) -> dict[str, set[Any]]:
        out: dict[str, set[Any]] = {}
        for ax in fig.axes:
            for line in ax.get_lines():
                name = str(line.get_label()).split(" (AUROC")[0]
                if name in {g.gate for g in committed.gates}:
                    out.setdefault(name, set()).add(tuple(line.get_color()))
        return out

    roc = roc_figure(committed)
    try:
        acc, rocs = colours(figure), colours(roc)
        assert set(acc) == {"first-token-prob", "cbdr", "quco"}
        assert all(len(c) == 1 for c in acc.values()) and acc == rocs
        assert len({next(iter(c)) for c in acc.values()}) == len(acc)
    finally:
        plt.close(roc)


def test_gain_over_random() -> None:
    closed = [1.0, 0.0, 0.0, 1.0]      # questions 1 and 2 are wrong without retrieval
    retrieved = [1.0, 1.0, 1.0, 0.0]   # retrieval fixes them and breaks question 3
    oracle = threshold_curve([0.1, 0.9, 0.8, 0.0], closed, retrieved)
    backwards = threshold_curve([0.8, 0.0, 0.1, 0.9], closed, retrieved)
    tied = threshold_curve([0.5] * 4, closed, retrieved)

    def gain(curve: Any) -> float:
        return gain_over_random([(p.retrieval_rate, p.accuracy) for p in curve], 0.5, 0.75)

    assert gain(oracle) > 0 > gain(backwards)
    assert gain(tied) == pytest.approx(0.0)          # no ranking: exactly the random gate
    # The oracle retrieves q1, q2, q0, q3 in turn: accuracy 0.5, 0.75, 1, 1, 0.75 at rates
    # 0, .25, .5, .75, 1; the random gate is 0.5 + 0.25 r, so the heights above it are
    # 0, .1875, .375, .3125, 0, and the trapezoids of width .25 add up to:
    assert gain(oracle) == pytest.approx(0.25 * (0.1875 + 0.375 + 0.3125))


def test_report_states_each_gates_gain(tmp_path: Path, committed: Any) -> None:
    path = write_report([EVAL / "gate-cbdr-hotpotqa"], tmp_path / "report")
    text = path.read_text()
    gate = committed.gates[[g.gate for g in committed.gates].index("cbdr")]
    value = gain_over_random(gate.curve, gate.no_rag, gate.single)
    assert f"area above the random gate (mean accuracy gain over the no-rag to single line, " \
           f"retrieval rates 0-1): {value:+.2f} points" in text


def test_update_document_keeps_the_hand_written_notes(tmp_path: Path) -> None:
    report_dir = tmp_path / "results" / "report"
    report_dir.mkdir(parents=True)
    report = report_dir / "report.md"
    doc = tmp_path / "docs" / "benchmarks.md"
    doc.parent.mkdir()
    notes_before = "# Benchmarks\n\nHand-written reading notes.\n\n"
    notes_after = "\n\n## More notes\n\nkept as written\n"
    doc.write_text(f"{notes_before}{BEGIN_MARK}\nold tables\n{END_MARK}{notes_after}")
    report.write_text("# rag-gates report\n\n| a |\n\n![plot](roc.png)\n")
    for _ in range(2):  # regenerating twice gives the same page
        update_document(doc, report)
        text = doc.read_text()
        assert text.startswith(notes_before) and text.endswith(notes_after)
        assert "old tables" not in text and "# rag-gates report" not in text
        assert "![plot](../results/report/roc.png)" in text
        assert text.count(BEGIN_MARK) == 1 and text.count(END_MARK) == 1
    doc.write_text("no markers here\n")
    with pytest.raises(ValueError, match="BEGIN rag-gates report"):
        update_document(doc, report)
    assert doc.read_text() == "no markers here\n"


def test_labels_tell_apart_a_method_run_with_several_models() -> None:
    from rag_gates_lab.report import _method_labels, _Point

    def point(model: str, n: int, acc: float) -> _Point:
        return _Point("deeprag", "hotpotqa", n, 0, 0.5, acc, model)

    labels = {t for t, _, _ in _method_labels([
        point("default", 200, 6.0), point("models/deeprag-sft", 200, 7.8),
        point("models/deeprag-sft-dpo/", 200, 8.0)])}
    assert labels == {"deeprag [default]", "deeprag [deeprag-sft]", "deeprag [deeprag-sft-dpo]"}
    sizes = {t for t, _, _ in _method_labels([point("default", 200, 6.0),
                                               point("default", 100, 5.0)])}
    assert sizes == {"deeprag (n=200)", "deeprag (n=100)"}
    assert [t for t, _, _ in _method_labels([point("default", 200, 6.0)])] == ["deeprag"]


def test_paired_report_compares_a_stopped_run_on_the_questions_it_answered(
        tmp_path: Path) -> None:
    """A run stopped part-way (its cbdr methods answered the first 120 of 200 questions)
    beside a whole run on the same dataset: paired, every method of both is summarized on
    the 120 questions all of them answered; unpaired, each on what it has."""
    import shutil

    whole = EVAL / "popqa-200-cbdr"
    stopped = tmp_path / "stopped"
    shutil.copytree(whole, stopped)
    records = read_records(whole)
    kept_ids = list(dict.fromkeys(r.id for r in records))[:120]
    (stopped / "results.jsonl").write_text("".join(
        r.model_dump_json() + "\n" for r in records
        if not r.method.startswith("cbdr") or r.id in kept_ids))
    assert common_questions([read_records(stopped), records]) == set(kept_ids)

    def table(paired: bool) -> dict[str, dict[str, float]]:
        data = collect([stopped, whole], paired=paired)
        return {f"{p.method}/{i // 4}": (p.questions, p.accuracy)
                for i, p in enumerate(data.points)}

    unpaired, paired = table(False), table(True)
    assert unpaired["single/0"][0] == 200 and unpaired["cbdr-ce@1.0/0"][0] == 120
    assert {n for n, _ in paired.values()} == {120}
    on_kept = summarize([r for r in records if r.id in kept_ids])
    assert paired["single/1"][1] == pytest.approx(on_kept["single"]["accuracy"])
    assert paired["single/0"] == paired["single/1"]  # the same records, the same questions
    report = write_report([stopped, whole], tmp_path / "report", paired=True)
    assert "paired: only the 120 questions" in report.read_text()
    # Runs that share no answered question cannot be paired: said, not an empty table.
    other = tmp_path / "other"
    shutil.copytree(whole, other)
    (other / "results.jsonl").write_text("".join(
        r.model_dump_json() + "\n" for r in records if r.id not in kept_ids))
    with pytest.raises(ValueError, match="no question of popqa"):
        collect([stopped, other], paired=True)
