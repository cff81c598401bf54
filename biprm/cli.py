"""`biprm` command line: demo, train, score, eval, bench.

Each sub-command maps its flags onto a plain dataclass or function arguments and
calls one recipe; no logic lives here.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import typing

from biprm import __version__



def _add_dataclass_flags(parser: argparse.ArgumentParser, cls) -> None:
    """One --flag per dataclass field, typed from its annotation and defaulting to its default."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        flag = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        extra = {"help": f.metadata.get("help")}
        if f.default is dataclasses.MISSING:
            extra["required"] = True
        else:
            extra["default"] = f.default
            if extra["help"] and f.default is not None:
                extra["help"] += " (default: %(default)s)"
        if kind is bool:
            parser.add_argument(flag, action=argparse.BooleanOptionalAction, **extra)
            continue
        if typing.get_origin(kind) is tuple:  # a fixed-length tuple: that many values
            parts = typing.get_args(kind)
            parser.add_argument(flag, type=parts[0], nargs=len(parts), **extra)
            continue
        base = next((a for a in typing.get_args(kind) if a is not type(None)), kind)
        parser.add_argument(flag, type=base, **extra)


def _dataclass_from_args(cls, args: argparse.Namespace):
    return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})


def cmd_train(args: argparse.Namespace) -> None:
    from biprm.train import TrainConfig, train

    out = train(_dataclass_from_args(TrainConfig, args))
    print(f"saved to {out}")


def cmd_score(args: argparse.Namespace) -> None:
    from biprm.score_file import score_file

    n = score_file(args.model, args.input, args.output, fmt=args.format, skip_invalid=args.skip_invalid, device=args.device,
                   tokens_per_batch=args.tokens_per_batch, chunk=args.chunk, resume=args.resume)
    print(f"scored {n} trajectories into {'stdout' if args.output == '-' else args.output}", file=sys.stderr)


def cmd_demo(args: argparse.Namespace) -> None:
    from biprm.demo import DemoConfig, run_demo

    run_demo(_dataclass_from_args(DemoConfig, args))


def cmd_replicate(args: argparse.Namespace) -> None:
    from biprm.replication.recipe import preset, replicate, report_only

    cfg = preset(args.preset, out=args.out, work_dir=args.work_dir, data_root=args.data_root, bf16=args.bf16, top_layers=args.train_top_layers)
    if args.report_only:
        report_only(cfg)
    else:
        replicate(cfg)


def cmd_serve(args: argparse.Namespace) -> None:
    from biprm.serve.config import ServeConfig

    try:
        from biprm.serve.app import serve
    except ModuleNotFoundError as error:
        sys.exit(f"biprm serve: error: {error.name} is not installed; install the server extra: pip install -e '.[serve]'")

    serve(_dataclass_from_args(ServeConfig, args))


def cmd_loadtest(args: argparse.Namespace) -> None:
    from biprm.serve.loadtest import LoadTestConfig, run, write

    write(run(LoadTestConfig(shape=args.shape, requests=args.requests, out=args.out, **({"data_root": args.data_root} if args.data_root else {}))), args.out)


def cmd_bench_data(args: argparse.Namespace) -> None:
    from biprm.bench.data import DataBenchConfig, run, write

    cfg = DataBenchConfig(rows=args.rows, work_dir=args.work_dir or "", out=args.out, **({"data_root": args.data_root} if args.data_root else {}))
    write(run(cfg), args.out)


