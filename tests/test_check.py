"""`biprm check`: every item run for real on the tiny backbone on the CPU in 2 processes (`--smoke`), and each shown
failing on a fault planted where it looks: a resume that loses its optimizer state, scheduler or RNG, heads saved
from a bf16 cast, a model that scores NaN, vLLM picking another dtype, a slow bi; a failed run names its error."""

import importlib.machinery
import json
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

from biprm import check
from biprm.check import Item, error_in, latency_item, run_check, train_command
from biprm.config import CheckConfig


@pytest.mark.slow
def test_check_smoke_runs_every_item_in_two_processes_from_any_directory(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "biprm.cli", "check", "--smoke", "--out", "out", "--latency-solutions", "4"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )  # not the repository root
    assert done.returncode == 0, done.stderr[-3000:]
    items = {i["name"]: i for i in json.loads((tmp_path / "out" / "check.json").read_text())}
    assert {n: i["status"] for n, i in items.items() if n != "latency bi/l2r"} == {
        "train 3 steps": "pass",
        "heads dtype": "pass",
        "resume": "pass",
        "score": "pass",
        "vllm export dtype": "not checked",
    }
    assert items["latency bi/l2r"]["status"] in ("target met", "target missed")
    assert "2 process(es)" in items["train 3 steps"]["detail"]
    assert "a bf16-cast copy's save: ['F32']" in items["heads dtype"]["detail"]
    assert "weights 0, optimizer 0, rng 0, scheduler 0, trainer state 0 (exact)" in items["resume"]["detail"]
    assert (tmp_path / "out" / "check.md").read_text().startswith("| item | status | measured |")


def test_a_failed_training_run_shows_its_error_skips_the_rest_and_fails_the_check(tmp_path):
    items = run_check(CheckConfig(smoke=True, processes=1, data="no/such/file.jsonl", out=str(tmp_path)))
    assert [i.status for i in items] == ["fail", *["not reached"] * 5]
    assert (
        "biprm train: error: no/such/file.jsonl: no such data file" in items[0].detail
        and "train.log" in items[0].detail
    )


def a_trained_run(out: Path) -> Item:
    """What a passing training item leaves, by name: the final model and its last two checkpoints."""
    for name in ("config.json", "checkpoint-2/trainer_state.json", "checkpoint-3/trainer_state.json"):
        (out / "run" / name).parent.mkdir(parents=True, exist_ok=True)
        (out / "run" / name).write_text("{}")
    return Item("train 3 steps", "pass", "planted")


def test_a_failed_resume_is_a_failed_item_with_its_last_lines_and_the_table_is_written(tmp_path, monkeypatch):
    """Issue 56, finding 3: a resume that raised left no final model, `scored()` loaded it anyway, and `check` exited 2
    with no check.md; the run's error was only in resume.log."""
    from biprm.cli import cmd_check

    error = "Traceback (most recent call last):\nRuntimeError: planted in the RNG load\nE1128 torchrun: 1 failed"
    monkeypatch.setattr(check, "trained", lambda cfg, command, run, out: a_trained_run(out))
    monkeypatch.setattr(check, "heads_dtype", lambda *a: Item("heads dtype", "pass", ""))
    monkeypatch.setattr(check, "launch", lambda command, log: (1, error, 0.0))
    monkeypatch.setattr(check, "scored", lambda *a: pytest.fail("the resumed model was scored, though there is none"))
    monkeypatch.setattr(check, "latency", lambda cfg: latency_item({"l2r": 1.0, "bi": 1.0}, 1, "cpu"))
    with pytest.raises(SystemExit):
        cmd_check(CheckConfig(smoke=True, out=str(tmp_path)))
    items = {i["name"]: i for i in json.loads((tmp_path / "check.json").read_text())}
    assert {n: i["status"] for n, i in items.items()} == {
        "train 3 steps": "pass",
        "heads dtype": "pass",
        "resume": "fail",
        "score": "not reached",
        "latency bi/l2r": "target met",
        "vllm export dtype": "not reached",
    }
    detail = items["resume"]["detail"]
    assert (
        detail.startswith("exit 1: RuntimeError: planted in the RNG load; last lines: ")
        and "torchrun: 1 failed" in detail
    )
    assert "| resume | fail | exit 1: RuntimeError" in (tmp_path / "check.md").read_text()


def test_an_item_that_raises_fails_alone_and_the_rest_still_run(tmp_path, monkeypatch):
    monkeypatch.setattr(check, "trained", lambda cfg, command, run, out: a_trained_run(out))
    monkeypatch.setattr(check, "heads_dtype", lambda *a: (_ for _ in ()).throw(OSError("no safetensors file")))
    monkeypatch.setattr(check, "resumed", lambda *a: Item("resume", "pass", ""))
    monkeypatch.setattr(check, "scored", lambda *a: Item("score", "pass", ""))
    monkeypatch.setattr(check, "latency", lambda cfg: latency_item({"l2r": 1.0, "bi": 1.0}, 1, "cpu"))
    monkeypatch.setattr(check, "vllm_dtype", lambda *a: Item("vllm export dtype", "not checked", ""))
    items = run_check(CheckConfig(smoke=True, out=str(tmp_path)))
    assert [(i.status, i.detail) for i in items][1] == ("fail", "OSError: no safetensors file")
    assert [i.status for i in items[2:]] == ["pass", "pass", "target met", "not checked"]


