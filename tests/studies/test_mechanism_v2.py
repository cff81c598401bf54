"""The mechanism study's version 2: its labels, loss floors, the scorers that read no model, its endpoints,
the verdict rule, and the study end to end at toy size."""

import json
import math
import random
from decimal import Decimal
from pathlib import Path

import numpy as np
import pytest

from biprm.data.trajectory import Trajectory
from studies.mechanism.rows import quadruple, roundness, row_labels
from studies.mechanism import v2
from biprm.scoring.step_scores import StepScores
from test_mechanism import natalia


def test_each_step_is_labelled_by_whether_it_is_itself_correct():
    rows = {r.meta["kind"]: r for r in quadruple(natalia(), random.Random(0), labels="own", keep_roundness=True)}
    assert rows["R"].labels == rows["C"].labels == [1.0, 1.0, 1.0]
    assert rows["F"].labels == [0.0, 1.0, 1.0]  # the later steps use the right value and reach the right answer
    assert rows["L"].labels == [0.0, 0.0, 0.0]  # the slip is carried into every later result
    assert row_labels("F", 1, 4, "own") == [1.0, 0.0, 1.0, 1.0] and row_labels("F", 1, 4, "first-error") == [
        1.0,
        0.0,
        0.0,
        0.0,
    ]
    assert roundness(Decimal(rows["F"].meta["to"])) == roundness(Decimal("24"))


@pytest.mark.parametrize(
    "value,expected",
    [
        ("24", (0, 0, False)),
        ("150", (0, 1, True)),
        ("12.5", (1, 0, True)),
        ("2000", (0, 3, False)),
        ("0.75", (2, 0, True)),
        ("25.00", (0, 0, True)),
    ],
)
def test_roundness_class(value, expected):
    assert roundness(Decimal(value)) == expected


def test_a_wrong_value_keeps_the_right_values_roundness():
    for seed in range(20):
        rows = quadruple(natalia(), random.Random(seed), keep_roundness=True)
        assert roundness(Decimal(rows[2].meta["to"])) == (0, 0, False)  # 24: two digits, not ending in 0 or 5


def toy_rows(labels: str = "own") -> list[Trajectory]:
    """One question's four rows, error at step 0: "x = 2" is right, 4 wrong; step 1 reuses x."""
    text = {
        "R": ["x = 1+1 = 2", "y = 2+3 = 5"],
        "C": ["x = 2", "y = 2+3 = 5"],
        "F": ["x = 4", "y = 2+3 = 5"],
        "L": ["x = 1+1 = 4", "y = 4+3 = 7"],
    }
    return [
        Trajectory(
            "q", steps, labels=row_labels(kind, 0, 2, labels), meta={"kind": kind, "step": 0, "from": "2", "to": "4"}
        )
        for kind, steps in text.items()
    ]


def test_loss_floors_from_what_each_stream_reads():
    h = lambda p: -(p * math.log(p) + (1 - p) * math.log(1 - p))  # noqa: E731
    # L2R reads "x = <value>" at step 0 of both C (1) and F (0): it cannot tell them; R2L reads step 1 first
    assert v2.loss_floor(toy_rows("own"), "l2r") == pytest.approx(2 * h(0.5) / 8)
    assert v2.loss_floor(toy_rows("own"), "r2l") == 0.0
    assert v2.loss_floor(toy_rows("own"), "bi") == 0.0
    # version 1's labels: F's step 1 is 0, yet R2L reads there what it reads in R and C, both 1
    assert v2.loss_floor(toy_rows("first-error"), "r2l") == pytest.approx(3 * h(1 / 3) / 8)


def test_the_rules_that_read_text():
    trajs = [Trajectory("q", ["x = 2", "so 150 apples", "cost 12.5", "The answer is 5."], labels=[1.0] * 4)]
    assert v2.format_rule(trajs).fused.tolist() == [1.0, -1.0, -1.0, 1.0]  # the final step is exempt
    assert v2.rounder_number_rule(trajs).fused.tolist() == [
        0.0,
        3.0,
        0.0,
        1.0,
    ]  # 2·zeros + (last digit 5) − decimal places
    assert v2.position_rule(trajs * 2, np.array([1, -1])).fused.tolist() == [1.0, -1.0, 1.0, 1.0] + [1.0] * 4


def scores(probs: list[list[float]]) -> StepScores:
    logits = [math.log(p / (1 - p)) for row in probs for p in row]
    return StepScores(np.cumsum([0] + [len(r) for r in probs]), np.array(logits))


