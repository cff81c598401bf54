"""`biprm replicate`: the paper's L2R-vs-BiPRM comparison at laptop scale, read top to bottom.

1. Build the training data from real text on hand (`biprm.replication.data`), split
   validation by question and drop every question that an evaluation set contains.
2. Load SmolLM2-135M-Instruct and cut it: the embeddings and the bottom N-K layers are
   frozen, and their features for every trajectory and both streams are computed once
   into an on-disk cache (`biprm.trunk`) shared by every mode and seed.
3. For every (mode, seed): train the top K layers, the value head and the gate on the
   cached features with the same data, budget and hyper-parameters; evaluate on the
   validation split, ProcessBench, the PRMBench test split and Best-of-N; write one
   JSON per run. A finished run is never redone, and a killed run resumes from its
   last checkpoint, so the whole recipe can be stopped and restarted at any time.
4. Summarise every finished run into `results.json`, `report.md` and the figures.

Precision is decided at run time: bf16 autocast (fp32 master weights) where the CPU
multiplies bf16 natively or a GPU is present, fp32 elsewhere.
"""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm.auto import tqdm
from transformers import get_linear_schedule_with_warmup, set_seed

from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.data.encoding import Encoder
from biprm.evaluation.common import write_json
from biprm.modeling import BiPRMModel, from_backbone
from biprm.replication.config import NOT_STUDIED, VARIANTS, ReplicateConfig
from biprm.replication.data import build
from biprm.replication.evaluate import evaluate_run, load_eval_sets
from biprm.replication.report import write_report
from biprm.run_folder import changes
from biprm.scores import StepScores
from biprm.trunk import TrunkCache, cached_forward, cached_scores, freeze_bottom, split, trunk_digest

log = logging.getLogger(__name__)


@dataclass
class TrainBudget:
    """What `train_top` reads from a study's config; `heads_only` also freezes the top layers (a probe)."""

    top_layers: int
    lr: float
    epochs: float
    batch_size: int
    warmup_ratio: float
    gate_lr_scale: float
    save_every: int
    heads_only: bool = False

    @classmethod
    def of(cls, cfg: Any, **overrides) -> "TrainBudget":
        return cls(**{f: getattr(cfg, f) for f in cls.__dataclass_fields__ if hasattr(cfg, f)} | overrides)


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
    diff = changes(study(json.loads(path.read_text())["config"]), study(asdict(cfg)))
    if diff:
        raise ValueError(f"{cfg.out} holds the runs of another study ({'; '.join(diff)}); pass another --out, or remove it to start over")


def start(cfg: ReplicateConfig | Any) -> tuple[Path, Path, bool]:
    """(results folder, work dir, bf16?) of a study about to run: another study's folder is refused,
    every core is used, and bf16 is picked where the machine multiplies it natively."""
    check_study(cfg)
    torch.set_num_threads(os.cpu_count() or 1)
    out, work = Path(cfg.out), Path(cfg.work_dir)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    fast = {"auto": bf16_is_fast(), "yes": True, "no": False}[cfg.bf16]
    log.info("precision: %s", "bf16 autocast, fp32 master weights" if fast else "fp32")
    return out, work, fast


