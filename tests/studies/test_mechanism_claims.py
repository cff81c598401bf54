"""Every number in README.md's mechanism paragraph is read from the study's committed results (version 2's
results.json, version 3's power), so a rerun that moves a number fails here until the words change."""

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "studies" / "mechanism" / "results"
PRIMARY = "primary: F's step t below every step of C"
P1 = "P1: F rows, first error exact"
NUMBER = re.compile(r"(?<![\w×.])[−+-]?\d+(?:\.\d+)?")


def section() -> str:
    """README.md's mechanism paragraph: from its bold lead to the next bold lead."""
    text = (ROOT / "README.md").read_text()
    start = text.index("**The R2L stream")
    return text[start : text.index("\n**", start + 2)]


def signed(x: float) -> str:
    return f"{x:+.1f}".replace("-", "−")


def interval(d: dict) -> str:
    return f"{signed(d['mean'])} [{signed(d['low']).lstrip('+')}, {signed(d['high']).lstrip('+')}]"


def claims() -> list[str]:
    """The paragraph's numeric phrases, each written from the results files."""
    v2 = json.loads((RESULTS / "v2" / "results.json").read_text())
    power = json.loads((RESULTS / "v3_power.json").read_text())
    diff, table, post = v2["differences"], v2["table"], v2["post_hoc"]
    from studies.mechanism.v2_reread import sigma_trend

    rising = {k: post[k].values() for k in ("sigma_by_position", "sigma_by_position_without_template")}
    up = {k: sum(sigma_trend(v["spearman"]) == "rises" for v in runs) for k, runs in rising.items()}
    fuller = {k: sum(v["by_fifth"][0] < 0.5 < v["by_fifth"][-1] for v in runs) for k, runs in rising.items()}
    runs = len(post["sigma_by_position"])
    judged = power["power"][power["verdict_arm"]]
    shares = sorted((round(100 * p["power"]) for p in judged.values()), reverse=True)
    return [
        f"R2L beats L2R by {interval(diff[PRIMARY]['r2l − l2r'])}",
        f"L2R ({table['l2r'][PRIMARY]['mean']:.1f})",
        f"2×L2R ({table['2×L2R'][PRIMARY]['mean']:.1f})",
        f"({post['format_null']['mean']:.1f})",
        f"beats L2R ({interval(diff[PRIMARY]['bi-gate-lr0.1 − l2r'])})",
        f"does not ({interval(diff[PRIMARY]['bi − l2r'])})",
        f"on P1 ({interval(diff[P1]['bi − r2l'])})",
        f"({table['bi-static'][PRIMARY]['mean']:.1f} against {table['bi-gate-lr0.1'][PRIMARY]['mean']:.1f})",
        f"holds in {up['sigma_by_position']} of {runs} gated runs with the templated answer line",
        f"in {up['sigma_by_position_without_template']} of {runs} without it",
        f"in {fuller['sigma_by_position']} with the answer line and {fuller['sigma_by_position_without_template']} "
        "without",
        f"at its {power['planned']['seeds']} seeds and {power['planned']['questions']} test questions",
        f"({shares[0]} %)",
        f"the others {shares[1]}, {shares[2]} and {shares[3]} %",
    ]


def test_every_number_in_the_mechanism_paragraph_is_read_from_the_results():
    text = " ".join(section().split())
    missing = [c for c in claims() if c not in text]
    assert not missing, f"README.md's mechanism paragraph does not say: {missing}"
    for c in claims():
        text = text.replace(c, "")
    # what is left may hold only fixed words: the interval's level, σ's midpoint 0.5, the 80 % power target and
    # the Spearman that counts as rising (v2_reread.FLAT)
    left = [n for n in NUMBER.findall(text.replace("2×L2R", "")) if n not in ("97.5", "0.5", "80", "+0.1")]
    assert not left, f"numbers in README.md's mechanism paragraph that no results file backs: {left}"
