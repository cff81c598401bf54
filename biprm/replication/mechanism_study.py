"""`biprm replicate --preset mechanism`: the controlled test of the R2L stream and the gate.

Read top to bottom:
1. Build the R/C/F/L rows (`biprm.replication.mechanism`): train and validation from
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
5. The report (`biprm.replication.mechanism_report`) is computed from the saved logits
   alone, so it can be redone, or changed, without training.

The endpoints are written in docs/MECHANISM.md before the runs; the report computes
exactly those.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.data.encoding import Encoder
from biprm.evaluation.common import write_json
from biprm.modeling import from_backbone
from biprm.replication.config import MechanismConfig
from biprm.replication.mechanism import load_sets, scores_path
from biprm.replication.mechanism_report import write_report
from biprm.replication.recipe import release_memory, save_scores, start, study_key, train_run
from biprm.trunk import TrunkCache, cached_scores

log = logging.getLogger(__name__)


@dataclass
class Run:
    mode: str
    seed: int
    heads_only: bool = False

    @property
    def name(self) -> str:
        return f"{'probe-' if self.heads_only else ''}{self.mode}-seed{self.seed}"


def runs_of(cfg: MechanismConfig) -> list[Run]:
    """The pilot pair (l2r, r2l) first, then `bi`, then the remaining seeds: the runs the verdict needs
    come before `bi-static` and the probes, so an interrupted study decides as early as it can."""
    depth = max(cfg.seeds.values())
    order = ("l2r", "r2l", "bi", "bi-static")
    runs = [Run(m, 1106 + k) for k in range(depth) for m in order if k < cfg.seeds.get(m, 0)]
    runs.sort(key=lambda run: run.mode == "bi-static")
    return runs + [Run(m, 1106 + k, heads_only=True) for k in range(cfg.probe_seeds) for m in order]


def run_dir(cfg: MechanismConfig, name: str) -> Path:
    """Where a run keeps its checkpoints and final state (never committed)."""
    return Path(cfg.work_dir) / "runs" / study_key(cfg) / name


def run_study(cfg: MechanismConfig) -> None:
    out, work, fast = start(cfg)
    dtype = torch.bfloat16 if fast else None

    sets, _, report = load_sets(cfg)
    write_json(out / "data_report.json", report)
    backbone_dir = resolve_backbone(cfg.backbone)
    tokenizer = load_tokenizer(backbone_dir)
    base = from_backbone(backbone_dir, tokenizer, mode="bi")
    encoder = Encoder(tokenizer, base.config.step_tag_id, cfg.max_length)
    encs = {name: [encoder.encode(t, f"{name} row {i + 1}") for i, t in enumerate(trajs)] for name, trajs in sets.items()}
    caches = {name: TrunkCache(work / "trunk", base, cfg.top_layers, e, dtype=dtype) for name, e in encs.items()}
    for name, cache in caches.items():
        log.info("trunk cache %s: %d trajectories, %d feature rows", name, len(encs[name]), cache.layout.n_rows)
        cache.build(progress=True)
    del base  # the caches no longer hold it
    release_memory()
    write_json(out / "meta.json", {"config": asdict(cfg), "bf16": fast, "sizes": {n: len(t) for n, t in sets.items()}})

    for run in runs_of(cfg):
        path = out / "runs" / f"{run.name}.json"
        if path.exists() and scores_path(cfg, run.name).exists():
            continue
        started = time.perf_counter()
        model, train_log = train_run(cfg, run.mode, run.seed, run_dir(cfg, run.name), fast, sets["train"], heads_only=run.heads_only)
        with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=fast):
            scores = {name: cached_scores(model, caches[name]) for name in sets if name != "train"}
        save_scores(scores_path(cfg, run.name), scores)
        result = {"run": run.name, **asdict(run), "train": train_log, "seconds": round(time.perf_counter() - started, 1)}
        write_json(path, result)
        log.info("%s done in %.0f s", run.name, result["seconds"])
        del model, scores  # before the next run builds its own
        release_memory()
        write_report(cfg)

