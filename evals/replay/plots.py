"""PNG plots of a run (per turn) and of a comparison (per run), with matplotlib's Agg backend
(no display needed; matplotlib==3.11.2, the test extra).

Per run: ``ttft.png`` (TTFT per turn, s), ``decode_tps.png`` (decode tok/s per turn),
``reuse.png`` (reused / prompt tokens per turn). Turns are on the x axis in plan order; failed
turns and turns without the quantity are left out. Comparison: ``compare.png``, one bar group
per metric (mean TTFT, mean decode tok/s, reuse ratio), one bar per run.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)
from matplotlib.ticker import MaxNLocator  # noqa: E402

PER_TURN = (
    ("ttft.png", "ttft_s", "TTFT (s)"),
    ("decode_tps.png", "decode_tps", "decode tok/s"),
    ("reuse.png", None, "reused / prompt tokens"),
)


def _per_turn(records: list[dict], field: str | None) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in records:
        if r["error"] is not None:
            continue
        if field is None:
            if r["prompt_tokens"] and r["reused_tokens"] is not None:
                xs.append(r["index"])
                ys.append(r["reused_tokens"] / r["prompt_tokens"])
        elif r[field] is not None:
            xs.append(r["index"])
            ys.append(r[field])
    return xs, ys


def turn_figure(xs: list[int], ys: list[float], ylabel: str, title: str, unit_range: bool = False):
    """A bar chart of one quantity per turn (x: turn index in plan order, integer ticks only;
    ``unit_range``: y from 0 to 1); returns the matplotlib figure (the caller saves and closes
    it)."""
    fig, ax = plt.subplots(figsize=(8, 3.5))
    ax.bar(xs, ys, color="tab:blue")
    ax.set_xlabel("turn (plan order)")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title}: {ylabel}")
    if unit_range:
        ax.set_ylim(0, 1)
    if not xs:
        ax.text(0.5, 0.5, "no data", transform=ax.transAxes, ha="center")
    fig.subplots_adjust(left=0.09, right=0.98, bottom=0.15, top=0.9)
    return fig


def plot_run(out: Path, records: list[dict], title: str) -> list[Path]:
    """Write the three per-turn plots under ``out``; returns their paths."""
    paths = []
    for name, field, ylabel in PER_TURN:
        xs, ys = _per_turn(records, field)
        fig = turn_figure(xs, ys, ylabel, title, unit_range=field is None)
        fig.savefig(out / name, dpi=90)
        plt.close(fig)
        paths.append(out / name)
    return paths


def compare_figure(summaries: list[dict], labels: list[str] | None = None):
    """The figure of :func:`plot_compare` (the caller saves and closes it): a panel per metric
    (mean TTFT, mean decode tok/s, reuse ratio), a bar per run labelled exactly as in the
    comparison table (``labels``: the unique labels of ``comparison.unique_labels``; default: the
    summaries' ``label``); missing values are drawn as 0 and marked ``n/a``.

    Raises:
        ValueError: ``labels`` given with another length than ``summaries``.
    """
    metrics = (("ttft_mean_s", "mean TTFT (s)"), ("decode_tps_mean", "decode tok/s (mean)"),
               ("reuse_ratio", "reuse ratio"))
    labels = list(labels) if labels is not None else [str(s["label"]) for s in summaries]
    if len(labels) != len(summaries):
        raise ValueError(f"{len(labels)} labels for {len(summaries)} runs")
    fig, axes = plt.subplots(1, len(metrics), figsize=(4 * len(metrics), 3.2))
    for ax, (key, title) in zip(axes, metrics):
        values = [s.get(key) for s in summaries]
        bars = ax.bar(range(len(values)), [v or 0 for v in values],
                      color=[f"C{i}" for i in range(len(values))])
        for bar, value in zip(bars, values):
            ax.annotate("n/a" if value is None else f"{value:.3g}",
                        (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                        ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(values)), labels, rotation=20, ha="right", fontsize=8)
        ax.set_title(title)
    fig.subplots_adjust(left=0.06, right=0.98, bottom=0.24, top=0.9, wspace=0.3)
    return fig


def plot_compare(path: Path, summaries: list[dict], labels: list[str] | None = None) -> Path:
    """Write :func:`compare_figure` to ``path`` (PNG); returns ``path``.

    Raises:
        ValueError: see :func:`compare_figure`.
    """
    fig = compare_figure(summaries, labels)
    try:
        fig.savefig(path, dpi=90)
    finally:
        plt.close(fig)
    return path
