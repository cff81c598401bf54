"""A run folder's checkpoints judged by the rules of the backend that wrote them: plain and DDP (the Trainer's own,
tested by real runs in test_train.py), FSDP full and sharded and DeepSpeed ZeRO-3 (their parts written by the real
libraries on CPU in tests/backend_checkpoints.py; DeepSpeed's also as a fake of the same layout, for machines
without it). A resume takes a complete one, refuses one it cannot judge, and never restarts silently from step 0."""

import json
import logging
import re
import shutil
from pathlib import Path

import pytest
import torch

from biprm.run_folder import judge, plan, run_record, start
from conftest import launch

LAYOUTS = {"fsdp-full": "fsdp", "fsdp-sharded": "fsdp", "deepspeed": "deepspeed", "deepspeed-fake": "deepspeed"}
SETTINGS = {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 1, "seed": 1}
ZERO3 = {"backend": "deepspeed", "zero_stage": 3, "scheduler_in_config": False}  # what the record of a ZeRO-3 run says


def record(world_size: int = 2, engine: dict | None = None, settings: dict = SETTINGS) -> dict:
    return run_record(settings, "data", world_size, engine)


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
    torch.save({}, checkpoint / "scheduler.pt")  # the Trainer's, beside FSDP's and DeepSpeed's parts
    (checkpoint / "trainer_state.json").write_text(
        json.dumps({"global_step": 2, "max_steps": 4})
    )  # the Trainer's last write
    start(dest, record(world_size, ZERO3 if LAYOUTS[layout] == "deepspeed" else {"backend": "fsdp"}), overwrite=False)
    return dest


def resume(folder: Path, backend: str, world_size: int = 2) -> str | None:
    return plan(folder, record(world_size, {"backend": backend}), resume=True, overwrite=False, backend=backend)


@pytest.mark.slow
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_checkpoint_of_every_backend_is_complete_and_resumed_by_that_backend_only(written, tmp_path, layout):
    folder = run_folder(written, layout, tmp_path / "run")
    assert judge(folder / "checkpoint-2") == (LAYOUTS[layout], None)
    assert resume(folder, LAYOUTS[layout]) == str(folder / "checkpoint-2")
    with pytest.raises(
        ValueError, match=r"checkpoint-2 was written by (FSDP|DeepSpeed) and this run trains with one process or DDP"
    ):
        resume(folder, "plain")


@pytest.mark.slow
@pytest.mark.parametrize(
    "layout, removed, lacks",
    [
        ("fsdp-full", "optimizer.bin", "optimizer.bin or optimizer_0/"),
        ("fsdp-sharded", "optimizer_0/.metadata", "optimizer.bin or optimizer_0/"),
        ("fsdp-sharded", "pytorch_model_fsdp_0/.metadata", "pytorch_model_fsdp.bin or pytorch_model_fsdp_0/"),
        ("fsdp-full", "scheduler.pt", "scheduler.pt"),
        (
            "deepspeed",
            "global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt",
            "global_step2/zero_pp_rank_1_mp_rank_00_optim_states.pt",
        ),
        (
            "deepspeed-fake",
            "global_step2/zero_pp_rank_0_mp_rank_00_model_states.pt",
            "global_step2/zero_pp_rank_0_mp_rank_00_model_states.pt",
        ),
        ("deepspeed-fake", "latest", "the step folder that `latest` names"),
        ("deepspeed-fake", "scheduler.pt", "scheduler.pt"),
    ],
)
def test_a_finished_save_without_what_its_backend_reads_is_an_error_not_a_restart(
    written, tmp_path, layout, removed, lacks
):
    folder = run_folder(written, layout, tmp_path / "run")
    target = folder / "checkpoint-2" / removed
    target.unlink()
    with pytest.raises(
        ValueError, match="checkpoint-2 cannot be judged: missing .*" + lacks.replace("(", r"\(").replace(")", r"\)")
    ):
        resume(folder, LAYOUTS[layout])


def test_a_checkpoint_whose_optimizer_state_is_nowhere_known_is_an_error(tmp_path):
    """Weights and a whole trainer_state.json, but no optimizer state (save_only_model, or a layout biprm does not
    know)."""
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
    assert (
        "skipping" in caplog.text
        and "checkpoint-4: missing trainer_state.json, optimizer.bin or optimizer_0/" in caplog.text
    )


def test_deepspeed_zero_shards_resume_only_in_as_many_processes(tmp_path):
    fake_deepspeed(tmp_path / "written" / "deepspeed-fake" / "checkpoint-2")
    folder = run_folder(tmp_path / "written", "deepspeed-fake", tmp_path / "run", world_size=2)
    assert plan(folder, record(2, ZERO3), resume=True, overwrite=False, backend="deepspeed") == str(
        folder / "checkpoint-2"
    )
    saved = {
        "per_device_train_batch_size": 4,
        "gradient_accumulation_steps": 1,
        "seed": 1,
    }  # the same global batch in 1
    with pytest.raises(ValueError, match="ZeRO-3 state in 2 shards, one per process.*resume it in 2 processes, not 1"):
        plan(folder, record(1, ZERO3, saved), resume=True, overwrite=False, backend="deepspeed")


