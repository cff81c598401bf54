"""The mechanism study's version 3 as amended (studies/mechanism/PREREGISTRATION_v3_amended.md): its verdict rule on
hand-computed intervals, the L2R-readable-value covariate, the σ-by-position claim, which runs the verdict reads, the
design read from its YAML, and the command end to end at toy size."""

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from biprm.data.trajectory import Trajectory
from studies.mechanism import v3
from studies.mechanism.config import MechanismConfig
from biprm.scoring.step_scores import StepScores

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "studies" / "mechanism" / "v3_amended.yaml"
DESIGN = yaml.safe_load(CONFIG.read_text())
MARGINS = DESIGN["margins"]


def test_the_config_holds_the_amended_numbers():
    """PREREGISTRATION_v3_amended.md: the numbers, read back from the YAML the study runs from."""
    assert (DESIGN["version"], DESIGN["out"], DESIGN["bf16"], DESIGN["top_layers"], DESIGN["device"]) == (
        3,
        "studies/mechanism/results/v3",
        "yes",
        8,
        "cuda",
    )
    assert DESIGN["seeds"] == dict.fromkeys(("l2r", "r2l", "bi-static", "bi", "bi-gate-lr0.1"), 41)
    assert (DESIGN["first_seed"], DESIGN["lr"], DESIGN["epochs"], DESIGN["batch_size"], DESIGN["pilot"]) == (
        1106,
        1e-4,
        3.0,
        16,
        False,
    )
    assert (DESIGN["labels"], DESIGN["keep_roundness"], DESIGN["data_seed"]) == ("own", True, 1106)
    assert (DESIGN["train_questions"], DESIGN["valid_questions"], DESIGN["test_questions"]) == (600, 100, 1319)
    assert (DESIGN["verdict_arm"], DESIGN["level"]) == ("bi", 0.9875)
    # each margin halfway between no effect and the effect the prediction is powered for
    assert MARGINS == {k: effect / 2 for k, (effect,) in DESIGN["power_at"].items()}
    assert DESIGN["power_at"] == {
        "r2l_beats_l2r": [9.0],
        "gate_beats_static": [1.3],
        "gate_beats_l2r": [9.0],
        "sigma_rises": [0.3],
    }
    assert set(MARGINS) == set(v3.PREDICTIONS)
    cfg = MechanismConfig(**DESIGN)
    assert cfg.version == 3 and cfg.seeds == DESIGN["seeds"] and cfg.margins == MARGINS
    assert v3.gated_arms(cfg) == ("bi", "bi-gate-lr0.1")


def test_the_superseded_design_is_refused(tmp_path):
    original = yaml.safe_load((CONFIG.parent / "v3.yaml").read_text()) | {"out": str(tmp_path)}
    with pytest.raises(ValueError, match="p1_beats_l2r.*this code computes r2l_beats_l2r"):
        v3.check_design(MechanismConfig(**original))
    v3.check_design(MechanismConfig(**DESIGN | {"out": str(tmp_path)}))


def test_version_3_refuses_to_run_without_its_design():
    with pytest.raises(ValueError, match="margins is missing.*studies/mechanism/v3_amended.yaml"):
        MechanismConfig(**{k: v for k, v in DESIGN.items() if k != "margins"})
    with pytest.raises(TypeError, match="margin"):
        MechanismConfig(**DESIGN | {"margin": 1})
    assert (
        MechanismConfig(**yaml.safe_load((CONFIG.parent / "v2.yaml").read_text())).version == 2
    )  # the earlier versions take no design


def interval(low: float, high: float) -> dict:
    return {"mean": (low + high) / 2, "low": low, "high": high}


