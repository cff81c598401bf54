"""The demo recipe: four PRMs, one budget, one seed, on the embedded synthetic task.

It trains `l2r`, `r2l`, `bi-static` and `bi` on a tiny randomly initialised
backbone, then measures first-error F1 (ProcessBench protocol, at 0.5 and at a
threshold tuned on a held-out dev set) on held-out labelled solutions and
Best-of-N accuracy (min aggregation) on held-out candidate pools, prints a table,
and writes results.json and the gate curve (mean sigma_t by position).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from biprm.analysis.common import first_errors
from biprm.analysis.plots import plot_sigma_by_position
from biprm.analysis.position import sigma_by_position
from biprm.config import DemoConfig, TrainConfig
from biprm.data.synthetic import make_bon_pools, make_dataset
from biprm.data.writer import write_trajectories
from biprm.metrics.bon import bon_table
from biprm.metrics.processbench import flag_step, predict_first_error, processbench_scores, tune_flag_step, tune_threshold
from biprm.scoring.step_scores import StepScores
from biprm.scoring.scorer import Scorer
from biprm.data.trajectory import Trajectory
from biprm.training import train


def scores_of(scorer: Scorer, trajs: list[Trajectory]) -> StepScores:
    encs, _ = scorer.encode(trajs)
    return scorer.score(encs, progress=False)


def evaluate(scorer: Scorer, dev, test, pools) -> dict:
    """First-error F1 at 0.5 and at the threshold tuned on `dev` (ProcessBench tunes on its GSM8K subset)."""
    dev_scores = scores_of(scorer, dev)
    threshold, _ = tune_threshold(dev_scores.prob(), dev_scores.offsets, first_errors(dev))
    scores = scores_of(scorer, test)
    result = {"threshold": threshold}
    for name, t in (("processbench", 0.5), ("processbench_tuned", threshold)):
        result[name] = processbench_scores(predict_first_error(scores.prob(), scores.offsets, t), first_errors(test))
    result["exact"] = exact_by_kind(predict_first_error(scores.prob(), scores.offsets, threshold), test)
    pool_scores = scores_of(scorer, pools).solution_logits("min")
    qid = np.array([t.meta["qid"] for t in pools])
    correct = np.array([bool(t.correct) for t in pools])
    answers = np.array([t.steps[-1] for t in pools])
    result["bon"] = bon_table(qid, pool_scores, correct, answers, ns=(4, 8, 16))
    if scores.sigma is not None and scorer.mode == "bi":
        result["sigma_by_position"] = sigma_by_position(scores)
    return result


def exact_by_kind(pred: np.ndarray, trajs: list) -> dict[str, float]:
    """% of rows whose first error is found at its exact step, per error kind: "claim" errors show only in
    later steps (what the R2L stream is for), "calc" errors where they happen."""
    kind, first = np.array([t.meta["kind"] for t in trajs]), first_errors(trajs)
    return {k: 100.0 * float(np.mean(pred[kind == k] == first[kind == k])) for k in ("claim", "calc") if (kind == k).any()}


# Best-of-N pools where a random pick is far from pass@n: at most half the candidates right, the errors
# mostly calc (a claim error recovers, so its answer is right).
BON_ERRORS = (0.7, 0.3)
BON_CORRECT_SHARE = (0.0, 0.5)


def held_out(seed: int, n_test: int, bon_questions: int, bon_candidates: int, mix, events) -> tuple[list, list, list]:
    """(dev, test, Best-of-N pools) of the task, from seeds next to the training data's `seed`."""
    task = dict(mix=mix, events=events)
    dev, test = make_dataset(n_test, seed=seed + 3, **task), make_dataset(n_test, seed=seed + 1, **task)
    pools = make_bon_pools(bon_questions, bon_candidates, seed=seed + 2, errors=BON_ERRORS, events=events, correct_share=BON_CORRECT_SHARE)
    return dev, test, pools


def text_free_rule(dev: list[Trajectory], test: list[Trajectory]) -> tuple[str, dict[str, float]]:
    """(its name, exact first error by kind) of the baseline that reads no text: flag the step index tuned on `dev`."""
    k, _ = tune_flag_step(np.array([len(t.steps) for t in dev]), first_errors(dev))
    return f"flag step {k} (reads no text)", exact_by_kind(flag_step(np.array([len(t.steps) for t in test]), k), test)


