"""`python -m benchmarks`: BiPRM against the reference pattern and against itself, side by side in one run.

Sections: matmul peak and machine; gate parameters at Qwen2.5-Math-1.5B's shape (meta
device); fp32 full-vocabulary logits memory (analytic); training step time, FLOP/s and
peak memory; single-solution latency; Best-of-N scoring of real GSM8K candidates; cost
against the number of candidates and solution length. Only ratios of times taken in the
same run are compared (see docs/PERFORMANCE.md).

Configuration names: `ref-<mode>` is the reference pattern (benchmarks.reference);
`<mode>:plain` puts every stream in its own row (prompt copied, no mask); `<mode>:tree`
puts a trajectory's prompt once, then its streams (the training layout);
`<mode>:default` is the Scorer's one-pass default (tree rows up to 512 tokens, plain
rows beyond); `<mode>:kv` encodes each question's prompt once into a KV cache for all
its candidates (`Scorer(prefix_cache=True)`).
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict
from functools import partial

import numpy as np
import torch
from transformers import Qwen2Config

from benchmarks.config import BenchConfig
from benchmarks.measure import machine, matmul_peak, step_memory, timed
from benchmarks.reference import score_one_at_a_time
from benchmarks.progress import Stages, announce
from benchmarks.report import plot_scaling, save, targets, write_markdown
from benchmarks.workload import CANDIDATES, Bench, build, question_pool, train_step, training_batch, training_config
from biprm.data.trajectory import Trajectory
from biprm.data.benchmarks import gsm8k_bon_small
from biprm.modeling import BiPRMConfig, BiPRMModel
from biprm.scoring.scorer import Scorer

# (what the targets need, what the full run adds)
TRAIN = ("ref-bi", "l2r:plain", "bi:tree"), ("ref-l2r", "bi:plain", "bi:packed1024")
MEMORY = ("ref-bi", "bi:tree"), ("l2r:plain",)
LATENCY = ("ref-bi", "l2r:plain", "bi:default", "bi:kv"), ("ref-l2r", "bi:plain")
BON = ("ref-bi", "l2r:plain", "l2r:kv", "bi:kv"), ("ref-l2r", "bi:default")
SCALING = ("l2r:plain", "bi:plain", "bi:default", "bi:kv")


def scorer(bench: Bench, name: str) -> Scorer:
    mode, layout = name.split(":")
    model, tok = bench.ours[mode], bench.tokenizer
    if layout == "plain":  # the cache is chosen explicitly: left to itself, Scorer picks it for these pools
        return Scorer(model, tok, share_prefix=False, tokens_per_row=None, prefix_cache=False)
    return Scorer(model, tok, prefix_cache=layout == "kv")


def scoring_fn(bench: Bench, name: str, trajs: list[Trajectory]):
    """Score `trajs` with configuration `name`: the reference one candidate at a time, ours in one call."""
    if name.startswith("ref-"):
        return partial(score_one_at_a_time, bench.ref[name[4:]], bench.encoder(), trajs, bench.pad_id)
    ours = scorer(bench, name)
    return lambda: ours.score(ours.encode(trajs)[0], progress=False)  # timed with the encoding, as a caller pays it


def gate_overhead() -> dict:
    """Parameters of BiPRM on Qwen2.5-Math-1.5B's shape, built on the meta device (nothing downloaded)."""
    config = Qwen2Config(
        hidden_size=1536,
        num_hidden_layers=28,
        vocab_size=151936,
        intermediate_size=8960,
        num_attention_heads=12,
        num_key_value_heads=2,
        tie_word_embeddings=True,
    )
    with torch.device("meta"):
        model = BiPRMModel(BiPRMConfig(backbone_config=config, mode="bi"))
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    body, gate, value = count(model.backbone), count(model.gate), count(model.value_head)
    return {
        "backbone": body,
        "value_head": value,
        "gate": gate,
        "l2r_total": body + value,
        "bi_total": body + value + gate,
        "gate_fraction": gate / (body + value),
    }


def logits_memory(vocabs=(49152, 151936), batches=(1, 4, 8), lengths=(256, 1024, 2048)) -> list[dict]:
    """Bytes of one stream's fp32 full-vocabulary logits, B x L x V x 4, which BiPRM never materialises."""
    return [
        {"vocab": v, "batch": b, "length": n, "gib": b * n * v * 4 / 2**30}
        for v in vocabs
        for b in batches
        for n in lengths
    ]