def fake_deepspeed_run(
    root: Path, ranks: range, world_size: int, stage: int, scheduler_in_config: bool = False
) -> Path:
    """A run folder whose record says `world_size` processes of ZeRO-`stage`, holding checkpoint-2 with the DeepSpeed
    files of `ranks` only (as a node lost before its save would leave it) and the Trainer's files around them."""
    checkpoint = root / "checkpoint-2"
    step = checkpoint / "global_step2"
    step.mkdir(parents=True)
    for rank in ranks:
        (step / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt").touch()
        if stage == 3:
            (step / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt").touch()
    if stage < 3:
        (step / "mp_rank_00_model_states.pt").touch()
    (checkpoint / "latest").write_text("global_step2")
    if not scheduler_in_config:
        torch.save({}, checkpoint / "scheduler.pt")
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 2, "max_steps": 4}))
    start(
        root,
        record(world_size, {"backend": "deepspeed", "zero_stage": stage, "scheduler_in_config": scheduler_in_config}),
        overwrite=False,
    )
    return root


@pytest.mark.parametrize(
    "stage, ranks, missing",
    [
        (
            3,
            range(3),
            [
                "global_step2/zero_pp_rank_3_mp_rank_00_model_states.pt",
                "global_step2/zero_pp_rank_3_mp_rank_00_optim_states.pt",
            ],
        ),
        (2, range(3), ["global_step2/zero_pp_rank_3_mp_rank_00_optim_states.pt"]),
        (
            1,
            range(0),
            [f"global_step2/zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(4)],
        ),  # no optimizer shards at all
    ],
)
def test_a_deepspeed_checkpoint_lacking_a_rank_is_named_from_the_record_not_guessed_from_the_files(
    tmp_path, stage, ranks, missing
):
    """4 processes wrote the run; the files hold fewer ranks. Guessed from the files, rank 3's loss went unseen and a
    resume was advised in 3 processes (ZeRO-3), or a ZeRO-1/2 checkpoint without optimizer shards was taken."""
    folder = fake_deepspeed_run(tmp_path / "run", ranks, world_size=4, stage=stage)
    with pytest.raises(
        ValueError, match=r"checkpoint-2 cannot be judged: missing " + re.escape(", ".join(missing)) + ", though"
    ) as error:
        plan(folder, record(4, ZERO3), resume=True, overwrite=False, backend="deepspeed")
    assert "\n" not in str(error.value)


def test_bf16_optimizer_shards_are_named_as_on_disk(tmp_path):
    """Issue 56, item 10: DeepSpeed's bf16 mode names the optimizer shards bf16_zero_pp_rank_*; messages dropped the
    prefix, naming files that never exist."""
    folder = fake_deepspeed_run(tmp_path / "run", range(2), world_size=2, stage=3)
    step = folder / "checkpoint-2" / "global_step2"
    for shard in step.glob("zero_pp_rank_*_optim_states.pt"):
        shard.rename(step / f"bf16_{shard.name}")
    assert judge(folder / "checkpoint-2", json.loads((folder / "biprm_run.json").read_text())) == ("deepspeed", None)
    (step / "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt").unlink()
    with pytest.raises(
        ValueError, match=r"missing global_step2/bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt, though"
    ):
        plan(folder, record(2, ZERO3), resume=True, overwrite=False, backend="deepspeed")


def test_a_deepspeed_checkpoint_holding_more_processes_shards_than_its_record_says_is_not_whole(tmp_path):
    """Issue 56, item 10: a record saying 2 processes beside 4 ranks' shards on disk was judged complete."""
    folder = fake_deepspeed_run(tmp_path / "run", range(4), world_size=2, stage=3)
    with pytest.raises(ValueError, match=r"holds the shards of 4 processes and biprm_run.json says 2 wrote it"):
        plan(folder, record(2, ZERO3), resume=True, overwrite=False, backend="deepspeed")


def test_a_deepspeed_checkpoint_needs_the_trainers_scheduler_unless_its_config_builds_one(tmp_path):
    folder = fake_deepspeed_run(tmp_path / "own", range(2), world_size=2, stage=2, scheduler_in_config=True)
    assert judge(folder / "checkpoint-2", json.loads((folder / "biprm_run.json").read_text())) == ("deepspeed", None)
    folder = fake_deepspeed_run(tmp_path / "trainers", range(2), world_size=2, stage=2)
    (folder / "checkpoint-2" / "scheduler.pt").unlink()
    with pytest.raises(ValueError, match=r"checkpoint-2 cannot be judged: missing scheduler.pt, though"):
        plan(folder, record(2, ZERO3), resume=True, overwrite=False, backend="deepspeed")


@pytest.mark.slow
def test_the_fake_deepspeed_checkpoint_has_the_real_layout(written):
    if not (written / "deepspeed").is_dir():
        pytest.skip("deepspeed is not installed")

    def names(root: Path) -> list[str]:
        return sorted(str(p.relative_to(root)) for p in root.rglob("*"))

    assert names(written / "deepspeed") == names(written / "deepspeed-fake")


@pytest.mark.parametrize(
    "now, world_size, refused",
    [
        ({"per_device_train_batch_size": 4, "gradient_accumulation_steps": 1}, 1, None),  # 2 x 2 processes -> 4 x 1
        (
            {"per_device_train_batch_size": 1, "gradient_accumulation_steps": 2},
            2,
            None,
        ),  # 2 x 2 -> 1 x 2 steps x 2 processes
        ({"per_device_train_batch_size": 2, "gradient_accumulation_steps": 1}, 1, "global_batch_size: 4 then, 2 now"),
    ],
)
def test_the_record_compares_the_global_batch_not_its_split(tmp_path, now, world_size, refused):
    start(tmp_path, run_record(SETTINGS, "data", world_size=2), overwrite=False)

    def check():
        return plan(tmp_path, run_record({**SETTINGS, **now}, "data", world_size), resume=True, overwrite=False)

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


def test_a_run_is_resumed_by_its_folder_and_files_however_they_are_spelt(tmp_path, monkeypatch):
    """The record kept --output-dir as typed: `./runs/rel` or its absolute path was "another run", and the advice
    that followed (--overwrite) deleted the checkpoints. Paths are compared resolved, from any working directory."""
    monkeypatch.chdir(tmp_path)
    Path("d.jsonl").touch()
    settings = {**SETTINGS, "output_dir": "runs/rel", "data": "d.jsonl"}
    start(Path("runs/rel"), run_record(settings, "data"), overwrite=False)
    assert json.loads(Path("runs/rel/biprm_run.json").read_text())["config"]["data"] == str(tmp_path / "d.jsonl")
    for spelt in ("runs/rel", "./runs/rel", str(tmp_path / "runs" / "rel")):
        assert plan(spelt, run_record({**settings, "output_dir": spelt}, "data"), resume=True, overwrite=False) is None
    monkeypatch.chdir(tmp_path / "runs")  # a cluster job started from another directory
    assert (
        plan(
            "rel",
            run_record({**settings, "output_dir": "rel", "data": "../d.jsonl"}, "data"),
            resume=True,
            overwrite=False,
        )
        is None
    )
    Path("../e.jsonl").touch()
    with pytest.raises(ValueError, match=f"data: '{tmp_path / 'd.jsonl'}' then, '{tmp_path / 'e.jsonl'}' now"):
        plan("rel", run_record({**settings, "data": "../e.jsonl"}, "data"), resume=True, overwrite=False)


def test_every_path_the_record_holds_is_compared_resolved(tmp_path, monkeypatch):
    """Issue 56, finding 2: --init-from was not among the resolved paths, so a resume spelling it `prm` after `./prm`
    (or absolute) was refused as another run, and the advice offered (--overwrite) deleted the run."""
    monkeypatch.chdir(tmp_path)
    for name in ("prm", "body", "d.jsonl", "ds.json"):
        (tmp_path / name).mkdir() if "." not in name else (tmp_path / name).touch()
    paths = {"init_from": "./prm", "backbone": "./body", "data": "./d.jsonl", "deepspeed": "./ds.json"}
    start(Path("run"), run_record({**SETTINGS, **paths}, "data"), overwrite=False)
    for spelt in (
        {k: v.removeprefix("./") for k, v in paths.items()},
        {k: str(tmp_path / v) for k, v in paths.items()},
    ):
        assert plan("run", run_record({**SETTINGS, **spelt}, "data"), resume=True, overwrite=False) is None
    with pytest.raises(ValueError, match=f"init_from: '{tmp_path / 'prm'}' then, '{tmp_path / 'body'}' now"):
        plan("run", run_record({**SETTINGS, **paths, "init_from": "body"}, "data"), resume=True, overwrite=False)


def test_every_refusal_that_offers_overwrite_names_the_checkpoints_it_deletes(tmp_path, caplog):
    folder = tmp_path / "run"
    for step in (1, 3):
        (folder / f"checkpoint-{step}").mkdir(parents=True)
    start(folder, record(1), overwrite=False)
    deletes = re.escape(
        "--overwrite, which deletes checkpoint-1, checkpoint-3 (the run's trained steps), biprm_run.json"
    )
    with pytest.raises(FileExistsError, match="add --resume to continue it, or " + deletes):
        plan(folder, record(1), resume=False, overwrite=False)
    with pytest.raises(
        ValueError, match=r"holds another run \(seed: 1 then, 2 now\); train into another --output-dir, or " + deletes
    ):
        plan(folder, record(1, settings={**SETTINGS, "seed": 2}), resume=True, overwrite=False)
    with pytest.raises(ValueError, match="--resume continues the run in .* and --overwrite deletes it; choose one"):
        plan(folder, record(1), resume=True, overwrite=True)
    assert (folder / "checkpoint-3").is_dir()  # nothing refused touched the folder
    with caplog.at_level(logging.WARNING):
        start(folder, record(1, settings={**SETTINGS, "seed": 2}), overwrite=True)
    assert "--overwrite: deleting checkpoint-1, checkpoint-3 (the run's trained steps), biprm_run.json" in caplog.text
    assert not (folder / "checkpoint-3").exists()


def a_model(folder: Path) -> Path:
    """A finished model without its run record or checkpoints: copied from elsewhere, or a run of an older biprm."""
    folder.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "train_log.json", "README.md", "tokenizer.json"):
        (folder / name).write_text("{}")
    return folder


