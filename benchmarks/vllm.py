"""`python -m benchmarks --preset vllm`: biprm's own scorer against vLLM with biprm's plugin, side by side in one run.

Random weights in a real backbone's shape: speed does not depend on them.

1. A Best-of-N pool (every candidate of the first questions of gsm8k_bon_small), scored
   whole: `Scorer.score` (which encodes each question's prompt once for all candidates and
   both streams) against the vLLM engine (`VLLMScorer.score`, one `LLM.encode`).
2. Concurrent clients sending single solutions to `biprm serve`, `biprm serve --engine vllm`
   and `vllm serve` of an export: throughput and p50/p99 latency.
Every score is checked against `Scorer.score` on the same input.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from dataclasses import asdict
from functools import partial
from pathlib import Path

import numpy as np

from benchmarks.config import BenchConfig
from benchmarks.measure import machine
from benchmarks.serve import Server, drive, save_json
from benchmarks.workload import build
from biprm.config import MAX_LENGTH
from biprm.data.benchmarks import gsm8k_bon_small
from biprm.scoring import Scorer
from biprm.serve.export import export_for_vllm
from biprm.serve.vllm_engine import VLLMScorer


def _score(scorer, trajs: list) -> object:
    """Encode, then score: what a caller of either engine does, so both timings include the tokenizer."""
    return scorer.score(scorer.encode(trajs)[0], progress=False)


def _timed(score, trajs) -> tuple[float, object]:
    started = time.perf_counter()
    scores = score(trajs)
    return time.perf_counter() - started, scores


def run(cfg: BenchConfig) -> dict:
    """The shape must suit vLLM's CPU attention (head size 32, 64, ...): smollm2-135m, not tiny."""
    sizes = cfg.sizes
    clients, limit = sizes["compare_at"], sizes["time_limit_s"]
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    bench = build(cfg.shape)
    pool = gsm8k_bon_small(cfg.data_root)
    questions = list(dict.fromkeys(t.question for t in pool))[: sizes["questions"]]
    bon = [t for t in pool if t.question in set(questions)]
    singles = [pool[i] for i in np.random.default_rng(0).choice(len(pool), sizes["requests"], replace=False)]
    result: dict = {"config": asdict(cfg) | sizes, "machine": machine(), "pool_solutions": len(bon)}
    with tempfile.TemporaryDirectory() as tmp:
        ckpt, export = Path(tmp) / "ckpt", Path(tmp) / "export"
        bench.ours["bi"].save_pretrained(ckpt)
        bench.tokenizer.save_pretrained(ckpt)
        export_for_vllm(str(ckpt), str(export))
        scorer = Scorer.from_pretrained(str(ckpt), device="cpu")
        seconds, want = _timed(partial(_score, scorer), bon)
        want_singles = _score(scorer, singles)
        engine = VLLMScorer.from_pretrained(str(ckpt), max_length=MAX_LENGTH, enforce_eager=True)
        _score(engine, bon[:2])  # warm-up
        vllm_seconds, got = _timed(partial(_score, engine), bon)
        engine.close()
        result["pool"] = {
            "biprm Scorer": {"solutions_per_s": round(len(bon) / seconds, 2)},
            "vLLM engine": {
                "solutions_per_s": round(len(bon) / vllm_seconds, 2),
                "max_abs_diff": float(np.max(np.abs(got.prob() - want.prob()))),
            },
        }
        servers = {}
        for name, flags in (
            ("biprm serve", ()),
            ("biprm serve --engine vllm", ("--engine", "vllm", "--engine-args", '{"enforce_eager": true}')),
        ):
            server = Server(ckpt, *flags)
            asyncio.run(drive(server.url + "/v1/score", singles[:2], 1, limit))  # warm-up, not counted
            servers[name] = asyncio.run(drive(server.url + "/v1/score", singles, clients, limit))
            server.stop()
        plugin = Server(export, vllm=True)
        asyncio.run(drive(plugin.url + "/pooling", singles[:2], 1, limit, vllm_model=str(export)))
        servers["vllm serve (plugin)"] = asyncio.run(
            drive(plugin.url + "/pooling", singles, clients, limit, vllm_model=str(export))
        )
        plugin.stop()
    for r in servers.values():
        scores = r.pop("scores")
        diffs = [np.max(np.abs(np.array(s) - want_singles.of(i))) for i, s in enumerate(scores) if s is not None]
        r["max_abs_diff"] = float(max(diffs)) if diffs else None
    result["servers"] = servers
    return result


def write(result: dict, out: str) -> Path:
    cfg = result["config"]
    path = save_json(result, out, f"vllm-{cfg['shape']}")
    rows = [
        f"| Best-of-N pool ({result['pool_solutions']} solutions, {cfg['questions']} questions) | solutions/s | max "
        "abs diff |",
        "| --- | ---: | ---: |",
    ]
    rows += [
        f"| {name} | {r['solutions_per_s']} | {r.get('max_abs_diff', 0.0):.1e} |" for name, r in result["pool"].items()
    ]
    rows += [
        "",
        f"| {cfg['compare_at']} clients, single solutions | ok | req/s | p50 (ms) | p99 (ms) | max abs diff |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    rows += [
        f"| {name} | {r['ok']} | {r['throughput_rps']} | {r['p50_ms']} | {r['p99_ms']} | {r['max_abs_diff']:.1e} |"
        for name, r in result["servers"].items()
    ]
    m = result["machine"]
    text = "\n".join(
        [
            f"# biprm against vLLM with biprm's plugin, {cfg['shape']} (random weights), "
            f"{m['lscpu'].get('Model name', 'CPU')}, {m['threads']} threads",
            "",
            *rows,
            "",
        ]
    )
    path.with_suffix(".md").write_text(text)
    print(text)
    return path
