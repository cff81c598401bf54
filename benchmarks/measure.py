"""How the benchmarks measure: round-robin timing, counted FLOPs, matmul peak, per-process peak memory.

Memory. PyTorch's CPU allocator keeps no statistics, so a training step's peak is read
from the kernel in a fresh process: run one step (it allocates the optimizer state),
reset the high-water mark (`/proc/self/clear_refs`), run a second step and report
VmHWM minus the VmRSS just before it. glibc is told to serve every block above 64 KiB
with mmap (MALLOC_MMAP_THRESHOLD_), so freed tensors leave RSS at once and RSS tracks
live tensors instead of allocator slack. Linux only.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import re
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
import torch.nn as nn

from benchmarks.workload import build, train_step, training_config
from biprm.data.encoding import Encoded


@contextmanager
def counting_flops(model: nn.Module) -> Iterator[list[int]]:
    """Executed model FLOPs of everything `model` runs, read from shapes by forward hooks (no overhead to speak of).

    Linear layers count 2 * tokens * in * out, padding included; attention counts the
    dense 4 * tokens * keys * heads * head_dim over cached and own keys, as a masked
    kernel computes it. A call made under autograd counts 3x (backward = 2 x forward).
    """
    total = [0]

    def linear(m: nn.Linear, args, out: torch.Tensor) -> None:
        total[0] += 2 * out.numel() * m.in_features * (3 if out.requires_grad else 1)

    def attention(m: nn.Module, args, kwargs, out) -> None:
        h, cache = out[0], kwargs.get("cache", kwargs.get("past_key_values"))
        keys = cache.get_seq_length(m.layer_idx) if cache is not None else h.shape[1]
        heads = m.config.num_attention_heads
        total[0] += 4 * h.shape[0] * h.shape[1] * keys * heads * m.head_dim * (3 if h.requires_grad else 1)

    handles = [m.register_forward_hook(linear) for m in model.modules() if isinstance(m, nn.Linear)]
    handles += [
        m.register_forward_hook(attention, with_kwargs=True)
        for m in model.modules()
        if type(m).__name__.endswith("Attention") and hasattr(m, "head_dim")
    ]
    try:
        yield total
    finally:
        for handle in handles:
            handle.remove()


def timed(
    fns: dict[str, Callable[[], object]], repeats: int, warmup: int = 1, flops_of: nn.Module | None = None
) -> dict[str, dict]:
    """Median wall and CPU seconds of each function, and its FLOPs per call when `flops_of` is given.

    Every repeat runs each function once in turn, so a burst of load from another process
    slows one round of every configuration instead of all repeats of one.
    """
    out: dict[str, dict] = {k: {"wall_s": [], "cpu_s": []} for k in fns}
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    for _ in range(repeats):
        for k, fn in fns.items():
            with counting_flops(flops_of if flops_of is not None else nn.Module()) as flops:
                cpu, wall = time.process_time(), time.perf_counter()
                fn()
                out[k]["wall_s"].append(time.perf_counter() - wall)
                out[k]["cpu_s"].append(time.process_time() - cpu)
            out[k]["flops"] = flops[0]
    for r in out.values():
        r["median_s"] = statistics.median(r["wall_s"])
        r["cpu_median_s"] = statistics.median(r["cpu_s"])
        r["spread"] = max(r["wall_s"]) / min(r["wall_s"])
        r["gflops_per_s"] = r["flops"] / r["median_s"] / 1e9
    return out


def matmul_peak(dtype: torch.dtype, seconds: float = 0.3) -> dict:
    """Best GFLOP/s of square matmuls, the largest sized so one product takes about `seconds` (n <= 3072)."""

    def rate(n: int) -> float:
        a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
        best = float("inf")
        for _ in range(3):
            t = time.perf_counter()
            a @ b
            best = min(best, time.perf_counter() - t)
        return 2 * n**3 / best / 1e9

    top = max(64, int(min(3072, (seconds * rate(256) * 1e9 / 2) ** (1 / 3))) // 64 * 64)
    gflops, n = max((rate(n), n) for n in {max(64, top // 128 * 64), top})
    return {"dtype": str(dtype).removeprefix("torch."), "n": n, "gflops": gflops}


def machine() -> dict:
    fields = dict(
        (k.strip(), v.strip()) for k, v in (line.split(":", 1) for line in _run(["lscpu"]).splitlines() if ":" in line)
    )
    flags = fields.get("Flags", "").split()
    keep = ("Model name", "CPU(s)", "Thread(s) per core", "L2 cache", "L3 cache", "Hypervisor vendor")
    return {
        "lscpu": {k: fields[k] for k in keep if k in fields},
        "simd": [f for f in ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile") if f in flags],
        "mkldnn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
    }


def _run(command: list[str]) -> str:
    try:
        return subprocess.run(command, capture_output=True, text=True).stdout
    except OSError:
        return ""


def step_memory(shape: str, encs: list[Encoded], name: str, threads: int) -> dict:
    """Peak memory of one training step of configuration `name`, in a fresh process (see module docstring)."""
    return fresh_process(
        "benchmarks.measure",
        {"shape": shape, "encs": encs, "name": name, "threads": threads},
        f"memory probe for {name}",
    )


def fresh_process(module: str, spec: dict, what: str) -> dict:
    """What `python -m module SPEC.pkl` prints last, as JSON: a probe run where no earlier allocation counts, with glibc
    returning freed blocks at once (see module docstring)."""
    with tempfile.NamedTemporaryFile(suffix=".pkl") as f:
        pickle.dump(spec, f)
        f.flush()
        env = os.environ | {"MALLOC_MMAP_THRESHOLD_": "65536"}
        done = subprocess.run([sys.executable, "-m", module, f.name], capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _status_mib(key: str) -> float:
    return int(re.search(rf"{key}:\s+(\d+) kB", open("/proc/self/status").read()).group(1)) / 1024


def _memory_probe(path: str) -> None:
    spec = pickle.load(open(path, "rb"))
    torch.set_num_threads(spec["threads"])
    model, inputs = training_config(build(spec["shape"]), spec["encs"], spec["name"])
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
    train_step(model, inputs, optimizer)
    gc.collect()
    steady = _status_mib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    train_step(model, inputs, optimizer)
    peak = _status_mib("VmHWM")
    print(json.dumps({"steady_mib": steady, "peak_mib": peak, "step_mib": peak - steady}))


if __name__ == "__main__":
    _memory_probe(sys.argv[1])