def train_section(bench: Bench, cfg: BenchConfig, pool: list[Trajectory], threads: int) -> dict:
    encs = training_batch(pool, bench.encoder(), cfg.sizes["batch"], cfg.sizes["tokens"], cfg.seed)
    everything = torch.nn.ModuleList([*bench.ours.values(), *bench.ref.values()]).train()
    optimizer = torch.optim.AdamW(everything.parameters(), lr=1e-6)
    configs = {name: training_config(bench, encs, name) for name in cfg.names(TRAIN)}
    fns = {name: partial(train_step, model, inputs, optimizer) for name, (model, inputs) in configs.items()}
    rows = timed(fns, cfg.sizes["repeats"], warmup=1, flops_of=everything)
    del optimizer
    everything.eval()
    for name, row in rows.items():
        row["layout"] = list(configs[name][1]["input_ids"].shape) if ":" in name else None
        if name.startswith("ref-"):  # its LM head runs under autograd but never backward: FLOPs would be overcounted
            row["flops"] = row["gflops_per_s"] = None
        if cfg.memory and name in cfg.names(MEMORY):
            row["memory"] = step_memory(cfg.shape, encs, name, threads)
    return {
        "batch": len(encs),
        "tokens_per_stream": [e.n_tokens for e in encs],
        "prompts": [len(e.prompt) for e in encs],
        "rows": rows,
    }


def latency_section(bench: Bench, cfg: BenchConfig, trajs: list[Trajectory]) -> dict:
    """Seconds to score one solution alone, median over a few candidates of the pool."""
    picked = [
        trajs[i] for i in np.random.default_rng(cfg.seed).choice(len(trajs), cfg.sizes["latency_sample"], replace=False)
    ]
    fns = {name: [scoring_fn(bench, name, [t]) for t in picked] for name in cfg.names(LATENCY)}
    rows = timed(
        {k: lambda fs=fs: [f() for f in fs] for k, fs in fns.items()}, cfg.sizes["repeats"], warmup=1, flops_of=bench.lm
    )
    for row in rows.values():
        row["per_solution_s"] = row["median_s"] / len(picked)
    return {"solutions": len(picked), "tokens": [bench.encoder().encode(t).n_tokens for t in picked], "rows": rows}


def bon_section(bench: Bench, cfg: BenchConfig, trajs: list[Trajectory]) -> dict:
    """Score the pool with every path. The reference scores one candidate at a time, so its cost
    is a sum over candidates: it runs on a random sample and is scaled to the pool by tokens."""
    encoder = bench.encoder()
    tokens = np.array([encoder.encode(t).n_tokens for t in trajs])
    sample = np.random.default_rng(cfg.seed).choice(len(trajs), cfg.sizes["ref_sample"], replace=False)
    names = cfg.names(BON)
    fns = {
        name: scoring_fn(bench, name, [trajs[i] for i in sample] if name.startswith("ref-") else trajs)
        for name in names
    }
    rows = timed(fns, cfg.sizes["bon_repeats"], warmup=0, flops_of=bench.lm)  # the backbone is warm by now
    for name, row in rows.items():
        scale = tokens.sum() / tokens[sample].sum() if name.startswith("ref-") else 1.0
        row["pool_s"] = row["median_s"] * scale
        row["solutions_per_s"] = len(trajs) / row["pool_s"]
        row["tokens_per_s"] = tokens.sum() / row["pool_s"]
    check = [trajs[i] for i in sample[:2]]
    scores = {name: scoring_fn(bench, name, check)().fused for name in ("bi:plain", "bi:kv", "bi:default")}
    reference = scoring_fn(bench, "ref-bi", check)()
    return {
        "questions": len(trajs) // CANDIDATES,
        "solutions": len(trajs),
        "tokens": int(tokens.sum()),
        "ref_sample": len(sample),
        "max_abs_diff_bi_paths": max(float(np.abs(s - scores["bi:plain"]).max()) for s in scores.values()),
        "max_abs_diff_vs_reference": float(np.abs(scores["bi:plain"] - reference).max()),
        "rows": rows,
    }


