"""`python -m benchmarks.data`: the training data pipeline at Math-Shepherd size (docs/PERFORMANCE.md).

A TRL-format file of N rows (GSM8K-train questions and reference steps, resampled, with
Math-Shepherd-style labels; `--solutions-per-row 3.8` chains references into rows with 2.7x
the tokens, as long as Math-Shepherd's) is written once. Then `biprm train` is
started on it with the tiny backbone, so the time and memory measured are the data
pipeline's and the framework's, not a big model's, and stopped after its first
optimizer step, in four settings: 1 and 2 processes, each with an empty cache (cold)
and again with the cache the first run left (cached). Each process reports the seconds
from its start to the end of its first step, and its peak RSS twice: when training
begins (the data pipeline's peak: reading, encoding, the sampler, the first 100 batches)
and after the first step (which adds the model's longest batch: the length-grouped
sampler puts it first). The first process also reports the padding share of its first
100 batches.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from benchmarks.config import DataBenchConfig
from biprm.data.benchmarks import data_file


def write_rows(path: Path, n: int, data_root: str, per_row: float = 1.0, seed: int = 0) -> None:
    """n TRL rows: GSM8K-train questions with their reference steps, labels 1 before a random first error (or none).

    A row holds the steps of floor(per_row) or one more reference solutions (the question is
    the first one's), drawn so that rows chain `per_row` solutions on average.
    """
    from biprm.data.readers import read_rows, solution_steps

    source, _ = read_rows(str(data_file(data_root, "gsm8k", "train.jsonl.gz")))
    refs = [(r["question"], solution_steps(r["answer"])) for r in source]
    rng = np.random.default_rng(seed)
    chained = np.floor(per_row).astype(int) + (rng.random(n) < per_row % 1)
    picks, firsts = np.split(rng.integers(len(refs), size=chained.sum()), np.cumsum(chained)[:-1]), rng.random(n)
    with open(path, "w") as f:
        for pick, u in zip(picks, firsts):
            question, steps = refs[pick[0]][0], [s for i in pick for s in refs[i][1]]
            first = int(u * 2 * len(steps)) if u < 0.5 else len(steps)  # half the rows wrong from a uniform step on
            f.write(
                json.dumps({"prompt": question, "completions": steps, "labels": [t < first for t in range(len(steps))]})
                + "\n"
            )


def peak_rss_mib() -> float:
    """The process's peak resident memory so far (VmHWM, Linux; ru_maxrss elsewhere)."""
    status = Path("/proc/self/status")
    if status.exists():
        line = next(x for x in status.read_text().splitlines() if x.startswith("VmHWM:"))
        return round(int(line.split()[1]) / 1024, 1)
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def worker(spec: str) -> None:
    """One training process: time to the end of the first step, peak RSS, padding of the first 100 batches."""
    started = time.perf_counter()
    from transformers import TrainerCallback

    from biprm.training import TrainConfig, train

    job = json.loads(spec)
    report: dict = {}

    class FirstStep(TrainerCallback):
        def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
            if args.process_index == 0 and train_dataloader is not None:
                pad = total = 0
                for k, batch in enumerate(train_dataloader):
                    if k == 100:
                        break
                    pad, total = pad + int((batch["unit_ids"] == -1).sum()), total + batch["unit_ids"].numel()
                report["padding"] = pad / total
            report["peak_rss_before_step_mib"] = peak_rss_mib()

        def on_step_end(self, args, state, control, **kwargs):
            report.update(rank=args.process_index, seconds_to_first_step=round(time.perf_counter() - started, 1))
            control.should_training_stop = True

    cfg = TrainConfig(
        backbone="tiny",
        data=job["data"],
        output_dir=job["output_dir"],
        max_length=job["max_length"],
        per_device_train_batch_size=job["batch_size"],
        gradient_accumulation_steps=1,
        max_steps=10,
        save_steps=10**9,
        show_progress=False,
    )
    train(cfg, callbacks=[FirstStep()])
    report["peak_rss_mib"] = peak_rss_mib()
    Path(job["report"]).with_suffix(f".rank{report['rank']}.json").write_text(json.dumps(report))


def _launch(cfg: DataBenchConfig, data: Path, cache: Path, processes: int, name: str, work: Path) -> dict:
    report = work / f"{name}.json"
    spec = json.dumps(
        {
            "data": str(data),
            "output_dir": str(work / f"run-{name}"),
            "max_length": cfg.max_length,
            "batch_size": cfg.batch_size,
            "report": str(report),
        }
    )
    worker_cmd = ["-m", "benchmarks.data", spec]
    if processes > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), *worker_cmd]
    else:
        cmd = [sys.executable, *worker_cmd]
    env = {
        **os.environ,
        "HF_DATASETS_CACHE": str(cache),
        "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 1) // processes)),
    }
    started = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{name} failed:\n{done.stderr[-3000:]}")
    ranks = [json.loads(p.read_text()) for p in sorted(work.glob(f"{name}.rank*.json"))]
    return {"processes": processes, "wall_s": round(time.perf_counter() - started, 1), "ranks": ranks}


def run(cfg: DataBenchConfig) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(cfg.work_dir or tmp)
        work.mkdir(parents=True, exist_ok=True)
        data = work / f"trl-{cfg.name[5:]}.jsonl"
        if not data.exists():
            write_rows(data, cfg.rows, cfg.data_root, cfg.solutions_per_row)
        result = {"config": asdict(cfg), "file_mib": round(data.stat().st_size / 2**20, 1), "runs": {}}
        for processes in (1, 2):
            cache = work / f"hf-cache-{cfg.name[5:]}-{processes}"
            for state in ("cold", "cached"):
                name = f"{processes}proc-{state}"
                result["runs"][name] = _launch(cfg, data, cache, processes, name, work)
                print(name, json.dumps(result["runs"][name]), flush=True)
    return result


def write(result: dict, out: str) -> Path:
    path = Path(out) / f"{DataBenchConfig(**result['config']).name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    n = result["config"]["rows"]
    rows = [
        "| run | processes | wall (s) | slowest rank to first step (s) | rows/s to first step "
        "| peak RSS per rank before the first step (MiB) | peak RSS per rank with the first step (MiB) | padding |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, r in result["runs"].items():
        first = max(x["seconds_to_first_step"] for x in r["ranks"])
        rss = " / ".join(str(x["peak_rss_mib"]) for x in r["ranks"])
        data_rss = " / ".join(str(x.get("peak_rss_before_step_mib", "–")) for x in r["ranks"])
        pad = next((x["padding"] for x in r["ranks"] if "padding" in x), None)
        rows.append(
            f"| {name} | {r['processes']} | {r['wall_s']} | {first} | {n / first:,.0f} | {data_rss} | {rss} | "
            f"{'' if pad is None else f'{pad:.1%}'} |"
        )
    per_row = result["config"].get("solutions_per_row", 1.0)
    length = "" if per_row == 1 else f", {per_row:g} reference solutions per row"
    text = (
        f"# Data pipeline, {result['config']['rows']:,} TRL rows{length} ({result['file_mib']} MiB)\n\n"
        + "\n".join(rows)
        + "\n"
    )
    path.with_suffix(".md").write_text(text)
    print(text)
    return path


if __name__ == "__main__":
    if len(sys.argv) == 2 and not sys.argv[1].startswith(
        "-"
    ):  # one measured process, started by `run` with its settings
        worker(sys.argv[1])
    else:
        from biprm.cli import run_program

        run_program(DataBenchConfig, lambda cfg: write(run(cfg), cfg.out), "python -m benchmarks.data")
