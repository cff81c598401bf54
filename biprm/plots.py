"""Curves over normalised step position (paper Fig. 4) and their PNGs."""
from __future__ import annotations

import numpy as np


def normalised_position(offsets: np.ndarray) -> np.ndarray:
    """(t + 0.5) / T for every flat step: the centre of step t's share of its trajectory."""
    lengths = np.diff(offsets)
    t = np.arange(offsets[-1]) - np.repeat(offsets[:-1], lengths)
    return (t + 0.5) / np.repeat(lengths, lengths)


def position_curve(values: np.ndarray, offsets: np.ndarray, bins: int = 10) -> dict[str, list[float]]:
    """Mean of `values` in equal-width bins of normalised position; empty bins are NaN."""
    pos = normalised_position(offsets)
    which = np.minimum((pos * bins).astype(int), bins - 1)
    counts = np.bincount(which, minlength=bins)
    sums = np.bincount(which, weights=values, minlength=bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean = sums / counts
    centres = (np.arange(bins) + 0.5) / bins
    return {"position": centres.tolist(), "mean": mean.tolist(), "count": counts.tolist()}


def plot_curves(path: str, curves: dict[str, dict], ylabel: str, title: str, vline: float | None = None, vline_label: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for name, curve in curves.items():
        ax.plot(np.array(curve["position"]) * 100, curve["mean"], marker="o", ms=3, label=name)
    if vline is not None:
        ax.axvline(vline * 100, ls="--", color="grey", label=vline_label)
    ax.set_xlabel("normalised step position (%)")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
