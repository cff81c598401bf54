"""`biprm eval all`: every protocol and analysis of the paper that the data on hand allows, top to bottom.

1. Best-of-N on gsm8k_bon_small and any extra --pool, with aggregation sensitivity and
   the long-chain subset (> `long_chain_tokens` tokens, counted by the model's tokenizer).
2. ProcessBench at the fixed threshold and at the one tuned on GSM8K.
3. Step-wise MAE and the gate σ by position on ProcessBench (paper Fig. 4).
4. The long-chain subset of ProcessBench.
5. Step-boundary perturbations of ProcessBench (merge / split / noise, seeded).
6. Case studies (Markdown and HTML).
Modes are the checkpoint's own outputs (a `bi` model: fused, L2R stream, R2L stream) or,
with `ablation`, the separately trained models. Scores come from the cache, so a rerun
only computes what is missing, and report.md, results.json and the PNGs are rewritten.
"""

from __future__ import annotations

import re
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from tqdm.auto import tqdm

from biprm import StepScores
from biprm.analysis import (
    aggregation_table,
    case_studies,
    format_aggregation_table,
    format_perturbation_table,
    long_chain_bon,
    long_chain_processbench,
    mae_by_position,
    perturbation_robustness,
    pick_cases,
    plot_mae_by_position,
    plot_sigma_by_position,
    sigma_by_position,
)
from biprm.analysis.common import markdown_table
from biprm.data.perturb import perturb_dataset
from biprm.data.trajectory import Trajectory
from biprm.evaluation.ablations import ablation_table, format_ablation_table
from biprm.evaluation.cache import ScoreCache
from biprm.evaluation.bon import evaluate_bon, format_bon, in_tables
from biprm.evaluation.outputs import fmt, open_cache, write_json
from biprm.evaluation.config import SuiteConfig
from biprm.data.benchmarks import load_processbench
from biprm.evaluation.pools import load_pool
from biprm.evaluation.models import (
    ScoreSource,
    ablation_sources,
    checkpoint_mode,
    checkpoint_sources,
    score_sources,
    token_lengths,
)
from biprm.evaluation.processbench import (
    RESAMPLES,
    TUNE_ON,
    evaluate_processbench,
    format_processbench,
    on_scorable,
)
from biprm.evaluation.report import format_curves, format_long_chain
from biprm.metrics.selection import PROTOCOLS
from biprm.scoring.score_file import trace_segmenter


class Stages:
    """The outer progress bar, and the seconds every stage took."""

    def __init__(self, total: int):
        self.bar = tqdm(total=total, desc="eval all", unit="stage")
        self.seconds: dict[str, float] = {}

    @contextmanager
    def __call__(self, name: str):
        self.bar.set_postfix_str(name)
        start = time.perf_counter()
        yield
        self.seconds[name] = round(time.perf_counter() - start, 1)
        self.bar.update()


@dataclass
class Suite:
    """What every section reads: the settings, the score cache, the score sources and the output folder."""

    cfg: SuiteConfig
    cache: ScoreCache
    sources: list[ScoreSource]
    out: Path

    def scores(self, trajs: list[Trajectory]) -> dict[str, StepScores]:
        return score_sources(self.sources, self.cache, trajs)


Section = tuple[dict, list[str]]  # what a section adds to results.json, and to report.md


