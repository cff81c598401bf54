"""The controlled mechanism study: its R/C/F/L rows, seeded runs, and the study end to end at toy size."""

import json
import random

import numpy as np
import pytest
import torch

from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.data.encoding import Encoder
from biprm.data.benchmarks import gsm8k_reference
from studies.mechanism.rows import KINDS, eligible_steps, quadruple
from studies.replication.recipe import train_run
from biprm.trunk import TrunkCache
from conftest import study_encoder

ANSWER = (
    "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips altogether in "
    "April and May.\n#### 72"
)
QUESTION = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
    "clips did she sell altogether?"
)


def natalia():
    return gsm8k_reference(QUESTION, ANSWER, "test row")


def test_four_rows_differ_only_where_they_should():
    ref = natalia()
    assert list(eligible_steps(ref)) == [0]  # step 1 feeds only the final answer, which is not arithmetic
    rows = {r.meta["kind"]: r for r in quadruple(ref, random.Random(0))}
    assert list(rows) == list(KINDS)
    wrong = rows["F"].meta["to"]
    assert rows["F"].meta["from"] == "24" and len(wrong) == 2 and wrong != "24"
    assert rows["R"].steps == ref.steps
    assert rows["C"].steps[0] == "Natalia sold 24 clips in May."
    assert rows["F"].steps[0] == f"Natalia sold {wrong} clips in May."
    assert rows["F"].steps[1:] == ref.steps[1:]  # the future still uses the right value
    assert rows["L"].steps[0] == f"Natalia sold 48/2 = {wrong} clips in May."
    total = 48 + int(wrong)
    assert rows["L"].steps[1:] == [
        f"Natalia sold 48+{wrong} = {total} clips altogether in April and May.",
        f"The answer is {total}.",
    ]
    assert rows["R"].labels == rows["C"].labels == [1.0, 1.0, 1.0]
    assert rows["F"].labels == rows["L"].labels == [0.0, 0.0, 0.0]
    assert {r.meta["first_error"] for r in rows.values()} == {-1, 0}


def test_a_reference_with_no_reused_arithmetic_gives_no_rows():
    ref = gsm8k_reference("How many legs do 3 cats have?", "3 cats have 3*4 = <<3*4=12>>12 legs.\n#### 12", "row")
    assert eligible_steps(ref) == {} and quadruple(ref, random.Random(0)) is None


