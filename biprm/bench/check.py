"""`biprm check`: the cluster path, tried once on this machine, as a pass/fail table.

Tests on a CPU cannot show that a GPU node runs biprm, so the first GPU that touches it should
leave evidence. This runs what a cluster job does, in order:

1. a few optimizer steps of a training config (the paper's by default: bf16, ZeRO-3) under the
   launcher a job would use (`torchrun`, one process per GPU);
2. a simulated preemption: the last checkpoint and the final model are deleted, `--resume`
   continues from the one before, and must reach the uninterrupted run's weights;
3. a scoring pass of the trained model;
4. single-solution latency of `bi` against `l2r` (the paper reports +5 %);
5. the dtype that `vllm serve` would give the model's export.

Each item is written with what was measured to OUT/check.{json,md}. `--smoke` runs the same
items on the tiny backbone on a CPU in about a minute (what the tests run).
"""
from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from biprm.bench.config import CheckConfig


@dataclass
class Item:
    name: str
    status: str  # pass, fail, info (a measurement with no bar to clear) or skip
    detail: str


def run_check(cfg: CheckConfig) -> list[Item]:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    run, command = out / "run", train_command(cfg, out)
    items = [trained(cfg, command, run, out)]
    if not (run / "config.json").is_file():  # a run that trained but failed a bar (its heads' dtype) is still checked on
        return items + [Item(n, "skip", "needs the trained model") for n in ("resume", "score", "latency bi/l2r", "vllm export dtype")]
    items += [resumed(cfg, command, run, out), scored(cfg, run, command[command.index("--data") + 1]), latency(cfg),
              vllm_dtype(run, out)]
    return items


def device(cfg: CheckConfig) -> torch.device:
    return torch.device("cpu" if cfg.smoke or not torch.cuda.is_available() else "cuda")


def train_command(cfg: CheckConfig, out: Path) -> list[str]:
    """`biprm train` as a job launches it: the config file, then this check's small budget on top."""
    launch = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={cfg.processes}"] if cfg.processes > 1 else [sys.executable]
    flags = ["--config", cfg.train_config] if cfg.train_config else []
    flags += ["--backbone", cfg.backbone, "--data", data_slice(cfg, out), "--max-steps", "3", "--save-steps", "1",
              "--save-total-limit", "3", "--logging-steps", "1", "--output-dir", str(out / "run"), "--show-progress", "false"]
    if cfg.smoke:
        flags += ["--batch-size", "2", "--grad-accum", "1", "--lr", "1e-3", "--max-length", "256", "--bf16"]
    return [*launch, "-m", "biprm.cli", "train", *flags]


def data_slice(cfg: CheckConfig, out: Path) -> str:
    """The first `rows` trajectories of a local file, as TRL JSONL; any other source as it is."""
    from biprm.data.readers import load_trajectories, looks_like_path
    from biprm.data.writer import write_trajectories

    if not looks_like_path(cfg.data) or not Path(cfg.data).is_file():
        return cfg.data
    return str(write_trajectories(out / "slice.jsonl", load_trajectories(cfg.data)[: cfg.rows]))


def launch(command: list[str], log: Path) -> tuple[int, str, float]:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    log.write_text(done.stdout + done.stderr)
    return done.returncode, done.stderr, time.perf_counter() - start


def trained(cfg: CheckConfig, command: list[str], run: Path, out: Path) -> Item:
    (run / "config.json").unlink(missing_ok=True)  # an earlier check's model must not stand in for a run that fails early
    code, err, seconds = launch(command + ["--overwrite"], out / "train.log")
    if code != 0:
        return Item("train 3 steps", "fail", f"exit {code}: {err.strip().splitlines()[-1] if err.strip() else ''} (log: {out / 'train.log'})")
    losses = [e["loss"] for e in json.loads((run / "train_log.json").read_text()) if "loss" in e]
    heads = head_dtypes(run)
    ok = bool(losses) and all(math.isfinite(x) for x in losses) and heads == {"F32"}
    return Item("train 3 steps", "pass" if ok else "fail",
                f"{seconds:.0f} s, {cfg.processes} process(es); losses {', '.join(f'{x:.4f}' for x in losses)}; heads saved as {sorted(heads)}")


def head_dtypes(folder: Path) -> set[str]:
    from safetensors import safe_open

    from biprm.modeling import HEADS

    found = set()
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            found |= {f.get_slice(k).get_dtype() for k in f.keys() if k.startswith(HEADS)}
    return found


