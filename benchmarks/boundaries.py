"""`python -m benchmarks.boundaries`: ProcessBench's OlympiadBench and Omni-MATH rows, their given steps laid end to
end and re-cut by each segmenter, and how close the cuts fall to the given boundaries (issue 45, item 5;
docs/LONG_TRACES.md). The steps are laid out twice: with a blank line between them (the layout they came with, which
the paragraph rule reads back by construction) and with a space (no layout: what the words alone give a segmenter).

No model runs: the table is the segmenters' alone, in seconds.
"""

from __future__ import annotations

from dataclasses import asdict

import numpy as np

from benchmarks.config import BoundaryBenchConfig
from benchmarks.report import save
from biprm.analysis.boundaries import agreement, even_cut, f1_interval, first_errors_on_given, laid_out
from biprm.data.benchmarks import load_processbench
from biprm.data.segment import Segmenter
from biprm.metrics.first_error import flag_step, tune_flag_step

STEM = "processbench-boundaries"
EVEN = "even (text-free: as many equal pieces as given steps)"
JOINS = {repr("\n\n"): "a blank line", repr(" "): "a space"}  # how the table names a join


def run(cfg: BoundaryBenchConfig) -> dict:
    """Per join and segmenter, over all rows and per subset: `agreement` of its cuts with the given steps; first-error
    F1 of the text-free rules on the given labels, and with --model, of the model's scores of each cut (and of the given
    steps), its predictions mapped back to the given steps by character offset."""
    trajs = load_processbench(cfg.data_root, tuple(cfg.subsets), cfg.limit)
    tokenizer = None
    if any(name.startswith("tokens:") for name in cfg.segmenters):
        from biprm.backbones import load_tokenizer

        tokenizer = load_tokenizer(cfg.tokenizer)
    names = list(dict.fromkeys(t.meta["subset"] for t in trajs))  # a subset given as a file is named by the file
    parts = {"all": range(len(trajs))} | {s: [i for i, t in enumerate(trajs) if t.meta["subset"] == s] for s in names}
    result = {
        "config": asdict(cfg),
        "subsets": {s: len(parts[s]) for s in names},
        "given_chars_per_step": float(np.mean([len(s) for t in trajs for s in t.steps])),
        "joins": {},
    }
    label, n_steps = np.array([t.meta["first_error"] for t in trajs]), np.array([len(t.steps) for t in trajs])
    k, _ = tune_flag_step(n_steps, label)
    result["first_error"] = {
        name: f1_interval(pred, label, cfg.resamples, cfg.seed)
        for name, pred in (
            ("flag nothing (text-free)", np.full(len(trajs), -1)),
            ("flag step 0 (text-free)", flag_step(n_steps, 0)),
            (
                f"flag step k when there are more than k (k = {k}, tuned on these rows: an upper bound; text-free)",
                flag_step(n_steps, k),
            ),
        )
    }
    scorer = None
    if cfg.model:
        from biprm.config import ScorerSettings
        from biprm.scoring.scorer import Scorer

        scorer = Scorer.from_settings(cfg.model, ScorerSettings(max_length=cfg.max_length))
        given = [Segmenter("given").cut(t.steps, t.meta["id"]) for t in trajs]
        result["first_error"][f"{cfg.model}: the given steps"] = model_f1(
            scorer, trajs, given, [g.offsets for g in given], label, cfg
        )
    for join in cfg.joins:
        join = join.encode().decode("unicode_escape")
        laid = [laid_out(t.steps, join) for t in trajs]
        per_segmenter = result["joins"][repr(join)] = {}
        for name in cfg.segmenters:
            segmenter = Segmenter(name, tokenizer)
            cuts = [segmenter.cut(text, t.meta["id"]) for (text, _), t in zip(laid, trajs)]
            per_segmenter[name] = {
                part: agreement(
                    [laid[i][1] for i in rows], [cuts[i].offsets for i in rows], cfg.within, cfg.resamples, cfg.seed
                )
                for part, rows in parts.items()
            } | {"fallbacks": sum(c.fallback is not None for c in cuts)}
            if scorer is not None:
                result["first_error"][f"{cfg.model}: joined by {JOINS.get(repr(join), repr(join))}, cut by {name}"] = (
                    model_f1(scorer, trajs, cuts, [spans for _, spans in laid], label, cfg)
                )
        even = [even_cut(len(text), len(spans)) for text, spans in laid]
        per_segmenter[EVEN] = {
            part: agreement([laid[i][1] for i in rows], [even[i] for i in rows], cfg.within, cfg.resamples, cfg.seed)
            for part, rows in parts.items()
        } | {"fallbacks": 0}
    return result


