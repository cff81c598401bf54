"""Training in several CPU processes (torchrun, gloo), as on a GPU node: DDP reaches one process's weights at the
same global batch without searching for unused parameters, a checkpoint resumes in another number of processes,
and the trunk cache refuses several processes before anything is built."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from conftest import launch, weights

# global batch 4 (4 x 1 process or 2 x 2 processes) at lr 1e-3 for 4 steps; 40 rows, so that grouping batches by
# length per process instead of per global batch would change the order
RUN = [
    "--backbone",
    "tiny",
    "--data",
    "synthetic:40",
    "--max-steps",
    "4",
    "--save-steps",
    "2",
    "--grad-accum",
    "1",
    "--lr",
    "1e-3",
    "--logging-steps",
    "1",
    "--no-show-progress",
]


def train_in(processes: int, out: Path, *flags: str, launcher: str = "torchrun") -> str:
    """`biprm train` at global batch 4 in `processes` processes; its stderr."""
    done = launch(
        ["biprm.cli", "-v", "train", *RUN, "--batch-size", str(4 // processes), "--output-dir", str(out), *flags],
        processes,
        launcher,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


@pytest.fixture(scope="module")
def straight(tmp_path_factory) -> dict[int, Path]:
    """The same run trained straight through in 1 process, in 2 started by accelerate's launcher (the resumes below
    start theirs with torchrun), and in 1 with the batch split as the 2 split it (2 x accumulation 2)."""
    root = tmp_path_factory.mktemp("straight")
    train_in(1, root / "in1")
    train_in(2, root / "in2", launcher="accelerate")
    train_in(1, root / "split", "--batch-size", "2", "--grad-accum", "2")
    return {1: root / "in1", 2: root / "in2", "split": root / "split"}


def assert_same_weights(a: Path, b: Path, atol: float = 1e-5) -> None:
    wa, wb = weights(a), weights(b)
    assert wa.keys() == wb.keys()
    for key in wa:
        torch.testing.assert_close(wa[key], wb[key], rtol=0, atol=atol, msg=key)


@pytest.mark.slow
def test_two_processes_reach_the_weights_of_one_at_the_same_global_batch(straight):
    assert (
        json.loads((straight[2] / "biprm_train.json").read_text())["world_size"] == 2
    )  # one gloo group, not two lone runs
    for run in straight.values():
        assert max(e.get("step", 0) for e in json.loads((run / "train_log.json").read_text())) == 4
    # a batch of 4 and two halves of it sum the gradient in another order: 3.4e-6
    # apart here after 4 steps at lr 1e-3 (6.7e-6 at lr 2e-3); the split alone makes
    # the gap, not DDP: one process splitting it alike lands on the same weights
    assert_same_weights(straight[1], straight[2])
    assert_same_weights(straight[2], straight["split"], atol=0)


@pytest.mark.slow
@pytest.mark.parametrize("saved_in, resumed_in", [(2, 1), (1, 2)])
def test_a_checkpoint_resumes_in_another_number_of_processes(straight, tmp_path, saved_in, resumed_in):
    """The run killed after its step-2 checkpoint, then resumed with the global batch split otherwise."""
    out = tmp_path / "run"
    shutil.copytree(straight[saved_in] / "checkpoint-2", out / "checkpoint-2")
    shutil.copy(straight[saved_in] / "biprm_run.json", out)  # the record names no folder: it is the one it lies in
    log = train_in(resumed_in, out, "--resume")
    assert "resuming from" in log and "checkpoint-2" in log
    assert_same_weights(out, straight[saved_in])


@pytest.mark.slow
def test_the_trunk_cache_refuses_several_processes_before_anything_is_built(tmp_path):
    done = launch(
        [
            "biprm.cli",
            "train",
            *RUN,
            "--batch-size",
            "2",
            "--output-dir",
            str(tmp_path / "run"),
            "--train-top-layers",
            "1",
            "--trunk-cache-dir",
            str(tmp_path / "trunk"),
        ],
        2,
    )
    assert done.returncode != 0 and "in one process" in done.stderr and "--no-trunk-cache" in done.stderr, done.stderr[
        -3000:
    ]
    assert not (tmp_path / "trunk").exists() and not (tmp_path / "run").exists()


def test_zero3_in_bf16_trains_the_model_biprm_train_builds():
    """The paper's recipe on its first GPU stopped in DeepSpeed's ZeRO-3 setup: the body came partitioned in bf16, the
    heads in fp32, and ZeRO-3 takes one dtype. This builds the model the same way, on the CPU, and takes two steps."""
    pytest.importorskip("deepspeed")
    done = launch(
        ["torch.distributed.run", "--standalone", "--nproc_per_node", "1", str(Path(__file__).parent / "zero3_step.py")]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["losses"]) == 2 and all(x == x and abs(x) < 1e3 for x in result["losses"])
    assert result["fused_dtype"] == "torch.float32"  # the heads compute in fp32 whatever the engine stores
    assert result["grad_accum_dtype"] == "torch.float32"  # the shipped config's data_types; DeepSpeed's default is bf16
    # what a save writes for the heads: the optimizer's fp32 masters, of which the module holds bf16 roundings
    assert result["heads"] == [
        "gate.0.bias",
        "gate.0.weight",
        "gate.2.bias",
        "gate.2.weight",
        "value_head.bias",
        "value_head.weight",
    ]
    assert result["master_dtypes"] == ["torch.float32"]
    assert result["masters_round_to_the_copies"] and result["masters_finer_than_bf16"]


def test_a_deepspeed_save_writes_the_heads_gathered_fp32_masters(tmp_path):
    """`BiPRMTrainer.save_model` gathers the masters on every rank; the writer's `_save` puts them in the state dict."""
    from safetensors.torch import load_file
    from transformers import TrainingArguments

    from biprm.backbones import load_tokenizer, resolve_backbone
    from biprm.modeling import from_backbone
    from biprm.training import BiPRMTrainer

    path = resolve_backbone("tiny")
    model = from_backbone(path, load_tokenizer(path), mode="bi")
    trainer = BiPRMTrainer(model, TrainingArguments(output_dir=str(tmp_path), report_to=[], use_cpu=True))
    master = torch.full_like(model.value_head.weight, 0.1234567)  # not a bf16 value
    trainer.head_masters = {"value_head.weight": master}
    trainer._save(str(tmp_path / "saved"), state_dict={k: v.bfloat16() for k, v in model.state_dict().items()})
    saved = load_file(str(tmp_path / "saved" / "model.safetensors"))
    torch.testing.assert_close(saved["value_head.weight"], master, rtol=0, atol=0)
    assert saved["gate.0.weight"].dtype == torch.float32  # the other heads: the bf16 copy, saved in fp32 as before


