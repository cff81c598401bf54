"""A run folder's checkpoints judged by the rules of the backend that wrote them: plain and DDP (the Trainer's own,
tested by real runs in test_train.py), FSDP full and sharded and DeepSpeed ZeRO-3 (their parts written by the real
libraries on CPU in tests/backend_checkpoints.py; DeepSpeed's also as a fake of the same layout, for machines
without it). A resume takes a complete one, refuses one it cannot judge, and never restarts silently from step 0."""
import json
import logging
import shutil
from pathlib import Path

import pytest
import torch

from biprm.run_folder import judge, plan, run_record, start
from conftest import launch

LAYOUTS = {"fsdp-full": "fsdp", "fsdp-sharded": "fsdp", "deepspeed": "deepspeed", "deepspeed-fake": "deepspeed"}
SETTINGS = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "seed": 1}


@pytest.fixture(scope="module")
def written(tmp_path_factory) -> Path:
    """The backend parts of checkpoint-2 of each layout, as 2 processes of the real libraries write them."""
    root = tmp_path_factory.mktemp("written")
    done = launch(["tests.backend_checkpoints", str(root)], 2)
    assert done.returncode == 0, done.stderr[-3000:]
    fake_deepspeed(root / "deepspeed-fake" / "checkpoint-2")
    return root


def fake_deepspeed(checkpoint: Path) -> None:
    """DeepSpeed ZeRO-3's save_checkpoint of 2 processes after 2 steps, by name (empty files)."""
    step = checkpoint / "global_step2"
    step.mkdir(parents=True)
    for rank in (0, 1):
        for kind in ("model_states", "optim_states"):
            (step / f"zero_pp_rank_{rank}_mp_rank_00_{kind}.pt").touch()
    (checkpoint / "latest").write_text("global_step2")
    for script in ("zero_to_fp32.py", "zero_to_torch.py"):
        (checkpoint / script).touch()


def run_folder(written: Path, layout: str, dest: Path, world_size: int = 2) -> Path:
    """A run folder holding checkpoint-2 of `layout`, with the files the Trainer writes around the backend's part."""
    if layout == "deepspeed" and not (written / "deepspeed").is_dir():
        pytest.skip("deepspeed is not installed; its layout is tested on the fake")
    checkpoint = dest / "checkpoint-2"
    shutil.copytree(written / layout / "checkpoint-2", checkpoint)
    if LAYOUTS[layout] == "fsdp":
        torch.save({}, checkpoint / "scheduler.pt")
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 2, "max_steps": 4}))  # the Trainer's last write
    start(dest, run_record(SETTINGS, "data", world_size), overwrite=False)
    return dest


def resume(folder: Path, backend: str, world_size: int = 2) -> str | None:
    return plan(folder, run_record(SETTINGS, "data", world_size), resume=True, overwrite=False, backend=backend)


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_checkpoint_of_every_backend_is_complete_and_resumed_by_that_backend_only(written, tmp_path, layout):
    folder = run_folder(written, layout, tmp_path / "run")
    assert judge(folder / "checkpoint-2") == (LAYOUTS[layout], None)
    assert resume(folder, LAYOUTS[layout]) == str(folder / "checkpoint-2")
    with pytest.raises(ValueError, match=r"checkpoint-2 was written by (FSDP|DeepSpeed) and this run trains with one process or DDP"):
        resume(folder, "plain")


@pytest.mark.slow
@pytest.mark.parametrize("layout, removed, lacks", [
    ("fsdp-full", "optimizer.bin", "optimizer.bin or optimizer_0/"),
    ("fsdp-sharded", "optimizer_0/.metadata", "optimizer.bin or optimizer_0/"),
    ("fsdp-sharded", "pytorch_model_fsdp_0/.metadata", "pytorch_model_fsdp.bin or pytorch_model_fsdp_0/"),
    ("fsdp-full", "scheduler.pt", "scheduler.pt"),
    ("deepspeed", "global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt", "global_step2/ rank 1's ZeRO optimizer shard"),
    ("deepspeed-fake", "global_step2/zero_pp_rank_0_mp_rank_00_model_states.pt", "global_step2/ rank 0's ZeRO-3 model shard"),
    ("deepspeed-fake", "latest", "the step folder that `latest` names"),
])
def test_a_finished_save_without_what_its_backend_reads_is_an_error_not_a_restart(written, tmp_path, layout, removed, lacks):
    folder = run_folder(written, layout, tmp_path / "run")
    target = folder / "checkpoint-2" / removed
    target.unlink()
    with pytest.raises(ValueError, match="checkpoint-2 cannot be judged: missing .*" + lacks.replace("(", r"\(").replace(")", r"\)")):
        resume(folder, LAYOUTS[layout])


