"""`biprm bench`: side-by-side speed and memory benchmarks (docs/PERFORMANCE.md)."""
from __future__ import annotations

import argparse


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    from biprm.bench.run import PRESETS, BenchConfig
    from biprm.evaluation.data import default_data_root

    d = BenchConfig()
    p = sub.add_parser("bench", help="time and measure BiPRM against the reference pattern and L2R, side by side")
    p.add_argument("--quick", dest="preset", action="store_const", const="quick", default=d.preset,
                   help=f"small sizes, under 3 minutes on 2 cores: {PRESETS['quick']} (full: {PRESETS['full']})")
    p.add_argument("--shape", default=d.shape, help="backbone whose config and tokenizer to use (random weights): smollm2-135m or tiny")
    p.add_argument("--data-root", default=default_data_root(), help="folder holding gsm8k/ and gsm8k_bon_small/ (%(default)s)")
    p.add_argument("--out", default=d.out, help="where bench-<shape>[-quick].{json,md} and the scaling PNG go")
    p.add_argument("--threads", type=int, default=d.threads, help="torch threads; 0 = every core")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--no-memory", dest="memory", action="store_false", help="skip the per-configuration memory probes")
    p.add_argument("--dtypes", default=d.dtypes, help="auto (fp32, and bf16 when this CPU multiplies it faster), or a list like float32,bfloat16")
    p.set_defaults(func=_cmd)


def _cmd(args: argparse.Namespace) -> None:
    from biprm.bench.run import BenchConfig, main

    main(BenchConfig(shape=args.shape, preset=args.preset, data_root=args.data_root, out=args.out, threads=args.threads,
                     seed=args.seed, memory=args.memory, dtypes=args.dtypes))
