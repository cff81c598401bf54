"""Best-of-N: per question, the highest-scored of n candidates, graded against the gold.

Solution score = one aggregation of the step scores (min by default, as in the paper). n
runs over the paper's {8, 16, 32, 64, 128} where the pools are large enough. Which n
candidates a question offers is the protocol (biprm.metrics.selection): the paper's first n,
or random n-subsets; every table names its protocol. Beside every PRM row stand the
scorers that read no text (random pick, majority vote with fair ties, fewest and most
steps, i.i.d. noise under the same aggregation) and pass@n (the pool ceiling), each with a 95 %
bootstrap interval over questions; every pair of PRMs gets a paired difference, marked
"within noise" where its interval holds 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations

import numpy as np

from biprm.scoring.aggregate import sigmoid
from biprm.analysis.common import markdown_table
from biprm.evaluation.ledger import format_ledger, ledger, scorable
from biprm.evaluation.outputs import fmt, open_cache, provenance, write_outputs
from biprm.evaluation.config import BonConfig
from biprm.evaluation.pools import Pool, load_pool
from biprm.evaluation.models import models_given, score_sources, sources_of
from biprm.metrics.selection import DEFAULT_NS, best_of, bon_table, content_free, pool_bounds, subsets, vote
from biprm.metrics.bootstrap import bootstrap_mean, paired_difference, question_clusters
from biprm.scoring.score_file import trace_segmenter
from biprm.scoring.step_scores import StepScores, offsets_of


def _interval(values: np.ndarray, seed: int, clusters: np.ndarray | None) -> dict:
    return bootstrap_mean(100.0 * values, seed=seed, clusters=clusters)


def bon_rows(
    pool: Pool,
    scores: dict[str, StepScores],
    how: str,
    ns: Sequence[int],
    protocol: str,
    draws: int = 100,
    seed: int = 0,
    votes: bool = False,
) -> dict[str, dict[int, np.ndarray]]:
    """{row name: {n: [Q] per-question values}} for every PRM and every content-free scorer."""
    n_steps = np.array([len(t.steps) for t in pool.trajs])
    rows: dict[str, dict[int, np.ndarray]] = {}
    for n in ns:
        idx = subsets(pool.qid, n, protocol, draws, seed)
        for key, s in scores.items():
            logit = s.solution_logits(how)
            rows.setdefault(key, {})[n] = best_of(idx, logit, pool.correct)
            if votes:
                rows.setdefault(f"{key}: weighted vote", {})[n] = vote(
                    idx, pool.answer_key, sigmoid(logit), pool.correct
                )
        noise_draws = 200 if protocol == "first" else 10
        for name, v in content_free(
            idx, n_steps, pool.correct, pool.answer_key, how, offsets_of(n_steps), noise_draws, seed
        ).items():
            rows.setdefault(name, {})[n] = v
    return rows


def summarise(
    rows: dict[str, dict[int, np.ndarray]], models: Sequence[str], seed: int = 0, clusters: np.ndarray | None = None
) -> dict:
    """Means with intervals per row and n (and over n), and the paired difference of every two PRMs; with `clusters`
    (one per pool: its question, `bootstrap.question_clusters`), pools of one question are drawn together, the same
    draws for every row and both sides of a difference."""
    over_n = {name: np.mean(list(by_n.values()), axis=0) for name, by_n in rows.items()}
    table = {
        name: {
            **{n: _interval(v, seed, clusters) for n, v in by_n.items()},
            "mean": _interval(over_n[name], seed, clusters),
        }
        for name, by_n in rows.items()
    }
    pair = lambda a, b: paired_difference(100 * a, 100 * b, seed=seed, clusters=clusters)  # noqa: E731
    diffs = {
        f"{a} − {b}": {
            **{n: pair(rows[a][n], rows[b][n]) for n in rows[a]},
            "mean": pair(over_n[a], over_n[b]),
        }
        for a, b in combinations(models, 2)
    }
    return {"rows": table, "differences": diffs}


def evaluate_bon(
    pool: Pool,
    scores: dict[str, StepScores],
    agg: str = "min",
    ns: Sequence[int] = DEFAULT_NS,
    protocols: Sequence[str] = ("first",),
    aggs: Sequence[str] = (),
    draws: int = 100,
    seed: int = 0,
) -> dict:
    """Per protocol: the `agg` table with baselines, intervals and differences, and a mean-over-n row per
    PRM for every other aggregation in `aggs`; "modes" keeps `bon_table` of the first protocol per PRM. The tables
    stand on `in_tables`; the ledger counts every candidate and pool read."""
    book, pool, scores = _ledger_and_tables(pool, scores, min(ns))
    starts, sizes = pool_bounds(pool.qid)
    clusters = question_clusters([pool.trajs[s].question for s in starts])
    used = [n for n in ns if n <= sizes.min()]
    models = list(scores)
    result = {
        "pool": pool.name,
        "questions": len(sizes),
        "distinct_questions": int(clusters.max()) + 1,
        "candidates": len(pool.trajs),
        "agg": agg,
        "ns": used,
        "skipped": [n for n in ns if n not in used],
        "draws": draws,
        "protocols": {},
    }
    for protocol in protocols:
        main = summarise(bon_rows(pool, scores, agg, used, protocol, draws, seed, votes=True), models, seed, clusters)
        others = {}
        for how in dict.fromkeys(aggs):
            if how != agg:
                rows = bon_rows(pool, scores, how, used, protocol, draws, seed)
                names = [*models, f"noise + {how}"]
                others[how] = {
                    k: v["mean"] for k, v in summarise({k: rows[k] for k in names}, [], seed, clusters)["rows"].items()
                }
        result["protocols"][protocol] = {**main, "aggregations": others}
    result["ledger"] = book
    first = protocols[0]
    result["modes"] = {
        k: bon_table(pool.qid, s.solution_logits(agg), pool.correct, pool.answer_key, used, first, draws, seed)
        for k, s in scores.items()
    }
    return result


def in_tables(
    pool: Pool, scores: dict[str, StepScores], smallest: int
) -> tuple[Pool, dict[str, StepScores], np.ndarray]:
    """The candidates every model scored (`ledger.scorable`), in the pools that still hold `smallest` of them, and
    their indices: a pool with fewer candidates than the smallest n asked is left out (and counted), never read as a
    smaller n."""
    keep = scorable(pool.trajs, scores)
    _, where, count = np.unique(pool.qid[keep], return_inverse=True, return_counts=True)
    keep = keep[count[where] >= smallest]
    if len(keep) == len(pool.trajs):
        return pool, scores, keep
    trajs = [pool.trajs[i] for i in keep]
    part = Pool(pool.name, trajs, pool.qid[keep], pool.correct[keep], pool.answer_key[keep])
    return part, {k: s.select(keep) for k, s in scores.items()}, keep


def _ledger_and_tables(
    pool: Pool, scores: dict[str, StepScores], smallest: int
) -> tuple[dict, Pool, dict[str, StepScores]]:
    """(the ledger of every candidate and pool read, then the pool and scores the tables stand on: `in_tables`)."""
    book = ledger(pool.trajs, np.full(len(pool.trajs), pool.name), scores)
    read = len(pool_bounds(pool.qid)[0])
    pool, scores, _ = in_tables(pool, scores, smallest)
    if not len(pool.trajs):
        raise ValueError(
            f"{pool.name}: no pool holds the smallest n asked ({smallest}) in candidates every model scored"
        )
    left = read - len(np.unique(pool.qid))
    book[pool.name] |= {"in_tables": len(pool.trajs), "pools": read, "pools_too_small": left, "smallest_n": smallest}
    return book, pool, scores


def _cell(s: dict) -> str:
    return f"{fmt(s['mean'])} [{fmt(s['low'])}, {fmt(s['high'])}]"


PROTOCOL_TITLES = {
    "first": "first n candidates of each question, in pool order (the paper's protocol)",
    "random": "random n-subsets of each question's pool",
}


def format_bon(result: dict) -> str:
    """Per protocol: the PRM rows, the content-free rows, the paired differences, the other aggregations."""
    ns, distinct = result["ns"], result.get("distinct_questions", result["questions"])
    skipped = f"; n = {', '.join(map(str, result['skipped']))} skipped (pools too small)" if result["skipped"] else ""
    parts = [
        f"**{result['pool']}**: {result['questions']} pools on {distinct} distinct questions, {result['candidates']} "
        f"candidates, aggregation `{result['agg']}`{skipped}. Accuracy (%) with 95 % bootstrap intervals over "
        "questions (the pools of one question drawn together, the same draws for every row and difference); ties "
        "broken uniformly."
    ]
    for protocol, p in result["protocols"].items():
        title = PROTOCOL_TITLES[protocol] + (f", {result['draws']} draws" if protocol == "random" else "")
        rows = [[name, *(_cell(r[n]) for n in ns), _cell(r["mean"])] for name, r in p["rows"].items()]
        parts += [f"Protocol: {title}.", markdown_table(["scorer", *(f"@{n}" for n in ns), "mean over n"], rows)]
        if p["differences"]:
            noise = lambda d: " (within noise)" if d["within_noise"] else ""  # noqa: E731
            diff = [
                [name, *(_cell(d[n]) for n in ns), _cell(d["mean"]) + noise(d["mean"])]
                for name, d in p["differences"].items()
            ]
            parts += [
                "Paired differences (points):",
                markdown_table(["difference", *(f"@{n}" for n in ns), "mean over n"], diff),
            ]
        if p["aggregations"]:
            names = list(dict.fromkeys(k for t in p["aggregations"].values() for k in t if not k.startswith("noise")))
            hows = list(p["aggregations"])
            agg_rows = [[name, *(_cell(p["aggregations"][h][name]) for h in hows)] for name in names]
            agg_rows.append(["noise + that aggregation", *(_cell(p["aggregations"][h][f"noise + {h}"]) for h in hows)])
            parts += [f"Other aggregations, mean over n ({protocol}):", markdown_table(["scorer", *hows], agg_rows)]
    if "ledger" in result:
        parts.append(format_ledger(result["ledger"], "candidates"))
    return "\n\n".join(parts)


def run_bon(cfg: BonConfig) -> dict:
    cache = open_cache(cfg)
    pool = load_pool(
        cfg.pool,
        cfg.data_root,
        cfg.limit,
        questions=cfg.questions,
        questions_split=cfg.questions_split,
        split_rule=trace_segmenter(cfg.model, cfg.segmenter),
        cache=cache,
        grade_workers=cfg.grade_workers,
        grade_timeout=cfg.grade_timeout,
    )
    scores = score_sources(sources_of(cfg.model, cfg.prm_kind), cache, pool.trajs) if cfg.model else {}
    result = evaluate_bon(pool, scores, cfg.agg, cfg.ns, cfg.protocol, cfg.aggs, cfg.draws, cfg.seed)
    result["models"] = models_given(cfg.model, cfg.prm_kind)
    markdown = "# Best-of-N\n\n" + provenance(result["models"]) + format_bon(result) + "\n"
    print(markdown)
    print(f"wrote {write_outputs(cfg.out, 'bon', result, markdown)} and bon.json")
    return result