def model_f1(scorer, trajs: list, cuts: list, given: list, label: np.ndarray, cfg: BoundaryBenchConfig) -> dict:
    """First-error F1 of the model's scores of one cut of every row, its predictions mapped to the given steps. A row
    the model cannot read (a first step past --max-length: a cut into one long step) flags nothing, and is counted."""
    from biprm.data.trajectory import Trajectory

    encs, unread = scorer.encode(
        [Trajectory(t.question, c.texts) for t, c in zip(trajs, cuts)], [t.meta["id"] for t in trajs], skip_invalid=True
    )
    kept = sorted(set(range(len(trajs))) - {i for i, _ in unread})
    scores = scorer.score(encs, progress=False)
    pred = np.full(len(trajs), -1)
    pred[kept] = first_errors_on_given(
        scores.prob(), scores.offsets, cfg.threshold, [cuts[i].offsets for i in kept], [given[i] for i in kept]
    )
    return f1_interval(pred, label, cfg.resamples, cfg.seed) | {"unread": len(unread)}


def _f1(x: dict) -> str:
    """F1 with its interval, and how many rows the model could not read (they flag nothing)."""
    unread = f" ({x['unread']} rows unread)" if x.get("unread") else ""
    return f"{x['mean']:.1f} [{x['low']:.1f}, {x['high']:.1f}]{unread}"


def _pct(x: dict) -> str:
    return f"{100 * x['mean']:.1f} [{100 * x['low']:.1f}, {100 * x['high']:.1f}]"


def markdown(result: dict, path: str) -> str:
    cfg, subsets = result["config"], list(result["subsets"])
    head = [
        "given steps joined by",
        "segmenter",
        "steps per row",
        *(f"found, {s} (%)" for s in ("all", *subsets)),
        "cuts near a given boundary (%)",
        "no-marker fallbacks",
    ]
    rows = [
        [
            JOINS.get(join, f"`{join}`"),
            name,
            f"{r['all']['cut_steps']:.1f}",
            *(_pct(r[s]["found"]) for s in ("all", *subsets)),
            _pct(r["all"]["near"]),
            str(r["fallbacks"]),
        ]
        for join, table in result["joins"].items()
        for name, r in table.items()
    ]
    first = next(iter(next(iter(result["joins"].values())).values()))["all"]
    n = ", ".join(f"{s} {k}" for s, k in result["subsets"].items())
    text = "\n".join(
        [
            "# Boundary agreement on ProcessBench's long subsets",
            "",
            f"{n} rows joined; {first['given_steps']:.1f} given steps per row, {result['given_chars_per_step']:.0f} "
            "characters per given step. Each row's given steps are laid end to end and cut again by each segmenter. "
            "*found*: the share of given boundaries (where a given step after the first starts) with a cut within "
            f"{cfg['within']} characters (ThinkBooster's measure); *cuts near a given boundary*: the share of cuts "
            f"within {cfg['within']} characters of a given boundary (cutting everywhere finds every boundary, and "
            f"scores low here). Pooled over rows; 95 % intervals from {cfg['resamples']} resamples of the rows (seed "
            f"{cfg['seed']}). tokens:N counts {cfg['tokenizer']}'s tokens. Joined by a blank line, the given steps "
            "keep the layout they came with, which the paragraph rule reads back by construction; joined by a space, "
            "a segmenter has only the words (and the line breaks inside steps).",
            "",
            "| " + " | ".join(head) + " |",
            "|" + "---|" * len(head),
            *("| " + " | ".join(r) + " |" for r in rows),
            "",
            "First-error F1 (%) on the given labels, all rows joined (ProcessBench's threshold "
            f"{cfg['threshold']:g}; a model's first error on a cut maps to the given step that holds its first "
            "character):",
            "",
            "| rule or model | F1 (%) |",
            "|---|---|",
            *(f"| {name} | {_f1(x)} |" for name, x in result["first_error"].items()),
            "",
            "Command: `python -m benchmarks.boundaries` (data under `--data-root`, default `../shared/data`; `--model "
            "CKPT` adds a PRM's rows).",
            "",
        ]
    )
    with open(path, "w") as f:
        f.write(text)
    return text


if __name__ == "__main__":
    from biprm.cli import run_program

    run_program(
        BoundaryBenchConfig, lambda cfg: save(run(cfg), cfg.out, STEM, markdown), "python -m benchmarks.boundaries"
    )
