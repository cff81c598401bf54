"""Settings of the benchmarks (`python -m benchmarks`, `python -m benchmarks.data`): plain dataclasses, so --help loads
no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from biprm.config import arg, default_data_root

SCRATCH = "out/benchmarks"  # where a run writes unless told: the committed results in benchmarks/ change only on --out
PRESETS = {  # smoke: every code path in seconds on the tiny shape (tests)
    "full": dict(
        batch=4,
        tokens=256,
        repeats=3,
        questions=5,
        bon_repeats=2,
        ref_sample=12,
        latency_sample=3,
        extra=True,
        scaling=True,
    ),
    "quick": dict(
        batch=2,
        tokens=128,
        repeats=2,
        questions=2,
        bon_repeats=1,
        ref_sample=4,
        latency_sample=2,
        extra=False,
        scaling=False,
    ),
    "smoke": dict(
        batch=2,
        tokens=128,
        repeats=1,
        questions=1,
        bon_repeats=1,
        ref_sample=2,
        latency_sample=1,
        extra=True,
        scaling=True,
    ),
    # servers on loopback (benchmarks.serve, benchmarks.vllm):
    # requests per measurement, clients, seconds per measurement
    "serve": dict(
        requests=192, concurrency=[1, 8, 32], compare_at=32, overload_clients=256, overload_queue=32, time_limit_s=240.0
    ),
    "vllm": dict(questions=8, requests=64, compare_at=8, time_limit_s=300.0),
    # benchmarks.search: beam search of depth 8, width 4, 16 paths per question; `group` questions per PathScorer call
    "search": dict(questions=32, depth=8, width=4, paths=16, group=8),
    # benchmarks.long: one trace of each length (tokens per stream);
    # the dense tree up to tree_max; tiny training at train_length
    "long": dict(lengths=[1024, 4096, 8192, 16384], layers=30, tree_max=4096, train_length=8192),
}
SIZES = (
    "questions",
    "requests",
    "concurrency",
    "compare_at",
    "overload_clients",
    "overload_queue",
    "time_limit_s",
)  # flags that resize a preset


@dataclass
class BenchConfig:
    preset: Literal["full", "quick", "smoke", "serve", "vllm", "search", "long"] = arg(
        "full",
        "quick: the target ratios on small sizes (docs/PERFORMANCE.md gives its wall clock); full: adds the reference "
        "L2R, more layouts and the scaling curve; smoke: every code path once, in seconds, on tiny sizes (what the "
        "tests run); serve: `biprm serve` under concurrent load on loopback (docs/SERVING.md); vllm: biprm's scorer "
        "and servers against vLLM running biprm's plugin (extra [vllm]); search: scoring a beam search's partial "
        "solutions, incremental L2R against from scratch and fused (docs/SEARCH.md); long: one trace of 1k-16k tokens, "
        "l2r against each bi layout, time per token and peak memory (docs/LONG_TRACES.md)",
    )
    shape: str = arg(
        "smollm2-135m", "backbone whose config and tokenizer to use (random weights): smollm2-135m or tiny"
    )
    data_root: str = arg(help="folder holding gsm8k/ and gsm8k_bon_small/", factory=default_data_root)
    out: str = arg(
        SCRATCH,
        "where bench-<shape>[-quick].{json,md} and the scaling PNG go (serve-<shape>, vllm-<shape>, "
        "bench-<shape>-search for those presets); --out benchmarks replaces the committed results",
    )
    threads: int = arg(0, "torch threads; 0: every core (fastest on free cores; pass 1 where other jobs share them)")
    seed: int = arg(0, "seed of the sampled solutions")
    memory: bool = arg(True, "probe the peak memory of each configuration")
    dtypes: str = arg(
        "auto", "auto (fp32, and bf16 where this CPU multiplies it faster), or a list like float32,bfloat16"
    )
    # sizes a run may set itself; unset (None), they are the preset's
    questions: int | None = arg(None, "questions of the Best-of-N pool (preset's if unset)")
    requests: int | None = arg(None, "serve, vllm: single-solution requests per measurement (preset's if unset)")
    concurrency: list[int] | None = arg(
        None, "serve: concurrent clients of the batching server's latency table (preset's if unset)"
    )
    compare_at: int | None = arg(
        None, "serve, vllm: concurrent clients where the servers are compared side by side (preset's if unset)"
    )
    overload_clients: int | None = arg(None, "serve: clients of the overload measurement (preset's if unset)")
    overload_queue: int | None = arg(None, "serve: --max-queue of the overloaded server (preset's if unset)")
    time_limit_s: float | None = arg(
        None, "serve, vllm: seconds per measurement; requests not sent by then are not sent (preset's if unset)"
    )

    def __post_init__(self) -> None:
        unused = [k for k in SIZES if getattr(self, k) is not None and k not in PRESETS[self.preset]]
        if unused:
            raise ValueError(
                f"--{unused[0].replace('_', '-')}: the {self.preset} preset has no such size; "
                f"it takes {', '.join('--' + k.replace('_', '-') for k in SIZES if k in PRESETS[self.preset])}"
            )

    @property
    def sizes(self) -> dict:
        """The preset's sizes, with those this run sets."""
        return PRESETS[self.preset] | {k: getattr(self, k) for k in SIZES if getattr(self, k) is not None}

    def names(self, pair: tuple[tuple[str, ...], tuple[str, ...]]) -> tuple[str, ...]:
        return pair[0] + (pair[1] if self.sizes["extra"] else ())


