"""`python -m benchmarks --preset search`: what scoring a beam search's partial solutions costs, incremental L2R against
from scratch.

The workload is a beam search of depth D and width W over P paths per question: P first
steps, then at every depth the W kept paths each grow P/W next steps. Real GSM8K reference
steps (test split) stand in for generated ones, and the kept paths are a seeded draw rather
than the PRM's choice, so every configuration scores the very same tree. Configurations,
all `PrefixScorer`s on one random-weight backbone:
- `l2r:incremental`: L2R on its KV cache, only each path's new step runs (O(D) tokens per path);
- `l2r:scratch`: L2R from scratch at every depth, each question's prompt once per call (O(D^2));
- `bi:fused`: incremental L2R plus R2L rerun on every step at every depth, and the gate.
Questions run in groups (one PathScorer call per group and depth, as a search batching
across questions makes them), and the configurations take turns per group, so a burst of
load from another process slows all of them alike.

Each configuration's row of a group (its seconds and tokens per depth) is appended to
`bench-<shape>-search.rows.jsonl` in `--out` as it finishes, and the report is rewritten
from the groups measured so far after every group, marked partial until all are. A run cut
short goes on, run again with the same settings, from the groups it finished (a group with a
configuration missing is measured again, whole); the rows file goes once the report is whole.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from benchmarks.config import BenchConfig
from benchmarks.measure import machine
from benchmarks.report import _table, save
from benchmarks.workload import build
from biprm.data.readers import read_rows
from biprm.data.benchmarks import data_file
from biprm.data.benchmarks import gsm8k_reference
from biprm.run_folder import changes
from biprm.scoring.scorer import Scorer
from biprm.scoring.prefix import PrefixScorer

CONFIGS = {
    "l2r:incremental": ("l2r", True, "l2r"),
    "l2r:scratch": ("l2r", False, "l2r"),
    "bi:fused": ("bi", True, "fused"),
}
Level = list[tuple[str, list[str]]]  # the (question, path) pairs one call scores


def search_tree(data_root: str, sizes: dict, seed: int = 0) -> list[list[Level]]:
    """Per group of questions, per depth, the paths to score (see the module docstring)."""
    rows, name = read_rows(str(data_file(data_root, "gsm8k", "test.jsonl")))
    refs = [gsm8k_reference(r.get("question"), r.get("answer"), f"{name} row {i + 1}") for i, r in enumerate(rows)]
    pool = [s for t in refs for s in t.steps]
    rng = np.random.default_rng(seed)
    questions = [refs[i].question for i in rng.choice(len(refs), sizes["questions"], replace=False)]
    width, grow = sizes["width"], sizes["paths"] // sizes["width"]
    draw = lambda n: [pool[i] for i in rng.integers(len(pool), size=n)]  # noqa: E731
    groups = []
    for g in range(0, len(questions), sizes["group"]):
        level = [(q, [s]) for q in questions[g : g + sizes["group"]] for s in draw(sizes["paths"])]
        levels = [level]
        for _ in range(sizes["depth"] - 1):
            kept = [
                level[i + k * sizes["paths"]]
                for k in range(len(level) // sizes["paths"])
                for i in rng.choice(sizes["paths"], width, replace=False)
            ]
            level = [(q, [*p, s]) for q, p in kept for s in draw(grow)]
            levels.append(level)
        groups.append(levels)
    return groups


def rows_file(cfg: BenchConfig) -> Path:
    return Path(cfg.out) / f"bench-{cfg.shape}-search.rows.jsonl"


def measured(path: Path, config: dict) -> tuple[dict, list[dict], int]:
    """(the run's header, the rows of the question groups it has measured whole, this session's number) from the rows
    file a run cut short left, which must be this run's; a new file (its header: settings and load average) if none."""
    lines = (
        [json.loads(line) for line in path.read_text().split("\n")[:-1]] if path.is_file() else []
    )  # a line cut by a kill is dropped
    if not lines:
        header = {"config": config, "loadavg_start": os.getloadavg()}
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(header) + "\n")
        return header, [], 0
    header, *rows = lines
    if header["config"] != config:
        raise ValueError(
            f"{path} holds the rows of another run ({'; '.join(changes(header['config'], config))}); "
            "delete it to measure this one"
        )
    whole = {g for g in {r["group"] for r in rows} if {r["config"] for r in rows if r["group"] == g} == set(CONFIGS)}
    rows = [r for r in rows if r["group"] in whole]
    path.write_text("".join(json.dumps(line) + "\n" for line in [header, *rows]))
    return header, rows, 1 + max((r["session"] for r in rows), default=-1)


