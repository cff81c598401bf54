"""questions.jsonl -> the summary table (accuracy with 95 % intervals, cost per question) and the cost plot.

Rows come per N: pass@N (the pool ceiling: some one of the pool's N samples is right; a tree
search draws other paths and can beat it), majority vote and random pick over the same
samples, then each PRM-driven method (every PRM's row side by side) followed by the same
method driven by noise. A PRM row's "vs noise" is the paired difference to its noise twin
on the same questions: an interval that holds 0 means the search learned nothing from the
PRM there. Every method but the baselines has a "vs majority": its paired difference to majority
vote over the same number of samples, the bar a verifier has to clear to be worth its cost. With exactly
two PRMs a second table gives each method's paired difference between them, on the same
pool and questions. "right by fallback" counts the questions a row has right only through an answer read
as the text's last number, with no answer marker (biprm.evaluation.grading.read_answer): GSM8K's convention, but a
path cut off mid-solution has a last number too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from biprm.metrics.bootstrap import bootstrap_mean, paired_difference

BASELINES = ("pass", "majority", "random")
NAME = re.compile(r"(?P<base>.+)@(?P<n>\d+)(?: \[(?P<prm>[^\]]+)\])?")


def method_name(base: str, n: int, prm: str | None = None) -> str:
    """("beam/fused", 4, "bi") -> "beam/fused@4 [bi]"; `prm` is None for baselines, noise twins and a run with one
    PRM."""
    return f"{base}@{n}" + (f" [{prm}]" if prm else "")


def parts(method: str) -> tuple[str, int, str | None]:
    """ "beam/fused@4 [bi]" -> ("beam/fused", 4, "bi"): what `method_name` joined."""
    m = NAME.fullmatch(method)
    return m["base"], int(m["n"]), m["prm"]


def family(method: str) -> str:
    """ "beam/fused@4 [bi]" -> "beam/fused [bi]": the method over every N, one line of the plot."""
    base, _, prm = parts(method)
    return f"{base} [{prm}]" if prm else base


def noise_twin(method: str) -> str | None:
    """The noise-driven run of a PRM method ("beam/l2r@4 [bi]" -> "noise:beam@4", "bon-max/fused@4" ->
    "noise:bon-max@4")."""
    base, n, _ = parts(method)
    if base.startswith("noise:") or base in BASELINES or base.startswith("bon-vote"):
        return None
    return method_name(f"noise:{base.split('/')[0]}", n)


def ordered(methods: list[str]) -> list[str]:
    """Per N: baselines, then each PRM method (its PRMs in the order given, the sort being stable) with its noise twin
    right under it."""

    def key(m: str) -> tuple:
        base, n, _ = parts(m)
        plain = base.removeprefix("noise:")
        return (
            n,
            BASELINES.index(base) if base in BASELINES else len(BASELINES),
            plain.split("/")[0],
            base.startswith("noise:"),
            base,
        )

    return sorted(methods, key=key)


def graded(records: list[dict], method: str) -> np.ndarray:
    """Per question 1.0 (right), 0.0 (wrong) or NaN (the grade timed out: unknown)."""
    return np.array([np.nan if (v := r["methods"][method]["correct"]) is None else float(v) for r in records])


def how_read(record: dict, method: str) -> str | None:
    """How a method's answer to a question was read (marked or fallback: biprm.evaluation.grading.read_answer), as its
    record says, else read again from its text (records written before they said); pass@N's is "marked" when a marked
    sample is right."""
    from biprm.evaluation.grading import read_answer

    m = record["methods"][method]
    if "read" in m:
        return m["read"]
    if "solution" in m:
        return read_answer(m["solution"])[1]
    right = [p for p in record.get("pool", [])[: parts(method)[1]] if p["correct"]]  # a hand-made record may hold none
    reads = [p["read"] if "read" in p else read_answer("\n".join(p["steps"]))[1] for p in right]
    return "marked" if "marked" in reads else "fallback" if right else None


def paired(a: np.ndarray, b: np.ndarray, seed: int) -> dict | None:
    """mean(a) - mean(b) with its interval, over the questions graded in both; None if there is none."""
    both = ~np.isnan(a) & ~np.isnan(b)
    return paired_difference(a[both], b[both], seed=seed) | {"questions": int(both.sum())} if both.any() else None


def method_rows(records: list[dict], seed: int = 0) -> list[dict]:
    """One row per method: accuracy over the questions it could grade, its interval, unknowns, mean cost per
    question."""
    names = ordered(list(dict.fromkeys(m for r in records for m in r["methods"])))
    correct = {m: graded(records, m) for m in names}
    rows = []
    for m in names:
        known = ~np.isnan(correct[m])
        row = {"method": m, "line": family(m), "questions": int(known.sum()), "unknown": int((~known).sum())}
        by_fallback = np.array([correct[m][i] == 1 and how_read(r, m) == "fallback" for i, r in enumerate(records)])
        row["right_by_fallback"] = int(by_fallback.sum())
        if known.any():
            row["accuracy_marked"] = float(np.mean(correct[m][known] * ~by_fallback[known]))
        if known.any():
            row |= {f"accuracy_{k}": v for k, v in bootstrap_mean(correct[m][known], seed=seed).items()}
        if (twin := noise_twin(m)) in correct and (d := paired(correct[m], correct[twin], seed)):
            row["vs_noise"] = d
        base, n, _ = parts(m)
        if (
            base not in BASELINES
            and (majority := method_name("majority", n)) in correct
            and (d := paired(correct[m], correct[majority], seed))
        ):
            row["vs_majority"] = d
        budgets = [r["methods"][m]["budget"] for r in records]
        row["budget"] = {
            k: float(np.mean([b.get(k, 0.0) for b in budgets])) for k in sorted({k for b in budgets for k in b})
        }
        rows.append(row)
    return rows


def prm_differences(records: list[dict], seed: int = 0) -> list[dict]:
    """With exactly two PRMs, each method's paired difference: the second's accuracy minus the first's, in --prm's order
    (the order a run writes their methods in)."""
    names = list(dict.fromkeys(m for r in records for m in r["methods"]))
    prms = list(dict.fromkeys(prm for m in names if (prm := parts(m)[2])))
    names = ordered(names)
    if len(prms) != 2:
        return []
    rows = []
    for m in names:
        base, n, prm = parts(m)
        if (
            prm == prms[1]
            and (other := method_name(base, n, prms[0])) in names
            and (d := paired(graded(records, m), graded(records, other), seed))
        ):
            rows.append({"method": method_name(base, n), "difference": f"{prms[1]} - {prms[0]}", **d})
    return rows


def points(d: dict) -> str:
    """A difference in accuracy points with its interval."""
    return f"{100 * d['mean']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]"


def table(rows: list[dict]) -> str:
    """The markdown table `biprm search` prints and writes to summary.md."""
    streams = sorted({k.removeprefix("prm_tokens_") for r in rows for k in r["budget"] if k.startswith("prm_tokens_")})
    head = [
        "method",
        "accuracy % [95% CI]",
        "vs noise (pts) [95% CI]",
        "vs majority (pts) [95% CI]",
        "unknown",
        "policy tok/q",
        f"PRM tok/q ({' / '.join(streams) or '-'})",
        "calls/q policy / PRM",
        "wall s/q policy / PRM",
        "marked only % (right by fallback)",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        b = r["budget"]
        acc = (
            f"{100 * r['accuracy_mean']:.1f} [{100 * r['accuracy_low']:.1f}, {100 * r['accuracy_high']:.1f}]"
            if "accuracy_mean" in r
            else "-"
        )
        d, m = r.get("vs_noise"), r.get("vs_majority")
        vs = f"{points(d)}{' (noise)' if d['within_noise'] else ''}" if d else ""
        vs_majority = f"{points(m)}{' (tie)' if m['within_noise'] else ''}" if m else ""
        prm = " / ".join(f"{b.get(f'prm_tokens_{s}', 0):.0f}" for s in streams) or "0"
        name = f"{r['method']} (pool ceiling)" if parts(r["method"])[0] == "pass" else r["method"]
        cells = [
            name,
            acc,
            vs,
            vs_majority,
            str(r["unknown"]),
            f"{b.get('policy_tokens', 0):.0f}",
            prm,
            f"{b.get('policy_calls', 0):.1f} / {b.get('prm_calls', 0):.1f}",
            f"{b.get('policy_s', 0):.2f} / {b.get('prm_s', 0):.2f}",
            f"{100 * r['accuracy_marked']:.1f} ({r['right_by_fallback']})" if "accuracy_marked" in r else "-",
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def difference_table(rows: list[dict]) -> str:
    """The two PRMs' paired differences, one line per method; '(tie)' where the interval holds 0."""
    lines = [f"| method | {rows[0]['difference']} (pts) [95% CI] | questions |", "|---|---|---|"]
    lines += [
        f"| {r['method']} | {points(r)}{' (tie)' if r['within_noise'] else ''} | {r['questions']} |" for r in rows
    ]
    return "\n".join(lines)