def run_demo(cfg: DemoConfig) -> dict:
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    task = dict(mix=cfg.mix, events=cfg.events)
    data = write_trajectories(out / "train.jsonl", make_dataset(cfg.n_train, cfg.seed, **task))
    dev, test, pools = held_out(cfg.seed, cfg.n_test, cfg.bon_questions, cfg.bon_candidates, cfg.mix, cfg.events)
    results = {}
    for mode in cfg.modes.split(","):
        start = time.perf_counter()
        print(f"\n== training {mode} ==")
        ckpt = train(TrainConfig(
            backbone="tiny", data=str(data), output_dir=str(out / mode), mode=mode,
            learning_rate=cfg.lr, gate_lr_scale=cfg.gate_lr_scale, num_train_epochs=cfg.epochs, per_device_train_batch_size=cfg.batch_size,
            gradient_accumulation_steps=1, warmup_ratio=0.05,
            seed=cfg.seed, save_steps=10**9, logging_steps=50, overwrite=True,  # a rerun of the demo retrains
        ))
        results[mode] = evaluate(Scorer.from_pretrained(ckpt, device="cpu"), dev, test, pools)
        results[mode]["seconds"] = round(time.perf_counter() - start, 1)
    name, rule = text_free_rule(dev, test)
    print("\n" + table(results, {name: rule}))
    print("\n" + verdict_line(results, rule))
    print(
        "A tiny random backbone on a synthetic task: this shows every mode training and being evaluated end to end;"
        "\nits ordering moves with the seed, CPU and thread count and is not evidence for or against BiPRM."
        "\nFor that, see the replication study (a real backbone on real data; studies/replication/README.md)."
    )
    (out / "results.json").write_text(json.dumps({"config": asdict(cfg), "results": results}, indent=2))
    if "bi" in results:
        plot_sigma_by_position(results["bi"]["sigma_by_position"], str(out / "sigma_by_position.png"))
    print(f"\nwrote {out / 'results.json'}" + (f" and {out / 'sigma_by_position.png'}" if "bi" in results else ""))
    return results


def above_text_free(r: dict, rule: dict[str, float]) -> bool:
    """Above every row that reads no text: both exact-match columns over the position rule, BoN over majority vote and random pick."""
    bon = r["bon"]["mean"]
    return all(r["exact"].get(k, 0.0) > rule.get(k, 0.0) for k in ("claim", "calc")) and bon["bon"] > max(bon["majority"], bon["chance"])


def verdict_line(results: dict, rule: dict[str, float]) -> str:
    above = [mode for mode, r in results.items() if above_text_free(r, rule)]
    if not above:
        return "No mode is above every row that reads no text on this table."
    return f"Above every row that reads no text on this table (first error by kind, and Best-of-N): {', '.join(above)}."


def table(results: dict, rules: dict[str, dict[str, float]]) -> str:
    ns = next(iter(results.values()))["bon"]["ns"]
    head = ["mode", "F1@0.5", "F1@tau", "tau", "acc_err", "acc_corr", "claim exact", "calc exact"] + [f"BoN@{n}" for n in ns] + ["BoN mean", "time s"]
    rows = [head]
    exact = lambda e: [f"{e.get(k, float('nan')):.1f}" for k in ("claim", "calc")]  # noqa: E731
    for mode, r in results.items():
        fixed, tuned, bon = r["processbench"], r["processbench_tuned"], r["bon"]
        rows.append([mode, f"{fixed['f1']:.1f}", f"{tuned['f1']:.1f}", f"{r['threshold']:.2f}", f"{tuned['acc_error']:.1f}",
                     f"{tuned['acc_correct']:.1f}", *exact(r["exact"])] + [f"{bon['bon'][n]:.1f}" for n in ns] + [f"{bon['mean']['bon']:.1f}", f"{r['seconds']:.0f}"])
    rows += [[name, "", "", "", "", "", *exact(e)] + [""] * (len(ns) + 2) for name, e in rules.items()]
    some = next(iter(results.values()))["bon"]
    blank = [""] * 7
    rows.append(["pass@n (oracle)"] + blank + [f"{some['pass'][n]:.1f}" for n in ns] + [f"{some['mean']['pass']:.1f}", ""])
    rows.append(["majority vote (fair ties)"] + blank + [f"{some['majority'][n]:.1f}" for n in ns] + [f"{some['mean']['majority']:.1f}", ""])
    rows.append(["random pick (chance)"] + blank + [f"{some['chance'][n]:.1f}" for n in ns] + [f"{some['mean']['chance']:.1f}", ""])
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths)))  # noqa: E731
    return "\n".join([fmt(rows[0]), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows[1:]])
