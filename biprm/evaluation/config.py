"""Settings of `biprm eval bon | processbench | ablations | all`: one dataclass per sub-command, parsed by
`HfArgumentParser` like every other command (so `--config FILE` works), and handed as is to its recipe.

Shared groups are mixins (how a checkpoint is run, where data and results live, the Best-of-N and
ProcessBench knobs), so no setting is written twice. Nothing here imports torch: `biprm --help` stays quick.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from biprm.scoring.aggregate import AGGREGATIONS
from biprm.config import CHECKPOINT_ROLES, PROCESSBENCH_SUBSETS, ScorerSettings, arg, default_data_root
from biprm.metrics.selection import DEFAULT_NS, PROTOCOLS

AGGS = ("min", "mean", "last", "prod")  # the aggregations `eval bon` reports side by side unless told
POOL = (
    "gsm8k_bon_small, a candidates file (ours or PQM's layout) or hf://OWNER/REPO/FILE; append @QUESTIONS for gold "
    "answers"
)


@dataclass(kw_only=True)
class EvalOptions(ScorerSettings):
    data_root: str = arg(
        help="benchmark folder: $BIPRM_DATA, else ../shared/data beside the repo",
        factory=default_data_root,
        group="data",
    )
    out: str = arg("eval", "output folder", group="output")
    cache_dir: str | None = arg(None, "score cache (default: OUT/cache)", group="output")
    overwrite: bool = arg(
        False,
        "delete the results this command wrote in --out with other settings (named when refused); a rerun with the "
        "same settings goes on from its cache without it",
        group="output",
    )
    limit: int | None = arg(
        None,
        "at most N questions per pool and rows per ProcessBench subset, evenly spaced (quick runs)",
        min=1,
        group="data",
    )
    on_overlength: Literal["flag", "refuse"] = arg(
        "flag",
        "a row whose question and first step alone exceed --max-length: flag leaves it out of the tables and counts it "
        "in the ledger; refuse stops the run naming it",
        group="data",
    )
    grade_workers: int = arg(2, "processes for math-verify grading (0: inline)", min=0, group="compute")
    grade_timeout: float = arg(
        5.0, "seconds per graded answer; slower ones are reported and retried next run", above=0, group="compute"
    )

    def __post_init__(self) -> None:
        super().__post_init__()  # the choices, and the segmenter's name
        if self.prm_mode is not None:
            raise ValueError(
                f"--prm-mode {self.prm_mode}: eval reports a PRM trained elsewhere in all three readings at once (as "
                "shipped, reversed, and their average); drop the flag"
            )


@dataclass(kw_only=True)
class BestOfN:
    agg: Literal[AGGREGATIONS] = arg("min", "step -> solution score", group="protocol")
    ns: list[int] = arg(
        help="Best-of-N sizes; those above the pool size are skipped",
        factory=lambda: list(DEFAULT_NS),
        min=1,
        group="protocol",
    )


@dataclass(kw_only=True)
class FirstError:
    subsets: list[str] = arg(help="ProcessBench subsets", factory=lambda: list(PROCESSBENCH_SUBSETS), group="data")
    threshold: float = arg(0.5, "first-error threshold on step probabilities", min=0, max=1, group="protocol")


@dataclass(kw_only=True)
class BonConfig(BestOfN, EvalOptions):
    model: list[str] = arg(
        help="checkpoint folder (several, or repeated, to compare); none: the content-free rows alone",
        factory=list,
        action="extend",
        group="model",
    )
    pool: str = arg("gsm8k_bon_small", POOL, aliases=("--data",), group="data")  # --data: as the other eval commands
    questions: str | None = arg(
        None, "gold answers, matched by position: gsm_plus, math500, gsm8k, a file or a Hub dataset", group="data"
    )
    questions_split: str = arg("test", "split when --questions is a Hub dataset (GSM-Plus: testmini)", group="data")
    protocol: list[str] = arg(
        help="which n candidates a question offers: first (its first n, the paper's), random (random n-subsets), or "
        "both",
        factory=lambda: list(PROTOCOLS),
        choices=PROTOCOLS,
        group="protocol",
    )
    draws: int = arg(100, "random n-subsets per question under --protocol random", min=1, group="protocol")
    aggs: list[str] = arg(
        help="aggregations reported side by side (mean over n)",
        factory=lambda: list(AGGS),
        choices=AGGREGATIONS,
        group="protocol",
    )
    seed: int = arg(0, "seed of the random n-subsets, the noise baseline and the bootstrap", min=0, group="protocol")


@dataclass(kw_only=True)
class ProcessBenchConfig(FirstError, EvalOptions):
    model: list[str] = arg(help="checkpoint folder (several, or repeated, to compare)", action="extend", group="model")
    tune_threshold: bool = arg(
        False,
        "also report F1 at a threshold chosen out of sample: tuned on GSM8K "
        "(cross-fitted on its own rows), applied to all subsets",
        group="protocol",
    )
    tune_data: str | None = arg(
        None,
        "a ProcessBench-layout dev file on which the threshold is tuned instead (its rows are never reported)",
        metavar="FILE",
        group="data",
    )
    data: list[str] = arg(
        help="files in ProcessBench's layout (problem, steps, label) to evaluate instead of --subsets",
        factory=list,
        action="extend",
        metavar="FILE",
        group="data",
    )


@dataclass(kw_only=True)
class AblationConfig(BestOfN, FirstError, EvalOptions):
    l2r: str = arg(help="l2r checkpoint", group="model")
    r2l: str = arg(help="r2l checkpoint", group="model")
    bi_static: str = arg(help="bi-static checkpoint", group="model")
    bi: str = arg(help="bi checkpoint", group="model")
    l2r_2: str | None = arg(None, "second l2r checkpoint (another seed) for the 2x ensemble", group="model")
    r2l_2: str | None = arg(None, "second r2l checkpoint (another seed) for the 2x ensemble", group="model")
    pool: list[str] = arg(
        help=f"{POOL} (several, or repeated; default gsm8k_bon_small)", factory=list, action="extend", group="data"
    )
    tune_threshold: bool = arg(False, "add ProcessBench F1 at the threshold tuned on GSM8K", group="protocol")

    @property
    def checkpoints(self) -> dict[str, str]:
        """role (l2r, r2l, bi-static, bi, l2r-2, r2l-2) -> folder, for the roles given."""
        return {role: path for role in CHECKPOINT_ROLES if (path := getattr(self, role.replace("-", "_")))}


@dataclass(kw_only=True)
class SuiteConfig(BestOfN, FirstError, EvalOptions):
    model: str = arg(help="checkpoint folder", group="model")
    pool: list[str] = arg(
        help=f"extra pools besides gsm8k_bon_small: {POOL}", factory=list, action="extend", group="data"
    )
    ablation: list[str] = arg(
        help=f"separately trained models as ROLE=CKPT (ROLE in {', '.join(CHECKPOINT_ROLES)}); "
        "--model fills its own role",
        factory=list,
        action="extend",
        metavar="ROLE=CKPT",
        group="model",
    )
    long_chain_tokens: int = arg(1024, "long-chain subset: sequences longer than this", min=1, group="data")
    perturb_seed: int = arg(1106, "seed of the perturbation analysis", min=0, group="protocol")
    cases: int = arg(3, "case studies to show", min=1, group="protocol")

    def __post_init__(self) -> None:
        super().__post_init__()
        for given in self.ablation:
            role, sep, _ = given.partition("=")
            if not sep or role not in CHECKPOINT_ROLES:
                raise ValueError(
                    f"--ablation {given!r}: expected ROLE=CHECKPOINT with ROLE in {', '.join(CHECKPOINT_ROLES)}"
                )

    @property
    def roles(self) -> dict[str, str]:
        """--ablation as role -> folder."""
        return dict(given.partition("=")[::2] for given in self.ablation)
