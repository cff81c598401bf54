"""`python -m studies.replication`: the paper's L2R-vs-BiPRM comparison at laptop scale, read top to bottom.

1. Build the training data from real text on hand (`studies.replication.data`), split
   validation by question and drop every question that an evaluation set contains.
2. Load SmolLM2-135M-Instruct and cut it: the embeddings and the bottom N-K layers are
   frozen, and their features for every trajectory and both streams are computed once
   into an on-disk cache (`biprm.trunk`) shared by every mode and seed.
3. For every (mode, seed): train the top K layers, the value head and the gate on the
   cached features with the same data, budget and hyper-parameters, through `biprm train`'s
   trainer (`train_run`); evaluate on the
   validation split, ProcessBench, the PRMBench test split and Best-of-N; write one
   JSON per run. A finished run is never redone, and a killed run resumes from its
   last checkpoint, so the whole recipe can be stopped and restarted at any time.
4. Summarise every finished run into `results.json`, `report.md` and the figures.

Precision is decided at run time: bf16 autocast (fp32 master weights) where the CPU
multiplies bf16 natively or a GPU is present, fp32 elsewhere.
"""

from __future__ import annotations

import ctypes
import gc
import hashlib
import json
import logging
import os
import shutil
import time
from dataclasses import asdict, fields, replace
from pathlib import Path
from typing import Any, Callable

import torch

from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.data.encoding import Encoded, Encoder, add_step_tag
from biprm.evaluation.outputs import write_json
from biprm.config import TrainConfig
from biprm.modeling import BiPRMModel, from_backbone
from studies.replication.config import NOT_STUDIED, VARIANTS, ReplicateConfig
from studies.replication.data import build
from studies.replication.evaluate import EvalSets, evaluate_run, load_eval_sets
from studies.replication.report import write_report
from biprm.run_folder import changes
from biprm.scoring.scorer import default_device
from biprm.scoring.step_scores import load_scores, save_scores
from biprm.training import train
from biprm.trunk import TrunkCache, cached_scores

log = logging.getLogger(__name__)


def bf16_is_fast() -> bool:
    """A GPU, or a CPU with native bf16 dot products (avx512_bf16 / amx); elsewhere bf16 is emulated and slow."""
    if torch.cuda.is_available():
        return True
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def runs_of(cfg: ReplicateConfig) -> list[tuple[str, int]]:
    """(mode, seed) pairs: the first seed of every mode first, so an interrupted study covers every mode
    early, then the other seeds; the gate-study variants come last."""
    depth = max(cfg.seeds.values())
    runs = [(mode, 1106 + k) for k in range(depth) for mode, n in cfg.seeds.items() if k < n]
    return sorted(runs, key=lambda run: run[0] in VARIANTS)


def study(config: dict) -> dict:
    """The settings that decide the results (a config as JSON would hold it)."""
    return {k: v for k, v in json.loads(json.dumps(config)).items() if k not in NOT_STUDIED}


def study_key(cfg: ReplicateConfig | Any) -> str:
    """Names a study's run folders in the work dir, so another study never resumes their checkpoints."""
    return hashlib.sha256(json.dumps(study(asdict(cfg)), sort_keys=True).encode()).hexdigest()[:12]


def check_study(cfg: ReplicateConfig | Any) -> None:
    """Finished runs are kept across reruns, so a results folder holding another study's runs is refused."""
    path = Path(cfg.out) / "meta.json"
    if not path.is_file():
        return
    recorded = study(json.loads(path.read_text())["config"])
    defaults = {f.name: f.default for f in fields(cfg)}
    now = {
        k: v for k, v in study(asdict(cfg)).items() if k in recorded or v != defaults.get(k)
    }  # a setting added since, at its default, is no change
    diff = changes(recorded, now)
    if diff:
        raise ValueError(
            f"{cfg.out} holds the runs of another study ({'; '.join(diff)}); pass another --out, or remove it to start "
            "over"
        )


def start(cfg: ReplicateConfig | Any) -> tuple[Path, Path, bool]:
    """(results folder, work dir, bf16?) of a study about to run: another study's folder is refused,
    every core it may use is used (OMP_NUM_THREADS, if set, wins: on shared cores two threads that
    wait on each other run slower than one), and bf16 is picked where the machine multiplies it natively."""
    check_study(cfg)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS") or len(os.sched_getaffinity(0))))
    out, work = Path(cfg.out), Path(cfg.work_dir)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    fast = {"auto": bf16_is_fast(), "yes": True, "no": False}[cfg.bf16]
    log.info("precision: %s", "bf16 autocast, fp32 master weights" if fast else "fp32")
    return out, work, fast