@dataclass
class DataBenchConfig:
    rows: int = arg(445_000, "rows of the generated TRL file")
    solutions_per_row: float = arg(
        1.0,
        "reference solutions chained into one row, on average: 1 gives GSM8K-length rows, "
        "3.8 gives rows with 2.7x the tokens, about Math-Shepherd's length",
    )
    data_root: str = arg(help="folder holding gsm8k/", factory=default_data_root)
    work_dir: str = arg("", "keep the generated file and caches here (default: a temporary folder)")
    out: str = arg(SCRATCH, "where data-<rows>.{json,md} go; --out benchmarks replaces the committed results")
    max_length: int = arg(2048, "tokens per stream, as in `biprm train`")
    batch_size: int = arg(8, "trajectories per step")

    @property
    def name(self) -> str:
        """data-<rows>, plus -x<solutions per row> for longer rows."""
        return f"data-{self.rows}" + ("" if self.solutions_per_row == 1 else f"-x{self.solutions_per_row:g}")


@dataclass
class BoundaryBenchConfig:
    """ProcessBench's long subsets re-cut by each segmenter: how close the cuts fall to the given steps."""

    data_root: str = arg(help="folder holding processbench/", factory=default_data_root)
    subsets: list[str] = arg(
        help="ProcessBench subsets, joined into one set of rows", factory=lambda: ["olympiadbench", "omnimath"]
    )
    segmenters: list[str] = arg(
        help="segmenters that re-cut the joined steps", factory=lambda: ["paragraph", "lines", "markers", "tokens:64"]
    )
    joins: list[str] = arg(
        help="what lies between the given steps when they are laid end to end (backslash escapes read): a blank "
        "line keeps the layout the steps came with, a space takes it away",
        factory=lambda: ["\\n\\n", " "],
    )
    tokenizer: str = arg("smollm2-135m", "the tokenizer tokens:N counts (a biprm backbone name or a folder)")
    within: int = arg(100, "characters between a given boundary and a cut for the boundary to count as found", min=0)
    resamples: int = arg(1000, "bootstrap resamples of the rows", min=1)
    seed: int = arg(0, "seed of the bootstrap", min=0)
    limit: int | None = arg(None, "rows per subset, evenly spread (default: all)", min=1)
    model: str | None = arg(
        None,
        "a PRM checkpoint: also first-error F1 of its scores of each cut, mapped back to the given steps "
        "by character offset (default: the text-free rows alone)",
    )
    threshold: float = arg(0.5, "first-error threshold on step probabilities", min=0, max=1)
    max_length: int = arg(4096, "--model: tokens per stream; trailing steps past it are not scored", min=1)
    out: str = arg(
        SCRATCH, "where processbench-boundaries.{json,md} go; --out benchmarks replaces the committed results"
    )