def test_endpoints_on_hand_built_scores():
    trajs = toy_rows() + toy_rows()
    for i, t in enumerate(trajs):
        t.meta["group"] = i // 4
    s = scores(
        [
            [0.9, 0.8],
            [0.7, 0.9],
            [0.6, 0.9],
            [0.2, 0.3],  # question 1: F's step 0 (0.6) below C's 0.7 and 0.9
            [0.9, 0.8],
            [0.5, 0.9],
            [0.6, 0.4],
            [0.8, 0.3],
        ]
    )  # question 2: F's 0.6 is above C's 0.5
    q = v2.endpoints(s, trajs, threshold=0.65)
    assert q["primary: F's step t below every step of C"].tolist() == [1.0, 0.0]
    assert q["P1: F rows, first error exact"].tolist() == [1.0, 1.0]  # first step below 0.65: step 0 in both
    assert q["P2: L rows, first error exact"].tolist() == [1.0, 0.0]  # question 2's L row is flagged at step 1
    assert q["C rows: no error"].tolist() == [1.0, 0.0] and q["R rows: no error"].tolist() == [1.0, 1.0]
    assert q["S1: C > F at t"].tolist() == [1.0, 0.0] and q["S1: R > L at t"].tolist() == [1.0, 1.0]
    assert v2.below_every_clean_step(s, np.array([2, 6]), np.array([1, 5]), np.array([0, 0])).tolist() == [1.0, 0.0]
    # a scorer that reads no text scores the twins alike: 0; noise gets one in n + 1
    same = scores([[0.5, 0.5]] * 8)
    assert v2.endpoints(same, trajs, 0.4)["primary: F's step t below every step of C"].tolist() == [0.0, 0.0]
    assert v2.chance_below_every_clean_step([2, 4]).tolist() == [1 / 3, 1 / 5]


def test_the_p1_threshold_passes_a_fixed_share_of_clean_rows():
    s = scores([[0.9, 0.3], [0.8, 0.6], [0.7, 0.95], [0.2, 0.9]])
    clean = np.arange(4)  # lowest steps: 0.3, 0.6, 0.7, 0.2
    assert v2.clean_pass_threshold(s, clean, share=0.75) == pytest.approx(0.3)  # 3 of 4 rows have no step below 0.3
    assert v2.clean_pass_threshold(s, clean, share=0.5) == pytest.approx(0.6)


def test_minimum_detectable_effect():
    assert v2.minimum_detectable_effect(1.0, level=0.95) == pytest.approx(1.95996 + 0.84162, abs=1e-4)
    assert v2.minimum_detectable_effect(3.0, level=0.975) == pytest.approx(3 * (2.24140 + 0.84162), abs=1e-4)


def diffs(**lows: float) -> dict:
    names = {
        "F": ("primary: F's step t below every step of C", "bi − l2r"),
        "L": ("P2: L rows, first error exact", "bi − l2r"),
        "better": ("primary: F's step t below every step of C", "bi − r2l"),
        "static": ("primary: F's step t below every step of C", "bi − bi-static"),
        "sigma": ("σ at t", "bi: L rows − F rows"),
    }
    out: dict = {}
    for key, low in lows.items():
        endpoint, name = names[key]
        out.setdefault(endpoint, {})[name] = {"mean": low + 1, "low": low, "high": low + 2}
    return out


def test_the_verdict_rule_is_the_papers_predictions():
    everything = dict(
        F=2.0, L=-4.0, better=-4.9, static=-1.0, sigma=0.01
    )  # each interval's low end, its high end 2 above
    assert v2.verdict(diffs(**everything), ("bi",), "r2l")["outcome"] == "supported (bi)"
    for key, low in (("F", 0.0), ("L", -5.0), ("better", -6.0), ("static", -5.5), ("sigma", -0.01)):
        v = v2.verdict(diffs(**everything | {key: low}), ("bi",), "r2l")
        assert v["outcome"] == "not decided at this power" and list(v["predictions"].values()).count("undecided") == 1
    worse = v2.verdict(diffs(**everything | {"better": -8.0}), ("bi",), "r2l")  # high end -6: clearly worse than r2l
    assert (
        worse["outcome"] == "contradicted"
        and worse["predictions"]["bi is at least as good as the better single stream (r2l)"] == "contradicted"
    )
    partial = v2.verdict(diffs(F=2.0), ("bi",), "r2l")
    assert partial["outcome"] == "not yet decidable" and len(partial["missing"]) == 4
    # without prediction 5, the σ interval is not read: a contradicted σ no longer decides
    no_sigma = v2.verdict(diffs(**everything | {"sigma": -0.05}), ("bi",), "r2l", sigma=False)
    assert no_sigma["outcome"] == "supported (bi)" and len(no_sigma["predictions"]) == 4


