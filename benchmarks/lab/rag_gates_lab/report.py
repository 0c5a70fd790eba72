"""Markdown reports with PNG plots from bench and gate-evaluation directories.

``accuracy_vs_retrievals.png``: one panel per dataset (small multiples). In each, one point
per method (accuracy against retrievals per question, labelled beside it without overlaps;
stars on the Pareto front), each evaluated gate's threshold curve, and the straight line from
no-rag to single retrieval: the *random gate*, which retrieves for a random share of the
questions. A gate is worth what its curve rises above that line; the report states that area
(:func:`gain_over_random`, in accuracy points averaged over retrieval rates 0-1).
``roc.png``: the gates' ROC curves, one panel per dataset.

The markdown can also be kept inside a hand-written page: :func:`update_document` replaces
only the text between :data:`BEGIN_MARK` and :data:`END_MARK` (``rag-gates report --doc``).

Example:
    >>> from rag_gates_lab.report import write_report
    >>> write_report(["runs/hotpot", "runs/gate-hotpot"], "reports/hotpot")  # doctest: +SKIP
"""

from __future__ import annotations

import json
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rag_gates._optional import require
from rag_gates_lab.boundary import boundary_by_method, subquery_boundary
from rag_gates_lab.runner import (
    CONFIG,
    RunRecord,
    read_records,
    summarize,
    summary_markdown,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.transforms import Bbox

__all__ = [
    "BEGIN_MARK",
    "END_MARK",
    "RANDOM_GATE_GID",
    "ReportData",
    "accuracy_by_quartile",
    "accuracy_figure",
    "collect",
    "common_questions",
    "gain_over_random",
    "pareto_front",
    "roc_figure",
    "update_document",
    "write_report",
]

BEGIN_MARK = "<!-- BEGIN rag-gates report (generated: edit outside these markers) -->"
END_MARK = "<!-- END rag-gates report -->"
RANDOM_GATE_GID = "random-gate"
"""``gid`` of the random-gate reference lines in :func:`accuracy_figure`."""


def pareto_front(points: Sequence[tuple[str, float, float]]) -> list[str]:
    """Names of (name, retrievals, accuracy) points no other point dominates (at most as
    many retrievals and at least the accuracy, strictly better in one)."""
    front = []
    for name, cost, acc in points:
        dominated = any(c <= cost and a >= acc and (c < cost or a > acc)
                        for other, c, a in points if other != name)
        if not dominated:
            front.append(name)
    return front


def accuracy_by_quartile(records: Sequence[RunRecord], method: str, key: str = "s_pop"
                         ) -> list[dict[str, float]]:
    """Accuracy of one method per quartile of a numeric meta field (PopQA popularity)."""
    rows = sorted((float(r.meta[key]), r.accuracy) for r in records
                  if r.method == method and isinstance(r.meta.get(key), int | float))
    if len(rows) < 4:
        return []
    out = []
    for q in range(4):
        part = rows[q * len(rows) // 4:(q + 1) * len(rows) // 4]
        out.append({"quartile": q + 1, "questions": len(part), "min": part[0][0],
                    "max": part[-1][0], "accuracy": 100 * sum(a for _, a in part) / len(part)})
    return out


def gain_over_random(curve: Sequence[tuple[float, float]], no_rag: float, single: float
                     ) -> float:
    """Mean height of a gate's (retrieval rate, accuracy) curve above the random gate.

    The random gate retrieves for a random share ``r`` of the questions; its expected
    accuracy is the straight line ``no_rag + r * (single - no_rag)``. The result is the area
    between the gate's curve (linear between its points, extended to ``(0, no_rag)`` and
    ``(1, single)``) and that line over ``r`` in [0, 1], in the curve's accuracy unit.
    Positive: the gate's ranking of the questions beats chance.

    Example:
        >>> gain_over_random([(0.0, 10.0), (0.5, 20.0), (1.0, 20.0)], 10.0, 20.0)
        2.5
    """
    pts = sorted((min(max(r, 0.0), 1.0), a) for r, a in curve)
    if not pts or pts[0][0] > 0.0:
        pts.insert(0, (0.0, no_rag))
    if pts[-1][0] < 1.0:
        pts.append((1.0, single))
    area = 0.0
    for (r0, a0), (r1, a1) in pairwise(pts):
        line0 = no_rag + r0 * (single - no_rag)
        line1 = no_rag + r1 * (single - no_rag)
        area += (r1 - r0) * ((a0 - line0) + (a1 - line1)) / 2
    return area


@dataclass(frozen=True)
class _Point:
    method: str
    dataset: str
    questions: int
    offset: int
    cost: float
    accuracy: float
    model: str = "default"


@dataclass(frozen=True)
class _Gate:
    gate: str
    dataset: str
    questions: int
    offset: int
    curve: list[tuple[float, float]]      # (retrieval rate, accuracy %)
    roc: list[tuple[float, float]]
    auroc: float | None
    no_rag: float                          # accuracy % closed book
    single: float                          # accuracy % with one retrieval


@dataclass
class ReportData:
    """Everything the report shows, read from bench and eval-gate directories by
    :func:`collect`: markdown sections, method points and gate curves."""

    markdown: list[str] = field(default_factory=list)
    points: list[_Point] = field(default_factory=list)
    gates: list[_Gate] = field(default_factory=list)
    records: dict[tuple[str, str, str | None], list[RunRecord]] = field(default_factory=dict)
    """Bench records per (dataset, model, data file), pooled over the directories (for the
    boundary table: one model's closed-book answers never judge another's retrievals)."""

    @property
    def datasets(self) -> list[str]:
        """Datasets in order of first appearance."""
        return list(dict.fromkeys([p.dataset for p in self.points]
                                  + [g.dataset for g in self.gates]))

    def references(self, dataset: str) -> list[tuple[int, float, float]]:
        """The dataset's random-gate lines: (questions, no-rag %, single %), one per
        question set that has both ends (a bench run with no-rag and single, or a gate
        evaluation), de-duplicated."""
        refs: dict[tuple[int, int], tuple[int, float, float]] = {}
        runs: dict[tuple[int, int], dict[str, float]] = {}
        for p in self.points:
            if p.dataset == dataset and p.method in ("no-rag", "single"):
                runs.setdefault((p.offset, p.questions), {})[p.method] = p.accuracy
        for key, ends in runs.items():
            if len(ends) == 2:
                refs[key] = (key[1], ends["no-rag"], ends["single"])
        for g in self.gates:
            if g.dataset == dataset:
                refs.setdefault((g.offset, g.questions), (g.questions, g.no_rag, g.single))
        return list(refs.values())


def _load(directory: Path) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """A bench directory's config and records (its summary is computed from them, so an
    unfinished or interrupted run reports what it has), and/or a gate evaluation."""
    config = directory / CONFIG
    gate = directory / "gate_eval.json"
    bench = None
    if config.is_file():
        stored = json.loads(config.read_text())
        bench = {"config": stored["config"], "records": read_records(directory),
                 "planned_questions": stored["config"]["n"]}
    gate_eval = json.loads(gate.read_text()) if gate.is_file() else None
    if bench is None and gate_eval is None:
        raise FileNotFoundError(f"{directory} has neither config.json (rag-gates bench) nor "
                                "gate_eval.json (rag-gates eval-gate)")
    return bench, gate_eval


def common_questions(runs: Sequence[Sequence[RunRecord]]) -> set[str]:
    """The question ids that every method of every run answered: the questions a paired
    comparison of unfinished runs (one stopped part-way, one whole) may use."""
    answered = [{r.id for r in records if r.method == method}
                for records in runs for method in {r.method for r in records}]
    return set.intersection(*answered) if answered else set()


def _bench_section(data: ReportData, directory: Path, bench: dict[str, Any],
                   paired: int | None = None) -> None:
    cfg = bench["config"]
    summary = summarize(bench["records"])
    done = min((int(s["questions"]) for s in summary.values()), default=0)
    partial = (f", partial: {done} of {bench['planned_questions']} questions"
               if done < bench["planned_questions"] else "")
    if paired is not None:
        partial += (f"; paired: only the {paired} questions every method of the reported "
                    f"runs on {cfg['dataset']} answered")
    data.markdown.append(summary_markdown(
        summary, f"{cfg['dataset']} ({directory.name}): {cfg['retriever']}, "
                 f"k={cfg['k']}, model {cfg['model']}{partial}"))
    popularity = {m: accuracy_by_quartile(bench["records"], m) for m in summary}
    for method, rows in popularity.items():
        if not rows:
            continue
        data.markdown += [f"{method} accuracy by s_pop quartile (Wikipedia page views of the "
                          "question's subject):", "",
                          "| quartile | s_pop range | n | accuracy |",
                          "| ---: | --- | ---: | ---: |"]
        data.markdown += [f"| {r['quartile']} | {r['min']:.0f} - {r['max']:.0f} | "
                          f"{r['questions']} | {r['accuracy']:.1f} |" for r in rows]
        data.markdown.append("")
    setting = (cfg["dataset"], cfg.get("model", "default"), cfg.get("data_path"))
    data.records.setdefault(setting, []).extend(bench["records"])
    for method, s in summary.items():
        data.points.append(_Point(method, cfg["dataset"], int(s["questions"]),
                                  int(cfg.get("offset", 0)), s["retrievals_per_question"],
                                  s["accuracy"], str(cfg.get("model", "default"))))


def _gate_section(data: ReportData, gate_eval: dict[str, Any]) -> None:
    cfg = gate_eval["config"]
    no_rag = 100 * gate_eval["closed_book_accuracy"]
    single = 100 * gate_eval["single_retrieval_accuracy"]
    g = _Gate(gate=cfg["gate"], dataset=cfg["dataset"], questions=int(gate_eval["questions"]),
              offset=int(cfg.get("offset", 0)),
              curve=[(p["retrieval_rate"], 100 * p["accuracy"]) for p in gate_eval["curve"]],
              roc=[(p[0], p[1]) for p in gate_eval["roc"]], auroc=gate_eval["auroc"],
              no_rag=no_rag, single=single)
    data.gates.append(g)
    auc = g.auroc
    pop = gate_eval.get("popularity_spearman")
    chosen = gate_eval["calibrated"]
    data.markdown += [
        f"### gate {g.gate} on {g.dataset} ({g.questions} questions)", "",
        f"- AUROC for 'closed-book answer wrong': {'n/a' if auc is None else f'{auc:.3f}'}",
        f"- closed-book accuracy {no_rag:.1f}%, single retrieval {single:.1f}%",
        f"- area above the random gate (mean accuracy gain over the no-rag to single line, "
        f"retrieval rates 0-1): {gain_over_random(g.curve, no_rag, single):+.2f} points",
        f"- calibrated ({gate_eval['calibration']}) threshold {chosen['threshold']:.4g}: "
        f"accuracy {100 * chosen['accuracy']:.1f}% at retrieval rate "
        f"{100 * chosen['retrieval_rate']:.1f}%"]
    if pop is not None:
        data.markdown.append(f"- Spearman correlation with PopQA s_pop: {pop:.3f}")
    data.markdown.append("")


def collect(run_dirs: Sequence[str | Path], *, paired: bool = False) -> ReportData:
    """Read bench (``config.json``) and eval-gate (``gate_eval.json``) directories.

    ``paired``: report each dataset's bench runs on the questions that every method of
    every run on it answered (:func:`common_questions`), so that a run stopped part-way
    compares with the others on the same questions.

    Raises:
        FileNotFoundError: a directory holds neither.
        ValueError: ``paired``, and the runs on a dataset share no answered question.
    """
    data = ReportData()
    loaded = [(Path(raw), *_load(Path(raw))) for raw in run_dirs]
    common: dict[str, set[str]] = {}
    if paired:
        for dataset in {b["config"]["dataset"] for _, b, _ in loaded if b is not None}:
            common[dataset] = common_questions([b["records"] for _, b, _ in loaded
                                                if b is not None
                                                and b["config"]["dataset"] == dataset])
            if not common[dataset]:
                raise ValueError(
                    f"paired: no question of {dataset} was answered by every method of every "
                    "run given; report them unpaired, or give runs that share questions")
    for directory, bench, gate_eval in loaded:
        if bench is not None:
            ids = common.get(bench["config"]["dataset"])
            if ids is not None:
                bench = {**bench, "records": [r for r in bench["records"] if r.id in ids]}
            _bench_section(data, directory, bench, None if ids is None else len(ids))
        if gate_eval is not None:
            _gate_section(data, gate_eval)
    for setting, records in data.records.items():
        label = setting[0] + "".join(f", {name} {value}" for name, value in
                                     (("model", setting[1]), ("data", setting[2]))
                                     if value not in (None, "default"))
        _boundary_section(data, label, records)
        _subquery_section(data, setting, label, records)
    return data


def _subquery_section(data: ReportData, setting: tuple[str, str, str | None], label: str,
                      records: Sequence[RunRecord]) -> None:
    """On a testbed's two-hop questions, with a no-rag run on its hops (``testbed-hops:DIR``,
    same model): each DeepRAG step's retrieval against that hop's closed-book answer."""
    prefix, _, directory = setting[0].partition(":")
    truth = data.records.get((f"testbed-hops:{directory}", setting[1], setting[2]), [])
    wrong = {r.id: r.accuracy < 1.0 for r in truth if r.method == "no-rag"}
    if prefix not in ("testbed-twohop", "testbed-twohop-calibration") or not wrong:
        return
    from rag_gates_lab.testbed.dataset import twohop_hops

    table = subquery_boundary(records, twohop_hops(directory), wrong)
    if not table:
        return
    data.markdown += [
        f"### per-subquery knowledge boundary on {label}", "",
        "Each step matched to the hop it names, retrieved against the closed-book answer to "
        "that hop's own question being wrong (testbed-hops no-rag run).", "",
        "| method | steps | unmatched | retrieved % | hop wrong alone % | F1 | balanced accuracy "
        "| MCC |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for method, s in table.items():
        a = s.agreement
        n = max(1, a.questions)
        data.markdown.append(
            f"| {method} | {s.steps} | {s.unmatched} | "
            f"{100 * (a.true_positive + a.false_positive) / n:.1f} | "
            f"{100 * (a.true_positive + a.false_negative) / n:.1f} | {_num(a.f1)} | "
            f"{_num(a.balanced_accuracy)} | {_num(a.mcc)} |")
    data.markdown.append("")


def _num(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _boundary_section(data: ReportData, dataset: str, records: Sequence[RunRecord]) -> None:
    """The knowledge-boundary table (DeepRAG's Table 3) when the runs have no-rag and an
    adaptive method: does each method retrieve where the closed-book answer was wrong?"""
    if not any(r.method == "no-rag" for r in records):
        return
    rows = {m: a for m, a in boundary_by_method(records).items()
            if 0 < a.true_positive + a.false_positive < a.questions}  # adaptive ones only
    if not rows:
        return
    num = _num
    data.markdown += [
        f"### knowledge boundary on {dataset}", "",
        "Per question: retrieved at least once, against the no-rag answer being wrong "
        "(DeepRAG's Table 3; MCC 0 = chance).", "",
        "| method | questions | retrieved % | closed book wrong % | F1 | accuracy "
        "| balanced accuracy | MCC |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for method, a in rows.items():
        retrieved = 100 * (a.true_positive + a.false_positive) / a.questions
        wrong = 100 * (a.true_positive + a.false_negative) / a.questions
        data.markdown.append(
            f"| {method} | {a.questions} | {retrieved:.1f} | {wrong:.1f} | {num(a.f1)} | "
            f"{num(a.accuracy)} | {num(a.balanced_accuracy)} | {num(a.mcc)} |")
    data.markdown.append("")


# ------------------------------------------------------------------------- plotting

def _pyplot() -> Any:
    require("matplotlib", "eval")
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


def _gate_colors(data: ReportData) -> dict[str, Any]:
    """One colour per gate name, the same in every panel and both figures."""
    plt = _pyplot()
    palette = plt.get_cmap("tab10").colors
    names = sorted({g.gate for g in data.gates})
    return {name: palette[i % len(palette)] for i, name in enumerate(names)}


def _grid(plt: Any, panels: int, extra_cell: bool, size: tuple[float, float]
          ) -> tuple[Figure, list[Axes], Axes | None]:
    """``panels`` axes in rows of at most two; a spare cell (if any, and wanted) for the
    legend."""
    cells = panels + (1 if extra_cell else 0)
    cols = 1 if cells == 1 else 2
    rows = -(-cells // cols)
    fig, grid = plt.subplots(rows, cols, figsize=(size[0] * cols, size[1] * rows),
                             squeeze=False)
    flat = list(grid.ravel())
    spare = flat[panels] if extra_cell and len(flat) > panels else None
    for ax in flat[panels:]:
        ax.set_axis_off()
    return fig, flat[:panels], spare


def _panel_title(data: ReportData, dataset: str) -> str:
    counts = dict.fromkeys([p.questions for p in data.points if p.dataset == dataset]
                           + [g.questions for g in data.gates if g.dataset == dataset])
    return f"{dataset} ({' / '.join(str(n) for n in counts)} questions)"


def _overlap(a: Bbox, b: Bbox) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


# Label positions tried in turn, as (dx, dy) in points from the marker: close ones first.
_OFFSETS = [(7, 3), (7, -9), (-7, 3), (-7, -9), (0, 8), (0, -14), (12, 12), (12, -18),
            (-12, 12), (-12, -18), (0, 18), (0, -24), (20, 0), (-20, 0), (20, 22),
            (20, -28), (-20, 22), (-20, -28), (0, 30), (0, -36), (30, 34), (-30, 34),
            (30, -40), (-30, -40)]
_LABEL_STYLE: dict[str, Any] = {
    "fontsize": 8, "zorder": 5,
    "bbox": {"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8}}


def _place_labels(fig: Figure, ax: Axes, labels: Sequence[tuple[str, float, float]]) -> None:
    """Annotate each (text, x, y) at the first nearby offset whose box overlaps no label
    placed before and no marker, and stays inside the axes; if none is free, the offset with
    the least overlap. Far offsets get a thin leader line to their point."""
    from matplotlib.transforms import Bbox

    fig.canvas.draw()  # the layout must be final: offsets are measured in display space
    inside = ax.get_window_extent()
    pad = 4 * fig.dpi / 72
    pixels = [ax.transData.transform((x, y)) for _, x, y in labels]
    taken = [Bbox.from_extents(px - pad, py - pad, px + pad, py + pad) for px, py in pixels]
    # Points with many close neighbours first: they have the fewest free spots.
    crowd = [sum(abs(px - qx) < 60 and abs(py - qy) < 40 for qx, qy in pixels)
             for px, py in pixels]
    for i in sorted(range(len(labels)), key=lambda i: -crowd[i]):
        text, x, y = labels[i]
        best: tuple[float, tuple[int, int], Bbox] | None = None
        for dx, dy in _OFFSETS:
            ann = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy),
                              ha="left" if dx > 0 else "right" if dx < 0 else "center",
                              va="bottom" if dy >= 0 else "top", **_LABEL_STYLE)
            box = ann.get_window_extent()
            ann.remove()
            outside = (max(inside.x0 - box.x0, 0) + max(box.x1 - inside.x1, 0)
                       + max(inside.y0 - box.y0, 0) + max(box.y1 - inside.y1, 0))
            cost = sum(_overlap(box, t) for t in taken) + 1000 * outside
            if best is None or cost < best[0]:
                best = (cost, (dx, dy), box)
            if cost == 0:
                break
        assert best is not None  # _OFFSETS is not empty
        _, (dx, dy), box = best
        leader = ({"arrowstyle": "-", "color": "0.5", "lw": 0.6, "shrinkA": 0, "shrinkB": 3}
                  if abs(dx) > 10 or abs(dy) > 15 else None)
        ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy),
                    ha="left" if dx > 0 else "right" if dx < 0 else "center",
                    va="bottom" if dy >= 0 else "top", arrowprops=leader, **_LABEL_STYLE)
        taken.append(box)


def _method_labels(points: Sequence[_Point]) -> list[tuple[str, float, float]]:
    """One label per marker position: methods at the same point share it ("single =
    fs-rag"); a method run with two models says which ("deeprag [deeprag-sft]", the model
    directory's name), one run on two question sets of the dataset says which ("n=500")."""
    names = Counter(p.method for p in points)
    models: dict[str, set[str]] = {}
    for p in points:
        models.setdefault(p.method, set()).add(p.model)
    at: dict[tuple[float, float], list[str]] = {}
    for p in points:
        name = p.method
        if len(models[p.method]) > 1:
            name += f" [{Path(p.model).name or p.model}]"
        if names[p.method] > len(models[p.method]):  # the same model on several sets
            name += f" (n={p.questions})"
        at.setdefault((round(p.cost, 6), round(p.accuracy, 6)), []).append(name)
    return [(" = ".join(v), x, y) for (x, y), v in at.items()]


def accuracy_figure(data: ReportData) -> Figure:
    """Accuracy against retrievals per question, one panel per dataset.

    Each panel: the methods' points (stars on the Pareto front of each question set,
    joined by a dashed line), the gates' threshold curves, and the random gate (the straight
    no-rag to single line, ``gid`` :data:`RANDOM_GATE_GID`). The legend sits in a spare
    grid cell or below the panels.
    """
    plt = _pyplot()
    from matplotlib.lines import Line2D

    datasets = data.datasets
    colors = _gate_colors(data)
    fig, axes, spare = _grid(plt, len(datasets), extra_cell=True, size=(6.0, 4.6))
    placements = []
    for ax, dataset in zip(axes, datasets, strict=True):
        points = [p for p in data.points if p.dataset == dataset]
        front: set[_Point] = set()
        sets: dict[tuple[int, int], list[_Point]] = {}
        for p in points:  # methods compete only on the same questions
            sets.setdefault((p.offset, p.questions), []).append(p)
        for members in sets.values():
            named = [(str(i), p.cost, p.accuracy) for i, p in enumerate(members)]
            on = [members[int(i)] for i in pareto_front(named)]
            front.update(on)
            if len(on) > 1:
                ordered = sorted(on, key=lambda p: (p.cost, p.accuracy))
                ax.plot([p.cost for p in ordered], [p.accuracy for p in ordered], "k--",
                        linewidth=0.8, zorder=2)
        for p in points:
            ax.scatter(p.cost, p.accuracy, s=90 if p in front else 30, color="0.15",
                       marker="*" if p in front else "o", zorder=4)
        for n, no_rag, single in data.references(dataset):
            ax.plot([0.0, 1.0], [no_rag, single], color="0.3", linestyle=":", linewidth=1.6,
                    zorder=3.5, gid=RANDOM_GATE_GID, label=f"random gate (n={n})")
        for g in data.gates:
            if g.dataset == dataset:
                curve = sorted(g.curve)
                ax.plot([r for r, _ in curve], [a for _, a in curve], color=colors[g.gate],
                        linewidth=1.3, zorder=3, label=g.gate)
        ax.set_title(_panel_title(data, dataset), fontsize=10)
        ax.set_xlabel("retrievals per question")
        ax.set_ylabel("accuracy (%)")
        ax.grid(alpha=0.3)
        ax.margins(x=0.08, y=0.1)
        placements.append((ax, _method_labels(points)))
    handles = [Line2D([], [], color=c, linewidth=1.3, label=f"gate {name}")
               for name, c in colors.items()]
    handles += [
        Line2D([], [], color="0.3", linestyle=":", linewidth=1.6,
               label="random gate: no-rag to single\n(a gate's value is its area above)"),
        Line2D([], [], color="k", linestyle="--", linewidth=0.8, marker="*", markersize=9,
               label="Pareto front (per question set)"),
        Line2D([], [], color="0.15", linestyle="", marker="o", markersize=5,
               label="method (dominated)")]
    fig.suptitle("accuracy against retrieval cost", fontsize=12)
    if spare is not None:
        spare.legend(handles=handles, loc="center", fontsize=9, frameon=False)
        fig.tight_layout()
    else:
        fig.legend(handles=handles, loc="lower center", ncol=3, fontsize=8, frameon=False)
        fig.tight_layout(rect=(0, 0.12, 1, 1))
    for ax, labels in placements:
        ax.set_xlim(ax.get_xlim())  # freeze the scale the labels are placed against
        ax.set_ylim(ax.get_ylim())
        _place_labels(fig, ax, labels)
    return fig


def roc_figure(data: ReportData) -> Figure:
    """The gates' ROC curves for "the closed-book answer is wrong", one panel per dataset."""
    plt = _pyplot()
    datasets = [d for d in data.datasets if any(g.dataset == d for g in data.gates)]
    colors = _gate_colors(data)
    fig, axes, _ = _grid(plt, len(datasets), extra_cell=False, size=(4.6, 4.4))
    for ax, dataset in zip(axes, datasets, strict=True):
        for g in data.gates:
            if g.dataset == dataset:
                auc = "n/a" if g.auroc is None else f"{g.auroc:.3f}"
                ax.plot([p[0] for p in g.roc], [p[1] for p in g.roc], color=colors[g.gate],
                        linewidth=1.3, label=f"{g.gate} (AUROC {auc})")
        ax.plot([0, 1], [0, 1], "k:", linewidth=0.8, label="chance")
        ax.set_title(_panel_title(
            ReportData(gates=[g for g in data.gates if g.dataset == dataset]), dataset),
            fontsize=10)
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.set_aspect("equal")
        ax.legend(fontsize=8, loc="lower right")
    fig.suptitle("gate ROC: closed-book answer wrong", fontsize=12)
    fig.tight_layout()
    return fig


def write_report(run_dirs: Sequence[str | Path], out_dir: str | Path,
                 title: str = "rag-gates report", *, paired: bool = False) -> Path:
    """Write ``report.md`` and its PNGs to ``out_dir``; return the report's path.
    ``paired``: as :func:`collect`'s."""
    plt = _pyplot()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = collect(run_dirs, paired=paired)
    lines = [f"# {title}", "", *data.markdown]
    if data.points or data.gates:
        fig = accuracy_figure(data)
        fig.savefig(out / "accuracy_vs_retrievals.png", dpi=110)
        plt.close(fig)
        lines += ["![accuracy against retrievals per question, one panel per dataset]"
                  "(accuracy_vs_retrievals.png)", ""]
    if data.gates:
        fig = roc_figure(data)
        fig.savefig(out / "roc.png", dpi=110)
        plt.close(fig)
        lines += ["![ROC curves of the gates, one panel per dataset](roc.png)", ""]
    report = out / "report.md"
    report.write_text("\n".join(lines))
    return report


_IMAGE = re.compile(r"(!\[[^\]]*\]\()([^)\s]+)(\))")


def update_document(doc: str | Path, report: str | Path) -> Path:
    """Put ``report`` (a ``report.md`` from :func:`write_report`, without its title) into
    ``doc`` between :data:`BEGIN_MARK` and :data:`END_MARK`, leaving everything outside
    the markers as written; image links are rewritten relative to ``doc``.

    Raises:
        ValueError: ``doc`` lacks the two markers (in that order, once each): add them
            where the generated part belongs.
    """
    doc_path, report_path = Path(doc), Path(report)
    text = doc_path.read_text()
    if text.count(BEGIN_MARK) != 1 or text.count(END_MARK) != 1 or (
            text.index(BEGIN_MARK) > text.index(END_MARK)):
        raise ValueError(f"{doc_path} must contain the line {BEGIN_MARK!r} and, after it, "
                         f"{END_MARK!r}, once each: add them where the report belongs")
    body = report_path.read_text().split("\n")
    if body and body[0].startswith("# "):
        body = body[1:]
    rel = os.path.relpath(report_path.parent.resolve(), doc_path.parent.resolve())

    def relink(m: re.Match[str]) -> str:
        target = m.group(2)
        if "://" in target or target.startswith("/"):
            return m.group(0)
        return f"{m.group(1)}{Path(rel, target).as_posix()}{m.group(3)}"

    generated = _IMAGE.sub(relink, "\n".join(body).strip("\n"))
    head, rest = text.split(BEGIN_MARK, 1)
    _, tail = rest.split(END_MARK, 1)
    tmp = doc_path.with_name(f".{doc_path.name}.tmp")
    tmp.write_text(f"{head}{BEGIN_MARK}\n\n{generated}\n\n{END_MARK}{tail}")
    tmp.replace(doc_path)  # never a half-written page
    return doc_path
