"""`python -m benchmarks --preset long`: scoring one long trace, time per token and peak memory, `l2r` against each `bi`
layout.

A trace of L tokens per stream (a 64-token prompt, then 128-token steps) on a backbone's shape (random weights; `layers`
keeps its first K layers, as a 2-core machine cannot run 30 layers at 16k tokens in minutes: time per token and the
attention memory are properties of one layer, the weights' share is not). Configurations:
- `l2r`: one causal row;
- `bi:plain`: what `pack` runs past DENSE_MAX, one causal row per stream, no mask (memory linear in length);
- `bi:tree`: the shared-prompt tree under the dense per-stream mask (what ran at every length before), up to `tree_max`
  tokens per stream: past it its L x L bias alone outgrows the machine.
Each configuration of each length runs in a fresh process, which reports the wall time of one scoring call and its peak
memory (VmHWM above the resident set just before the call, with glibc returning freed blocks at once, as
`benchmarks.measure` does for training steps). A last probe takes one training step of the tiny bi model on a row of
`train_length` tokens per stream, against the 8 GB the issue allows. Ratios are read within one run.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModel

from biprm.backbones import resolve_backbone
from benchmarks.config import BenchConfig
from benchmarks.measure import _status_mib, fresh_process, machine, step_memory
from benchmarks.progress import Stages, announce
from benchmarks.report import _table, save
from biprm.data.encoding import Encoded
from biprm.modeling import BiPRMConfig, BiPRMModel
from biprm.packing import pack

PROMPT, STEP = 64, 128  # tokens of the trace's prompt and of each step
CONFIGS = ("l2r", "bi:plain", "bi:tree")
TAG = 7  # any id works as the step tag of a random-weight model


def trace(length: int, tag: int = TAG, labels: bool = False) -> Encoded:
    """One trajectory of `length` tokens per stream: the prompt, then steps of STEP tokens each ending with the tag."""
    n = (length - PROMPT) // STEP
    return Encoded(
        list(range(100, 100 + PROMPT)),
        [[11 + t % 50] * (STEP - 1) + [tag] for t in range(n)],
        [1.0] * n if labels else None,
    )


def model_of(shape: str, layers: int | None, mode: str) -> BiPRMModel:
    config = AutoConfig.from_pretrained(resolve_backbone(shape))
    config.num_hidden_layers = layers or config.num_hidden_layers
    torch.manual_seed(0)
    body = AutoModel.from_config(config, attn_implementation="sdpa")
    model = BiPRMModel(BiPRMConfig(backbone_config=config, mode=mode, step_tag_id=TAG), backbone=body)
    model.set_attn_implementation("sdpa")
    return model.eval()


def batch_of(name: str, length: int) -> dict[str, torch.Tensor]:
    mode, _, layout = name.partition(":")
    return pack([trace(length)], mode, share_prefix=layout == "tree", dense_max=None if layout == "tree" else 1024)


def probe(shape: str, layers: int | None, name: str, length: int, threads: int) -> dict:
    """Seconds and peak memory of one scoring call, in a fresh process."""
    spec = {"shape": shape, "layers": layers, "name": name, "length": length, "threads": threads}
    return fresh_process("benchmarks.long", spec, f"long-trace probe {name} at {length} tokens")


def _probe(path: str) -> None:
    spec = pickle.load(open(path, "rb"))
    torch.set_num_threads(spec["threads"])
    model = model_of(spec["shape"], spec["layers"], spec["name"].partition(":")[0])
    with torch.inference_mode():
        model(**batch_of(spec["name"], 256))  # warm-up: kernels and thread pools
        batch = batch_of(spec["name"], spec["length"])
        gc.collect()
        steady = _status_mib("VmRSS")
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        start = time.perf_counter()
        model(**batch)
        seconds = time.perf_counter() - start
    print(
        json.dumps(
            {
                "seconds": seconds,
                "peak_mib": _status_mib("VmHWM") - steady,
                "tokens": int((batch["unit_ids"] >= 0).sum()),
            }
        )
    )


def run(cfg: BenchConfig, sizes: dict | None = None) -> dict:
    """Every configuration at every length, shortest first; `sizes` overrides the preset's."""
    sizes = sizes or cfg.sizes
    threads = cfg.threads or os.cpu_count()
    start, load = time.perf_counter(), os.getloadavg()
    results = []
    probes = [(n, k) for n in sizes["lengths"] for k in CONFIGS if not (k == "bi:tree" and n > sizes["tree_max"])]
    announce(
        f"python -m benchmarks --preset long: {len(probes)} traces of "
        f"{', '.join(map(str, sizes['lengths']))} tokens on the {cfg.shape} shape ({sizes['layers']} layers), "
        f"then a tiny training step; results go to {cfg.out}/"
    )
    stages = Stages(len(probes) + 1)
    for length, name in probes:
        with stages.stage(f"{name} at {length} tokens"):
            got = probe(cfg.shape, sizes["layers"], name, length, threads)
        results.append({"config": name, "length": length, **got, "s_per_token": got["seconds"] / length})
        print(json.dumps(results[-1]), flush=True)
    with stages.stage(f"tiny training step at {sizes['train_length']} tokens"):
        memory = step_memory("tiny", [trace(sizes["train_length"], labels=True)], "bi:plain", threads)
    return {
        "config": asdict(cfg) | sizes,
        "machine": machine(),
        "loadavg_start": load,
        "loadavg_end": os.getloadavg(),
        "results": results,
        "train_tiny": memory | {"length": sizes["train_length"]},
        "elapsed_s": time.perf_counter() - start,
    }