# Per prediction, hand-placed intervals around its margin: held (low end above), contradicted (high end below),
# undecided (the interval holds the margin), and the edges (an end exactly at the margin decides nothing).
CASES = {
    "r2l_beats_l2r": {"held": (4.6, 20.0), "contradicted": (-3.0, 4.4), "undecided": (4.0, 12.0), "edge": (4.5, 9.0)},
    "gate_beats_static": {
        "held": (0.7, 3.0),
        "contradicted": (-4.0, 0.6),
        "undecided": (-1.0, 2.0),
        "edge": (-1.0, 0.65),
    },
    "gate_beats_l2r": {"held": (5.0, 14.0), "contradicted": (-6.0, 4.0), "undecided": (1.0, 9.0), "edge": (4.5, 8.0)},
    "sigma_rises": {"held": (0.3, 0.9), "contradicted": (-0.2, 0.1), "undecided": (0.05, 0.5), "edge": (0.0, 0.15)},
}


@pytest.mark.parametrize("key", list(CASES))
def test_each_prediction_is_held_contradicted_or_undecided_by_its_margin(key):
    for expected, (low, high) in CASES[key].items():
        assert v3.judge(interval(low, high), MARGINS[key]) == ("undecided" if expected == "edge" else expected), (
            key,
            expected,
        )


def all_held() -> dict:
    return {key: interval(*CASES[key]["held"]) for key in v3.PREDICTIONS}


def test_the_verdict_rule():
    assert v3.verdict(all_held(), MARGINS)["outcome"] == "supported"
    for key in v3.PREDICTIONS:  # every judged prediction decides: any contradicted contradicts, any undecided leaves it
        for how, outcome in (("contradicted", "contradicted"), ("undecided", "not decided at this power")):
            v = v3.verdict(all_held() | {key: interval(*CASES[key][how])}, MARGINS)
            assert v["predictions"][key] == how and v["outcome"] == outcome, (key, how)
    # a contradiction decides even beside an undecided prediction
    mixed = all_held() | {
        "gate_beats_static": interval(*CASES["gate_beats_static"]["undecided"]),
        "sigma_rises": interval(*CASES["sigma_rises"]["contradicted"]),
    }
    assert v3.verdict(mixed, MARGINS)["outcome"] == "contradicted"
    partial = v3.verdict({k: v for k, v in all_held().items() if k != "sigma_rises"}, MARGINS)
    assert partial["outcome"] == "not yet decidable" and partial["missing"] == ["sigma_rises"]


def row(question: str, steps: list[str], t: int, right: str) -> Trajectory:
    return Trajectory(
        question, steps, labels=[1.0] * len(steps), meta={"kind": "R", "step": t, "from": right, "to": "0"}
    )


def test_the_readable_value_covariate():
    q = "Ann has 12 apples and buys 3 bags of 4 apples. How many now?"
    assert v3.readable(row(q, ["3 * 4 = 12 apples", "12 + 12 = 24", "The answer is 24"], 0, "12"))  # 3 × 4
    assert v3.readable(row(q, ["She buys 12 more", "So 24", "The answer is 24"], 1, "24"))  # 12 + 12: one number twice
    assert v3.readable(row(q, ["x", "y", "z"], 1, "0.75"))  # 3 ÷ 4
    assert not v3.readable(row(q, ["x", "y", "z"], 0, "43"))  # 43 is no +, −, ×, ÷ of 12, 3, 4
    assert not v3.readable(
        row(q, ["12 * 3 = 36", "36 + 7 = 43", "The answer is 43"], 0, "43")
    )  # steps from t on are not read
    assert v3.readable(row(q, ["12 * 3 = 36", "36 + 7 = 43", "The answer is 43"], 1, "48"))  # 12 × 4, or 36 + 12
    assert v3.readable(
        row("A 7.5 m rope is cut in 2.", ["Each is 3.75 m", "The answer is 3.75"], 0, "3.75")
    )  # 7.5 ÷ 2 exactly
    assert not v3.readable(
        row("Split 10 among 3.", ["Each gets 3.33", "The answer is 3.33"], 0, "3.33")
    )  # 10 ÷ 3 is not 3.33


def test_the_readable_share_on_version_2s_test_questions_is_the_reviews(data_dir):
    from studies.mechanism.rows import build_mechanism
    from studies.mechanism.report import rows_by_kind

    sets, _ = build_mechanism(str(data_dir), 0, 0, 400, 1106, labels="own", keep_roundness=True)
    rows, _ = rows_by_kind(sets["test"])
    shares = [v3.readable(sets["test"][r]) for r in rows["R"]]
    assert (len(shares), sum(shares), round(100 * np.mean(shares), 1)) == (266, 202, 75.9)  # issue 48: 75.9 %