def test_lora_under_zero2_saves_the_heads_from_their_fp32_masters(tmp_path):
    """PEFT renames the heads (`modules_to_save`), so `head_masters` found none, and the merged save on rank 0 wrote the
    module's bf16 copies. `lora_head_masters` gathers the masters by the merged names; the save writes them."""
    pytest.importorskip("deepspeed")
    pytest.importorskip("peft")
    done = launch(
        [
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "1",
            str(Path(__file__).parent / "lora_zero2_step.py"),
            str(tmp_path / "saved"),
        ]
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["optimizer_steps"] == 2 and result["grad_accum_dtype"] == "torch.float32"  # configs/ds_zero2.json
    assert result["heads"] == [
        "gate.0.bias",
        "gate.0.weight",
        "gate.2.bias",
        "gate.2.weight",
        "value_head.bias",
        "value_head.weight",
    ]
    assert result["saved_dtypes"] == ["torch.float32"] and result["saved_are_the_masters"]
    assert (
        result["masters_round_to_the_copies"] and result["masters_finer_than_bf16"]
    )  # the copies would have lost digits


def test_a_closed_process_group_leaves_the_next_command_a_fresh_one(tmp_path):
    """close_processes ends the group and the state holding it: a second command in the same launched Python process
    (here a world of one, as torchrun starts it) opens a new group instead of failing on the destroyed one."""
    import os
    import socket
    import subprocess
    import sys

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = (
        "import torch.distributed as dist\n"
        "from biprm.scoring.process_group import close_processes, process_state\n"
        "for _ in range(2):\n"
        "    process_state().wait_for_everyone()\n"
        "    assert dist.is_initialized()\n"
        "    close_processes()\n"
        "    assert not dist.is_initialized()\n"
        "print('ok')\n"
    )
    env = os.environ | dict(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