def test_the_error_shown_is_the_runs_not_the_last_line_of_its_log():
    """On the H200 a failed item showed an NCCL warning, printed after the traceback, instead of the error."""
    log = "\n".join(
        [
            "[rank0]: Traceback (most recent call last):",
            '[rank0]:   File "x.py", line 1, in <module>',
            "[rank0]: ValueError: DeepSpeed needs config.hidden_size",
            "[rank1]: ValueError: DeepSpeed needs config.hidden_size",
            "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
            "[W1128 01:02:03 ProcessGroupNCCL.cpp:1234] Warning: destroy",
        ]
    )
    assert error_in(log) == "ValueError: DeepSpeed needs config.hidden_size"
    assert (
        error_in("some output\nbiprm train: error: --deepspeed x.json: cannot read it as JSON")
        == "biprm train: error: --deepspeed x.json: cannot read it as JSON"
    )
    assert error_in("Killed") == "Killed"  # nothing that names an error: the last line


def test_the_shipped_configs_are_found_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    command = train_command(CheckConfig(out=str(tmp_path)), tmp_path)
    config, deepspeed = command[command.index("--config") + 1], command[command.index("--deepspeed") + 1]
    assert Path(config).is_file() and config.endswith("configs/train-paper-qwen2.5-math-1.5b.yaml")
    assert Path(deepspeed).is_file() and deepspeed.endswith("configs/ds_zero3.json")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A check's training run (3 steps, 2 processes, a checkpoint at each), to plant faults in copies of."""
    out = tmp_path_factory.mktemp("check")
    cfg = CheckConfig(smoke=True, out=str(out))
    item = check.trained(cfg, train_command(cfg, out), out / "run", out)
    assert item.status == "pass", item.detail
    return out


def copy_of(trained: Path, dest: Path) -> tuple[CheckConfig, list[str]]:
    shutil.copytree(trained, dest)
    cfg = CheckConfig(smoke=True, out=str(dest))
    return cfg, train_command(cfg, dest)


def empty_the_optimizer(checkpoint: Path) -> None:
    state = torch.load(checkpoint / "optimizer.pt", weights_only=True)
    torch.save({**state, "state": {}}, checkpoint / "optimizer.pt")


def reset_the_scheduler(checkpoint: Path) -> None:
    state = torch.load(checkpoint / "scheduler.pt", weights_only=True)
    torch.save({**state, "last_epoch": 0, "_step_count": 1, "_last_lr": state["base_lrs"]}, checkpoint / "scheduler.pt")


def draw_the_rng_elsewhere(checkpoint: Path) -> None:
    for path in checkpoint.glob("rng_state*.pth"):
        state = torch.load(path, weights_only=False)
        torch.save({**state, "cpu": torch.Generator().manual_seed(12345).get_state()}, path)


def skip_the_rng_restore(checkpoint: Path) -> None:
    """The Trainer restores no RNG state from a checkpoint that holds none: it goes on from the seeded start."""
    for path in checkpoint.glob("rng_state*.pth"):
        path.unlink()


@pytest.mark.slow
@pytest.mark.parametrize(
    "plant, part",
    [
        (empty_the_optimizer, "optimizer"),
        (reset_the_scheduler, "scheduler"),
        (draw_the_rng_elsewhere, "rng"),
        (skip_the_rng_restore, "rng"),
    ],
)
def test_the_resume_item_fails_on_a_lost_optimizer_state_scheduler_or_rng(trained, tmp_path, monkeypatch, plant, part):
    """Issue 46, finding 2: with checkpoint-2's optimizer state emptied the weights moved by 5.9e-4, under the old 1e-3
    bar, and a reset scheduler or RNG changed no weight after one step: the item passed. It compares every state now.
    Issue 56, finding 4: the smoke run drew no random numbers per step, so a resume that skipped the RNG restore left
    the same RNG state as the uninterrupted run's and passed as exact; its body's attention dropout draws at every
    step now."""
    cfg, command = copy_of(trained, tmp_path / "out")
    launch = check.launch

    def planted(command: list[str], log: Path):
        if "--resume" in command:
            plant(tmp_path / "out" / "run" / "checkpoint-2")
        return launch(command, log)

    monkeypatch.setattr(check, "launch", planted)
    item = check.resumed(cfg, command, tmp_path / "out" / "run", tmp_path / "out")
    assert item.status == "fail" and "checkpoint-3: " in item.detail, item.detail
    gaps = dict(p.rsplit(" ", 1) for p in item.detail.split("checkpoint-3: ")[1].split(";")[0].split(", "))
    assert float(gaps[part]) > 0, item.detail
    assert "between two uninterrupted runs: weights 0, optimizer 0, rng 0, scheduler 0, trainer state 0" in item.detail


