"""`biprm eval {bon,processbench,ablations,all}`: flags -> one config dataclass -> one recipe.

The recipes are imported when a command runs, so that building the parser (and `--help`) stays cheap.
Under `accelerate launch` or `torchrun` the recipe runs on the main process and the
others share its scoring (biprm.evaluation.sharing).
"""
from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING

from biprm.aggregate import AGGREGATIONS
from biprm.config import CHECKPOINT_ROLES as ROLES
from biprm.config import PROCESSBENCH_SUBSETS, default_data_root
from biprm.metrics.bon import DEFAULT_NS, PROTOCOLS

AGGS = ("min", "mean", "last", "prod")

if TYPE_CHECKING:
    from biprm.evaluation.common import EvalOptions


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _protocols(text: str) -> tuple[str, ...]:
    names = _names(text)
    if not names or any(n not in PROTOCOLS for n in names):
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {PROTOCOLS}, got {text!r}")
    return names


def _aggs(text: str) -> tuple[str, ...]:
    names = _names(text)
    if any(n not in AGGREGATIONS for n in names):
        raise argparse.ArgumentTypeError(f"expected a comma-separated subset of {AGGREGATIONS}, got {text!r}")
    return names


def _role(text: str) -> tuple[str, str]:
    role, sep, path = text.partition("=")
    if not sep or role not in ROLES:
        raise argparse.ArgumentTypeError(f"expected ROLE=CHECKPOINT with ROLE in {ROLES}, got {text!r}")
    return role, path


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data-root", default=default_data_root(), help="benchmark folder: $BIPRM_DATA, else ../shared/data beside the repo")
    p.add_argument("--out", default="eval", help="output folder")
    p.add_argument("--cache-dir", default=None, help="score cache (default: OUT/cache)")
    p.add_argument("--limit", type=int, default=None, help="at most N questions per pool and rows per ProcessBench subset, evenly spaced")
    p.add_argument("--grade-workers", type=int, default=2, help="processes for math-verify grading (0: inline)")
    p.add_argument("--grade-timeout", type=float, default=5.0, help="seconds per graded answer; slower ones are reported and retried next run")
    p.add_argument("--device", default=None, help="cuda if available, else cpu")
    p.add_argument("--tokens-per-batch", type=int, default=None, help="tokens per backbone batch (Scorer's default by layout)")
    p.add_argument("--tokens-per-row", type=int, default=None, help="packed row length (default: the Scorer's); 0 gives every question its own row")
    p.add_argument("--max-length", type=int, default=4096, help="tokens per stream; trailing steps past it are not scored")


def _scoring(p: argparse.ArgumentParser, pb: bool = True) -> None:
    p.add_argument("--agg", choices=AGGREGATIONS, default="min", help="step -> solution score")
    p.add_argument("--ns", type=_ints, default=DEFAULT_NS, help="BoN sizes, comma-separated; those above the pool size are skipped")
    if pb:
        p.add_argument("--subsets", type=_names, default=PROCESSBENCH_SUBSETS, help="ProcessBench subsets, comma-separated")
        p.add_argument("--threshold", type=float, default=0.5, help="first-error threshold on step probabilities")


def _options(args: argparse.Namespace) -> dict:
    from biprm.evaluation.cache import ScorerSettings

    per_row = ScorerSettings.tokens_per_row if args.tokens_per_row is None else args.tokens_per_row or None
    scorer = ScorerSettings(args.device, args.tokens_per_batch, per_row, args.max_length)
    return dict(data_root=args.data_root, out=args.out, cache_dir=args.cache_dir, limit=args.limit,
                grade_workers=args.grade_workers, grade_timeout=args.grade_timeout, scorer=scorer)


def _on_every_process(recipe: Callable[[EvalOptions], object], cfg: EvalOptions) -> None:
    from biprm.evaluation.cache import scorer_loader
    from biprm.evaluation.sharing import run_shared

    run_shared(lambda: recipe(cfg), scorer_loader(cfg.scorer))


def cmd_bon(args: argparse.Namespace) -> None:
    from biprm.evaluation.bon import BonConfig, run_bon

    _on_every_process(run_bon, BonConfig(models=args.model, pool=args.pool, questions=args.questions, questions_split=args.questions_split,
                                         split_rule=args.split_rule, agg=args.agg, aggs=args.aggs, ns=args.ns, protocols=args.protocol,
                                         draws=args.draws, seed=args.seed, **_options(args)))


def cmd_processbench(args: argparse.Namespace) -> None:
    from biprm.evaluation.processbench import ProcessBenchConfig, run_processbench

    _on_every_process(run_processbench, ProcessBenchConfig(models=args.model, subsets=tuple(args.data or args.subsets), threshold=args.threshold,
                                                           tune=args.tune_threshold, tune_data=args.tune_data, **_options(args)))