def test_the_data_split_is_by_question_and_deterministic(data_dir):
    from studies.mechanism.rows import build_mechanism

    sets, report = build_mechanism(str(data_dir), 40, 10, 12)
    again, _ = build_mechanism(str(data_dir), 40, 10, 12)
    assert [r.steps for r in sets["train"]] == [r.steps for r in again["train"]]
    questions = {name: {r.question for r in rows} for name, rows in sets.items()}
    assert not questions["train"] & questions["valid"] and not questions["train"] & questions["test"]
    for name, rows in sets.items():
        assert [r.meta["kind"] for r in rows] == list(KINDS) * (len(rows) // 4)
        assert (
            report[name]["questions"] + report[name]["questions_without_eligible_step"]
            == report[name]["questions_tried"]
        )


def _trained_weights(seed: int, tmp_path) -> dict[str, torch.Tensor]:
    from biprm.data.trajectory import Trajectory
    from studies.mechanism.config import MechanismConfig
    from biprm.trunk import freeze_bottom

    trajs = [
        Trajectory("What is 2+3?", ["2+3 = 5", "The answer is 5."], [1.0, 1.0]),
        Trajectory("What is 2+3?", ["2+3 = 6", "The answer is 6."], [0.0, 0.0]),
    ] * 4
    cfg = MechanismConfig(
        work_dir=str(tmp_path / "work"),
        backbone="tiny",
        top_layers=1,
        lr=1e-3,
        epochs=1.0,
        batch_size=2,
        warmup_ratio=0.0,
        save_every=100,
    )
    encs = [study_encoder(cfg.max_length).encode(t) for t in trajs]
    model, _ = train_run(cfg, "bi", seed, tmp_path / f"run{seed}-{len(list(tmp_path.glob('run*')))}", False, encs)
    freeze_bottom(model, 1)  # what the run trained: the top layer, the value head and the gate
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def test_the_seed_fixes_every_initialisation_and_the_final_state_is_kept(tmp_path):
    a, b, c = _trained_weights(7, tmp_path), _trained_weights(7, tmp_path), _trained_weights(8, tmp_path)
    assert a.keys() == b.keys() and any(n.startswith("gate.") for n in a)
    assert all(torch.equal(a[n], b[n]) for n in a)
    assert not all(torch.equal(a[n], c[n]) for n in a if n.startswith(("gate.", "value_head")))
    assert len(list(tmp_path.glob("run*/model.safetensors"))) == 3


@pytest.mark.slow
def test_toy_mechanism_study_runs_resumes_and_reports(data_dir, tmp_path):
    from studies.mechanism.report import write_report
    from studies.mechanism.config import MechanismConfig
    from studies.mechanism.study import run_study

    cfg = MechanismConfig(
        out=str(tmp_path / "out"),
        work_dir=str(tmp_path / "work"),
        data_root=str(data_dir),
        backbone="tiny",
        top_layers=1,
        train_questions=12,
        valid_questions=8,
        test_questions=8,
        seeds={"l2r": 2, "r2l": 1, "bi": 2},
        probe_seeds=1,
        processbench_rows=8,
        bon_questions=4,
        epochs=1,
        batch_size=8,
        bf16="no",
    )
    run_study(cfg)
    out = tmp_path / "out"
    names = sorted(p.stem for p in (out / "runs").glob("*.json"))
    assert names == sorted(
        [
            "l2r-seed1106",
            "l2r-seed1107",
            "r2l-seed1106",
            "bi-seed1106",
            "bi-seed1107",
            *(f"probe-{m}-seed1106" for m in ("l2r", "r2l", "bi", "bi-static")),
        ]
    )
    assert sorted(p.stem for p in (out / "runs").glob("*.npz")) == names  # the logits travel with the results
    assert len(list((tmp_path / "work" / "runs").glob("*/*/model.safetensors"))) == len(names)
    result = json.loads((out / "results.json").read_text())
    assert set(result["groups"]) >= {"l2r", "bi", "r2l", "2×L2R", "probe-bi"}
    assert result["verdict"] in ("supported", "not supported")
    p1 = result["first_error"]["bi"]["P1: F rows, first error exact"]
    assert 0 <= p1["low"] <= p1["mean"] <= p1["high"] <= 100
    assert "bi − l2r" in result["differences"] and "σ at t, F rows" in result["sigma"]["bi"]
    report = (out / "report.md").read_text()
    assert (
        "baseline: always 'no error'" in report
        and "any scorer that reads no text" in report
        and "noise under the same aggregation" in report
    )

    # a rerun trains nothing; the report is recomputed from the saved logits alone
    stamp = {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")}
    run_study(cfg)
    assert {p: p.stat().st_mtime_ns for p in (out / "runs").glob("*.json")} == stamp
    (out / "report.md").unlink()
    assert write_report(cfg)["verdict"] == result["verdict"] and (out / "report.md").is_file()
    assert np.isfinite(write_report(cfg)["first_error"]["l2r"]["threshold"])


def test_micro_batches_give_the_whole_batch_gradient(tmp_path):
    from transformers import TrainingArguments, set_seed

    from biprm.data.trajectory import Trajectory
    from biprm.modeling import from_backbone
    from biprm.training import BiPRMTrainer
    from biprm.trunk import TrunkCollator, TrunkData, freeze_bottom, micro_batches

    assert [p.tolist() for p in micro_batches(np.array([5, 5, 9, 2]), np.array([0, 1, 2, 3]), budget=10)] == [
        [0, 1],
        [2],
        [3],
    ]
    backbone = resolve_backbone("tiny")
    tokenizer = load_tokenizer(backbone)
    set_seed(3)
    model = from_backbone(backbone, tokenizer, mode="bi")
    encoder = Encoder(tokenizer, model.config.step_tag_id)
    trajs = [
        Trajectory("What is 2+3?", ["2+3 = 5", "The answer is 5."], [1.0, 1.0]),
        Trajectory("What is 2+3 times 4?", ["3*4 = 12", "2+12 = 15", "The answer is 15."], [1.0, 0.0, 0.0]),
        Trajectory("What is 7-1?", ["7-1 = 6"], [1.0]),
    ]
    cache = TrunkCache(tmp_path / "trunk", model, 1, [encoder.encode(t) for t in trajs]).build(progress=False)
    data = TrunkData(cache, [t.labels for t in trajs])
    freeze_bottom(model, 1)
    trainer = BiPRMTrainer(
        model, TrainingArguments(str(tmp_path / "out"), use_cpu=True, report_to=[]), train_dataset=data
    )
    grads = []
    for budget in (10**9, 1):  # one pass, then one trajectory per pass
        model.zero_grad()
        batch = TrunkCollator(data, model.streams, budget)([0, 1, 2])
        assert len(batch["parts"]) == (1 if budget > 1 else 3)
        loss = trainer.training_step(model, batch)
        grads.append((loss, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (whole, g1), (parts, g2) = grads
    assert torch.allclose(whole, parts, atol=1e-6) and g1.keys() == g2.keys()
    assert all(torch.allclose(g1[n], g2[n], atol=1e-6) for n in g1)


def test_the_verdict_applies_the_preregistered_rule_and_stays_provisional_until_every_seed_is_in():
    from studies.mechanism.report import verdict

    def diff(p1_low: float, p2_high: float = 1.0) -> dict:
        return {"P1: F rows, first error exact": {"low": p1_low}, "P2: L rows, first error exact": {"high": p2_high}}

    planned = {"l2r": 3, "r2l": 1, "bi": 3, "bi-static": 1}
    done = {"l2r": 3, "r2l": 1, "bi": 3}
    assert verdict({"bi − l2r": diff(2.0)}, done, planned).startswith("not yet decidable")
    assert verdict({"bi − l2r": diff(2.0), "r2l − l2r": diff(0.5)}, done, planned) == "supported"
    assert (
        verdict({"bi − l2r": diff(2.0), "r2l − l2r": diff(-0.5)}, done, planned) == "not supported"
    )  # r2l's interval holds 0
    assert (
        verdict({"bi − l2r": diff(2.0, -0.1), "r2l − l2r": diff(0.5)}, done, planned) == "not supported"
    )  # bi loses on L rows
    early = verdict({"bi − l2r": diff(2.0), "r2l − l2r": diff(0.5)}, {"l2r": 1, "r2l": 1, "bi": 1}, planned)
    assert early == "supported (provisional: seeds finished l2r 1 of 3, bi 1 of 3)"