@pytest.fixture
def a_model(tmp_path) -> tuple[CheckConfig, Path]:
    """A smoke check's folder holding an untrained tiny bi model where its run would be: what the heads item reads."""
    from biprm.backbones import load_tokenizer, resolve_backbone
    from biprm.modeling import from_backbone

    tokenizer = load_tokenizer(resolve_backbone("tiny"))
    from_backbone(resolve_backbone("tiny"), tokenizer, mode="bi").save_pretrained(tmp_path / "run")
    tokenizer.save_pretrained(tmp_path / "run")
    return CheckConfig(smoke=True, out=str(tmp_path)), tmp_path


def test_the_heads_dtype_item_fails_on_heads_saved_from_a_bf16_cast(a_model, monkeypatch):
    """Issue 46, finding 3: on a CPU the model is fp32, so the bar could not fail; the smoke check saves a bf16-cast
    copy."""
    from transformers import PreTrainedModel

    from biprm.modeling import BiPRMModel

    cfg, out = a_model
    item = check.heads_dtype(cfg, out / "run", out)
    assert item.status == "pass" and "computed in, bf16 weights under bf16 autocast: ['float32']" in item.detail
    monkeypatch.setattr(BiPRMModel, "save_pretrained", PreTrainedModel.save_pretrained)  # a save that keeps the cast
    item = check.heads_dtype(cfg, out / "run", out)
    assert item.status == "fail" and "a bf16-cast copy's save: ['BF16']" in item.detail, item.detail


def test_the_heads_dtype_item_fails_on_heads_that_compute_in_bf16(a_model, monkeypatch):
    """Issue 56, finding 4: the item read only the saved dtype, so heads computing in bf16 under the cast passed."""
    from biprm.modeling import Float32Linear

    cfg, out = a_model

    def in_the_weights_dtype(self, x: torch.Tensor) -> torch.Tensor:  # a layer that follows the engine's cast
        return torch.nn.functional.linear(x.to(self.weight.dtype), self.weight, self.bias)

    monkeypatch.setattr(Float32Linear, "forward", in_the_weights_dtype)
    item = check.heads_dtype(cfg, out / "run", out)
    assert item.status == "fail" and "bf16 autocast: ['bfloat16']" in item.detail, item.detail


@pytest.mark.slow
def test_the_score_item_fails_on_a_model_that_scores_nan(trained, tmp_path):
    from safetensors.torch import load_file, save_file

    cfg, command = copy_of(trained, tmp_path / "out")
    weights = tmp_path / "out" / "run" / "model.safetensors"
    state = load_file(str(weights))
    state["value_head.bias"] = torch.full_like(state["value_head.bias"], float("nan"))
    save_file(state, str(weights), metadata={"format": "pt"})
    assert check.scored(cfg, tmp_path / "out" / "run", command[command.index("--data") + 1]).status == "fail"


def fake_vllm(monkeypatch, served: str) -> None:
    """A vLLM whose engine would serve the export in `served`."""
    config = types.SimpleNamespace(dtype=getattr(torch, served))
    engine_args = type(
        "EngineArgs", (), {"__init__": lambda self, model: None, "create_model_config": lambda self: config}
    )
    modules = {
        "vllm": types.ModuleType("vllm"),
        "vllm.engine": types.ModuleType("vllm.engine"),
        "vllm.engine.arg_utils": types.SimpleNamespace(EngineArgs=engine_args),
        "vllm.plugins": types.SimpleNamespace(load_general_plugins=lambda: None),
    }
    modules["vllm"].__spec__ = importlib.machinery.ModuleSpec("vllm", None)
    for name, module in modules.items():
        monkeypatch.setitem(sys.modules, name, module)


@pytest.mark.slow
def test_the_vllm_item_asks_vllm_and_says_not_checked_without_it(trained, tmp_path, monkeypatch):
    run = trained / "run"
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None)
    assert check.vllm_dtype(run, tmp_path).status == "not checked"
    monkeypatch.undo()
    fake_vllm(monkeypatch, "float16")
    item = check.vllm_dtype(run, tmp_path)
    assert item.status == "fail" and "`vllm serve` picks float16 (asked of vLLM)" in item.detail
    fake_vllm(monkeypatch, "bfloat16")
    assert check.vllm_dtype(run, tmp_path).status == "pass"


def test_latency_is_a_target_met_or_missed_never_a_pass():
    assert latency_item({"l2r": 0.010, "bi": 0.0104}, 16, "cuda").status == "target met"
    missed = latency_item({"l2r": 0.010, "bi": 0.0120}, 16, "cuda")
    assert (
        missed.status == "target missed"
        and "1.200" in missed.detail
        and "the target is the paper's 1.05" in missed.detail
    )


def test_only_a_failed_item_fails_the_check(tmp_path, monkeypatch, capsys):
    from biprm.cli import cmd_check

    items = [Item("latency bi/l2r", "target missed", ""), Item("vllm export dtype", "not checked", "")]
    monkeypatch.setattr(check, "run_check", lambda cfg: items)
    cmd_check(CheckConfig(out=str(tmp_path)))  # no SystemExit
    items.append(Item("resume", "fail", ""))
    with pytest.raises(SystemExit):
        cmd_check(CheckConfig(out=str(tmp_path)))