def _malloc(call: Callable[[ctypes.CDLL], Any]) -> None:
    """A glibc allocator setting, where the C library is glibc; elsewhere nothing."""
    try:
        call(ctypes.CDLL("libc.so.6"))
    except (OSError, AttributeError):
        pass


def release_memory() -> None:
    """Give the memory of what a study has dropped (a backbone, a run's models) back to the system.

    A study builds and drops a model per run. glibc keeps freed blocks for reuse, and it raises its
    mmap threshold after each large free, so every run's tensors come from a heap that never shrinks
    by itself: the quick preset grew by about 0.7 GB per run. malloc_trim, between runs, hands the
    heap's free pages back. Pinning the threshold low instead (1 MiB, as this once did) maps every
    tensor of 1-32 MiB fresh and faults it in page by page: a third of a study's CPU time went to the
    kernel (studies/replication/README.md).
    """
    gc.collect()
    _malloc(lambda libc: libc.malloc_trim(0))


def prepare(cfg: ReplicateConfig, tokenizer, step_tag_id: int) -> tuple[EvalSets, dict[str, list[Encoded]], dict]:
    """(evaluation sets, every set's encodings, the data report): what a run trains on and is read on, encoded once for
    the study."""
    train_trajs, valid_trajs, report = build(cfg.data_root, cfg.data)
    sets = load_eval_sets(cfg, valid_trajs)
    encoder = Encoder(tokenizer, step_tag_id, cfg.max_length)
    named = {"train": train_trajs, **sets.trajectories()}
    encs = {
        name: [encoder.encode(t, f"{name} row {i + 1}") for i, t in enumerate(trajs)] for name, trajs in named.items()
    }
    return sets, encs, asdict(report)


def trunk_caches(
    work: Path, base: BiPRMModel, top_layers: int, encs: dict[str, list[Encoded]], dtype: torch.dtype | None
) -> dict[str, TrunkCache]:
    """Every set's trunk features, built (or found) under work/trunk. `base` moves to where the runs will train, so
    a GPU, when there is one, runs the trunk; once built, the caches no longer hold it."""
    base.to(default_device())
    caches = {name: TrunkCache(work / "trunk", base, top_layers, e, dtype=dtype) for name, e in encs.items()}
    for name, cache in caches.items():
        log.info("trunk cache %s: %d trajectories, %d feature rows", name, len(encs[name]), cache.layout.n_rows)
        cache.build(progress=True)
    return caches


def run_folder(cfg: ReplicateConfig, name: str) -> Path:
    """A run's checkpoints, final model and logits (never committed); another study never resumes these."""
    return Path(cfg.work_dir) / "runs" / cfg.preset / study_key(cfg) / name


def replicate(cfg: ReplicateConfig) -> dict:
    out, work, fast = start(cfg)
    dtype = torch.bfloat16 if fast else None

    # 1. data, encoded once with the step tag the model gets
    backbone_dir = resolve_backbone(cfg.backbone)
    tokenizer = load_tokenizer(backbone_dir)
    sets, encs, report = prepare(cfg, tokenizer, add_step_tag(tokenizer))
    write_json(out / "data_report.json", report)

    # 2. the trunk, cached once for every set
    base = from_backbone(backbone_dir, tokenizer, mode="bi")
    started = time.perf_counter()
    caches = trunk_caches(work, base, cfg.top_layers, encs, dtype)
    del base  # the caches no longer hold it
    release_memory()
    meta = {
        "config": asdict(cfg),
        "bf16": fast,
        "trunk_cache_seconds_this_session": round(time.perf_counter() - started, 1),
        "sizes": {name: len(e) for name, e in encs.items()},
        "torch_threads": torch.get_num_threads(),
    }
    write_json(out / "meta.json", meta)  # what `--report-only` summarises with

    # 3. every (mode, seed)
    for mode, seed in runs_of(cfg):
        name = f"{mode}-seed{seed}"
        path = out / "runs" / f"{name}.json"
        if path.exists():
            continue
        started = time.perf_counter()
        base_mode, overrides = VARIANTS.get(mode, (mode, {}))
        run_cfg = replace(cfg, **overrides)
        options = {
            "detach_gate_inputs": run_cfg.detach_gate_inputs,
            "aux_loss_weight": run_cfg.aux_loss_weight,
            "gate_lr_scale": run_cfg.gate_lr_scale,
        }
        folder = run_folder(cfg, name)
        model, train_log = train_run(run_cfg, base_mode, seed, folder, fast, encs["train"])
        with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=fast):
            scores = {set_name: cached_scores(model, caches[set_name]) for set_name in sets.trajectories()}
        save_scores(folder / "scores.npz", scores, compress=True)
        result = {
            "run": name,
            "mode": mode,
            "seed": seed,
            "options": options,
            "train": train_log,
            **evaluate_run(cfg, base_mode, sets, scores, encs),
        }
        result["seconds"] = round(time.perf_counter() - started, 1)
        write_json(path, result)
        log.info("%s done in %.0f s", name, result["seconds"])
        del model, scores  # before the next run builds its own
        release_memory()

    # 4. summary of whatever has finished
    return write_report(out, meta)