def targets(result: dict) -> list[dict]:
    """The issue's targets: bi / l2r time per token at the longest length, peak memory there against 4k, tiny
    training."""
    at = {(r["config"], r["length"]): r for r in result["results"]}
    top = max(r["length"] for r in result["results"])
    rows = [
        (
            "time per token, bi:plain / l2r",
            f"{top}",
            at["bi:plain", top]["s_per_token"] / at["l2r", top]["s_per_token"],
            "<=",
            2.2,
        )
    ]
    if 4096 in {r["length"] for r in result["results"]}:
        for name in ("l2r", "bi:plain"):
            rows.append(
                (
                    f"peak memory, {name}: {top} / 4096 tokens",
                    "",
                    at[name, top]["peak_mib"] / at[name, 4096]["peak_mib"],
                    "<=",
                    4.5,
                )
            )
    rows.append(
        (
            "training step peak memory (GiB), tiny bi",
            f"{result['train_tiny']['length']}",
            (result["train_tiny"]["steady_mib"] + result["train_tiny"]["step_mib"]) / 1024,
            "<=",
            8.0,
        )
    )
    return [{"target": n, "at": a, "value": v, "op": op, "goal": g, "met": v <= g} for n, a, v, op, g in rows]


def write_markdown(result: dict, path: str) -> str:
    cfg, m = result["config"], result["machine"]
    by = {(r["config"], r["length"]): r for r in result["results"]}
    lengths = sorted({r["length"] for r in result["results"]})
    rows = [
        [
            n,
            L,
            by[n, L]["tokens"],
            by[n, L]["seconds"],
            by[n, L]["s_per_token"] / by["l2r", L]["s_per_token"],
            by[n, L]["peak_mib"],
        ]
        for L in lengths
        for n in CONFIGS
        if (n, L) in by
    ]
    parts = [
        f"# biprm bench: one long trace, {cfg['shape']} shape, {cfg['layers'] or 'all its'} layers (random weights, "
        "fp32)",
        f"{m['lscpu'].get('Model name', '?')}, {m['lscpu'].get('CPU(s)', '?')} CPUs shared with other work; torch "
        f"{m['torch']}, {m['threads']} threads. Load average at start {result['loadavg_start'][0]:.2f}, at end "
        f"{result['loadavg_end'][0]:.2f}. One scoring call per configuration and length, each in a fresh process. The "
        f"whole run took {result['elapsed_s'] / 60:.1f} min.",
        "## Targets",
        _table(
            ["target", "at", "measured", "goal", "met"],
            [[t["target"], t["at"], t["value"], f"{t['op']} {t['goal']}", t["met"]] for t in result["targets"]],
        ),
        "## Per length (tokens per stream): tokens run, seconds, time per trace token against l2r, peak memory of the "
        "call (MiB)",
        _table(["config", "length", "tokens run", "seconds", "per token / l2r", "peak MiB"], rows),
        f"Training step of the tiny bi model on one row of {result['train_tiny']['length']} tokens per stream: "
        f"{result['train_tiny']['steady_mib']:.0f} MiB resident before the step, "
        f"{result['train_tiny']['step_mib']:.0f} MiB more at its peak.",
    ]
    text = "\n\n".join(parts) + "\n"
    Path(path).write_text(text)
    return text


def main(cfg: BenchConfig, sizes: dict | None = None) -> dict:
    result = run(cfg, sizes)
    result["targets"] = targets(result)
    save(result, cfg.out, f"bench-{cfg.shape}-long", write_markdown)
    return result


if __name__ == "__main__":
    _probe(sys.argv[1])
