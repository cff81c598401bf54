"""The demo recipe: four PRMs, one budget, one seed, on the embedded synthetic task.

It trains `l2r`, `r2l`, `bi-static` and `bi` on a tiny randomly initialised
backbone, then measures first-error F1 (ProcessBench protocol, at 0.5 and at a
threshold tuned on a held-out dev set) on held-out labelled solutions and
Best-of-N accuracy (min aggregation) on held-out candidate pools, prints a table
with the scorers that read no step text beside them in every column they fill,
and writes results.json and the gate curve (mean sigma_t by position).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch

from biprm.analysis.common import first_errors
from biprm.analysis.plots import plot_sigma_by_position
from biprm.analysis.position import sigma_by_position
from biprm.config import DemoConfig, TrainConfig
from biprm.data.synthetic import make_bon_pools, make_dataset
from biprm.data.writer import write_trajectories
from biprm.metrics.selection import bon_table, content_free, subsets
from biprm.metrics.first_error import (
    flag_step,
    predict_first_error,
    processbench_scores,
    tune_flag_step,
    tune_threshold,
)
from biprm.offsets import offsets_of
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
    qid, correct, answers = pool_arrays(pools)
    result["bon"] = bon_table(qid, scores_of(scorer, pools).solution_logits("min"), correct, answers, ns=(4, 8, 16))
    if scores.sigma is not None and scorer.mode == "bi":
        result["sigma_by_position"] = sigma_by_position(scores)
    return result


def pool_arrays(pools: list[Trajectory]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(question id, correct, final answer) of every Best-of-N candidate."""
    return (
        np.array([t.meta["qid"] for t in pools]),
        np.array([bool(t.correct) for t in pools]),
        np.array([t.steps[-1] for t in pools]),
    )


def exact_by_kind(pred: np.ndarray, trajs: list) -> dict[str, float]:
    """% of rows whose first error is found at its exact step, per error kind: "claim" errors show only in
    later steps (what the R2L stream is for), "calc" errors where they happen."""
    kind, first = np.array([t.meta["kind"] for t in trajs]), first_errors(trajs)
    return {
        k: 100.0 * float(np.mean(pred[kind == k] == first[kind == k])) for k in ("claim", "calc") if (kind == k).any()
    }


# Best-of-N pools where a random pick is far from pass@n: at most half the candidates right, the errors
# mostly calc (a claim error recovers, so its answer is right).
BON_ERRORS = (0.7, 0.3)
BON_CORRECT_SHARE = (0.0, 0.5)


def held_out(seed: int, n_test: int, bon_questions: int, bon_candidates: int, mix, events) -> tuple[list, list, list]:
    """(dev, test, Best-of-N pools) of the task, from seeds next to the training data's `seed`."""
    task = dict(mix=mix, events=events)
    dev, test = make_dataset(n_test, seed=seed + 3, **task), make_dataset(n_test, seed=seed + 1, **task)
    pools = make_bon_pools(
        bon_questions, bon_candidates, seed=seed + 2, errors=BON_ERRORS, events=events, correct_share=BON_CORRECT_SHARE
    )
    return dev, test, pools


PASS = "pass@n (oracle)"  # the pool's ceiling: a row beside the scorers, not one of them


def text_free_rows(
    dev: list[Trajectory], test: list[Trajectory], pools: list[Trajectory], ns: list[int]
) -> dict[str, dict]:
    """The scorers that read no step text, shaped as a mode's results in the columns they fill: "flag step k" (k tuned
    on `dev`, as a mode's threshold is) in the first-error ones; in the Best-of-N ones, on the candidates a mode picks
    from, the evaluation's content-free scorers (random pick, majority vote, fewest and most steps, noise under min)
    and pass@n."""
    k, _ = tune_flag_step(np.array([len(t.steps) for t in dev]), first_errors(dev))
    pred = flag_step(np.array([len(t.steps) for t in test]), k)
    rows = {
        f"flag step {k}": {
            "processbench_tuned": processbench_scores(pred, first_errors(test)),
            "exact": exact_by_kind(pred, test),
        }
    }
    (qid, correct, answers), n_steps = pool_arrays(pools), np.array([len(t.steps) for t in pools])
    by_n = {n: content_free(subsets(qid, n), n_steps, correct, answers, "min", offsets_of(n_steps)) for n in ns}
    for name in by_n[ns[0]]:
        bon = {n: 100.0 * float(by_n[n][name].mean()) for n in ns}
        rows[name] = {"bon": {"bon": bon, "mean": {"bon": float(np.mean(list(bon.values())))}}}
    return rows


