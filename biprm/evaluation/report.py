"""Markdown for the analyses that `biprm.analysis` returns as data only."""

from __future__ import annotations

from biprm.analysis.common import markdown_table
from biprm.evaluation.outputs import fmt


def format_long_chain(result: dict, metric: str, what: str) -> str:
    """Full set -> long subset per mode; `metric` is "mean" (BoN results) or "average_f1" (ProcessBench)."""
    rows = [
        [mode, fmt(full[metric]), fmt(result["long"][mode][metric]), fmt(result["relative_drop"][mode])]
        for mode, full in result["full"].items()
    ]
    head = (
        f"Long subset: {result['n_long']} of {result['n_full']} {what} longer than {result['threshold']} tokens; "
        f"average length {fmt(result['avg_len_full'], 0)} → {fmt(result['avg_len_long'], 0)} tokens.\n\n"
    )
    return head + markdown_table(["mode", "full", f"> {result['threshold']} tokens", "relative drop %"], rows)


def format_curves(curves: dict[str, dict], digits: int = 3) -> str:
    """One row per curve, one column per position bin (as in Fig. 4), then the overall mean."""
    first = next(iter(curves.values()))
    width = 100 / len(first["position"])
    bins = [f"{round(i * width)}–{round((i + 1) * width)}%" for i in range(len(first["position"]))]
    rows = [[name, *(fmt(v, digits) for v in c["mean"]), fmt(c["overall"], digits)] for name, c in curves.items()]
    return markdown_table(["mode", *bins, "overall"], rows)