def summarize(out: Path, seed: int = 0) -> str:
    """Read questions.jsonl; write summary.md, summary.json and accuracy.png; return the table with its totals."""
    from biprm.analysis.plots import plot_cost_curves

    records = [json.loads(line) for line in (Path(out) / "questions.jsonl").read_text().splitlines() if line]
    if not records:
        raise ValueError(f"{out}/questions.jsonl holds no question yet")
    rows, differences = method_rows(records, seed), prm_differences(records, seed)
    keys = sorted({k for r in records for k in r["budget"]})  # sorted: summary.json is the same bytes on every run
    total = {k: sum(r["budget"].get(k, 0.0) for r in records) for k in keys}
    text = (
        f"{len(records)} questions; accuracy over the questions graded (a grade that timed out is unknown); '(noise)', "
        "'(tie)': the interval holds 0; marked only: accuracy counting only answers with a marker (box, 'The answer "
        f"is', ####), beside the questions right only through the text's last number.\n\n{table(rows)}\n\nthe run's "
        "whole cost (the pool once, every search): "
        + ", ".join(f"{k} {v:.1f}" for k, v in sorted(total.items()))
        + "\n"
    )
    if differences:
        text += (
            "\nthe two PRMs on the same pool and questions, paired; '(tie)': the interval holds "
            f"0.\n\n{difference_table(differences)}\n"
        )
    Path(out, "summary.md").write_text(text)
    Path(out, "summary.json").write_text(
        json.dumps({"questions": len(records), "rows": rows, "prm_differences": differences, "total": total}, indent=1)
    )
    plot_cost_curves(str(Path(out, "accuracy.png")), rows)
    return text