def replicate(cfg: ReplicateConfig) -> dict:
    out, work, fast = start(cfg)
    dtype = torch.bfloat16 if fast else None

    # 1. data
    train_trajs, valid_trajs, report = build(cfg.data_root, cfg.data)
    write_json(out / "data_report.json", asdict(report))
    sets = load_eval_sets(cfg, valid_trajs)

    # 2. the trunk, cached once for every set
    backbone_dir = resolve_backbone(cfg.backbone)
    tokenizer = load_tokenizer(backbone_dir)
    base = from_backbone(backbone_dir, tokenizer, mode="bi")
    encoder = Encoder(tokenizer, base.config.step_tag_id, cfg.max_length)
    encs = {"train": [encoder.encode(t, f"train row {i + 1}") for i, t in enumerate(train_trajs)]}
    encs |= {name: [encoder.encode(t, f"{name} row {i + 1}") for i, t in enumerate(trajs)] for name, trajs in sets.trajectories().items()}
    caches = {name: TrunkCache(work / "trunk", base, cfg.top_layers, e, dtype=dtype) for name, e in encs.items()}
    started = time.perf_counter()
    for name, cache in caches.items():
        log.info("trunk cache %s: %d trajectories, %d feature rows", name, len(encs[name]), cache.layout.n_rows)
        cache.build(progress=True)
    digest = trunk_digest(base, cfg.top_layers)
    del base
    meta = {
        "config": asdict(cfg), "bf16": fast, "trunk_cache_seconds_this_session": round(time.perf_counter() - started, 1),
        "sizes": {name: len(e) for name, e in encs.items()}, "torch_threads": torch.get_num_threads(),
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
        options = {"detach_gate_inputs": run_cfg.detach_gate_inputs, "aux_loss_weight": run_cfg.aux_loss_weight}
        model = seeded_model(backbone_dir, tokenizer, base_mode, seed, **options)
        if trunk_digest(model, cfg.top_layers) != digest:
            raise RuntimeError("the backbone's frozen layers changed since the trunk cache was built")
        options["gate_lr_scale"] = run_cfg.gate_lr_scale
        checkpoints = work / "runs" / cfg.preset / study_key(cfg) / name  # another study never resumes these
        train_log = train_top(TrainBudget.of(run_cfg), model, caches["train"], [e.labels for e in encs["train"]], seed, checkpoints, fast)
        model.eval()
        top = split(model, cfg.top_layers)[1]
        with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=fast):
            scores = {set_name: cached_scores(model, top, caches[set_name]) for set_name in sets.trajectories()}
        save_scores(checkpoints / "scores.npz", scores)
        result = {"run": name, "mode": mode, "seed": seed, "options": options, "train": train_log, **evaluate_run(cfg, base_mode, sets, scores, encs)}
        result["seconds"] = round(time.perf_counter() - started, 1)
        write_json(path, result)
        log.info("%s done in %.0f s", name, result["seconds"])
        del model, top, scores  # before the next run builds its own

    # 4. summary of whatever has finished
    return write_report(out, meta)


def report_only(cfg: ReplicateConfig) -> dict:
    """The report of the runs finished so far, without training (e.g. while the study goes on elsewhere)."""
    path = Path(cfg.out) / "meta.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run `biprm replicate --preset {cfg.preset}` first (it writes it once the caches are built)")
    return write_report(Path(cfg.out), json.loads(path.read_text()))


def _batches(lengths: np.ndarray, batch_size: int, epochs: float, seed: int) -> list[np.ndarray]:
    """Seeded length-grouped batches: shuffle, sort within windows of 8 batches (less padding), shuffle the batches."""
    rng = np.random.default_rng(seed)
    per_epoch = math.ceil(len(lengths) / batch_size)
    out: list[np.ndarray] = []
    for _ in range(math.ceil(epochs)):
        perm = rng.permutation(len(lengths))
        window = 8 * batch_size
        for a in range(0, len(perm), window):
            chunk = perm[a : a + window]
            chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
            out += [chunk[b : b + batch_size] for b in range(0, len(chunk), batch_size)]
    total = round(per_epoch * epochs)
    head = out[:total]
    return [head[i] for i in rng.permutation(len(head))]


def seeded_model(backbone_dir: str, tokenizer, mode: str, seed: int, **options) -> BiPRMModel:
    """A fresh model whose value head and gate initialisation the run's seed fixes."""
    set_seed(seed)
    return from_backbone(backbone_dir, tokenizer, mode=mode, **options)


