"""Plots of benchmark results as PNG: matplotlib on the Agg backend, imported only when a plot is drawn.

- :func:`grouped_bars`: one group of bars per scenario, one bar per system (or series), labelled values,
  an optional target line, an optional log axis; :func:`system_series` picks the figures of every system.
- :func:`label_bars`: a value over each bar of a plain bar chart.
- :func:`machine_title` says which machine produced the figures; :func:`save_figure` writes
  ``<results>/<name>.png``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from .results import results_dir

SYSTEM_COLORS = {"fanout": "#1f77b4", "mosquitto": "#2ca02c", "amqtt": "#ff7f0e", "redis": "#d62728", "nats": "#9467bd"}


def pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def system_series(systems: dict[str, dict[str, Any]], keys: Sequence[str],
                  scale: float = 1.0) -> dict[str, list[float | None]]:
    """Per system, its figures ``keys`` times ``scale`` (None where a figure is missing or not a number)."""
    return {system: [f.get(k) * scale if isinstance(f.get(k), (int, float)) else None for k in keys]
            for system, f in systems.items()}


def grouped_bars(ax: Any, groups: Sequence[str], series: dict[str, Sequence[float | None]], *,
                 ylabel: str, title: str, target: float | None = None, target_label: str = "target",
                 fmt: str = "{:,.0f}", log: bool = False) -> None:
    """Draw one group of bars per entry of ``groups``, one bar per series (system) in each group.

    Missing values (None) leave a gap labelled ``n/a``. ``target`` draws a dashed horizontal line;
    ``log`` uses a logarithmic y axis (for peers that differ by orders of magnitude).
    """
    n = max(len(series), 1)
    width = 0.8 / n
    for i, (label, values) in enumerate(series.items()):
        xs = [g + (i - (n - 1) / 2) * width for g in range(len(groups))]
        heights = [v if v is not None and v > 0 else (float("nan") if log else 0.0) for v in values]
        bars = ax.bar(xs, heights, width, label=label, color=SYSTEM_COLORS.get(label))
        for bar, v in zip(bars, values):
            text = "n/a" if v is None else fmt.format(v)
            y = bar.get_height() if v is not None and v > 0 else (1.0 if log else 0.0)
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, y), ha="center",
                        va="bottom", fontsize=7, xytext=(0, 2), textcoords="offset points")
    if target is not None:
        ax.axhline(target, color="red", linestyle="--", linewidth=1, label=target_label)
    if log:
        ax.set_yscale("log")
    ax.set_xticks(range(len(groups)))
    ax.set_xticklabels(groups, fontsize=8)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.margins(y=0.25 if log else 0.15)
    ax.legend(fontsize=7)


def label_bars(ax: Any, bars: Any, labels: Sequence[str], fontsize: float = 8) -> None:
    """Write ``labels[i]`` centred over bar ``i``."""
    for bar, text in zip(bars, labels):
        ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), ha="center", va="bottom",
                    fontsize=fontsize)


def machine_title(fig: Any, result: dict[str, Any], name: str, shared: str) -> None:
    """``<name> (<mode>) - <CPU model>, <n> CPUs; <shared>`` over the figure (``shared``: who else ran there)."""
    m = result["machine"]
    fig.suptitle(f"{name} ({result['mode']}) - {m['cpu_model']}, {m['logical_cpus']} CPUs; {shared}", fontsize=10)


def save_figure(fig: Any, name: str, out_dir: str | Path | None = None) -> Path:
    """Save ``fig`` as ``<results>/<name>.png`` and close it. Returns the path."""
    path = results_dir(out_dir) / f"{name}.png"
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    pyplot().close(fig)
    return path