def test_one_standard_floors_make_r2l_unable_to_see_a_carried_slip():
    rows = toy_rows()
    # L's steps after t (labelled 0) now read like the other three rows' (labelled 1): one group of 4 per step after t
    # per question, label mean 3/4, entropy 0.5623 nats; those groups hold every step after t.
    after = sum(len(r.steps) - 1 - r.meta["step"] for r in rows)
    total = sum(len(r.steps) for r in rows)
    entropy = -(0.75 * math.log(0.75) + 0.25 * math.log(0.25))
    assert v2.loss_floor(rows, "r2l") < v2.loss_floor(rows, "r2l", one_standard=True)
    assert v2.loss_floor(rows, "r2l", one_standard=True) == pytest.approx(
        v2.loss_floor(rows, "r2l") + after / total * entropy, abs=1e-9
    )
    assert v2.loss_floor(rows, "l2r", one_standard=True) == v2.loss_floor(rows, "l2r")


COMMITTED = Path(__file__).resolve().parents[2] / "studies" / "mechanism" / "results" / "v2"


def test_the_post_hoc_reread_reproduces_issue_48_on_the_committed_logits(data_dir, tmp_path):
    """Issue 48's numbers, recomputed from the committed version 2 logits (studies/mechanism/README.md, the post-hoc
    re-read). Where a number differs from the issue's, the issue's is in the comment."""
    from studies.mechanism.config import MechanismConfig, design
    from studies.mechanism.rows import build_mechanism
    from studies.mechanism.report import _collect
    from studies.mechanism.v2_reread import SIGMA_CONTRASTS
    from studies.mechanism.v2_report import verdict_tables

    cfg = MechanismConfig(**design(2) | dict(out=str(COMMITTED), work_dir=str(tmp_path), data_root=str(data_dir)))
    sets, _ = build_mechanism(
        cfg.data_root,
        cfg.train_questions,
        cfg.valid_questions,
        cfg.test_questions,
        cfg.data_seed,
        labels=cfg.labels,
        keep_roundness=cfg.keep_roundness,
    )
    r = verdict_tables(cfg, sets, _collect(cfg))
    p = r["post_hoc"]
    assert r["verdict"]["outcome"] == "contradicted"  # the pre-registered outcome stays on record
    assert {v["outcome"] for v in p["verdicts"].values()} == {"not decided at this power"}
    pre, fmt, err, _, did = (name for name, _, _ in SIGMA_CONTRASTS)
    c = {
        arm: {k: {x: round(v[x], 4) for x in ("mean", "low", "high")} for k, v in cs.items()}
        for arm, cs in p["sigma_contrasts"].items()
    }
    assert c["bi"][pre]["mean"] == -0.0090 and c["bi-gate-lr0.1"][pre]["mean"] == -0.0107  # the docs' -0.009, -0.011
    assert c["bi"][fmt] == {"mean": -0.0082, "low": -0.0144, "high": -0.0026}  # issue: [-0.0144, -0.0027]
    assert c["bi-gate-lr0.1"][fmt] == {"mean": -0.0101, "low": -0.0165, "high": -0.0036}  # issue: [-0.0167, -0.0039]
    assert c["bi"][err] == {"mean": 0.0002, "low": -0.0003, "high": 0.0008}  # issue: [-0.0002, +0.0008]
    assert c["bi-gate-lr0.1"][err] == {"mean": 0.0005, "low": -0.0003, "high": 0.0013}
    assert all(v[did]["low"] < 0 < v[did]["high"] for v in c.values())  # the difference-in-differences is null too
    rho = {n: round(v["spearman"], 3) for n, v in p["sigma_by_position"].items()}
    assert rho == {
        "bi-seed1106": -0.125,
        "bi-seed1107": 0.942,
        "bi-seed1108": 0.905,
        "bi-gate-lr0.1-seed1106": 0.486,
        "bi-gate-lr0.1-seed1107": 0.788,
        "bi-gate-lr0.1-seed1108": 0.9,
    }  # issue: +0.49 to +0.93, -0.12
    share = p["r2l_share_at_t"]["bi-seed1106"]
    assert (round(share["C"], 3), round(share["R"], 3)) == (0.586, 0.384)
    assert round(share["σ"]["C"] - share["σ"]["R"], 3) == 0.014  # σ moves by about 0.01 where the share moves by 0.20
    assert (
        round(p["format_null"]["mean"], 1) == 48.9
    )  # issue: about 48.5 (one draw of tiny noise); exact expectation here
    assert round(p["primary_beside_null"]["l2r"]["mean"], 1) == 50.1
    lowest = [x for g in ("l2r", "r2l", "bi-static", "bi", "bi-gate-lr0.1") for x in p["clean_lowest_at_t"][g]]
    assert (round(100 * min(lowest), 1), round(100 * max(lowest), 1)) == (65.8, 94.0)  # issue: 66-94 %
    pw = {arm: [round(100 * x) if x > 0.01 else round(x, 4) for x in v.values()] for arm, v in p["power"].items()}
    assert pw == {
        "bi": [26, 38, 8, 8, 0.0062],
        "bi-gate-lr0.1": [43, 38, 15, 16, 0.0072],
    }  # issue: 26, 43; 8-16; about 0.0065
    floors = p["loss_floors"]
    assert round(floors["pre-registered"]["r2l"], 3) == 0.005 and round(floors["one standard"]["l2r"], 3) == 0.075
    assert round(floors["one standard"]["r2l"], 3) == 0.343  # issue: 0.330
    assert round(100 * floors["L rows after t, share of training steps"], 1) == 15.3
    machine = {n: (v["device"], v["bf16"]) for n, v in p["machines"].items()}
    assert {machine[n] for n in machine if n.endswith(("1106", "1107"))} == {("NVIDIA H200", True)}
    assert {machine[n] for n in machine if n.endswith("1108")} == {("cpu", False)}
    for arm in ("bi", "bi-gate-lr0.1"):  # each bi arm's worst seed is the one that trained on the CPU
        seeds = {n: v["primary"] for n, v in p["machines"].items() if n.startswith(f"{arm}-seed")}
        assert min(seeds, key=seeds.get) == f"{arm}-seed1108"