def train_top(
    cfg: TrainBudget, model: BiPRMModel, cache: TrunkCache, labels: list[list[float]], seed: int, run_dir: Path, bf16: bool
) -> dict:
    """AdamW + linear schedule on the top layers (unless `heads_only`), value head and gate.

    Checkpointed every `save_every` steps; the final trainable state is kept as
    `run_dir/final.pt`, and a run that finds it loads it instead of training again.
    """
    set_seed(seed)
    freeze_bottom(model, cfg.top_layers)
    top = split(model, cfg.top_layers)[1]
    if cfg.heads_only:
        top.requires_grad_(False)
    model.train()
    trainable = {n: p for n, p in model.named_parameters() if p.requires_grad}
    final_path = run_dir / "final.pt"
    if final_path.exists():
        final = torch.load(final_path, weights_only=False)
        model.load_state_dict(final["trainable"], strict=False)
        return final["log"]
    gate = {n for n in trainable if n.startswith("gate.")}
    groups = [
        {"params": [p for n, p in trainable.items() if n not in gate], "lr": cfg.lr},
        {"params": [p for n, p in trainable.items() if n in gate], "lr": cfg.lr * cfg.gate_lr_scale},
    ]
    optimizer = torch.optim.AdamW([g for g in groups if g["params"]], weight_decay=0.0)
    batches = _batches(cache.layout.sizes, cfg.batch_size, cfg.epochs, seed)
    scheduler = get_linear_schedule_with_warmup(optimizer, round(cfg.warmup_ratio * len(batches)), len(batches))
    state_path = run_dir / "state.pt"
    losses: list[float] = []
    start = 0
    if state_path.exists():
        state = torch.load(state_path, weights_only=False)
        model.load_state_dict(state["trainable"], strict=False)
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        start, losses = state["step"], state["losses"]
        torch.set_rng_state(state["rng"])
        log.info("resuming %s at step %d of %d", run_dir.name, start, len(batches))
    began = time.perf_counter()
    for step in tqdm(range(start, len(batches)), initial=start, total=len(batches), desc=f"train {run_dir.name}", unit="step"):
        loss = accumulate(model, top, cache, batches[step], labels, bf16)
        torch.nn.utils.clip_grad_norm_(list(trainable.values()), 1.0)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
        if (step + 1) % cfg.save_every == 0 and step + 1 < len(batches):
            run_dir.mkdir(parents=True, exist_ok=True)
            state = {
                "trainable": {n: p.detach() for n, p in trainable.items()}, "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "step": step + 1, "losses": losses, "rng": torch.get_rng_state(),
            }
            torch.save(state, run_dir / "state.tmp")
            os.replace(run_dir / "state.tmp", state_path)
    log_ = {"steps": len(batches), "trajectories": len(labels), "losses": losses, "seconds": round(time.perf_counter() - began, 1)}
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.save({"trainable": {n: p.detach() for n, p in trainable.items()}, "log": log_}, run_dir / "final.tmp")
    os.replace(run_dir / "final.tmp", final_path)
    return log_


MICRO_TOKENS = 4096  # feature rows (both streams, padded) per backward pass: bounds activation memory on long rows


def micro_batches(sizes: np.ndarray, batch: np.ndarray, budget: int = MICRO_TOKENS) -> list[np.ndarray]:
    """`batch` cut into consecutive parts of at most `budget` padded feature rows (at least one trajectory each)."""
    parts, start = [], 0
    for end in range(1, len(batch) + 1):
        if end - start > 1 and (end - start) * sizes[batch[start:end]].max() > budget:
            parts.append(batch[start : end - 1])
            start = end - 1
    return parts + [batch[start:]]


def accumulate(model: BiPRMModel, top, cache: TrunkCache, batch: np.ndarray, labels: list[list[float]], bf16: bool,
               budget: int = MICRO_TOKENS) -> torch.Tensor:
    """The batch's loss, its gradient accumulated over micro-batches. Every objective is a mean over
    trajectories, so weighting each part by its share of them gives the whole batch's gradient."""
    total = torch.zeros(())
    for part in micro_batches(cache.layout.sizes, batch, budget):
        with torch.autocast(model.device.type, dtype=torch.bfloat16, enabled=bf16):
            loss = cached_forward(model, top, **cache.batch(part, model.streams, labels)).loss * (len(part) / len(batch))
        loss.backward()
        total += loss.detach().float().cpu()
    return total


def save_scores(path: Path, scores: dict[str, StepScores]) -> None:
    """Per-item step logits of one run, per evaluation set, so its metrics can be recomputed without training."""
    arrays = {f"{name}/{field}": value for name, s in scores.items() for field in ("offsets", "fused", "l2r", "r2l", "sigma")
              if (value := getattr(s, field)) is not None}
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".tmp"), "wb") as f:
        np.savez_compressed(f, **arrays)
    os.replace(path.with_suffix(".tmp"), path)


def load_scores(path: Path) -> dict[str, StepScores]:
    with np.load(path) as data:
        names = {key.split("/")[0] for key in data.files}
        get = lambda name, field: data[f"{name}/{field}"] if f"{name}/{field}" in data.files else None  # noqa: E731
        return {n: StepScores(get(n, "offsets"), get(n, "fused"), get(n, "l2r"), get(n, "r2l"), get(n, "sigma")) for n in names}
