"""Best-of-N: per question, the highest-scored of its first n candidates, graded against the gold.

Solution score = one aggregation of the step probabilities (min by default, as in the
paper). n runs over the paper's {8, 16, 32, 64, 128} where the pools are large enough;
the headline number is the mean over those n. Baselines beside it: pass@n (an oracle
ceiling), majority vote over extracted answers, and the PRM-weighted vote. With
`random_subsets` R, BoN@n is also averaged over R random n-subsets per pool, with the
2.5–97.5 percentile range of the draws.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from biprm.analysis.common import markdown_table
from biprm.evaluation.common import EvalOptions, fmt, write_outputs
from biprm.evaluation.data import Pool, load_pool
from biprm.evaluation.models import modes_of, score_modes
from biprm.metrics.bon import DEFAULT_NS, bon_random_subsets, bon_table
from biprm.scores import StepScores


@dataclass(kw_only=True)
class BonConfig(EvalOptions):
    models: list[str]
    pool: str = "gsm8k_bon_small"
    questions: str | None = None
    questions_split: str = "test"
    split_rule: str = "auto"
    agg: str = "min"
    ns: tuple[int, ...] = DEFAULT_NS
    random_subsets: int = 0
    seed: int = 0


def evaluate_bon(
    pool: Pool, scores: dict[str, StepScores], agg: str = "min", ns: Sequence[int] = DEFAULT_NS, random_subsets: int = 0, seed: int = 0
) -> dict:
    """bon_table per mode (see biprm.metrics.bon), plus "random": {n: {mean, low, high}} when asked."""
    modes = {}
    for key, s in scores.items():
        score = s.solution_logits(agg)
        table = bon_table(pool.qid, score, pool.correct, pool.answer_key, ns)
        if random_subsets:
            draws = {n: bon_random_subsets(pool.qid, score, pool.correct, n, random_subsets, seed) for n in table["ns"]}
            table["random"] = {n: dict(zip(("mean", "low", "high"), d)) for n, d in draws.items()}
        modes[key] = table
    return {"pool": pool.name, "questions": len(np.unique(pool.qid)), "candidates": len(pool.trajs), "agg": agg, "modes": modes}


def format_bon(result: dict) -> str:
    """One row per mode (BoN, then its weighted vote), then the score-free baselines, in %."""
    modes = result["modes"]
    first = next(iter(modes.values()))
    ns = first["ns"]
    line = lambda name, row, mean: [name, *(fmt(row[n]) for n in ns), fmt(mean)]  # noqa: E731
    rows = [line(f"{key}: BoN", t["bon"], t["mean"]["bon"]) for key, t in modes.items()]
    rows += [line(f"{key}: weighted vote", t["weighted"], t["mean"]["weighted"]) for key, t in modes.items()]
    rows += [line(f"{key}: top score tied (% questions)", t["tie"], t["mean"]["tie"]) for key, t in modes.items()]
    rows += [line("majority vote", first["majority"], first["mean"]["majority"]), line("pass@n (oracle)", first["pass"], first["mean"]["pass"]),
             line("random pick (chance)", first["chance"], first["mean"]["chance"])]
    for key, t in modes.items():
        if "random" in t:
            r = t["random"]
            rows.append([f"{key}: BoN, random subsets", *(f"{fmt(r[n]['mean'])} [{fmt(r[n]['low'])}, {fmt(r[n]['high'])}]" for n in ns),
                         fmt(np.mean([r[n]["mean"] for n in ns]))])
    skipped = f"; n = {', '.join(map(str, first['skipped']))} skipped (pools too small)" if first["skipped"] else ""
    head = f"**{result['pool']}**: {result['questions']} questions, {result['candidates']} candidates, aggregation `{result['agg']}`{skipped}\n\n"
    return head + markdown_table(["method", *(f"@{n}" for n in ns), "mean"], rows)


def run_bon(cfg: BonConfig) -> dict:
    cache = cfg.open_cache()
    pool = load_pool(cfg.pool, cfg.data_root, cfg.limit, questions=cfg.questions, questions_split=cfg.questions_split,
                     split_rule=cfg.split_rule, cache=cache, grade_workers=cfg.grade_workers, grade_timeout=cfg.grade_timeout)
    result = evaluate_bon(pool, score_modes(modes_of(cfg.models), cache, pool.trajs), cfg.agg, cfg.ns, cfg.random_subsets, cfg.seed)
    markdown = "# Best-of-N\n\n" + format_bon(result) + "\n"
    print(markdown)
    print(f"wrote {write_outputs(cfg.out, 'bon', result, markdown)} and bon.json")
    return result
