"""questions.jsonl -> the summary table (accuracy with 95 % intervals, cost per question) and the cost plot.

Rows come per N: pass@N (the ceiling), majority vote and random pick over the same
samples, then each PRM-driven method followed by the same method driven by noise. A
PRM row's "vs noise" is the paired difference to its noise twin on the same questions:
an interval that holds 0 means the search learned nothing from the PRM there.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from biprm.metrics.bootstrap import bootstrap_mean, paired_difference

BASELINES = ("pass", "majority", "random")


def family(method: str) -> str:
    """"beam/fused@4" -> "beam/fused"."""
    return method.rsplit("@", 1)[0]


def noise_twin(method: str) -> str | None:
    """The noise-driven run of a PRM method ("beam/l2r@4" -> "noise:beam@4", "bon-max/fused@4" -> "noise:bon-max@4")."""
    if method.startswith("noise:") or family(method) in BASELINES or family(method).startswith("bon-vote"):
        return None
    return f"noise:{method.split('/')[0]}@{method.rsplit('@', 1)[1]}"


def ordered(methods: list[str]) -> list[str]:
    """Per N: baselines, then each PRM method with its noise twin right under it."""
    def key(m: str) -> tuple:
        n, fam = int(m.rsplit("@", 1)[1]), family(m)
        base = fam.removeprefix("noise:")
        return (n, BASELINES.index(fam) if fam in BASELINES else len(BASELINES), re.split(r"/", base)[0], fam.startswith("noise:"), fam)
    return sorted(methods, key=key)


def method_rows(records: list[dict], seed: int = 0) -> list[dict]:
    """One row per method: accuracy over the questions it could grade, its interval, unknowns, mean cost per question."""
    names = ordered(list(dict.fromkeys(m for r in records for m in r["methods"])))
    correct = {m: np.array([np.nan if (v := r["methods"][m]["correct"]) is None else float(v) for r in records]) for m in names}
    rows = []
    for m in names:
        known = ~np.isnan(correct[m])
        row = {"method": m, "questions": int(known.sum()), "unknown": int((~known).sum())}
        if known.any():
            row |= {f"accuracy_{k}": v for k, v in bootstrap_mean(correct[m][known], seed=seed).items()}
        twin = noise_twin(m)
        if twin in correct:
            both = known & ~np.isnan(correct[twin])
            if both.any():
                row["vs_noise"] = paired_difference(correct[m][both], correct[twin][both], seed=seed)
        budgets = [r["methods"][m]["budget"] for r in records]
        row["budget"] = {k: float(np.mean([b.get(k, 0.0) for b in budgets])) for k in sorted({k for b in budgets for k in b})}
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    """The markdown table `biprm search` prints and writes to summary.md."""
    streams = sorted({k.removeprefix("prm_tokens_") for r in rows for k in r["budget"] if k.startswith("prm_tokens_")})
    head = ["method", "accuracy % [95% CI]", "vs noise (pts) [95% CI]", "unknown", "policy tok/q", f"PRM tok/q ({' / '.join(streams) or '-'})",
            "calls/q policy / PRM", "wall s/q policy / PRM"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        b = r["budget"]
        acc = f"{100 * r['accuracy_mean']:.1f} [{100 * r['accuracy_low']:.1f}, {100 * r['accuracy_high']:.1f}]" if "accuracy_mean" in r else "-"
        d = r.get("vs_noise")
        vs = f"{100 * d['mean']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]{' (noise)' if d['within_noise'] else ''}" if d else ""
        prm = " / ".join(f"{b.get(f'prm_tokens_{s}', 0):.0f}" for s in streams) or "0"
        cells = [r["method"], acc, vs, str(r["unknown"]), f"{b.get('policy_tokens', 0):.0f}", prm,
                 f"{b.get('policy_calls', 0):.1f} / {b.get('prm_calls', 0):.1f}", f"{b.get('policy_s', 0):.2f} / {b.get('prm_s', 0):.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def summarize(out: Path, seed: int = 0) -> str:
    """Read questions.jsonl; write summary.md, summary.json and accuracy.png; return the table with its totals."""
    from biprm.analysis.plots import plot_cost_curves

    records = [json.loads(line) for line in (Path(out) / "questions.jsonl").read_text().splitlines() if line]
    if not records:
        raise ValueError(f"{out}/questions.jsonl holds no question yet")
    rows = method_rows(records, seed)
    total = {k: sum(r["budget"].get(k, 0.0) for r in records) for k in {k for r in records for k in r["budget"]}}
    text = (f"{len(records)} questions; accuracy over the questions graded (a grade that timed out is unknown); "
            f"'(noise)': the interval holds 0.\n\n{table(rows)}\n\nthe run's whole cost (the pool once, every search): "
            + ", ".join(f"{k} {v:.1f}" for k, v in sorted(total.items())) + "\n")
    Path(out, "summary.md").write_text(text)
    Path(out, "summary.json").write_text(json.dumps({"questions": len(records), "rows": rows, "total": total}, indent=1))
    plot_cost_curves(str(Path(out, "accuracy.png")), rows)
    return text