def build_parser() -> argparse.ArgumentParser:
    from biprm.demo import DemoConfig
    from biprm.train import TrainConfig

    parser = argparse.ArgumentParser(prog="biprm", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress, and show tracebacks on errors")
    parser.add_argument("--version", action="version", version=f"biprm {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("demo", help="train l2r, r2l, bi-static and bi on the synthetic task and compare them")
    _add_dataclass_flags(p, DemoConfig)
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("train", help="train a (Bi)PRM")
    _add_dataclass_flags(p, TrainConfig)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("score", help="write per-step and solution scores as JSONL")
    p.add_argument("--model", required=True, help="checkpoint folder written by `biprm train`")
    p.add_argument("--input", required=True, help="data file, HF dataset name or synthetic[:N]")
    p.add_argument("--output", default="scores.jsonl", help="JSONL file, or - for stdout (default: %(default)s)")
    p.add_argument("--format", default="auto")
    p.add_argument("--device", default=None)
    p.add_argument("--tokens-per-batch", type=int, default=None, help="tokens per backbone batch (Scorer's default by layout)")
    p.add_argument("--skip-invalid", action="store_true", help="skip bad rows (reported with file, row and field) instead of stopping")
    p.add_argument("--chunk", type=int, default=1024, help="rows scored and written to disk at a time; a kill loses at most one (default: %(default)s)")
    p.add_argument("--resume", action="store_true", help="continue a killed run from its OUTPUT.parts folder")
    p.set_defaults(func=cmd_score)

    p = sub.add_parser(
        "replicate", help="the paper's l2r / r2l / bi-static / bi comparison on SmolLM2-135M and real data (resumable)",
        description="Train every mode on the same real data with a frozen, cached trunk and evaluate each on ProcessBench, "
        "PRMBench and Best-of-N. Rerun the same command to resume; finished runs are kept.",
    )
    p.add_argument("--preset", choices=("quick", "full"), default="quick", help="quick: about 15 min, 1 seed per mode; full: about 3 h, 3 seeds for l2r and bi")
    p.add_argument("--out", default=None, help="results folder (default results/replication/<preset>)")
    p.add_argument("--work-dir", default=None, help="trunk caches and run checkpoints (default <biprm cache>/replicate)")
    p.add_argument("--data-root", default=None, help="folder holding processbench/, prmbench/, gsm8k/ ... (default $BIPRM_DATA or ../shared/data)")
    p.add_argument("--bf16", choices=("auto", "yes", "no"), default=None, help="bf16 autocast; auto: where the CPU has native bf16 or a GPU is present")
    p.add_argument("--train-top-layers", type=int, default=None, help="layers trained on top of the frozen, cached trunk (preset's value if unset)")
    p.add_argument("--report-only", action="store_true", help="write report.md, results.json and the figures from the runs finished so far; train nothing")
    p.set_defaults(func=cmd_replicate)

    from biprm.serve.config import ServeConfig

    p = sub.add_parser(
        "serve", help="serve a checkpoint over HTTP: /v1/score, /get_reward (OpenRLHF), /health, /metrics",
        description="Score solutions over HTTP with dynamic batching. Needs the [serve] extra: pip install -e '.[serve]'.",
    )
    _add_dataclass_flags(p, ServeConfig)
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("bench-data", help="time to the first training step and peak RSS per rank on a Math-Shepherd-size file, cold and cached, 1 and 2 processes")
    p.add_argument("--rows", type=int, default=445_000, help="rows of the generated TRL file (default: %(default)s)")
    p.add_argument("--work-dir", default=None, help="keep the generated file and caches here (default: a temporary folder)")
    p.add_argument("--data-root", default=None, help="folder holding gsm8k/ (default $BIPRM_DATA or ../shared/data)")
    p.add_argument("--out", default="benchmarks", help="where data-<rows>.{json,md} go (default: %(default)s)")
    p.set_defaults(func=cmd_bench_data)

    p = sub.add_parser("loadtest", help="benchmark `biprm serve` on loopback: batched vs one-at-a-time, latency by concurrency, overload")
    p.add_argument("--shape", default="smollm2-135m", help="backbone shape served with random weights: smollm2-135m or tiny (default: %(default)s)")
    p.add_argument("--requests", type=int, default=192, help="single-solution requests per measurement (default: %(default)s)")
    p.add_argument("--data-root", default=None, help="folder holding gsm8k/ and gsm8k_bon_small/ (default $BIPRM_DATA or ../shared/data)")
    p.add_argument("--out", default="benchmarks", help="where serve-<shape>.{json,md} go (default: %(default)s)")
    p.set_defaults(func=cmd_loadtest)

    from biprm.evaluation.cli import add_eval_parser

    add_eval_parser(sub)

    from biprm.bench import add_bench_parser

    add_bench_parser(sub)
    _verbose_everywhere(parser)
    return parser


def _verbose_everywhere(parser: argparse.ArgumentParser) -> None:
    """-v after a sub-command too (`biprm train -v`), not only before it."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                sub.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS, help="log progress, and show tracebacks on errors")
                _verbose_everywhere(sub)


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        args.func(args)
    except (ValueError, OSError) as error:  # bad input, a missing file: one line; -v shows the traceback
        if args.verbose:
            raise
        print(f"biprm {args.command}: error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main(sys.argv[1:])
