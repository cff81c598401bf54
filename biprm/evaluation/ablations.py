"""The paper's ablation table: which part of BiPRM carries the gain.

Rows, as in the paper: w/o R2L (an L2R model), w/o L2R (an R2L model), w/o Dynamic
(bi-static: fixed 0.5 fusion), 2×L2R and 2×R2L (two independently trained models with
their step probabilities averaged: BiPRM's compute without its second direction), and
BiPRM. Columns: mean BoN@n per pool, then ProcessBench F1 per subset and on average.
"""

from __future__ import annotations

import logging

from biprm.analysis.common import TITLES, markdown_table
from biprm.evaluation.bon import evaluate_bon, format_bon
from biprm.evaluation.outputs import fmt, open_cache, write_outputs
from biprm.evaluation.config import AblationConfig
from biprm.data.benchmarks import load_processbench
from biprm.evaluation.pools import load_pool
from biprm.evaluation.models import ROLES, ablation_sources, checkpoint_config, score_sources
from biprm.evaluation.processbench import RESAMPLES, evaluate_processbench, format_processbench
from biprm.metrics.selection import PROTOCOLS
from biprm.scoring.score_file import trace_segmenter

logger = logging.getLogger(__name__)


def ablation_table(bon_results: list[dict], pb_result: dict | None) -> dict:
    """{"columns": [...], "rows": {paper row label: {column: value}}} for the roles present in the results."""
    rows: dict[str, dict[str, float]] = {}
    columns: list[str] = [f"{r['pool']} BoN" for r in bon_results]
    if pb_result:
        columns += [TITLES.get(n, n) for n in pb_result["subsets"]] + ["PB Avg. F1"]
        columns += ["PB Avg. F1 (tuned)"] if any("tuned" in m for m in pb_result["modes"].values()) else []
    present = (pb_result or bon_results[0])["modes"]
    for role, _, label in ROLES:
        if role not in present:
            continue
        row = {f"{r['pool']} BoN": r["modes"][role]["mean"]["bon"] for r in bon_results}
        if pb_result:
            m = pb_result["modes"][role]
            row |= {TITLES.get(n, n): s["f1"] for n, s in m["fixed"]["subsets"].items()} | {
                "PB Avg. F1": m["fixed"]["average_f1"]
            }
            row |= {"PB Avg. F1 (tuned)": m["tuned"]["average_f1"]} if "tuned" in m else {}
        rows[label] = row
    return {"columns": columns, "rows": rows}


def format_ablation_table(table: dict) -> str:
    cols = table["columns"]
    return markdown_table(
        ["method", *cols], [[label, *(fmt(row.get(c)) for c in cols)] for label, row in table["rows"].items()]
    )


def unlike_objectives(checkpoints: dict[str, str]) -> str | None:
    """A warning when the checkpoints were trained with different objectives: their rows then compare objectives too."""
    used = {role: checkpoint_config(path).get("objective", "bce") for role, path in checkpoints.items()}
    if len(set(used.values())) > 1:
        return (
            "these checkpoints were trained with different objectives ("
            + ", ".join(f"{r}: {o}" for r, o in used.items())
            + "); the ablation then compares objectives as well as modes"
        )
    return None


def run_ablations(cfg: AblationConfig) -> dict:
    cache = open_cache(cfg)
    if warning := unlike_objectives(cfg.checkpoints):
        logger.warning(warning)
    sources = ablation_sources(cfg.checkpoints)
    bon, segmenter = [], trace_segmenter(list(cfg.checkpoints.values()), cfg.segmenter)
    for spec in cfg.pool or ["gsm8k_bon_small"]:
        pool = load_pool(
            spec,
            cfg.data_root,
            cfg.limit,
            split_rule=segmenter,
            cache=cache,
            grade_workers=cfg.grade_workers,
            grade_timeout=cfg.grade_timeout,
        )
        bon.append(evaluate_bon(pool, score_sources(sources, cache, pool.trajs), cfg.agg, cfg.ns, PROTOCOLS))
    trajs = load_processbench(cfg.data_root, cfg.subsets, cfg.limit)
    pb = evaluate_processbench(
        trajs, score_sources(sources, cache, trajs), cfg.threshold, cfg.tune_threshold, resamples=RESAMPLES
    )
    table = ablation_table(bon, pb)
    markdown = (
        "\n\n".join(
            [
                "# Ablations",
                f"Mean BoN@n (%, aggregation `{cfg.agg}`) and ProcessBench F1 (%, threshold {cfg.threshold:g}).",
                format_ablation_table(table),
                "## Best-of-N",
                *(format_bon(r) for r in bon),
                "## ProcessBench",
                format_processbench(pb),
            ]
        )
        + "\n"
    )
    print(markdown)
    print(
        f"wrote {write_outputs(cfg.out, 'ablations', {'table': table, 'bon': bon, 'processbench': pb}, markdown)} and "
        "ablations.json"
    )
    return {"table": table, "bon": bon, "processbench": pb}