def sigma_scores(rows: list[list[float]]) -> StepScores:
    flat = np.array([x for r in rows for x in r])
    offsets = np.cumsum([0] + [len(r) for r in rows])
    return StepScores(offsets, np.zeros(len(flat)), l2r=np.zeros(len(flat)), r2l=np.zeros(len(flat)), sigma=flat)


def test_sigma_rises_with_position_per_seed_and_on_average():
    # σ a rising function of the position k/(n−1): Spearman 1 (the one-step row is left out)
    rising = sigma_scores([[0.1, 0.5, 0.9], [0.1, 0.9], [0.1, 0.3, 0.7, 0.9], [0.5]])
    falling = sigma_scores([[0.9, 0.5, 0.1], [0.9, 0.1], [0.9, 0.7, 0.3, 0.1], [0.5]])
    rows = np.arange(4)
    r = v3.sigma_rises([rising, rising], rows, level=0.975, resamples=50)
    assert r["per_run"] == [pytest.approx(1.0)] * 2 and (r["mean"], r["low"], r["high"]) == pytest.approx(
        (1.0, 1.0, 1.0)
    )
    # positions 0, .5, 1 | 0, 1 | 0, 1/3, 2/3, 1 against σ; one
    # rising and one falling seed: mean 0, interval on both sides
    both = v3.sigma_rises([rising, falling], rows, level=0.975, resamples=200)
    assert both["per_run"][0] == pytest.approx(-both["per_run"][1]) and both["mean"] == pytest.approx(0.0)
    assert both["low"] < 0 < both["high"]
    flat = sigma_scores([[0.5, 0.4, 0.6], [0.6, 0.5], [0.5, 0.6, 0.4, 0.5], [0.5]])
    assert v3.sigma_rises([flat], rows, 0.975, resamples=10)["per_run"][0] == pytest.approx(
        v3.spearman([0, 0.5, 1, 0, 1, 0, 1 / 3, 2 / 3, 1], [0.5, 0.4, 0.6, 0.6, 0.5, 0.5, 0.6, 0.4, 0.5])
    )


def test_the_verdict_reads_one_machine_and_complete_sets_of_seeds(tmp_path):
    cfg = MechanismConfig(
        **{k: v for k, v in DESIGN.items() if k not in ("device",)}
        | dict(
            version=3, out=str(tmp_path), work_dir=str(tmp_path / "w"), seeds={"l2r": 3, "r2l": 3, "bi-gate-lr0.1": 3}
        )
    )
    (tmp_path / "runs").mkdir()
    gpu, cpu = {"device": "NVIDIA H200", "bf16": True}, {"device": "cpu", "bf16": False}
    machine = {
        ("l2r", 1106): gpu,
        ("r2l", 1106): gpu,
        ("bi-gate-lr0.1", 1106): gpu,
        ("l2r", 1107): gpu,
        ("r2l", 1107): cpu,
        ("bi-gate-lr0.1", 1107): gpu,
        ("l2r", 1108): gpu,
        ("r2l", 1108): gpu,
    }  # r2l 1107 elsewhere; no gate 1108
    groups = {}
    for (arm, seed), m in machine.items():
        name = f"{arm}-seed{seed}"
        (tmp_path / "runs" / f"{name}.json").write_text(json.dumps({"run": name, "seed": seed, **m}))
        groups.setdefault(arm, []).append((name, None))
    chosen = v3.verdict_runs(cfg, groups | {"2×L2R": [("l2r-seed1106 + l2r-seed1107", None)]})
    assert chosen["machine"] == gpu and chosen["apart"] == {"r2l-seed1107": cpu}
    assert chosen["seeds"] == [1106] and {g: [n for n, _ in r] for g, r in chosen["groups"].items()} == {
        "l2r": ["l2r-seed1106"],
        "r2l": ["r2l-seed1106"],
        "bi-gate-lr0.1": ["bi-gate-lr0.1-seed1106"],
    }
    assert chosen["provisional"] == ["r2l 2 of 3", "bi-gate-lr0.1 2 of 3"]