def run_suite(cfg: SuiteConfig) -> dict:
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    ablation = {checkpoint_mode(cfg.model): cfg.model} | cfg.roles if cfg.ablation else {}
    suite = Suite(
        cfg,
        open_cache(cfg),
        ablation_sources(ablation) if ablation else checkpoint_sources(cfg.model, prm_kind=cfg.prm_kind),
        out,
    )
    pools = ["gsm8k_bon_small", *cfg.pool]
    stage = Stages(len(pools) + 5)
    results: dict = {
        "config": asdict(cfg),
        "modes": {m.key: {"checkpoints": m.checkpoints, "stream": m.stream} for m in suite.sources},
        "bon": {},
    }
    md = [header(cfg, ablation), markdown_sources(suite.sources)]
    for spec in pools:
        with stage(f"BoN {spec}"):
            part, lines = bon_section(suite, spec)
        results["bon"] |= part
        md += lines
    with stage("ProcessBench"):
        trajs = load_processbench(cfg.data_root, cfg.subsets, cfg.limit)
        scores = suite.scores(trajs)
        pb = results["processbench"] = evaluate_processbench(
            trajs, scores, cfg.threshold, tune=TUNE_ON in cfg.subsets, resamples=RESAMPLES
        )
        md += ["## ProcessBench", format_processbench(pb)]
        trajs, scores = on_scorable(trajs, scores)  # the analyses stand on the table's rows too
    for name, section in (
        ("position analyses", position_section),
        ("long chains", long_chain_section),
        ("perturbations", perturbation_section),
        ("case studies", cases_section),
    ):
        with stage(name):
            part, lines = section(suite, trajs, scores)
        results |= part
        md += lines
    stage.bar.close()
    if ablation:
        table = results["ablation"] = ablation_table(list(results["bon"].values()), pb)
        md += ["## Ablations", format_ablation_table(table)]
    results["seconds"] = stage.seconds
    md += ["## Timings", "\n".join(f"- {name}: {s:.1f} s" for name, s in stage.seconds.items())]
    write_json(out / "results.json", results)
    (out / "report.md").write_text("\n\n".join(md) + "\n")
    print(f"wrote {out / 'report.md'}, {out / 'results.json'} and the figures in {out}")
    return results


def header(cfg: SuiteConfig, ablation: dict[str, str]) -> str:
    return (
        f"# BiPRM evaluation report\n\nModel `{cfg.model}`"
        + (f", ablation models {ablation}" if ablation else "")
        + f"; data `{cfg.data_root}`"
        + (f"; at most {cfg.limit} questions per pool and rows per subset" if cfg.limit else "")
        + "."
    )


def bon_section(suite: Suite, spec: str) -> Section:
    """Best-of-N on one pool: the protocol, aggregation sensitivity, long chains."""
    cfg = suite.cfg
    pool = load_pool(
        spec,
        cfg.data_root,
        cfg.limit,
        split_rule=trace_segmenter([cfg.model], cfg.segmenter),
        cache=suite.cache,
        grade_workers=cfg.grade_workers,
        grade_timeout=cfg.grade_timeout,
    )
    scores = suite.scores(pool.trajs)
    lengths = token_lengths(cfg.model, pool.trajs, suite.cache)
    bon = evaluate_bon(pool, scores, cfg.agg, cfg.ns, PROTOCOLS)
    pool, scores, keep = in_tables(pool, scores, min(cfg.ns))  # the analyses stand on the table's candidates too
    lengths = lengths[keep]
    bon["aggregation"] = aggregation_table(pool.qid, pool.correct, scores, cfg.ns)
    bon["long_chain"] = long_chain_bon(pool.qid, pool.correct, scores, lengths, cfg.long_chain_tokens, cfg.ns, cfg.agg)
    return {pool.name: bon}, [
        f"## Best-of-N: {pool.name}",
        format_bon(bon),
        "### Aggregation sensitivity",
        format_aggregation_table(bon["aggregation"]),
        "### Long chains",
        format_long_chain(bon["long_chain"], "mean", "candidates") + f"\n\nMean BoN@n (%), aggregation `{cfg.agg}`.",
    ]


