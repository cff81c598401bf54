"""Curves over normalised step position (paper Fig. 4) or over training steps, and their PNGs.

All plotting lives here so every figure shares one look: modes keep the paper's
names and colours (BiPRM red, L2R green, R2L blue) and the x axis reads in percent.
"""

from __future__ import annotations

import numpy as np

NAMES = {
    "bi": "BiPRM",
    "bi-static": "BiPRM (static avg.)",
    "l2r": "L2R-PRM",
    "r2l": "R2L-PRM",
    "2xl2r": "2×L2R",
    "2xr2l": "2×R2L",
    "outcome": "outcome GRPO (answer correct)",
    "min": "GRPO on min step score (bi)",  # the RL study's arms
    "process-l2r": "process GRPO, l2r PRM",
    "process-bi": "process GRPO, bi PRM (fused)",
}
COLORS = {
    "bi": "tab:red",
    "bi-static": "tab:orange",
    "l2r": "tab:green",
    "r2l": "tab:blue",
    "2xl2r": "olive",
    "2xr2l": "tab:cyan",
    "outcome": "black",
    "min": "tab:purple",
    "process-l2r": "tab:green",
    "process-bi": "tab:red",
}  # the RL study's arms


def normalised_position(offsets: np.ndarray) -> np.ndarray:
    """(t + 0.5) / T for every flat step: the centre of step t's share of its trajectory."""
    lengths = np.diff(offsets)
    t = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
    return (t + 0.5) / np.repeat(lengths, lengths)


