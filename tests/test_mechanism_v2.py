"""The mechanism study's version 2: its labels, loss floors, the scorers that read no model, its endpoints,
the verdict rule, and the study end to end at toy size."""
import json
import math
import random
from decimal import Decimal

import numpy as np
import pytest

from biprm.data.trajectory import Trajectory
from biprm.replication.mechanism import quadruple, roundness, row_labels
from biprm.replication import mechanism_v2 as v2
from biprm.scoring.step_scores import StepScores
from test_mechanism import natalia


def test_each_step_is_labelled_by_whether_it_is_itself_correct():
    rows = {r.meta["kind"]: r for r in quadruple(natalia(), random.Random(0), labels="own", keep_roundness=True)}
    assert rows["R"].labels == rows["C"].labels == [1.0, 1.0, 1.0]
    assert rows["F"].labels == [0.0, 1.0, 1.0]  # the later steps use the right value and reach the right answer
    assert rows["L"].labels == [0.0, 0.0, 0.0]  # the slip is carried into every later result
    assert row_labels("F", 1, 4, "own") == [1.0, 0.0, 1.0, 1.0] and row_labels("F", 1, 4, "first-error") == [1.0, 0.0, 0.0, 0.0]
    assert roundness(Decimal(rows["F"].meta["to"])) == roundness(Decimal("24"))


@pytest.mark.parametrize("value,expected", [("24", (0, 0, False)), ("150", (0, 1, True)), ("12.5", (1, 0, True)),
                                            ("2000", (0, 3, False)), ("0.75", (2, 0, True)), ("25.00", (0, 0, True))])
def test_roundness_class(value, expected):
    assert roundness(Decimal(value)) == expected


def test_a_wrong_value_keeps_the_right_values_roundness():
    for seed in range(20):
        rows = quadruple(natalia(), random.Random(seed), keep_roundness=True)
        assert roundness(Decimal(rows[2].meta["to"])) == (0, 0, False)  # 24: two digits, not ending in 0 or 5


def toy_rows(labels: str = "own") -> list[Trajectory]:
    """One question's four rows, error at step 0: "x = 2" is right, 4 wrong; step 1 reuses x."""
    text = {"R": ["x = 1+1 = 2", "y = 2+3 = 5"], "C": ["x = 2", "y = 2+3 = 5"], "F": ["x = 4", "y = 2+3 = 5"], "L": ["x = 1+1 = 4", "y = 4+3 = 7"]}
    return [Trajectory("q", steps, labels=row_labels(kind, 0, 2, labels), meta={"kind": kind, "step": 0, "from": "2", "to": "4"})
            for kind, steps in text.items()]


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
    assert v2.rounder_number_rule(trajs).fused.tolist() == [0.0, 3.0, 0.0, 1.0]  # 2·zeros + (last digit 5) − decimal places
    assert v2.position_rule(trajs * 2, np.array([1, -1])).fused.tolist() == [1.0, -1.0, 1.0, 1.0] + [1.0] * 4


def scores(probs: list[list[float]]) -> StepScores:
    logits = [math.log(p / (1 - p)) for row in probs for p in row]
    return StepScores(np.cumsum([0] + [len(r) for r in probs]), np.array(logits))


def test_endpoints_on_hand_built_scores():
    trajs = toy_rows() + toy_rows()
    for i, t in enumerate(trajs):
        t.meta["group"] = i // 4
    s = scores([[0.9, 0.8], [0.7, 0.9], [0.6, 0.9], [0.2, 0.3],    # question 1: F's step 0 (0.6) below C's 0.7 and 0.9
                [0.9, 0.8], [0.5, 0.9], [0.6, 0.4], [0.8, 0.3]])   # question 2: F's 0.6 is above C's 0.5
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
    names = {"F": ("primary: F's step t below every step of C", "bi − l2r"), "L": ("P2: L rows, first error exact", "bi − l2r"),
             "better": ("primary: F's step t below every step of C", "bi − r2l"),
             "static": ("primary: F's step t below every step of C", "bi − bi-static"), "sigma": ("σ at t", "bi: L rows − F rows")}
    out: dict = {}
    for key, low in lows.items():
        endpoint, name = names[key]
        out.setdefault(endpoint, {})[name] = {"mean": low + 1, "low": low, "high": low + 2}
    return out


def test_the_verdict_rule_is_the_papers_predictions():
    everything = dict(F=2.0, L=-4.0, better=-4.9, static=-1.0, sigma=0.01)  # each interval's low end, its high end 2 above
    assert v2.verdict(diffs(**everything), ("bi",), "r2l")["outcome"] == "supported (bi)"
    for key, low in (("F", 0.0), ("L", -5.0), ("better", -6.0), ("static", -5.5), ("sigma", -0.01)):
        v = v2.verdict(diffs(**everything | {key: low}), ("bi",), "r2l")
        assert v["outcome"] == "not decided at this power" and list(v["predictions"].values()).count("undecided") == 1
    worse = v2.verdict(diffs(**everything | {"better": -8.0}), ("bi",), "r2l")  # high end -6: clearly worse than r2l
    assert worse["outcome"] == "contradicted" and worse["predictions"]["bi is at least as good as the better single stream (r2l)"] == "contradicted"
    partial = v2.verdict(diffs(F=2.0), ("bi",), "r2l")
    assert partial["outcome"] == "not yet decidable" and len(partial["missing"]) == 4


@pytest.mark.slow
def test_toy_mechanism_v2_study_pilots_runs_resumes_and_reports(data_dir, tmp_path):
    from biprm.replication.config import MECHANISM_V2, MechanismConfig
    from biprm.replication.mechanism_study import write_report
    from biprm.replication.mechanism_study import run_study

    cfg = MechanismConfig(**MECHANISM_V2 | dict(
        out=str(tmp_path / "out"), work_dir=str(tmp_path / "work"), data_root=str(data_dir), backbone="tiny", top_layers=1,
        train_questions=12, valid_questions=8, test_questions=8, seeds={"l2r": 2, "r2l": 1, "bi-static": 1, "bi": 1, "bi-gate-lr0.1": 1},
        processbench_rows=8, bon_questions=4, batch_size=8, save_every=1, bf16="no", fallback_epochs=1.0))
    run_study(cfg)
    out = tmp_path / "out"
    pilot = json.loads((out / "pilot.json").read_text())
    assert set(pilot["values"]) == {"l2r", "r2l"} and pilot["decision"]
    names = sorted(p.name.removesuffix(".json") for p in (out / "runs").glob("*-seed*.json"))
    assert names == sorted(["l2r-seed1106", "l2r-seed1107", "r2l-seed1106", "bi-static-seed1106", "bi-seed1106", "bi-gate-lr0.1-seed1106"])
    gate = json.loads((out / "runs" / "bi-gate-lr0.1-seed1106.json").read_text())
    assert gate["gate_lr_scale"] == 0.1 and gate["mode"] == "bi-gate-lr0.1"
    assert sorted(p.name for p in (out / "runs").glob("*.sigma.jsonl")) == ["bi-gate-lr0.1-seed1106.sigma.jsonl", "bi-seed1106.sigma.jsonl"]
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
