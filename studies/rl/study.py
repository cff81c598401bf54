"""The small RL study: outcome, min-score and process GRPO (l2r and bi PRMs) from one SFT policy on the synthetic task.

Read top to bottom. `train_policy` fine-tunes a tiny Llama on correct synthetic solutions,
briefly, then the policy further, so that it still makes errors. `train_prm` trains an l2r and a bi PRM from the first
as `biprm demo` does, and `prm_quality` measures them on held-out rows. `run_arm` runs GRPO for one (arm, seed): greedy
held-out accuracy every few steps, and the wall clock of the reward computation. `write_report` turns the run files into
a table with intervals over seeds and questions, and a plot. Each (arm, seed) writes its JSON when it finishes and is
skipped on a rerun, so a killed study restarts only the run it was in.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM, TrainerCallback, set_seed
from trl import GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

from biprm import Scorer
from biprm.analysis.plots import NAMES, plot_steps
from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.config import TrainConfig
from biprm.data.synthetic import make_dataset
from biprm.data.trajectory import Trajectory
from biprm.data.writer import write_trajectories
from biprm.demo import evaluate, held_out, table, text_free_rows
from studies.rl.config import RLStudyConfig
from biprm.integrations.grpo import AnswerReward, BiPRMReward
from biprm.integrations.process_grpo import ProcessGRPOTrainer
from biprm.metrics.bootstrap import bootstrap_mean, paired_difference
from biprm.training import train

log = logging.getLogger(__name__)

CORRECT_ONLY = (1.0, 0.0, 0.0)  # the policy imitates right solutions; its own slips are the errors RL may fix
PRM_MIX = (0.4, 0.3, 0.3)  # the PRMs see calculation errors (the policy's kind) as well as claims
SPLIT = "newline"  # the policy writes one step per line


def prompt_of(question: str) -> str:
    return f"{question}\n"


def questions(n: int, seed: int, events: list[int]) -> list[Trajectory]:
    """n synthetic problems with their reference solutions."""
    return make_dataset(n, seed, mix=CORRECT_ONLY, events=tuple(events))


# ---- 1. the policy -------------------------------------------------------------------------------


def train_policy(cfg: RLStudyConfig, folder: Path, steps: int, start: Path | None = None) -> Path:
    """A tiny Llama (the tiny backbone's tokenizer), new or from `start`, fine-tuned on correct solutions for `steps`;
    kept if already there."""
    if (folder / "config.json").is_file():
        return folder
    tok = load_tokenizer(resolve_backbone("tiny"))
    set_seed(cfg.seed)
    model = (
        AutoModelForCausalLM.from_pretrained(start)
        if start
        else LlamaForCausalLM(
            LlamaConfig(
                vocab_size=len(tok),
                hidden_size=cfg.policy_hidden,
                intermediate_size=3 * cfg.policy_hidden,
                num_hidden_layers=cfg.policy_layers,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_position_embeddings=512,
                tie_word_embeddings=True,
                bos_token_id=tok.bos_token_id,
                eos_token_id=tok.eos_token_id,
                pad_token_id=tok.pad_token_id,
            )
        )
    )
    rows = [
        {"prompt": prompt_of(t.question), "completion": "\n".join(t.steps)}
        for t in questions(cfg.sft_examples, cfg.seed, cfg.policy_events)
    ]
    scratch = folder.with_name(folder.name + ".partial")
    args = SFTConfig(
        output_dir=str(scratch),
        max_steps=steps,
        per_device_train_batch_size=cfg.sft_batch_size,
        learning_rate=cfg.sft_lr,
        lr_scheduler_type="cosine",
        warmup_steps=0.05,
        max_length=256,
        logging_steps=max(1, steps // 20),
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        seed=cfg.seed,
        disable_tqdm=True,
    )
    SFTTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok).train()
    model.save_pretrained(scratch)
    tok.save_pretrained(scratch)
    scratch.rename(folder)  # whole or absent: a killed SFT is redone, never half-read
    return folder


@torch.no_grad()
def held_out_accuracy(model, tok, evals: list[Trajectory], max_new_tokens: int, batch_size: int = 100) -> list[int]:
    """1/0 per question: the greedy completion's final answer equals the reference (math-verify, as AnswerReward
    grades)."""
    was_training, side = model.training, tok.padding_side
    model.eval()
    tok.padding_side = "left"
    texts = []
    for a in range(0, len(evals), batch_size):
        prompts = [prompt_of(t.question) for t in evals[a : a + batch_size]]
        enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=tok.pad_token_id)
        texts += tok.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
    model.train(was_training)
    tok.padding_side = side
    graded = AnswerReward(workers=0)(
        prompts=[t.question for t in evals], completions=texts, answer=[t.answer for t in evals]
    )
    return [int(g == 1.0) for g in graded]


# ---- 2. the reward models ------------------------------------------------------------------------


def train_prm(cfg: RLStudyConfig, mode: str, backbone: Path, work: Path) -> Path:
    """A PRM trained by `biprm.training.train` on the demo's recipe from `backbone`, the SFT model the policy also
    starts from: a random tiny backbone learns no arithmetic check in minutes (it found no calculation error in a
    first try). A finished PRM is kept."""
    data = work / "prm-train.jsonl"
    if not data.is_file():
        write_trajectories(data, make_dataset(cfg.prm_train, cfg.seed + 1, mix=PRM_MIX, events=tuple(cfg.events)))
    return Path(
        train(
            TrainConfig(
                backbone=str(backbone),
                data=str(data),
                output_dir=str(work / f"prm-{mode}"),
                mode=mode,
                learning_rate=cfg.prm_lr,
                gate_lr_scale=0.1,
                num_train_epochs=cfg.prm_epochs,
                per_device_train_batch_size=16,
                gradient_accumulation_steps=1,
                warmup_ratio=0.05,
                seed=cfg.seed,
                save_steps=10**9,
                logging_steps=50,
                resume=True,
            )
        )
    )


def prm_quality(cfg: RLStudyConfig, folders: dict[str, Path], out: Path) -> None:
    """The PRMs' step-level quality on held-out rows beside the scorers that read no text (the demo's table), in
    `out`/prms.json."""
    if (out / "prms.json").is_file():
        return
    dev, test, pools = held_out(cfg.seed + 10, cfg.prm_test, cfg.prm_bon_questions, 16, PRM_MIX, tuple(cfg.events))
    results = {
        mode: evaluate(Scorer.from_pretrained(str(f), device="cpu"), dev, test, pools) for mode, f in folders.items()
    }
    for r in results.values():
        r["cpu_seconds"] = float(
            "nan"
        )  # the demo's table has a CPU time column; the PRMs' training time is in their train_log.json
    text_free = text_free_rows(dev, test, pools, next(iter(results.values()))["bon"]["ns"])
    (out / "prms.json").write_text(
        json.dumps({"results": results, "reads_no_text": text_free, "table": table(results, text_free)}, indent=2)
    )


# ---- 3. GRPO, one (arm, seed) --------------------------------------------------------------------


def arm_trainer(arm: str, scorers: dict[str, Scorer]) -> tuple[type[GRPOTrainer], dict]:
    """The trainer class and its reward arguments for one arm."""
    if arm == "outcome":
        return GRPOTrainer, {"reward_funcs": [AnswerReward(workers=0)]}
    if arm == "min":
        return GRPOTrainer, {"reward_funcs": [BiPRMReward(scorer=scorers["bi"], aggregation="min", split=SPLIT)]}
    mode = arm.removeprefix("process-")
    stream = "fused" if mode == "bi" else mode
    return ProcessGRPOTrainer, {"process_reward": BiPRMReward(scorer=scorers[mode], split=SPLIT), "stream": stream}


class HeldOut(TrainerCallback):
    """Greedy held-out accuracy every `every` steps and at the last, per question."""

    def __init__(self, tok, evals: list[Trajectory], every: int, max_new_tokens: int):
        self.tok, self.evals, self.every, self.max_new_tokens = tok, evals, every, max_new_tokens
        self.accuracy: dict[int, list[int]] = {}

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0 or state.global_step == state.max_steps:
            self.accuracy[state.global_step] = held_out_accuracy(model, self.tok, self.evals, self.max_new_tokens)
            log.info(
                "step %d: held-out accuracy %.1f%%", state.global_step, 100 * np.mean(self.accuracy[state.global_step])
            )


def run_arm(
    cfg: RLStudyConfig,
    arm: str,
    seed: int,
    policy: Path,
    scorers: dict[str, Scorer],
    prompts: list[Trajectory],
    evals: list[Trajectory],
    work: Path,
) -> dict:
    """GRPO from the SFT policy; the reward clock covers everything between rollout and advantages
    (decoding, step cutting, PRM scoring or answer grading)."""
    tok = load_tokenizer(str(policy))
    model = AutoModelForCausalLM.from_pretrained(policy)
    trainer_class, rewards = arm_trainer(arm, scorers)
    args = GRPOConfig(
        output_dir=str(work / f"grpo-{arm}-seed{seed}"),
        max_steps=cfg.steps,
        per_device_train_batch_size=cfg.prompts_per_step * cfg.group_size,
        num_generations=cfg.group_size,
        max_completion_length=cfg.max_completion_length,
        temperature=cfg.temperature,
        learning_rate=cfg.lr,
        lr_scheduler_type="constant",
        beta=0.0,
        seed=seed,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        disable_tqdm=True,
    )  # TRL defaults to both, slow on a CPU
    held = HeldOut(tok, evals, cfg.eval_every, cfg.max_completion_length)
    dataset = Dataset.from_dict(
        {"prompt": [prompt_of(t.question) for t in prompts], "answer": [t.answer for t in prompts]}
    )
    trainer = trainer_class(
        model=model, args=args, processing_class=tok, train_dataset=dataset, callbacks=[held], **rewards
    )
    clock = {
        "seconds": 0.0,
        "cpu_seconds": 0.0,
        "calls": 0,
    }  # CPU time too: on a shared machine the wall clock waits for others
    compute = trainer._calculate_rewards

    def timed(*a, **k):
        start, cpu = time.perf_counter(), time.process_time()
        try:
            return compute(*a, **k)
        finally:
            clock["seconds"] += time.perf_counter() - start
            clock["cpu_seconds"] += time.process_time() - cpu
            clock["calls"] += 1

    trainer._calculate_rewards = timed
    start = time.perf_counter()
    trainer.train()
    logged = [
        {k: e[k] for k in ("step", "reward", "reward_std", "completions/mean_length") if k in e}
        for e in trainer.state.log_history
    ]
    return {
        "arm": arm,
        "seed": seed,
        "accuracy": held.accuracy,
        "reward_seconds": clock["seconds"],
        "reward_cpu_seconds": clock["cpu_seconds"],
        "reward_calls": clock["calls"],
        "completions_per_call": cfg.prompts_per_step * cfg.group_size,
        "seconds": time.perf_counter() - start,
        "log": logged,
    }


# ---- the study -----------------------------------------------------------------------------------


def run_study(cfg: RLStudyConfig) -> None:
    out, work = Path(cfg.out), Path(cfg.work_dir)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    evals = questions(cfg.eval_questions, cfg.seed + 21, cfg.policy_events)
    base = train_policy(cfg, work / "sft-base", cfg.sft_steps)  # the PRMs' backbone, and the policy's start
    policy = train_policy(cfg, work / "policy", cfg.policy_sft_steps, start=base)
    if not (out / "policy.json").is_file():  # the SFT policy's accuracy: every arm's step 0
        model = AutoModelForCausalLM.from_pretrained(policy)
        start = held_out_accuracy(model, load_tokenizer(str(policy)), evals, cfg.max_completion_length)
        (out / "policy.json").write_text(json.dumps({"accuracy": start}))
    folders = {mode: train_prm(cfg, mode, base, work) for mode in ("l2r", "bi")}
    prm_quality(cfg, folders, out)
    scorers = {mode: Scorer.from_pretrained(str(f), device="cpu") for mode, f in folders.items()}
    prompts = questions(cfg.steps * cfg.prompts_per_step, cfg.seed + 20, cfg.policy_events)
    for seed in cfg.seeds:  # seed-major: an interrupted study has every arm on its first seeds
        for arm in cfg.arms.split(","):
            path = out / "runs" / f"{arm}-seed{seed}.json"
            if path.is_file():
                continue
            print(f"== {arm}, seed {seed} ==", flush=True)
            result = run_arm(cfg, arm, seed, policy, scorers, prompts, evals, work)
            path.write_text(json.dumps({**result, "config": asdict(cfg)}))
            write_report(cfg)
    print(write_report(cfg))  # the tables, then where the report lies
    print(f"\nwrote {out / 'report.md'}")


# ---- 4. the report -------------------------------------------------------------------------------


def load_runs(out: Path) -> dict[str, list[dict]]:
    """{arm: its finished runs, by seed}."""
    runs: dict[str, list[dict]] = {}
    for path in sorted((out / "runs").glob("*.json")):
        run = json.loads(path.read_text())
        run["accuracy"] = {int(k): v for k, v in run["accuracy"].items()}
        runs.setdefault(run["arm"], []).append(run)
    return runs


def arm_summary(runs: list[dict], start: list[int]) -> dict:
    """Accuracy at each evaluated step over the seeds that reached it ([S, Q] -> bootstrap over both), the last and the
    best."""
    steps = sorted(set.intersection(*(set(r["accuracy"]) for r in runs)))
    curve = {0: bootstrap_mean(np.array([start]))} | {
        s: bootstrap_mean(np.array([r["accuracy"][s] for r in runs])) for s in steps
    }
    best = max(steps, key=lambda s: curve[s]["mean"])

    def per_step(key: str) -> float:
        return float(np.mean([r[key] / max(1, r["reward_calls"]) for r in runs]))

    return {
        "seeds": [r["seed"] for r in runs],
        "curve": curve,
        "last": steps[-1],
        "best": best,
        "final": np.array([r["accuracy"][steps[-1]] for r in runs]),
        "reward_seconds_per_step": per_step("reward_seconds"),
        "reward_cpu_seconds_per_step": per_step("reward_cpu_seconds"),
        "run_minutes": float(np.mean([r["seconds"] for r in runs]) / 60),
    }


def pct(b: dict) -> str:
    return f"{100 * b['mean']:.1f} [{100 * b['low']:.1f}, {100 * b['high']:.1f}]"


def write_report(cfg: RLStudyConfig) -> str:
    """report.md and accuracy_by_step.png from the runs finished so far; names the runs still missing."""
    out = Path(cfg.out)
    start = json.loads((out / "policy.json").read_text())["accuracy"]
    runs = load_runs(out)
    arms = [a for a in cfg.arms.split(",") if a in runs]
    summary = {arm: arm_summary(runs[arm], start) for arm in arms}
    missing = [
        f"{a} seed {s}" for s in cfg.seeds for a in cfg.arms.split(",") if s not in summary.get(a, {}).get("seeds", [])
    ]
    lines = [
        "# RL study: outcome vs min-score vs process GRPO on the synthetic task",
        "",
        f"Written by `python -m studies.rl` (studies/rl/study.py) with {cfg.steps} GRPO steps of "
        f"{cfg.prompts_per_step} questions × {cfg.group_size} samples, lr {cfg.lr}, from one SFT policy; held-out "
        f"greedy accuracy on {len(start)} questions. Intervals: 95 % bootstrap over seeds and questions. Δ: paired "
        "difference from outcome GRPO on the same questions.",
        "",
        f"SFT policy (step 0): {pct(bootstrap_mean(np.array([start])))} %",
        "",
        "| arm | seeds | accuracy at the last step, % | Δ vs outcome, points | best step | accuracy there, % | reward "
        "s / step (CPU s) | run min |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for arm, s in summary.items():
        delta = "—"
        if arm != "outcome" and "outcome" in summary:
            common = [i for i, seed in enumerate(s["seeds"]) if seed in summary["outcome"]["seeds"]]
            base = [summary["outcome"]["seeds"].index(s["seeds"][i]) for i in common]
            if common:
                d = paired_difference(s["final"][common], summary["outcome"]["final"][base])
                delta = f"{100 * d['mean']:+.1f} [{100 * d['low']:+.1f}, {100 * d['high']:+.1f}]"
        lines.append(
            f"| {NAMES[arm]} | {len(s['seeds'])} | {pct(s['curve'][s['last']])} (step {s['last']}) | {delta} | "
            f"{s['best']} | {pct(s['curve'][s['best']])} | {s['reward_seconds_per_step']:.2f} "
            f"({s['reward_cpu_seconds_per_step']:.2f}) | "
            f"{s['run_minutes']:.1f} |"
        )
    lines += [
        "",
        "The best step is picked on the held-out questions themselves: an optimistic number, shown to see whether an "
        "arm rose and fell.",
        "",
        f"Missing runs: {', '.join(missing) if missing else 'none'}.",
    ]
    prms = out / "prms.json"
    if prms.is_file():
        lines += [
            "",
            "## The reward models on held-out labelled rows (the demo's table)",
            "",
            "```text",
            json.loads(prms.read_text())["table"],
            "```",
        ]
    report = "\n".join(lines) + "\n"
    (out / "report.md").write_text(report)
    curves = {
        arm: {"step": list(s["curve"]), **{k: [c[k] for c in s["curve"].values()] for k in ("mean", "low", "high")}}
        for arm, s in summary.items()
    }
    if curves:
        plot_steps(
            str(out / "accuracy_by_step.png"),
            curves,
            ylabel="held-out accuracy (greedy)",
            title="GRPO arms from one SFT policy",
        )
    return report