def mechanism(argv: list[str]) -> None:
    """`python -m studies.mechanism ARGV`, in this process."""
    from biprm.cli import run_program
    from studies.mechanism.__main__ import main

    run_program(MechanismConfig, main, "python -m studies.mechanism", argv)


def toy_config(tmp_path: Path, **over) -> Path:
    """The shipped YAML at toy size on this machine's CPU: every key the same, the sizes and the machine shrunk."""
    written = yaml.safe_load(CONFIG.read_text())
    written |= dict(out=str(tmp_path / "out"), work_dir=str(tmp_path / "work"), bf16="no", top_layers=1) | over
    written |= dict(
        device="cpu",
        backbone="tiny",
        train_questions=12,
        valid_questions=8,
        test_questions=8,
        batch_size=8,
        epochs=1.0,
        seeds={"l2r": 2, "r2l": 2, "bi-static": 2, "bi": 2, "bi-gate-lr0.1": 2},
        processbench_rows=8,
        bon_questions=4,
        save_every=1,
        workers=2,  # side by side, as on the GPU
    )
    path = tmp_path / "v3.yaml"
    path.write_text(CONFIG.read_text().splitlines()[0] + "\n" + yaml.safe_dump(written, allow_unicode=True))
    return path


@pytest.mark.slow
def test_toy_mechanism_v3_runs_resumes_refuses_another_machine_and_reports(data_dir, tmp_path, capsys):
    config = toy_config(tmp_path)
    mechanism(["--config", str(config), "--data-root", str(data_dir)])
    out = tmp_path / "out"
    names = sorted(p.name.removesuffix(".json") for p in (out / "runs").glob("*-seed*.json"))
    assert names == sorted(
        f"{a}-seed{s}" for a in ("l2r", "r2l", "bi-static", "bi", "bi-gate-lr0.1") for s in (1106, 1107)
    )
    assert not (out / "pilot.json").exists()  # no pilot
    assert {json.loads((out / "runs" / f"{n}.json").read_text())["lr"] for n in names} == {1e-4}
    result = json.loads((out / "results.json").read_text())
    assert (
        result["seeds"] == [1106, 1107]
        and result["apart"] == {}
        and result["machine"] == {"device": "cpu", "bf16": False}
    )
    assert result["verdict"]["outcome"] in ("supported", "contradicted", "not decided at this power")
    assert set(result["verdict"]["predictions"]) == set(v3.PREDICTIONS)
    assert 0 <= result["covariate"]["readable_share"] <= 1 and set(result["r2l_share_at_t"]) == {
        "bi-seed1106",
        "bi-seed1107",
    }
    assert set(result["beside"]) == {"bi-gate-lr0.1"} and set(result["sigma_rises"]["bi"]) == {
        "without the answer line",
        "with it",
    }
    report = (out / "report.md").read_text()
    for text in (
        "## The judged predictions",
        "format rule, ties broken at random",
        "Covariate",
        "σ(C) − σ(F)",
        "one standard",
    ):
        assert text in report
    stamp = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}
    mechanism(["--config", str(config), "--data-root", str(data_dir)])  # a rerun trains nothing
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")} == stamp
    capsys.readouterr()
    mechanism(["--config", str(config), "--data-root", str(data_dir), "--report-only"])
    assert "## The judged predictions" in capsys.readouterr().out
    assert json.loads((out / "results.json").read_text())["verdict"] == result["verdict"]
    first = out / "runs" / "l2r-seed1106.json"  # as if the study's first run had trained on a GPU
    first.write_text(json.dumps(json.loads(first.read_text()) | {"device": "NVIDIA H200", "bf16": False}))
    with pytest.raises(SystemExit):  # another machine than the study's first run: refused before anything loads
        mechanism(["--config", str(config), "--data-root", str(data_dir)])
    err = capsys.readouterr().err
    assert "NVIDIA H200" in err and "this machine is cpu" in err and "\n" not in err.strip()