@pytest.mark.slow
def test_toy_mechanism_v2_study_pilots_runs_resumes_and_reports(data_dir, tmp_path):
    from studies.mechanism.config import MechanismConfig, design
    from studies.mechanism.study import write_report
    from studies.mechanism.study import run_study

    cfg = MechanismConfig(
        **design(2)
        | dict(
            out=str(tmp_path / "out"),
            work_dir=str(tmp_path / "work"),
            data_root=str(data_dir),
            backbone="tiny",
            top_layers=1,
            train_questions=12,
            valid_questions=8,
            test_questions=8,
            seeds={"l2r": 2, "r2l": 1, "bi-static": 1, "bi": 1, "bi-gate-lr0.1": 1},
            processbench_rows=8,
            bon_questions=4,
            batch_size=8,
            save_every=1,
            bf16="no",
            fallback_epochs=1.0,
        )
    )
    run_study(cfg)
    out = tmp_path / "out"
    pilot = json.loads((out / "pilot.json").read_text())
    assert set(pilot["values"]) == {"l2r", "r2l"} and pilot["decision"]
    names = sorted(p.name.removesuffix(".json") for p in (out / "runs").glob("*-seed*.json"))
    assert names == sorted(
        ["l2r-seed1106", "l2r-seed1107", "r2l-seed1106", "bi-static-seed1106", "bi-seed1106", "bi-gate-lr0.1-seed1106"]
    )
    gate = json.loads((out / "runs" / "bi-gate-lr0.1-seed1106.json").read_text())
    assert gate["gate_lr_scale"] == 0.1 and gate["mode"] == "bi-gate-lr0.1"
    assert sorted(p.name for p in (out / "runs").glob("*.sigma.jsonl")) == [
        "bi-gate-lr0.1-seed1106.sigma.jsonl",
        "bi-seed1106.sigma.jsonl",
    ]
    result = json.loads((out / "results.json").read_text())
    assert result["verdict"]["outcome"].startswith(("supported", "contradicted", "not decided at this power"))
    assert result["loss_floors"]["version 1 (first error)"]["r2l"] > result["loss_floors"]["version 2 (own)"]["r2l"]
    report = (out / "report.md").read_text()
    for row in ("format rule", "rounder-number rule", "position: flag step", "chance: i.i.d. normal", "2×L2R"):
        assert row in report
    for figure in ("endpoints.png", "sigma_by_position.png"):
        assert f"]({figure})" in report and (out / figure).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    stamp = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}
    run_study(cfg)  # a rerun trains nothing
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")} == stamp
    assert write_report(cfg)["verdict"] == result["verdict"]
