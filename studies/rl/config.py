"""What `python -m studies.rl` can be told: one dataclass, kept apart from the recipe so `biprm --help` loads no
torch."""

from __future__ import annotations

from dataclasses import dataclass

from biprm.config import arg

ARMS = ("outcome", "min", "process-l2r", "process-bi")


@dataclass
class RLStudyConfig:
    """Every number of the small RL study (studies/rl/README.md): one SFT policy, two PRMs, four GRPO arms."""

    out: str = arg(
        "studies/rl/results", "results folder: one JSON per (arm, seed) run, prms.json, report.md and the plot"
    )
    work_dir: str = arg(
        "out/rl-study", "model folders (SFT policy, PRMs) and GRPO scratch; kept out of results, never committed"
    )
    arms: str = arg(
        ",".join(ARMS),
        "GRPO arms, comma-separated: outcome (answer correct), min (BiPRMReward, bi PRM), "
        "process-l2r (ProcessGRPOTrainer, l2r PRM), process-bi (ProcessGRPOTrainer, bi PRM, fused)",
        commas=True,
    )
    seeds: list[int] = arg(
        help="GRPO seeds: every arm runs each, with the same prompts and sampling seed",
        factory=lambda: [0, 1, 2],
        min=0,
    )
    events: list[int] = arg(
        help="least and most events per problem in the PRMs' training and held-out data (as `biprm demo`)",
        factory=lambda: [2, 3],
        min=1,
    )
    policy_events: list[int] = arg(
        help="least and most events per problem the policy is fine-tuned, rewarded and evaluated on: "
        "fewer than the PRMs', so that a tiny policy gets a fair share right",
        factory=lambda: [1, 2],
        min=1,
    )
    seed: int = arg(1106, "seed of the task data, the SFT policy and the PRMs (the GRPO seeds are --seeds)", min=0)
    # the policy
    policy_hidden: int = arg(128, "hidden size of the tiny Llama policy (the tiny backbone's tokenizer)", min=1)
    policy_layers: int = arg(4, "layers of the policy", min=1)
    sft_examples: int = arg(4000, "correct synthetic solutions the policy is fine-tuned on", min=1)
    sft_steps: int = arg(300, "SFT steps of the base model that the PRMs and the policy start from", min=0)
    policy_sft_steps: int = arg(
        250, "further SFT steps of the policy alone: few enough that it still makes errors", min=0
    )
    sft_lr: float = arg(2e-3, "SFT learning rate", above=0)
    sft_batch_size: int = arg(16, "SFT sequences per step", min=1)
    # the reward models
    prm_train: int = arg(2000, "labelled synthetic solutions each PRM is trained on (the demo's task mix)", min=1)
    prm_epochs: float = arg(1.0, "PRM passes over its data", above=0)
    prm_lr: float = arg(3e-3, "PRM learning rate (the demo's)", above=0)
    prm_test: int = arg(300, "held-out labelled solutions for the PRMs' step-level quality", min=1)
    prm_bon_questions: int = arg(40, "held-out Best-of-N questions for the PRMs' quality table", min=1)
    # GRPO
    steps: int = arg(24, "GRPO steps per run", min=1)
    prompts_per_step: int = arg(4, "questions per GRPO step", min=1)
    group_size: int = arg(4, "completions sampled per question (GRPO's num_generations)", min=2)
    max_completion_length: int = arg(
        80, "most tokens a completion may have (reference solutions of 1-2 events have at most about 75)", min=1
    )
    lr: float = arg(3e-4, "GRPO learning rate", above=0)
    temperature: float = arg(1.0, "sampling temperature of the GRPO rollouts", above=0)
    eval_every: int = arg(8, "held-out greedy accuracy every this many GRPO steps (and at step 0)", min=1)
    eval_questions: int = arg(150, "held-out questions, the same for every arm and seed", min=1)
    report_only: bool = arg(
        False, "rewrite report.md and the plot from the run JSONs already in --out, training nothing"
    )