def test_a_folder_holding_only_a_model_is_a_runs_output_refused_and_overwritten_file_by_file(tmp_path, caplog):
    """Issue 56, findings 1 and 6: plan() looked only for the record and checkpoints, so a model folder was trained into
    silently, and --overwrite removed config.json alone, leaving the old model.safetensors to pass for the new run's."""
    folder = a_model(tmp_path / "run")
    named = "README.md, config.json, model.safetensors, tokenizer.json, train_log.json"
    with pytest.raises(FileExistsError, match=re.escape(f"holds a model ({named}) and no biprm_run.json")):
        plan(folder, record(1), resume=False, overwrite=False)
    with pytest.raises(FileExistsError, match="so there is nothing to --resume; .*--overwrite, which deletes README"):
        plan(folder, record(1), resume=True, overwrite=False)
    assert plan(folder, record(1), resume=False, overwrite=True) is None
    with caplog.at_level(logging.WARNING):
        start(folder, record(1), overwrite=True)
    assert f"--overwrite: deleting {named} in {folder}" in caplog.text
    assert sorted(p.name for p in folder.iterdir()) == ["biprm_run.json"]


def test_a_runs_overwrite_deletes_its_model_log_and_card_and_says_so(tmp_path, caplog):
    folder = a_model(tmp_path / "run")
    (folder / "checkpoint-2").mkdir()
    start(folder, record(1), overwrite=False)
    deletes = (
        "checkpoint-2 (the run's trained steps), README.md, config.json, model.safetensors, tokenizer.json, "
        "train_log.json, biprm_run.json"
    )
    with pytest.raises(FileExistsError, match=re.escape(f"--overwrite, which deletes {deletes}")):
        plan(folder, record(1), resume=False, overwrite=False)
    with caplog.at_level(logging.WARNING):
        start(folder, record(1), overwrite=True)
    assert f"--overwrite: deleting {deletes}" in caplog.text
    assert sorted(p.name for p in folder.iterdir()) == ["biprm_run.json"]