# The demo's thread count, whatever the machine's: a sum split over another number of threads may add in another order,
# and the table moved between machines. One, since every machine has one, and two threads on a shared 2-core machine
# mostly wait for each other: beside other jobs, l2r's first 371 steps cost 673 CPU s (25 min) on two threads, its
# first 189 steps 77 CPU s (2.5 min) on one.
DEMO_THREADS = 1


@contextmanager
def pinned_threads(threads: int = DEMO_THREADS) -> Iterator[None]:
    """Torch's intra- and inter-op thread counts set to `threads` and its deterministic algorithms on (warning where an
    op has none), all restored on exit: the demo's table is the same on any machine and thread count."""
    before = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    try:  # the interop count can be set once per process, before any parallel work: a later call is refused
        torch.set_num_interop_threads(threads)
    except RuntimeError:
        pass
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        yield
    finally:
        torch.set_num_threads(before[0])
        torch.use_deterministic_algorithms(before[1])


def run_demo(cfg: DemoConfig) -> dict:
    """Train and evaluate every mode of `cfg` with torch's threads pinned (see `pinned_threads`)."""
    with pinned_threads():
        return demo(cfg)


def demo(cfg: DemoConfig) -> dict:
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    task = dict(mix=cfg.mix, events=cfg.events)
    data = write_trajectories(out / "train.jsonl", make_dataset(cfg.n_train, cfg.seed, **task))
    dev, test, pools = held_out(cfg.seed, cfg.n_test, cfg.bon_questions, cfg.bon_candidates, cfg.mix, cfg.events)
    print(WHAT_TO_LOOK_AT)
    results = {}
    for mode in cfg.modes.split(","):
        start = time.process_time()  # the work of every thread of this process, whatever else the machine runs
        print(f"\n== training {mode} ==")
        ckpt = train(
            TrainConfig(
                backbone="tiny",
                data=str(data),
                output_dir=str(out / mode),
                mode=mode,
                learning_rate=cfg.lr,
                gate_lr_scale=cfg.gate_lr_scale,
                num_train_epochs=cfg.epochs,
                per_device_train_batch_size=cfg.batch_size,
                gradient_accumulation_steps=1,
                warmup_ratio=0.05,
                seed=cfg.seed,
                save_steps=10**9,
                logging_steps=50,
                overwrite=True,  # a rerun of the demo retrains
            )
        )
        results[mode] = evaluate(Scorer.from_pretrained(ckpt, device="cpu"), dev, test, pools)
        results[mode]["cpu_seconds"] = round(time.process_time() - start, 1)
    text_free = text_free_rows(dev, test, pools, next(iter(results.values()))["bon"]["ns"])
    print("\n" + table(results, text_free))
    print("\n" + verdict_line(results, text_free))
    print(picks_line(results, text_free))
    print(
        "A tiny random backbone on a synthetic task: this shows every mode training and being evaluated end to end;"
        "\nits ordering moves with the seed (and may with the CPU; not with the thread count, which it pins) and is"
        "\nnot evidence for or against BiPRM. For that, see the replication study (a real backbone on real data;"
        "\nstudies/replication/README.md)."
    )
    (out / "results.json").write_text(
        json.dumps({"config": asdict(cfg), "results": results, "reads_no_text": text_free}, indent=2)
    )
    if "bi" in results:
        plot_sigma_by_position(results["bi"]["sigma_by_position"], str(out / "sigma_by_position.png"))
    print(f"\nwrote {out / 'results.json'}" + (f" and {out / 'sigma_by_position.png'}" if "bi" in results else ""))
    return results


WHAT_TO_LOOK_AT = (
    "biprm demo: l2r, r2l, bi-static and bi, trained from scratch on a tiny random backbone, on a synthetic"
    "\ntask with two error kinds: calc (a wrong equation: the answer changes) and claim (a wrong bare value that"
    "\na later step contradicts: the answer stays right). What to look at in the table at the end: 'calc exact'"
    "\n(is the answer-changing error found at its step?) and BoN@n (are right answers picked?), each against"
    "\nthe rows beneath it that read no step text."
)


