"""`python -m studies.mechanism`: the controlled test of the R2L stream and the gate.

Read top to bottom:
1. Build the R/C/F/L rows (`studies.mechanism.rows`): train and validation from
   GSM8K-train questions, test from GSM8K-test questions.
2. Load the transfer sets: ProcessBench's GSM8K subset and the gsm8k_bon_small pool cut
   to its one-style sub-pools (`SUBPOOLS`).
3. Cache the frozen trunk of SmolLM2-135M-Instruct for every set once (`biprm.trunk`).
4. For every run (mode, seed, and whether the top layers train or only the heads, a
   "probe"): seed, build, train through `biprm train`'s trainer (`train_run`), score
   every set, and write the per-item step logits to `OUT/runs/RUN.npz` beside the run's
   JSON (both committed, so the report survives the machine). The final model
   stays in the work dir. A finished run is never redone; a killed one resumes from its
   last checkpoint.
5. The report (`studies.mechanism.report`) is computed from the saved logits
   alone, so it can be redone, or changed, without training.

Version 3 (`--config studies/mechanism/v3_amended.yaml`) is version 2 without the pilot, more seeds of five arms,
one machine and precision for every run (`check_machine`) and its own verdict (`v3`).

Version 2 (`--preset mechanism-v2`) adds a pilot before step 4: `l2r` and `r2l` seed 1106 at
the paper's lr and epochs, read on validation; if neither learns, every run trains at the
fallback budget instead (`pilot_budget`). Its gated runs log σ by step position on the
validation rows as they train (`SigmaByPosition`).

The endpoints are written in studies/mechanism/README.md before the runs; the report computes
exactly those.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch
from transformers import TrainerCallback

from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.data.encoding import Encoded, Encoder
from biprm.evaluation.outputs import write_json
from biprm.modeling import from_backbone
from biprm.analysis.plots import position_curve
from studies.mechanism.config import MechanismConfig
from studies.replication.config import VARIANTS
from studies.mechanism.rows import load_sets, scores_path
from studies.mechanism import report, v2_report, v3
from studies.mechanism.report import rows_by_kind
from studies.mechanism.v2 import below_every_clean_step, chance_below_every_clean_step
from studies.replication.recipe import release_memory, start, study_key, train_run, trunk_caches
from biprm.scoring.step_scores import StepScores, load_scores, save_scores
from biprm.trunk import TrunkCache, cached_scores

log = logging.getLogger(__name__)


@dataclass
class Run:
    mode: str  # a mode, or a gate-study variant of `bi` (VARIANTS)
    seed: int
    heads_only: bool = False

    @property
    def name(self) -> str:
        return f"{'probe-' if self.heads_only else ''}{self.mode}-seed{self.seed}"


ORDER = ("l2r", "r2l", "bi", "bi-gate-lr0.1", "bi-static")


def runs_of(cfg: MechanismConfig) -> list[Run]:
    """The pilot pair (l2r, r2l) first, then `bi`, then the remaining seeds. Version 1 puts `bi-static`
    and the probes last, so an interrupted study decides as early as it can; version 2's verdict needs
    every arm, so it goes seed by seed."""
    depth, first = max(cfg.seeds.values()), cfg.first_seed
    runs = [Run(m, first + k) for k in range(depth) for m in ORDER if k < cfg.seeds.get(m, 0)]
    if cfg.version == 1:
        runs.sort(key=lambda run: run.mode == "bi-static")
    return runs + [
        Run(m, first + k, heads_only=True) for k in range(cfg.probe_seeds) for m in ("l2r", "r2l", "bi", "bi-static")
    ]


def run_dir(cfg: MechanismConfig, name: str) -> Path:
    """Where a run keeps its checkpoints and final state (never committed)."""
    return Path(cfg.work_dir) / "runs" / study_key(cfg) / name


class SigmaByPosition(TrainerCallback):
    """σ by normalised step position on the validation rows every `every` optimizer steps, one JSON line
    each in `path` (appended, so a resumed run keeps the lines from before its interruption)."""

    def __init__(self, cache: TrunkCache, every: int, path: Path, bf16: bool):
        self.cache, self.every, self.path, self.bf16 = cache, every, path, bf16

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every:
            return
        model.eval()
        with torch.no_grad(), torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=self.bf16):
            s = cached_scores(model, self.cache)
        model.train()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a") as f:
            f.write(json.dumps({"step": state.global_step, **position_curve(s.sigma, s.offsets, 5)}) + "\n")


def sigma_during_training(cfg: MechanismConfig, name: str) -> Path:
    return Path(cfg.out) / "runs" / f"{name}.sigma.jsonl"


def this_machine(fast: bool) -> dict:
    """The device a run trains on here (the GPU's name, or "cpu") and its precision, as each run's JSON records them."""
    return {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu", "bf16": fast}


def check_machine(cfg: MechanismConfig, fast: bool) -> None:
    """Version 3's one machine and precision (`cfg.device`): refused on another kind of device, and on another GPU or
    precision than the study's first finished run (a run there would be excluded from the verdict yet take its seed's
    place)."""
    if not cfg.device:
        return
    here = this_machine(fast)
    if ("cuda" if torch.cuda.is_available() else "cpu") != cfg.device:
        raise ValueError(
            f"{cfg.out}: every run of this study trains on {cfg.device} (studies/mechanism/README.md), and this "
            "machine has none"
        )
    for run in runs_of(cfg):
        path = Path(cfg.out) / "runs" / f"{run.name}.json"
        if path.is_file():
            first = json.loads(path.read_text())
            if {k: first[k] for k in here} != here:
                raise ValueError(
                    f"{cfg.out}: its runs train on {first['device']} with bf16 {first['bf16']} (as {run.name} did); "
                    f"this machine is {here['device']} with bf16 {here['bf16']}"
                )
            return


def train_and_score(
    cfg: MechanismConfig, run: Run, sets: dict, encs: dict[str, list[Encoded]], caches: dict, fast: bool
) -> dict[str, StepScores]:
    """Train one run (or load it, if finished) on the study's encodings, score every set, and write its logits and
    JSON."""
    started = time.perf_counter()
    base_mode, overrides = VARIANTS.get(run.mode, (run.mode, {}))
    run_cfg = replace(cfg, **overrides)
    callbacks = None
    if cfg.version >= 2 and base_mode == "bi" and not run.heads_only:
        callbacks = [SigmaByPosition(caches["valid"], cfg.save_every, sigma_during_training(cfg, run.name), fast)]
    model, train_log = train_run(
        run_cfg,
        base_mode,
        run.seed,
        run_dir(cfg, run.name),
        fast,
        encs["train"],
        heads_only=run.heads_only,
        callbacks=callbacks,
    )
    with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=fast):
        scores = {name: cached_scores(model, caches[name]) for name in sets if name != "train"}
    save_scores(scores_path(cfg, run.name), scores, compress=True)
    result = {
        "run": run.name,
        **asdict(run),
        "lr": cfg.lr,
        "epochs": cfg.epochs,
        "gate_lr_scale": run_cfg.gate_lr_scale,
        **this_machine(fast),
        "train": train_log,
        "seconds": round(time.perf_counter() - started, 1),
    }
    write_json(Path(cfg.out) / "runs" / f"{run.name}.json", result)
    log.info("%s done in %.0f s", run.name, result["seconds"])
    del model  # before the next run builds its own
    release_memory()
    return scores


def pilot_passes(valid: list, scores: StepScores) -> dict:
    """Version 2's pilot rule, on validation only: a stream learns if its F rows' step t falls below every
    step of the C twin on at least twice the share that i.i.d. noise gets (1/(n+1) per question)."""
    rows, t = rows_by_kind(valid)
    primary = float(np.mean(below_every_clean_step(scores, rows["F"], rows["C"], t)))
    chance = float(np.mean(chance_below_every_clean_step([len(valid[r].steps) for r in rows["F"]])))
    return {"primary": primary, "chance": chance, "learns": primary >= 2 * chance}


def pilot_budget(
    cfg: MechanismConfig, sets: dict, encs: dict[str, list[Encoded]], caches: dict, fast: bool
) -> MechanismConfig:
    """The study's config after version 2's pilot (studies/mechanism/README.md): `l2r` and `r2l` seed 1106 at the
    paper's lr and epochs; if either learns (`pilot_passes`) they are the study's first runs, else they
    move to OUT/pilot/ and every run trains at (fallback_lr, fallback_epochs). Decided once (OUT/pilot.json)."""
    out = Path(cfg.out)
    path = out / "pilot.json"
    if not path.is_file():
        values = {}
        for mode in ("l2r", "r2l"):
            run = Run(mode, 1106)
            json_path = out / "runs" / f"{run.name}.json"
            if json_path.exists() and scores_path(cfg, run.name).exists():
                valid = load_scores(scores_path(cfg, run.name))["valid"]
            else:
                valid = train_and_score(cfg, run, sets, encs, caches, fast)["valid"]
            values[mode] = pilot_passes(sets["valid"], valid)
        go = any(v["learns"] for v in values.values())
        if not go:
            (out / "pilot").mkdir(exist_ok=True)
            for mode in values:
                for p in (out / "runs").glob(f"{mode}-seed1106.*"):
                    shutil.move(p, out / "pilot" / p.name)
        write_json(
            path,
            {
                "rule": pilot_passes.__doc__.split("\n")[0].strip(),
                "lr": cfg.lr,
                "epochs": cfg.epochs,
                "values": values,
                "decision": "the paper's lr and epochs"
                if go
                else f"fallback: lr {cfg.fallback_lr}, {cfg.fallback_epochs} epochs",
            },
        )
        log.info("pilot: %s", json.loads(path.read_text())["decision"])
    if json.loads(path.read_text())["decision"].startswith("fallback"):
        return replace(cfg, lr=cfg.fallback_lr, epochs=cfg.fallback_epochs)
    return cfg


def prepare(cfg: MechanismConfig, fast: bool, sets: dict) -> tuple[dict[str, list[Encoded]], dict]:
    """(the sets' encodings, their trunk caches): what every run reads. The caches are built once (or found) under the
    work dir and memory-mapped, so workers that call this again share them."""
    backbone_dir = resolve_backbone(cfg.backbone)
    tokenizer = load_tokenizer(backbone_dir)
    base = from_backbone(backbone_dir, tokenizer, mode="bi")
    encoder = Encoder(tokenizer, base.config.step_tag_id, cfg.max_length)
    encs = {
        name: [encoder.encode(t, f"{name} row {i + 1}") for i, t in enumerate(trajs)] for name, trajs in sets.items()
    }
    caches = trunk_caches(Path(cfg.work_dir), base, cfg.top_layers, encs, torch.bfloat16 if fast else None)
    del base  # the caches no longer hold it
    release_memory()
    return encs, caches


def finished(cfg: MechanismConfig, run: Run) -> bool:
    return (Path(cfg.out) / "runs" / f"{run.name}.json").exists() and scores_path(cfg, run.name).exists()


_WORKER: dict = {}  # a worker process's config, sets, encodings and caches, read once per process


def _start_worker(cfg: MechanismConfig, fast: bool, threads: int, sets: dict) -> None:
    torch.set_num_threads(threads)
    encs, caches = prepare(cfg, fast, sets)
    _WORKER.update(cfg=cfg, fast=fast, sets=sets, encs=encs, caches=caches)


def _train_in_worker(run: Run) -> str:
    w = _WORKER
    train_and_score(w["cfg"], run, w["sets"], w["encs"], w["caches"], w["fast"])
    return run.name


def side_by_side(cfg: MechanismConfig, runs: list[Run], fast: bool, sets: dict) -> None:
    """Train `runs` in `cfg.workers` processes on the one device, each reading the memory-mapped trunk caches and
    taking the next run as it finishes one; the cores are split evenly. A run's logits do not depend on which worker
    trains it or what runs beside it (tests/studies/test_mechanism_workers.py)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    threads = max(1, torch.get_num_threads() // cfg.workers)
    context = multiprocessing.get_context("spawn")  # CUDA cannot be forked
    with ProcessPoolExecutor(cfg.workers, context, _start_worker, (cfg, fast, threads, sets)) as pool:
        for done in as_completed([pool.submit(_train_in_worker, run) for run in runs]):
            log.info("%s in", done.result())


def run_study(cfg: MechanismConfig) -> None:
    if cfg.version == 3:
        v3.check_design(cfg)
    out, work, fast = start(cfg)
    check_machine(cfg, fast)
    sets, _, data_report = load_sets(cfg)
    write_json(out / "data_report.json", data_report)
    encs, caches = prepare(cfg, fast, sets)
    write_json(out / "meta.json", {"config": asdict(cfg), "bf16": fast, "sizes": {n: len(t) for n, t in sets.items()}})

    if cfg.version >= 2 and cfg.pilot:
        cfg = pilot_budget(cfg, sets, encs, caches, fast)
    pending = [run for run in runs_of(cfg) if not finished(cfg, run)]
    if cfg.workers > 1 and len(pending) > 1:
        side_by_side(cfg, pending, fast, sets)
        write_report(cfg)
        return
    for run in pending:
        train_and_score(cfg, run, sets, encs, caches, fast)
        write_report(cfg)


def write_report(cfg: MechanismConfig) -> dict:
    """The report of the study's version, from the logits in its output folder."""
    return {1: report, 2: v2_report}.get(cfg.version, v3).write_report(cfg)
