"""Markdown reports with PNG plots from bench and gate-evaluation directories.

``accuracy_vs_retrievals.png``: one point per method (accuracy against retrievals per
question), the Pareto front (no other method is both more accurate and cheaper) marked, and
each evaluated gate's threshold curve. ``roc.png``: ROC curves of the evaluated gates.

Example:
    >>> from rag_gates.eval.report import write_report
    >>> write_report(["runs/hotpot", "runs/gate-hotpot"], "reports/hotpot")
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rag_gates._optional import require
from rag_gates.eval.runner import (
    CONFIG,
    RunRecord,
    read_records,
    summarize,
    summary_markdown,
)

__all__ = ["accuracy_by_quartile", "pareto_front", "write_report"]


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


def _load(directory: Path) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """A bench directory's config and summary (recomputed from its results, so an
    unfinished or interrupted run reports what it has), and/or a gate evaluation."""
    config = directory / CONFIG
    gate = directory / "gate_eval.json"
    bench = None
    if config.is_file():
        stored = json.loads(config.read_text())
        records = read_records(directory)
        bench = {"config": stored["config"], "summary": summarize(records),
                 "planned_questions": stored["config"]["n"],
                 "popularity": {m: accuracy_by_quartile(records, m)
                                for m in summarize(records)}}
    gate_eval = json.loads(gate.read_text()) if gate.is_file() else None
    if bench is None and gate_eval is None:
        raise FileNotFoundError(f"{directory} has neither config.json (rag-gates bench) nor "
                                "gate_eval.json (rag-gates eval-gate)")
    return bench, gate_eval


def write_report(run_dirs: Sequence[str | Path], out_dir: str | Path,
                 title: str = "rag-gates report") -> Path:
    """Write ``report.md`` and its PNGs to ``out_dir``; return the report's path."""
    require("matplotlib", "eval")
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"# {title}", ""]
    points: list[tuple[str, float, float]] = []
    gates: list[tuple[str, dict[str, Any]]] = []
    for raw in run_dirs:
        directory = Path(raw)
        bench, gate_eval = _load(directory)
        if bench is not None:
            cfg = bench["config"]
            done = min((int(s["questions"]) for s in bench["summary"].values()), default=0)
            partial = (f", partial: {done} of {bench['planned_questions']} questions"
                       if done < bench["planned_questions"] else "")
            lines.append(summary_markdown(
                bench["summary"], f"{cfg['dataset']} ({directory.name}): {cfg['retriever']}, "
                                  f"k={cfg['k']}, model {cfg['model']}{partial}"))
            for method, rows in bench["popularity"].items():
                if not rows:
                    continue
                lines += [f"{method} accuracy by s_pop quartile (Wikipedia page views of the "
                          "question's subject):", "",
                          "| quartile | s_pop range | n | accuracy |",
                          "| ---: | --- | ---: | ---: |"]
                lines += [f"| {r['quartile']} | {r['min']:.0f} - {r['max']:.0f} | "
                          f"{r['questions']} | {r['accuracy']:.1f} |" for r in rows]
                lines.append("")
            for method, s in bench["summary"].items():
                label = f"{method} [{cfg['dataset']}]" if len(run_dirs) > 1 else method
                points.append((label, s["retrievals_per_question"], s["accuracy"]))
        if gate_eval is not None:
            cfg = gate_eval["config"]
            label = f"{cfg['gate']} [{cfg['dataset']}]"
            gates.append((label, gate_eval))
            auc = gate_eval["auroc"]
            pop = gate_eval.get("popularity_spearman")
            chosen = gate_eval["calibrated"]
            lines += [f"### gate {cfg['gate']} on {cfg['dataset']} ({gate_eval['questions']} "
                      "questions)", "",
                      f"- AUROC for 'closed-book answer wrong': "
                      f"{'n/a' if auc is None else f'{auc:.3f}'}",
                      f"- closed-book accuracy {100 * gate_eval['closed_book_accuracy']:.1f}%, "
                      f"single retrieval {100 * gate_eval['single_retrieval_accuracy']:.1f}%",
                      f"- calibrated ({gate_eval['calibration']}) threshold "
                      f"{chosen['threshold']:.4g}: accuracy {100 * chosen['accuracy']:.1f}% at "
                      f"retrieval rate {100 * chosen['retrieval_rate']:.1f}%"]
            if pop is not None:
                lines.append(f"- Spearman correlation with PopQA s_pop: {pop:.3f}")
            lines.append("")

    if points or gates:
        fig, ax = plt.subplots(figsize=(7, 5))
        # Methods compete only within a dataset: one Pareto front per "[dataset]" label.
        groups: dict[str, list[tuple[str, float, float]]] = {}
        for p in points:
            groups.setdefault(p[0].rsplit("[", 1)[-1] if "[" in p[0] else "", []).append(p)
        fronts = [[p for p in g if p[0] in set(pareto_front(g))] for g in groups.values()]
        front = {p[0] for f in fronts for p in f}
        for name, cost, acc in points:
            on_front = name in front
            ax.scatter(cost, acc, s=70 if on_front else 40,
                       marker="*" if on_front else "o", zorder=3)
            ax.annotate(name, (cost, acc), textcoords="offset points", xytext=(5, 4),
                        fontsize=8)
        for i, members in enumerate(fronts):
            ordered = sorted(members, key=lambda p: p[1])
            ax.plot([p[1] for p in ordered], [p[2] for p in ordered], "k--", linewidth=0.8,
                    label="Pareto front (per dataset)" if i == 0 else None, zorder=2)
        for label, g in gates:
            curve = sorted(g["curve"], key=lambda p: p["retrieval_rate"])
            ax.plot([p["retrieval_rate"] for p in curve],
                    [100 * p["accuracy"] for p in curve], linewidth=1.2, label=f"gate {label}")
        ax.set_xlabel("retrievals per question")
        ax.set_ylabel("accuracy (%)")
        ax.set_title("accuracy against retrieval cost")
        ax.grid(alpha=0.3)
        if front or gates:
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "accuracy_vs_retrievals.png", dpi=120)
        plt.close(fig)
        lines += ["![accuracy against retrievals per question](accuracy_vs_retrievals.png)", ""]
    if gates:
        fig, ax = plt.subplots(figsize=(5, 5))
        for label, g in gates:
            roc = g["roc"]
            auc = g["auroc"]
            ax.plot([p[0] for p in roc], [p[1] for p in roc],
                    label=f"{label} (AUROC {'n/a' if auc is None else f'{auc:.3f}'})")
        ax.plot([0, 1], [0, 1], "k:", linewidth=0.8, label="chance")
        ax.set_xlabel("false positive rate")
        ax.set_ylabel("true positive rate")
        ax.set_title("gate ROC: closed-book answer wrong")
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "roc.png", dpi=120)
        plt.close(fig)
        lines += ["![ROC curves of the gates](roc.png)", ""]
    report = out / "report.md"
    report.write_text("\n".join(lines))
    return report