def measure(prefix: PrefixScorer, levels: list[Level], streams: str) -> tuple[dict, list]:
    """One configuration over one group's depths: its row (seconds and tokens per depth) and the L2R scores it gave."""
    row, scores = {"seconds": [], "tokens": []}, []
    for level in levels:
        before, t = np.array(list(prefix.tokens.values())), time.perf_counter()
        got = prefix.score([q for q, _ in level], [p for _, p in level], streams)
        row["seconds"].append(time.perf_counter() - t)
        row["tokens"].append((np.array(list(prefix.tokens.values())) - before).tolist())
        scores += [s.l2r for s in got]
    return row, scores


def run(cfg: BenchConfig, sizes: dict | None = None, report: Callable[[dict], None] | None = None) -> dict:
    """Tokens and seconds per depth of every configuration, going on from the groups a run cut short measured; `report`
    gets the result of the groups measured so far after each; `sizes` overrides the preset's (tests)."""
    sizes = sizes or cfg.sizes
    torch.set_num_threads(cfg.threads or os.cpu_count())
    start, path = time.perf_counter(), rows_file(cfg)
    groups = search_tree(cfg.data_root, sizes, cfg.seed)
    header, rows, session = measured(path, asdict(cfg) | sizes)
    todo = [g for g in range(len(groups)) if g not in {r["group"] for r in rows}]
    if todo:
        bench = build(cfg.shape, cfg.seed)
        scorers = {
            name: PrefixScorer(Scorer(bench.ours[mode], bench.tokenizer), incremental)
            for name, (mode, incremental, _) in CONFIGS.items()
        }
        for name, (_, _, streams) in CONFIGS.items():  # warm-up: one level, not counted
            level = groups[0][0]
            PrefixScorer(scorers[name].scorer).score([q for q, _ in level], [p for _, p in level], streams)
    for g in tqdm(todo, desc="question groups", unit="group"):  # each group: every configuration over every depth
        scores = {}
        for name, (_, _, streams) in CONFIGS.items():
            row, scores[name] = measure(scorers[name], groups[g], streams)
            if name == "l2r:scratch":
                row["max_abs_diff_vs_incremental"] = max(
                    float(np.abs(a - b).max()) for a, b in zip(scores["l2r:incremental"], scores[name])
                )
            rows.append(
                {"group": g, "config": name, **row, "session": session, "elapsed_s": time.perf_counter() - start}
            )
            with path.open("a") as f:
                f.write(json.dumps(rows[-1]) + "\n")
        if report is not None:
            report(result_of(header, rows, groups))
    return result_of(header, rows, groups)


def result_of(header: dict, rows: list[dict], groups: list[list[Level]]) -> dict:
    """The result of the groups `rows` holds: their seconds and tokens summed per configuration and depth; the wall
    clock of every session up to its last row."""
    depth = len(groups[0])
    seconds = {name: np.zeros(depth) for name in CONFIGS}
    tokens = {name: np.zeros((depth, 3), dtype=np.int64) for name in CONFIGS}  # prompt, l2r, r2l
    sessions: dict[int, float] = {}
    for r in rows:
        seconds[r["config"]] += r["seconds"]
        tokens[r["config"]] += np.array(r["tokens"], dtype=np.int64)
        sessions[r["session"]] = max(sessions.get(r["session"], 0.0), r["elapsed_s"])
    return {
        "config": header["config"],
        "machine": machine(),
        "loadavg_start": header["loadavg_start"],
        "paths_per_depth": [len(level) for level in groups[0]],
        "groups_done": len({r["group"] for r in rows}),
        "groups": len(groups),
        "seconds": {k: v.tolist() for k, v in seconds.items()},
        "tokens": {k: v.tolist() for k, v in tokens.items()},
        "max_abs_diff_incremental_vs_scratch": max(
            r["max_abs_diff_vs_incremental"] for r in rows if r["config"] == "l2r:scratch"
        ),
        "loadavg_end": os.getloadavg(),
        "elapsed_s": sum(sessions.values()),
        "sessions": len(sessions),
    }