def test_a_checkpoint_whose_optimizer_state_is_nowhere_known_is_an_error(tmp_path):
    """Weights and a whole trainer_state.json, but no optimizer state (save_only_model, or a layout biprm does not know)."""
    checkpoint = tmp_path / "run" / "checkpoint-2"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 2}))
    (checkpoint / "model.safetensors").touch()
    start(tmp_path / "run", run_record(SETTINGS, "data"), overwrite=False)
    with pytest.raises(ValueError, match="checkpoint-2 cannot be judged: no optimizer state"):
        plan(tmp_path / "run", run_record(SETTINGS, "data"), resume=True, overwrite=False)


@pytest.mark.slow
def test_a_save_cut_short_is_skipped_for_the_older_checkpoint(written, tmp_path, caplog):
    folder = run_folder(written, "fsdp-sharded", tmp_path / "run")
    shutil.copytree(folder / "checkpoint-2", folder / "checkpoint-4")
    (folder / "checkpoint-4" / "trainer_state.json").unlink()  # killed before the Trainer's last write
    (folder / "checkpoint-4" / "optimizer_0" / ".metadata").unlink()
    with caplog.at_level(logging.WARNING):
        assert resume(folder, "fsdp") == str(folder / "checkpoint-2")
    assert "skipping" in caplog.text and "checkpoint-4: missing trainer_state.json, optimizer.bin or optimizer_0/" in caplog.text


def test_deepspeed_zero_shards_resume_only_in_as_many_processes(tmp_path):
    fake_deepspeed(tmp_path / "written" / "deepspeed-fake" / "checkpoint-2")
    folder = run_folder(tmp_path / "written", "deepspeed-fake", tmp_path / "run", world_size=2)
    assert resume(folder, "deepspeed", world_size=2) == str(folder / "checkpoint-2")
    saved = {"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1, "seed": 1}  # the same global batch in 1
    with pytest.raises(ValueError, match="ZeRO state in 2 shards, one per process.*resume it in 2 processes, not 1"):
        plan(folder, run_record(saved, "data", 1), resume=True, overwrite=False, backend="deepspeed")


@pytest.mark.slow
def test_the_fake_deepspeed_checkpoint_has_the_real_layout(written):
    if not (written / "deepspeed").is_dir():
        pytest.skip("deepspeed is not installed")

    def names(root: Path) -> list[str]:
        return sorted(str(p.relative_to(root)) for p in root.rglob("*"))

    assert names(written / "deepspeed") == names(written / "deepspeed-fake")


@pytest.mark.parametrize("now, world_size, refused", [
    ({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1}, 1, None),  # 2 x 2 processes -> 4 x 1
    ({"per_device_train_batch_size": 1, "gradient_accumulation_steps": 2}, 2, None),  # 2 x 2 -> 1 x 2 steps x 2 processes
    ({"per_device_train_batch_size": 2, "gradient_accumulation_steps": 1}, 1, "global_batch_size: 4 then, 2 now"),
])
def test_the_record_compares_the_global_batch_not_its_split(tmp_path, now, world_size, refused):
    start(tmp_path, run_record(SETTINGS, "data", world_size=2), overwrite=False)
    check = lambda: plan(tmp_path, run_record({**SETTINGS, **now}, "data", world_size), resume=True, overwrite=False)
    if refused:
        with pytest.raises(ValueError, match=refused):
            check()
    else:
        assert check() is None  # the same run, with nothing to resume yet


def test_a_record_from_before_the_world_size_was_kept_is_one_process(tmp_path):
    old = run_record(SETTINGS, "data")
    del old["world_size"]
    (tmp_path / "biprm_run.json").write_text(json.dumps(old))
    assert plan(tmp_path, run_record(SETTINGS, "data", 1), resume=True, overwrite=False) is None
    with pytest.raises(ValueError, match="global_batch_size: 2 then, 4 now"):
        plan(tmp_path, run_record(SETTINGS, "data", 2), resume=True, overwrite=False)