def resumed(cfg: CheckConfig, command: list[str], run: Path, out: Path) -> Item:
    """Delete the last checkpoint and the final model, resume, and compare with the uninterrupted weights."""
    before = weights(run)
    shutil.rmtree(run / "checkpoint-3")
    for f in [run / "config.json", *run.glob("*.safetensors")]:
        f.unlink()
    code, err, seconds = launch(command + ["--resume"], out / "resume.log")
    if code != 0:
        return Item("resume", "fail", f"exit {code} (log: {out / 'resume.log'})")
    if "resuming from" not in err or "checkpoint-2" not in err:
        return Item("resume", "fail", f"did not resume from checkpoint-2 (log: {out / 'resume.log'})")
    after = weights(run)
    gap = max(float((before[k] - after[k]).abs().max()) for k in before)
    return Item("resume", "pass" if gap <= cfg.resume_tolerance else "fail",
                f"{seconds:.0f} s; from checkpoint-2 to step 3, largest weight difference to the uninterrupted run {gap:.2e} "
                f"(at most {cfg.resume_tolerance:g})")


def weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return {k: v.float() for path in sorted(folder.glob("*.safetensors")) for k, v in load_file(str(path)).items()}


def scored(cfg: CheckConfig, run: Path, source: str) -> Item:
    """Score the training slice (a Hub set is not read again: the synthetic task stands in)."""
    from biprm.data.readers import load_trajectories, synthetic_spec
    from biprm.scoring.scorer import Scorer

    scorer = Scorer.from_pretrained(str(run), device=device(cfg))
    trajs = load_trajectories(source)[: cfg.rows] if Path(source).is_file() or synthetic_spec(source) else synthetic(cfg.rows)
    start = time.perf_counter()
    scores = scorer.score(scorer.encode(trajs)[0], progress=False)
    seconds = time.perf_counter() - start
    finite = bool(np.isfinite(scores.fused).all())
    sigma_ok = scores.sigma is None or bool(((scores.sigma > 0) & (scores.sigma < 1)).all())
    return Item("score", "pass" if finite and sigma_ok else "fail",
                f"{len(trajs)} trajectories in {seconds:.2f} s on {device(cfg)}; budgets {asdict(scorer.budgets)}")


def synthetic(n: int):
    from biprm.data.readers import load_trajectories

    return load_trajectories(f"synthetic:{n}")


def latency(cfg: CheckConfig) -> Item:
    """Median time to score one solution, bi against l2r, on the same body and the same solutions."""
    from biprm.backbones import load_tokenizer, resolve_backbone
    from biprm.modeling import from_backbone
    from biprm.scoring.scorer import Scorer

    where = device(cfg)
    dtype = torch.bfloat16 if where.type == "cuda" else torch.float32
    path = resolve_backbone(cfg.backbone)
    trajs = synthetic(cfg.latency_solutions)
    median = {}
    for mode in ("l2r", "bi"):
        tok = load_tokenizer(path)
        scorer = Scorer(from_backbone(path, tok, mode=mode, dtype=dtype).to(where), tok)
        encs = [scorer.encode([t])[0] for t in trajs]
        scorer.score(encs[0], progress=False)  # warm-up: kernels, allocator
        times = []
        for enc in encs:
            start = time.perf_counter()
            scorer.score(enc, progress=False)
            if where.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        median[mode] = float(np.median(times))
        del scorer
    ratio = median["bi"] / median["l2r"]
    return Item("latency bi/l2r", "info", f"{ratio:.3f} (l2r {1e3 * median['l2r']:.1f} ms, bi {1e3 * median['bi']:.1f} ms per solution, "
                                          f"median of {len(trajs)} on {where}, {dtype}); the paper reports 1.05")


def vllm_dtype(run: Path, out: Path) -> Item:
    """The dtype `vllm serve EXPORT` picks under `--dtype auto`: asked of vLLM where it is installed, else its rule
    (a pooling model's float32 config is served in float16; what the export names is what it gets)."""
    import importlib.util

    from biprm.vllm_plugin import SERVED_DTYPES
    from biprm.serve.export import export_for_vllm

    export = export_for_vllm(str(run), str(out / "vllm-export"), link=True)
    named = json.loads((export / "config.json").read_text()).get("dtype")
    if importlib.util.find_spec("vllm") is None:
        served, source = (named if named in SERVED_DTYPES else "float16"), "vLLM's rule (vLLM is not installed here)"
    else:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.plugins import load_general_plugins

        load_general_plugins()
        served, source = str(EngineArgs(model=str(export)).create_model_config().dtype).removeprefix("torch."), "asked of vLLM"
    return Item("vllm export dtype", "pass" if served == named == "bfloat16" else "fail",
                f"the export names {named}; `vllm serve` picks {served} ({source})")


def write(items: list[Item], out: str | Path) -> Path:
    out = Path(out)
    (out / "check.json").write_text(json.dumps([asdict(i) for i in items], indent=2))
    lines = ["| item | status | measured |", "| --- | --- | --- |", *(f"| {i.name} | {i.status} | {i.detail} |" for i in items)]
    (out / "check.md").write_text("\n".join(lines) + "\n")
    return out / "check.md"