def position_curve(values: np.ndarray, offsets: np.ndarray, bins: int = 10) -> dict[str, list[float]]:
    """Mean of `values` in equal-width bins of normalised position; empty bins are None (JSON null).

    Short solutions leave bins empty: with 3 steps, positions fall in 3 of 10 bins."""
    pos = normalised_position(offsets)
    which = np.minimum((pos * bins).astype(int), bins - 1)
    counts = np.bincount(which, minlength=bins)
    sums = np.bincount(which, weights=values, minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = sums / counts
    centres = (np.arange(bins) + 0.5) / bins
    return {
        "position": centres.tolist(),
        "mean": [m if c else None for m, c in zip(mean.tolist(), counts)],
        "count": counts.tolist(),
    }


def plot_curves(
    path: str,
    curves: dict[str, dict],
    ylabel: str,
    title: str,
    vline: float | None = None,
    vline_label: str = "",
    hline: float | None = None,
    hline_label: str = "",
    ylim: tuple[float, float] | None = None,
) -> None:
    """One line per curve (keys may be mode names); `vline` is a position in [0, 1], `hline` a y value."""
    from matplotlib.ticker import PercentFormatter

    fig, ax = _axes()
    for name, curve in curves.items():
        y = np.array(curve["mean"], dtype=float)  # None -> NaN: empty bins are left out, the line joins the rest
        x = np.array(curve["position"]) * 100
        ax.plot(
            x[np.isfinite(y)], y[np.isfinite(y)], marker="o", ms=3, label=NAMES.get(name, name), color=COLORS.get(name)
        )
    if vline is not None and np.isfinite(vline):
        ax.axvline(vline * 100, ls="--", color="grey", label=vline_label)
    if hline is not None:
        ax.axhline(hline, ls=":", color="black", lw=1, label=hline_label)
    ax.set_xlim(0, 100)
    ax.xaxis.set_major_formatter(PercentFormatter(100))
    if ylim is not None:
        ax.set_ylim(*ylim)
    _save(fig, ax, path, "normalised step position", ylabel, title)


def figure(*args, **kwargs):
    """`plt.subplots(*args, **kwargs)` drawn off-screen (no display on a server or in CI)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*args, **kwargs)


def write_figure(fig, path, dpi: int = 120, **kwargs) -> None:
    """Lay the figure out, write it and free it (pyplot keeps every open figure)."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi, **kwargs)
    plt.close(fig)


def _axes():
    """A figure of the shared size."""
    return figure(figsize=(5.5, 3.8))


def _save(fig, ax, path: str, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    crowded = len(ax.get_legend_handles_labels()[0]) > 4  # beside the axes, where it hides no line
    ax.legend(fontsize=8, **(dict(loc="upper left", bbox_to_anchor=(1.01, 1)) if crowded else {}))
    write_figure(fig, path, bbox_inches="tight" if crowded else None)


def plot_mae_by_position(result: dict, path: str) -> None:
    """Fig. 4a from `biprm.analysis.mae_by_position`, the average error onset dashed."""
    onset = result["error_onset"]
    plot_curves(
        path,
        result["curves"],
        ylabel=r"MAE $|p_t - y_t|$",
        title="Step-wise MAE by position",
        vline=onset,
        vline_label=f"average error onset ({onset:.1%})",
    )


def plot_sigma_by_position(result: dict, path: str) -> None:
    """Fig. 4b from `biprm.analysis.sigma_by_position`: below 0.5 R2L dominates, above it L2R."""
    plot_curves(
        path,
        {"bi": result["curve"]},
        ylabel=r"mean gate $\sigma_t$ (weight on L2R)",
        title="Gate weight by step position",
        hline=0.5,
        hline_label="equal weight",
        ylim=(0.0, 1.0),
    )


def plot_steps(path: str, curves: dict[str, dict], ylabel: str, title: str) -> None:
    """One line per curve over training steps ({"step", "mean", "low", "high"}, fractions), its interval shaded."""
    from matplotlib.ticker import PercentFormatter

    fig, ax = _axes()
    for name, curve in curves.items():
        x, y = np.array(curve["step"]), np.array(curve["mean"]) * 100
        (line,) = ax.plot(x, y, marker="o", ms=3, label=NAMES.get(name, name), color=COLORS.get(name))
        ax.fill_between(
            x, np.array(curve["low"]) * 100, np.array(curve["high"]) * 100, color=line.get_color(), alpha=0.12
        )
    ax.yaxis.set_major_formatter(PercentFormatter(100))
    _save(fig, ax, path, "training step", ylabel, title)


def plot_intervals(path: str, panels: dict[str, dict[str, dict]], title: str, muted: tuple[str, ...] = ()) -> None:
    """Dot and whisker per scorer ({"mean", "low", "high"}, in %), one panel per endpoint, scorers top to bottom in
    order; scorers whose name starts with one of `muted` (the rules that read no model) in grey. A scorer a panel lacks
    is left out."""
    names = list(dict.fromkeys(n for cells in panels.values() for n in cells))
    fig, axes = figure(
        1, len(panels), figsize=(3.2 * len(panels) + 2.5, 0.32 * len(names) + 1.4), sharey=True, squeeze=False
    )
    y = np.arange(len(names))[::-1]
    for ax, (panel, cells) in zip(axes[0], panels.items()):
        for row, name in zip(y, names):
            if (c := cells.get(name)) is not None:
                colour = "grey" if name.startswith(muted) else COLORS.get(name, "black")
                ax.errorbar(
                    c["mean"],
                    row,
                    xerr=[[c["mean"] - c["low"]], [c["high"] - c["mean"]]],
                    fmt="o",
                    ms=4,
                    capsize=2,
                    color=colour,
                )
        ax.set_title(panel, fontsize=8)
        ax.set_xlabel("%")
        ax.grid(alpha=0.3)
    axes[0][0].set_yticks(y, names, fontsize=7)
    fig.suptitle(title, fontsize=9)
    write_figure(fig, path)


def line_styles(names: list[str]) -> list[dict]:
    """A distinct (colour, marker) per line: tab10 up to 10 lines, tab20 past them, then the marker; noise dashed."""
    import matplotlib

    palette = matplotlib.colormaps["tab10" if len(names) <= 10 else "tab20"]
    return [
        dict(
            color=palette(i % palette.N),
            marker="os^Dv"[i // palette.N % 5],
            ms=3,
            ls="--" if name.startswith("noise:") else "-",
        )
        for i, name in enumerate(names)
    ]


def plot_cost_curves(path: str, rows: list[dict]) -> None:
    """Search accuracy against generated tokens and against wall clock per question, one line per method over N
    (rows from `biprm.search.report.method_rows`, grouped by their "line"); noise-driven methods dashed."""
    lines: dict[str, list[dict]] = {}
    for r in rows:
        if "accuracy_mean" in r and not r["method"].startswith("pass@"):
            lines.setdefault(r["line"], []).append(r)
    fig, axes = figure(1, 2, figsize=(10, 4), sharey=True)
    for (name, points), style in zip(lines.items(), line_styles(list(lines))):
        tokens = [p["budget"].get("policy_tokens", 0) for p in points]
        seconds = [p["budget"].get("policy_s", 0) + p["budget"].get("prm_s", 0) for p in points]
        acc = [100 * p["accuracy_mean"] for p in points]
        for ax, x in zip(axes, (tokens, seconds)):
            ax.plot(x, acc, label=name, **style)
    for ax, label in zip(axes, ("policy tokens generated per question", "wall clock per question (s, policy + PRM)")):
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("accuracy (%)")
    if lines:
        axes[1].legend(fontsize=7, loc="best")
    write_figure(fig, path)