def picks_line(results: dict, text_free: dict[str, dict]) -> str:
    """Modes that pick better than a random candidate at every n of Best-of-N, and than majority vote at some n."""
    ns = next(iter(results.values()))["bon"]["ns"]
    chance, vote = (
        next(r["bon"]["bon"] for name, r in text_free.items() if name.startswith(k)) for k in ("random", "majority")
    )
    above = [m for m, r in results.items() if all(r["bon"]["bon"][n] > chance[n] for n in ns)]
    beats = [
        f"{m} (n = {', '.join(str(n) for n in ns if r['bon']['bon'][n] > vote[n])})"
        for m, r in results.items()
        if any(r["bon"]["bon"][n] > vote[n] for n in ns)
    ]
    return (
        f"Best-of-N above a random pick at every n: {', '.join(above) or 'none'}; "
        f"above majority vote at some n: {', '.join(beats) or 'none'}."
    )


def judged(r: dict) -> dict[str, float]:
    """The columns of a row the verdict compares: first-error F1 at the tuned threshold, exact first error by kind,
    Best-of-N mean."""
    found = {f"{kind} exact": v for kind, v in r.get("exact", {}).items()}
    if "processbench_tuned" in r:
        found["F1@tau"] = r["processbench_tuned"]["f1"]
    if "bon" in r:
        found["BoN mean"] = r["bon"]["mean"]["bon"]
    return found


def above_text_free(r: dict, text_free: dict[str, dict]) -> bool:
    """Above every scorer that reads no text in each column that scorer fills (pass@n, the pool's ceiling, is no
    scorer)."""
    mine = judged(r)
    return all(
        mine.get(column, 0.0) > theirs
        for name, row in text_free.items()
        if name != PASS
        for column, theirs in judged(row).items()
    )


def verdict_line(results: dict, text_free: dict[str, dict]) -> str:
    above = [mode for mode, r in results.items() if above_text_free(r, text_free)]
    if not above:
        return "No mode is above every row that reads no text on this table."
    return (
        "Above every row that reads no text on this table (first-error F1 and exact step by kind, and Best-of-N): "
        f"{', '.join(above)}."
    )


def table(results: dict, text_free: dict[str, dict]) -> str:
    """One row per mode, then the rows that read no step text, each in the columns it fills; CPU s is the process's CPU
    time (every thread) to train and evaluate the mode: its work, which a busy machine's wall clock would not show."""
    ns = next(iter(results.values()))["bon"]["ns"]
    head = (
        ["mode", "F1@0.5", "F1@tau", "tau", "acc_err", "acc_corr", "claim exact", "calc exact"]
        + [f"BoN@{n}" for n in ns]
        + ["BoN mean", "CPU s"]
    )
    rows = [head]

    def cells(r: dict, tau: str = "") -> list[str]:  # from F1@tau to BoN mean, blank where the row has no value
        tuned, e, bon = r.get("processbench_tuned"), r.get("exact", {}), r.get("bon")
        first = (
            [f"{tuned['f1']:.1f}", tau, f"{tuned['acc_error']:.1f}", f"{tuned['acc_correct']:.1f}"]
            if tuned
            else [""] * 4
        )
        picks = [f"{bon['bon'][n]:.1f}" for n in ns] + [f"{bon['mean']['bon']:.1f}"] if bon else [""] * (len(ns) + 1)
        return first + [f"{e[k]:.1f}" if k in e else "" for k in ("claim", "calc")] + picks

    rows += [
        [mode, f"{r['processbench']['f1']:.1f}", *cells(r, f"{r['threshold']:.2f}"), f"{r['cpu_seconds']:.0f}"]
        for mode, r in results.items()
    ]
    rows.append(["reads no text:"] + [""] * (len(head) - 1))
    rows += [[f"  {name}", "", *cells(r), ""] for name, r in text_free.items()]
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    fmt = lambda r: "  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths))).rstrip()  # noqa: E731
    return "\n".join([fmt(rows[0]), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows[1:]])