def position_section(suite: Suite, trajs: list[Trajectory], scores: dict[str, StepScores]) -> Section:
    """Where along a solution each mode errs, and what the gate trusts there."""
    mae = mae_by_position(trajs, scores)
    plot_mae_by_position(mae, str(suite.out / "mae_by_position.png"))
    md = [
        "## Step-wise MAE by position (ProcessBench labels)",
        f"![MAE by position](mae_by_position.png)\n\nMean |p_t − y_t| per position bin; average error onset "
        f"{fmt(100 * mae['error_onset'])}% over {mae['n_erroneous']} erroneous of {mae['n_trajectories']} "
        "solutions.\n\n" + format_curves(mae["curves"]),
    ]
    gated = {m.key: sigma_by_position(scores[m.key]) for m in suite.sources if m.stream == "fused" and m.kind == "bi"}
    for n, (key, sigma) in enumerate(gated.items()):
        name = "sigma_by_position.png" if n == 0 else f"sigma_by_position_{n}.png"
        plot_sigma_by_position(sigma, str(suite.out / name))
        md += [
            f"## Gate σ by position: {key}",
            f"![gate by position]({name})\n\nMean σ_t, the weight on the L2R stream "
            "(below 0.5 the R2L stream dominates).\n\n" + format_curves({key: sigma["curve"]}),
        ]
    return {"mae_by_position": mae, "sigma_by_position": gated}, md


def long_chain_section(suite: Suite, trajs: list[Trajectory], scores: dict[str, StepScores]) -> Section:
    cfg = suite.cfg
    lengths = token_lengths(cfg.model, trajs, suite.cache)
    lc = long_chain_processbench(trajs, scores, lengths, cfg.long_chain_tokens, cfg.threshold)
    return {"long_chain_processbench": lc}, [
        "## Long chains: ProcessBench",
        format_long_chain(lc, "average_f1", "solutions")
        + f"\n\nAverage F1 (%) over subsets at threshold {cfg.threshold:g}; a subset without both kinds of long row "
        "has no F1.",
    ]


def perturbation_section(suite: Suite, trajs: list[Trajectory], scores: dict[str, StepScores]) -> Section:
    """The same rows, merged / split / padded, labels re-mapped."""
    cfg = suite.cfg
    perturbed = perturb_dataset(trajs, cfg.perturb_seed)
    robust = perturbation_robustness(scores, suite.scores(perturbed), trajs, perturbed, cfg.threshold)
    return {"perturbation": robust}, [
        "## Robustness to step-boundary perturbations",
        f"Perturbed F1 (%) and its drop from the clean set, threshold "
        f"{cfg.threshold:g}, seed {cfg.perturb_seed}: one merge, split or filler step per solution.\n\n"
        + format_perturbation_table(robust),
    ]


def cases_section(suite: Suite, trajs: list[Trajectory], scores: dict[str, StepScores]) -> Section:
    """Case studies, read from the gated model (else the static one): they compare its two streams."""
    shown = {m.key: scores[m.key] for m in suite.sources if m.stream == "fused"}
    bi = next(
        (m.key for kind in ("bi", "bi-static") for m in suite.sources if m.stream == "fused" and m.kind == kind), None
    )
    if bi is None:
        return {}, [
            "## Case studies",
            "Skipped: case studies compare the L2R and R2L streams, and no model here has both.",
        ]
    picked = pick_cases(trajs, shown, suite.cfg.cases, bi=bi)
    cases_md, cases_html = case_studies(trajs, shown, picked, bi=bi)
    (suite.out / "cases.md").write_text(cases_md)
    (suite.out / "cases.html").write_text(cases_html)
    titles = "\n".join(f"- {t}" for t in re.findall("^## (.*)$", cases_md, flags=re.M))
    return {"cases": picked}, [
        "## Case studies",
        f"Step-by-step probabilities of {len(picked)} ProcessBench items, read from `{bi}`, in "
        f"[cases.md](cases.md) and [cases.html](cases.html):\n\n{titles}",
    ]


def markdown_sources(sources: list[ScoreSource]) -> str:
    rows = [[m.key, ", ".join(f"`{c}`" for c in m.checkpoints), m.stream] for m in sources]
    return markdown_table(["mode", "checkpoint(s)", "output"], rows, left=3)