def report_only(cfg: ReplicateConfig) -> dict:
    """The report of the runs finished so far, without training. A run whose logits are in the work dir
    has its metrics recomputed from them first; runs without (older ones) are read from their JSON."""
    out = Path(cfg.out)
    path = out / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path} not found: run `python -m studies.replication --preset {cfg.preset}` first (it writes it once the "
            "caches are built)"
        )
    runs = {p: json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))}
    logits = {p: run_folder(cfg, run["run"]) / "scores.npz" for p, run in runs.items()}
    logits = {p: npz for p, npz in logits.items() if npz.is_file()}
    if logits:
        tokenizer = load_tokenizer(resolve_backbone(cfg.backbone))
        sets, encs, _ = prepare(cfg, tokenizer, add_step_tag(tokenizer))
        for p, npz in logits.items():
            run = runs[p]
            base_mode = VARIANTS.get(run["mode"], (run["mode"], {}))[0]
            write_json(p, run | evaluate_run(cfg, base_mode, sets, load_scores(npz), encs))
        log.info("recomputed %d of %d runs from their logits", len(logits), len(runs))
    return write_report(out, json.loads(path.read_text()))


def train_run(
    cfg: ReplicateConfig | Any,
    mode: str,
    seed: int,
    run_dir: Path,
    bf16: bool,
    encs: list[Encoded],
    heads_only: bool = False,
    callbacks: list | None = None,
) -> tuple[BiPRMModel, dict]:
    """(the trained model, its log) of one run, trained by `biprm train` on the study's trunk cache.

    The seed is set before the model is built, so it fixes the value head's and the gate's
    initialisation. The Trainer checkpoints into `run_dir` every `save_every` steps, and a
    killed run resumes there; the final model is kept in `run_dir` and the checkpoints go,
    and a run whose final model is in is loaded, not trained again.
    """
    if not (run_dir / "config.json").is_file():  # run_folder.publish moves config.json in last
        train(
            TrainConfig(
                backbone=cfg.backbone,
                data=f"{len(encs)} training trajectories of the study",
                output_dir=str(run_dir),
                mode=mode,
                learning_rate=cfg.lr,
                num_train_epochs=cfg.epochs,
                per_device_train_batch_size=cfg.batch_size,
                gradient_accumulation_steps=1,
                warmup_ratio=cfg.warmup_ratio,
                seed=seed,
                max_length=cfg.max_length,
                bf16=bf16,
                save_steps=cfg.save_every,
                save_total_limit=1,
                logging_steps=1,
                resume=run_dir.is_dir(),
                gate_lr_scale=cfg.gate_lr_scale,
                detach_gate_inputs=getattr(cfg, "detach_gate_inputs", False),
                aux_loss_weight=getattr(cfg, "aux_loss_weight", 0.0),
                train_top_layers=cfg.top_layers,
                heads_only=heads_only,
                trunk_cache_dir=str(Path(cfg.work_dir) / "trunk"),
            ),
            callbacks=callbacks,
            encoded=encs,
        )
        for checkpoint in run_dir.glob("checkpoint-*"):
            shutil.rmtree(checkpoint)
        release_memory()  # the Trainer's copy goes before the final model loads
    history = json.loads((run_dir / "train_log.json").read_text())
    losses = [e["loss"] for e in history if "loss" in e]
    seconds = next((e["train_runtime"] for e in history if "train_runtime" in e), None)
    return BiPRMModel.from_pretrained(run_dir).to(default_device()).eval(), {
        "steps": len(losses),
        "trajectories": len(encs),
        "losses": losses,
        "seconds": seconds,
    }