def test_what_a_lora_run_and_an_export_write_is_theirs_to_overwrite(tmp_path):
    """A LoRA run keeps its adapter in adapter/ beside the merged model; an export of a PRM trained elsewhere writes its
    value head as biprm_head.bin beside pickled weights: neither is a stranger's file."""
    folder = a_model(tmp_path / "run")
    (folder / "adapter").mkdir()
    (folder / "biprm_head.bin").touch()
    with pytest.raises(FileExistsError, match=r"holds a model \(README.md, adapter, biprm_head.bin, config.json"):
        plan(folder, record(1), resume=False, overwrite=False)
    start(folder, record(1), overwrite=True)
    assert sorted(p.name for p in folder.iterdir()) == ["biprm_run.json"]


def test_a_folder_of_files_no_run_writes_is_refused_even_with_overwrite(tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    (folder / "notes.txt").touch()
    (folder / "config.json").touch()
    for resume, overwrite in ((False, False), (False, True), (True, False)):
        with pytest.raises(FileExistsError, match=r"holds notes.txt, which no training run writes; train into a new"):
            plan(folder, record(1), resume=resume, overwrite=overwrite)
    assert (folder / "notes.txt").is_file() and (folder / "config.json").is_file()


def test_resume_on_an_empty_or_missing_folder_trains_from_the_start_and_says_so(tmp_path, caplog):
    (tmp_path / "empty").mkdir()
    with caplog.at_level(logging.WARNING):
        for folder in (tmp_path / "empty", tmp_path / "missing"):
            assert plan(folder, record(1), resume=True, overwrite=False) is None
    assert caplog.text.count("holds no run yet; training from the start") == 2