def cmd_ablations(args: argparse.Namespace) -> None:
    from biprm.evaluation.ablations import AblationConfig, run_ablations

    ckpts = {role: path for role in ROLES if (path := getattr(args, role.replace("-", "_")))}
    _on_every_process(run_ablations, AblationConfig(checkpoints=ckpts, pools=args.pool or ["gsm8k_bon_small"], agg=args.agg, ns=args.ns,
                                                    subsets=args.subsets, threshold=args.threshold, tune=args.tune_threshold, **_options(args)))


def cmd_all(args: argparse.Namespace) -> None:
    from biprm.evaluation.suite import SuiteConfig, run_suite

    _on_every_process(run_suite, SuiteConfig(model=args.model, ablation=dict(args.ablation or []), pools=args.pool or [], agg=args.agg, ns=args.ns,
                                             subsets=args.subsets, threshold=args.threshold, long_chain_tokens=args.long_chain_tokens,
                                             perturb_seed=args.perturb_seed, cases=args.cases, **_options(args)))


def add_eval_parser(sub: argparse._SubParsersAction) -> None:
    ev = sub.add_parser("eval", help="Best-of-N, ProcessBench, ablations and the paper's analyses (see docs/EVALUATION.md)")
    protocols = ev.add_subparsers(dest="protocol", required=True)
    pool_help = "gsm8k_bon_small, a candidates file (ours or PQM's layout) or hf://OWNER/REPO/FILE; append @QUESTIONS for gold answers"

    p = protocols.add_parser("bon", help="Best-of-N@n beside the scorers that read no text, with intervals over questions")
    p.add_argument("--model", action="append", default=[], help="checkpoint folder (repeat to compare); none: the content-free rows alone")
    p.add_argument("--pool", default="gsm8k_bon_small", help=pool_help)
    p.add_argument("--questions", default=None, help="gold answers, matched by position: gsm_plus, math500, gsm8k, a file or a Hub dataset")
    p.add_argument("--questions-split", default="test", help="split when --questions is a Hub dataset (GSM-Plus: testmini)")
    p.add_argument("--split-rule", default="auto", help="how a candidate's text is cut into steps: auto, newline, double-newline, ки")
    p.add_argument("--protocol", type=_protocols, default=PROTOCOLS,
                   help="which n candidates a question offers: first (its first n, the paper's), random (random n-subsets), or both: first,random")
    p.add_argument("--draws", type=int, default=100, help="random n-subsets per question under --protocol random")
    p.add_argument("--aggs", type=_aggs, default=AGGS, help="aggregations reported side by side (mean over n), comma-separated")
    p.add_argument("--seed", type=int, default=0, help="seed of the random n-subsets, the noise baseline and the bootstrap")
    _scoring(p, pb=False)
    _common(p)
    p.set_defaults(func=cmd_bon)

    p = protocols.add_parser("processbench", help="first-error F1 per ProcessBench subset")
    p.add_argument("--model", action="append", required=True, help="checkpoint folder (repeat to compare)")
    p.add_argument("--tune-threshold", action="store_true",
                   help="also report F1 at a threshold chosen out of sample: tuned on GSM8K (cross-fitted on its own rows), applied to all subsets")
    p.add_argument("--tune-data", default=None, metavar="FILE",
                   help="a ProcessBench-layout dev file on which the threshold is tuned instead (its rows are never reported)")
    p.add_argument("--data", action="append", default=None, metavar="FILE",
                   help="a file in ProcessBench's layout (problem, steps, label) to evaluate instead of the subsets; repeatable")
    _scoring(p)
    _common(p)
    p.set_defaults(func=cmd_processbench)

    p = protocols.add_parser("ablations", help="the paper's ablation table from separately trained checkpoints")
    for role in ROLES:
        optional = role.endswith("-2")
        p.add_argument(f"--{role}", required=not optional,
                       help=f"second {role[:-2]} checkpoint (another seed) for the 2x ensemble" if optional else f"{role} checkpoint")
    p.add_argument("--pool", action="append", default=None, help=pool_help + " (repeatable; default gsm8k_bon_small)")
    p.add_argument("--tune-threshold", action="store_true", help="add ProcessBench F1 at the threshold tuned on GSM8K")
    _scoring(p)
    _common(p)
    p.set_defaults(func=cmd_ablations)

    p = protocols.add_parser("all", help="every protocol and analysis; writes report.md, results.json and figures")
    p.add_argument("--model", required=True, help="checkpoint folder")
    p.add_argument("--pool", action="append", default=None, help="extra pool besides gsm8k_bon_small: " + pool_help)
    p.add_argument("--ablation", type=_role, nargs="+", default=None, metavar="ROLE=CKPT",
                   help=f"separately trained models (ROLE in {', '.join(ROLES)}); --model fills its own role")
    p.add_argument("--long-chain-tokens", type=int, default=1024, help="long-chain subset: sequences longer than this")
    p.add_argument("--perturb-seed", type=int, default=1106, help="seed of the perturbation analysis")
    p.add_argument("--cases", type=int, default=3, help="case studies to show")
    _scoring(p)
    _common(p)
    p.set_defaults(func=cmd_all)
