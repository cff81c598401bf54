"""The RL study recipe: its report's numbers from hand-made runs, and the whole recipe on tiny sizes, resumed run by
run."""

import json

import numpy as np
import pytest

from studies.rl.config import RLStudyConfig


def test_report_numbers_from_hand_made_runs(tmp_path):
    pytest.importorskip("trl")
    from studies.rl.study import write_report

    cfg = RLStudyConfig(out=str(tmp_path), arms="outcome,process-bi", seeds=[0, 1], steps=4, eval_every=2)
    (tmp_path / "runs").mkdir()
    (tmp_path / "policy.json").write_text(json.dumps({"accuracy": [1, 0, 0, 0]}))
    runs = {  # (arm, seed): accuracy per question at steps 2 and 4
        ("outcome", 0): {2: [1, 1, 0, 0], 4: [1, 0, 0, 0]},
        ("outcome", 1): {2: [1, 1, 0, 0], 4: [1, 1, 0, 0]},
        ("process-bi", 0): {2: [1, 1, 1, 0], 4: [1, 1, 1, 1]},  # seed 1 missing
    }
    for (arm, seed), acc in runs.items():
        run = {
            "arm": arm,
            "seed": seed,
            "accuracy": acc,
            "reward_seconds": 2.0,
            "reward_cpu_seconds": 1.0,
            "reward_calls": 4,
            "seconds": 120.0,
        }
        (tmp_path / "runs" / f"{arm}-seed{seed}.json").write_text(json.dumps(run))
    report = write_report(cfg)
    cells = [
        line.strip("| ").split(" | ") for line in report.splitlines() if line.startswith("| ") and "---" not in line
    ]
    rows = {c[0]: c for c in cells}
    outcome, process = rows["outcome GRPO (answer correct)"], rows["process GRPO, bi PRM (fused)"]
    assert outcome[1] == "2" and outcome[2].startswith("37.5 [") and outcome[2].endswith("(step 4)")
    assert outcome[4] == "2" and outcome[5].startswith("50.0 [")  # the best step: 50 % at step 2 on both seeds
    assert (
        process[1] == "1" and process[2].startswith("100.0 [100.0, 100.0]") and process[3].startswith("+75.0 [")
    )  # paired on seed 0: 100 - 25
    assert outcome[6] == process[6] == "0.50 (0.25)" and outcome[7] == "2.0"  # reward seconds per step, run minutes
    assert "SFT policy (step 0): 25.0 [" in report and "Missing runs: process-bi seed 1." in report
    assert (tmp_path / "accuracy_by_step.png").stat().st_size > 0


@pytest.mark.slow
def test_rl_study_runs_every_arm_and_resumes_only_what_is_missing(tmp_path):
    pytest.importorskip("trl")
    from biprm.cli import run_program
    from studies.rl.__main__ import main as study
    from studies.rl.config import RLStudyConfig

    main = lambda argv: run_program(RLStudyConfig, study, "python -m studies.rl", argv)  # noqa: E731
    out, work = tmp_path / "results", tmp_path / "work"
    tiny = [
        "--out",
        str(out),
        "--work_dir",
        str(work),
        "--seeds",
        "0",
        "--policy_hidden",
        "32",
        "--policy_layers",
        "1",
        "--sft_examples",
        "16",
        "--sft_steps",
        "1",
        "--policy_sft_steps",
        "1",
        "--sft_batch_size",
        "8",
        "--prm_train",
        "32",
        "--prm_epochs",
        "0.25",
        "--prm_test",
        "12",
        "--prm_bon_questions",
        "2",
        "--steps",
        "2",
        "--prompts_per_step",
        "2",
        "--group_size",
        "2",
        "--max_completion_length",
        "12",
        "--eval_every",
        "1",
        "--eval_questions",
        "3",
    ]
    main(tiny)
    runs = {p.stem: json.loads(p.read_text()) for p in (out / "runs").glob("*.json")}
    assert set(runs) == {"outcome-seed0", "min-seed0", "process-l2r-seed0", "process-bi-seed0"}
    for run in runs.values():
        assert set(run["accuracy"]) == {"1", "2"} and all(
            len(a) == 3 and set(a) <= {0, 1} for a in run["accuracy"].values()
        )
        assert run["reward_calls"] == 2 and run["reward_seconds"] > 0 and run["reward_cpu_seconds"] > 0
    assert len(json.loads((out / "policy.json").read_text())["accuracy"]) == 3
    prms = json.loads((out / "prms.json").read_text())
    assert set(prms["results"]) == {"l2r", "bi"} and "reads no text" in prms["table"]
    assert json.loads((work / "prm-bi" / "biprm_train.json").read_text())["backbone"] == str(work / "sft-base")
    report = (out / "report.md").read_text()
    assert "Missing runs: none." in report and (out / "accuracy_by_step.png").is_file()

    kept = (out / "runs" / "outcome-seed0.json").read_text()
    policy_made = (work / "policy" / "model.safetensors").stat().st_mtime_ns
    (out / "runs" / "min-seed0.json").unlink()  # as if the study had been killed in this run
    main(tiny)
    assert (out / "runs" / "min-seed0.json").is_file() and (out / "runs" / "outcome-seed0.json").read_text() == kept
    assert (work / "policy" / "model.safetensors").stat().st_mtime_ns == policy_made
    again = json.loads((out / "runs" / "min-seed0.json").read_text())
    assert np.array_equal(again["accuracy"]["2"], runs["min-seed0"]["accuracy"]["2"])  # same seed, same run
