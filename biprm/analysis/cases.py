"""Case studies as in the paper: every step of a few items with its label and each PRM's probability.

Columns: the label, the fused probability of every mode, then the streams of the
bidirectional mode `bi` (L2R, R2L and the gate σ, its weight on L2R), as the paper's
tables show them. The first wrong step is highlighted (bold in Markdown, red in HTML).

`pick_cases` rule, on erroneous items only, read at the first wrong step f from the `bi`
scores (fused p, L2R stream l, R2L stream r), ties to the lower index:
- successes: p(f) < 0.5 (BiPRM flags the error), largest l(f) − p(f) first: where the
  forward view alone is fooled most and the fusion still gets it right;
- failures: r(f) >= 0.5 (the backward view misses the error), largest r(f) − l(f) first;
take the top k − 1 successes (at least one), then the top failure, and fill up to k with
the remaining successes, then failures.
"""

from __future__ import annotations

import html
from collections.abc import Sequence

import numpy as np

from biprm.analysis.common import first_errors, markdown_table
from biprm.analysis.plots import NAMES
from biprm.data.trajectory import Trajectory
from biprm.scoring.step_scores import StepScores

STREAM_COLUMNS = (("L2R", "l2r"), ("R2L", "r2l"), ("σ", "sigma"))
STYLE = """body{font-family:system-ui,sans-serif;max-width:64em;margin:2em auto;line-height:1.45}
table{border-collapse:collapse;width:100%;margin:1em 0 2.5em}
th,td{border-bottom:1px solid #ddd;padding:.35em .6em;vertical-align:top;text-align:left}
td.num,th.num{text-align:right;font-variant-numeric:tabular-nums}
td.text{white-space:pre-wrap}
tr.first-error td{background:#fdecea}tr.first-error td.step{color:#b00020;font-weight:bold}"""


def pick_cases(trajs: Sequence[Trajectory], scores: dict[str, StepScores], k: int = 3, bi: str = "bi") -> list[int]:
    """Indices of k informative erroneous items, by the rule in the module docstring."""
    s = scores[bi]
    if s.l2r is None or s.r2l is None:
        raise ValueError(f"mode {bi!r} has no L2R/R2L stream scores to compare")
    first = first_errors(trajs)
    wrong = np.flatnonzero((first >= 0) & (first < np.diff(s.offsets)))
    at = s.offsets[wrong] + first[wrong]
    p, l2r, r2l = s.prob()[at], s.prob("l2r")[at], s.prob("r2l")[at]
    flagged, missed = p < 0.5, r2l >= 0.5
    success = wrong[flagged][np.argsort(-(l2r - p)[flagged], kind="stable")].tolist()
    failure = wrong[missed][np.argsort(-(r2l - l2r)[missed], kind="stable")].tolist()
    order = success[: max(k - 1, 1)] + failure[:1] + success + failure
    return list(dict.fromkeys(order))[:k]


def _columns(scores: dict[str, StepScores], bi: str) -> list[tuple[str, StepScores, str]]:
    """(header, scores, stream) of every probability column."""
    cols = [(NAMES.get(mode, mode), s, "fused") for mode, s in scores.items()]
    if bi in scores:
        name = NAMES.get(bi, bi)
        cols += [
            (f"{name}: {head}", scores[bi], stream)
            for head, stream in STREAM_COLUMNS
            if getattr(scores[bi], stream) is not None
        ]
    return cols


def _case(traj: Trajectory, i: int, cols: list[tuple[str, StepScores, str]]) -> dict:
    """One item as plain strings: headline, question, and rows (step, text, label, values, is_first_error)."""
    first = traj.first_error if traj.labels is not None else None
    values = [s.of(i, stream) for _, s, stream in cols]
    rows = [
        (
            f"Step {t + 1}",
            text,
            "" if traj.labels is None else f"{traj.labels[t]:g}",
            [f"{v[t]:.2f}" if t < len(v) else "–" for v in values],
            t == first,
        )
        for t, text in enumerate(traj.steps)
    ]
    where = f" (subset {traj.meta['subset']})" if "subset" in traj.meta else ""
    verdict = "unlabelled" if first is None else "no wrong step" if first < 0 else f"first error at step {first + 1}"
    return {"title": f"item {i}{where}, {verdict}", "question": traj.question, "rows": rows}


def _markdown(n: int, case: dict, heads: list[str]) -> str:
    cell = lambda text: text.replace("|", "\\|").replace("\n", "<br>")  # noqa: E731
    rows = [
        [f"**{step} (first error)**" if bad else step, f"**{cell(text)}**" if bad else cell(text), label, *vals]
        for step, text, label, vals, bad in case["rows"]
    ]
    table = markdown_table(["Step", "Text", "Label", *heads], rows, left=2)
    return f"## Case {n}: {case['title']}\n\n**Question:** {case['question']}\n\n{table}\n"


def _html(n: int, case: dict, heads: list[str]) -> str:
    e = html.escape
    head = "".join(f'<th class="num">{e(h)}</th>' for h in ["Label", *heads])
    mark = {True: ' class="first-error"', False: ""}
    body = "".join(
        f'<tr{mark[bad]}><td class="step">{e(step)}</td><td class="text">{e(text)}</td>'
        + "".join(f'<td class="num">{e(v)}</td>' for v in [label, *vals])
        + "</tr>\n"
        for step, text, label, vals, bad in case["rows"]
    )
    return (
        f"<h2>Case {n}: {e(case['title'])}</h2>\n<p><b>Question:</b> {e(case['question'])}</p>\n"
        f"<table>\n<tr><th>Step</th><th>Text</th>{head}</tr>\n{body}</table>\n"
    )


def case_studies(
    trajs: Sequence[Trajectory], scores: dict[str, StepScores], indices: Sequence[int], bi: str = "bi"
) -> tuple[str, str]:
    """(Markdown, standalone HTML page) with one step table per item of `indices`."""
    cols = _columns(scores, bi)
    heads = [h for h, _, _ in cols]
    cases = [_case(trajs[i], i, cols) for i in indices]
    md = "\n".join(_markdown(n, c, heads) for n, c in enumerate(cases, 1))
    sections = "".join(_html(n, c, heads) for n, c in enumerate(cases, 1))
    page = (
        f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>BiPRM case studies</title>'
        f"<style>{STYLE}</style></head>\n<body>\n<h1>BiPRM case studies</h1>\n{sections}</body></html>\n"
    )
    return md, page