def targets(result: dict) -> list[dict]:
    """The issue's targets over the whole search of depth D: tokens and wall clock."""
    total = {k: float(np.sum(v)) for k, v in result["tokens"].items()}
    secs = {k: float(np.sum(v)) for k, v in result["seconds"].items()}
    rows = [
        ("L2R tokens: scratch / incremental", total["l2r:scratch"] / total["l2r:incremental"], ">=", 3.0),
        ("L2R seconds: scratch / incremental", secs["l2r:scratch"] / secs["l2r:incremental"], ">=", 3.0),
        ("tokens: fused / L2R scratch", total["bi:fused"] / total["l2r:scratch"], "<=", 1.4),
        ("seconds: fused / L2R scratch", secs["bi:fused"] / secs["l2r:scratch"], "<=", 1.4),
    ]
    return [
        {"target": n, "value": v, "op": op, "goal": g, "met": v >= g if op == ">=" else v <= g} for n, v, op, g in rows
    ]


def write_markdown(result: dict, path: str) -> str:
    cfg, m = result["config"], result["machine"]
    names = list(CONFIGS)
    per_depth = [
        [d + 1, *(int(np.sum(result["tokens"][n][d])) for n in names), *(result["seconds"][n][d] for n in names)]
        for d in range(cfg["depth"])
    ]
    parts = [
        f"# biprm bench: scoring a beam search's partial solutions, {cfg['shape']} shape (random weights, fp32)",
        f"{m['lscpu'].get('Model name', '?')}, {m['lscpu'].get('CPU(s)', '?')} CPUs; torch {m['torch']}, "
        f"{m['threads']} threads. Load average at start {result['loadavg_start'][0]:.2f}, at end "
        f"{result['loadavg_end'][0]:.2f}. {cfg['questions']} GSM8K test questions in groups of {cfg['group']}, beam "
        f"width {cfg['width']} over {cfg['paths']} paths per question, depth {cfg['depth']}; GSM8K reference steps "
        f"stand in for generated ones. The whole run took {result['elapsed_s'] / 60:.1f} min"
        + (
            f", in {result['sessions']} sessions (each counted to its last finished group)."
            if result["sessions"] > 1
            else "."
        ),
        *(
            [
                f"**Partial:** {result['groups_done']} of {result['groups']} question groups measured; the same "
                "command goes on from the rest."
            ]
            if result["groups_done"] < result["groups"]
            else []
        ),
        "## Targets (the whole search)",
        _table(
            ["target", "measured", "goal", "met"],
            [[t["target"], t["value"], f"{t['op']} {t['goal']}", t["met"]] for t in result["targets"]],
        ),
        "## Per depth: PRM tokens run (prompt + L2R + R2L) and seconds, summed over questions",
        _table(["depth", *(f"tokens {n}" for n in names), *(f"s {n}" for n in names)], per_depth),
        "## Totals by stream",
        _table(
            ["config", "prompt", "l2r", "r2l", "all", "seconds"],
            [
                [
                    n,
                    *np.sum(result["tokens"][n], axis=0).tolist(),
                    int(np.sum(result["tokens"][n])),
                    float(np.sum(result["seconds"][n])),
                ]
                for n in names
            ],
        ),
        "Largest L2R score difference, incremental against from scratch: "
        f"{result['max_abs_diff_incremental_vs_scratch']:.2g}.",
    ]
    text = "\n\n".join(parts) + "\n"
    Path(path).write_text(text)
    return text


def main(cfg: BenchConfig, sizes: dict | None = None) -> dict:
    """Measure, writing the report after every question group (printed once whole); the rows file goes at the end."""

    def report(result: dict, show: bool = False) -> None:
        result["targets"] = targets(result)
        save(result, cfg.out, f"bench-{cfg.shape}-search", write_markdown, show)

    try:
        result = run(cfg, sizes, report)
    except KeyboardInterrupt:  # the one line `run_program` prints
        raise KeyboardInterrupt(
            f"the question groups measured so far are kept in {rows_file(cfg)}, and reported beside it: "
            "the same command goes on from there"
        ) from None
    report(result, show=True)
    rows_file(cfg).unlink()
    return result