def scaling_section(bench: Bench, trajs: list[Trajectory], ref_per_token: float) -> dict:
    """Cost against the number of candidates of one question (the reference: per-candidate
    cost x N, from the Best-of-N run), and against the length of one solution."""
    counts, lengths = (1, 4, 12), (64, 256, 1024)
    fns = {f"{name}@{n}": scoring_fn(bench, name, trajs[:n]) for n in counts for name in SCALING}
    by_count = timed(fns, 1, warmup=0)
    encoder = bench.encoder()
    step = trajs[0].steps[0]
    per_step = len(encoder.encode(Trajectory(trajs[0].question, [step])).steps[0])
    long = {n: Trajectory(trajs[0].question, [step] * max(1, n // per_step)) for n in lengths}
    fns = {f"{name}@{n}": scoring_fn(bench, name, [long[n]]) for n in lengths for name in (*SCALING, "ref-bi")}
    by_length = timed(fns, 1, warmup=0)
    count_tokens = [sum(encoder.encode(t).n_tokens for t in trajs[:n]) for n in counts]
    return {
        "counts": list(counts),
        "candidates": {name: [by_count[f"{name}@{n}"]["median_s"] for n in counts] for name in SCALING}
        | {"ref-bi": [ref_per_token * t for t in count_tokens]},
        "lengths": [encoder.encode(long[n]).n_tokens for n in lengths],
        "length": {name: [by_length[f"{name}@{n}"]["median_s"] for n in lengths] for name in (*SCALING, "ref-bi")},
    }


def run(cfg: BenchConfig) -> dict:
    threads = cfg.threads or os.cpu_count()
    torch.set_num_threads(threads)
    start = time.perf_counter()
    announce(
        f"python -m benchmarks --preset {cfg.preset}: the {cfg.shape} shape (random weights), "
        f"{cfg.sizes['questions']} Best-of-N questions, {threads} threads; results go to {cfg.out}/ "
        "(docs/PERFORMANCE.md gives each preset's wall clock)"
    )
    result: dict = {"config": asdict(cfg) | cfg.sizes, "machine": machine(), "loadavg_start": os.getloadavg()}
    peaks = {str(dt).removeprefix("torch."): matmul_peak(dt) for dt in (torch.float32, torch.bfloat16)}
    result["matmul_peak"] = peaks
    fast_bf16 = peaks["bfloat16"]["gflops"] > peaks["float32"]["gflops"]
    dtypes = ["float32"] + (["bfloat16"] if fast_bf16 else []) if cfg.dtypes == "auto" else cfg.dtypes.split(",")
    result["dtypes"] = dtypes
    result["gate_overhead"] = gate_overhead()
    result["logits_memory"] = logits_memory()
    pool = gsm8k_bon_small(cfg.data_root)
    trajs = question_pool(pool, cfg.sizes["questions"], cfg.seed)
    bench = build(cfg.shape, cfg.seed)
    stages = Stages(len(dtypes) * (3 + bool(cfg.sizes["scaling"])))
    for dtype in dtypes:
        torch.nn.ModuleList([*bench.ours.values(), *bench.ref.values()]).to(getattr(torch, dtype))
        section = result.setdefault("runs", {})[dtype] = {}
        with stages.stage(f"{dtype}: training step"):
            section["train"] = train_section(bench, cfg, pool, threads)
        with stages.stage(f"{dtype}: latency"):
            section["latency"] = latency_section(bench, cfg, trajs)
        with stages.stage(f"{dtype}: Best-of-N pool"):
            section["bon"] = bon_section(bench, cfg, trajs)
        if cfg.sizes["scaling"]:
            ref = section["bon"]["rows"]["ref-bi"]
            with stages.stage(f"{dtype}: scaling curve"):
                section["scaling"] = scaling_section(bench, trajs, ref["pool_s"] / section["bon"]["tokens"])
    result["loadavg_end"] = os.getloadavg()
    result["elapsed_s"] = time.perf_counter() - start
    result["targets"] = targets(result)
    return result


def main(cfg: BenchConfig) -> None:
    result = run(cfg)
    stem = f"bench-{cfg.shape}" + ("" if cfg.preset == "full" else f"-{cfg.preset}")
    out = save(result, cfg.out, stem, write_markdown)
    if "scaling" in result["runs"]["float32"]:
        plot_scaling(result["runs"]["float32"]["scaling"], str(out / f"{stem}-scaling.png"), cfg.shape)
