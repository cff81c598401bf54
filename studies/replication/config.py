"""Settings of the replication study (`python -m studies.replication`): one dataclass, parsed like every biprm command.

A preset fixes the sizes of the study (seeds, data caps, evaluation rows); every field left unset (None) takes the
preset's value, and a value given as a flag or in `--config FILE` wins over it. The method itself (optimizer,
budget, lengths) is the same in every preset. Nothing here imports torch, so `--help` stays quick.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, fields
from typing import Literal

from biprm.config import arg, default_data_root


@dataclass
class DataRecipe:
    """What `replication.data.build` mixes; caps pick evenly spaced items before the step-count and evaluation
    filters."""

    prmbench_rows: int | None = None  # PRMBench-train trajectories kept after de-duplication; None = all
    gsm8k_questions: int | None = None  # GSM8K-train questions used; None = all 7,473
    corruptions_per_question: int = 1  # corrupted copies per GSM8K reference
    valid_fraction: float = 0.05  # share of questions held out
    min_steps: int = 2  # the paper drops single-step rows
    seed: int = 1106


# Runs besides the four modes: the gate study, read on the validation split only.
# Each is `bi` with some of the config fields below changed.
VARIANTS = {
    "bi-detached": ("bi", {"detach_gate_inputs": True}),
    "bi-gate-lr0.1": ("bi", {"gate_lr_scale": 0.1}),
    "bi-aux0.5": ("bi", {"aux_loss_weight": 0.5}),
}
PAPER_SEEDS = {"l2r": 3, "bi": 3, "r2l": 1, "bi-static": 1} | {name: 1 for name in VARIANTS}
PRESETS = {  # what each preset sets
    # one seed per mode, small sets; a smoke test of the whole recipe
    "quick": dict(
        seeds={"l2r": 1, "r2l": 1, "bi-static": 1, "bi": 1},
        data=DataRecipe(prmbench_rows=100, gsm8k_questions=80),
        processbench_rows=30,
        prmbench_rows=60,
        bon_questions=12,
        save_every=20,
        top_layers=2,
    ),
    # the paper's comparison with 3 seeds for l2r and bi
    "full": dict(
        seeds=PAPER_SEEDS,
        data=DataRecipe(prmbench_rows=1200, gsm8k_questions=600),
        processbench_rows=200,
        prmbench_rows=400,
        bon_questions=80,
        save_every=25,
        top_layers=2,
    ),
}
NOT_STUDIED = (
    "out",
    "work_dir",
    "data_root",
    "report_only",
    "workers",
)  # where the study reads and writes, what to do and how many runs train at once: not what it studies


@dataclass
class ReplicateConfig:
    """Every number of the study; fields left None take the preset's value."""

    preset: Literal["quick", "full"] = arg(
        "quick",
        "quick: 1 seed per mode, a smoke test of the recipe (studies/replication/README.md gives its wall clock); "
        "full: 3 seeds for l2r and bi, hours on a CPU",
    )
    out: str = arg("", "results folder (default studies/replication/results/<preset>)")
    work_dir: str = arg("", "trunk caches and run checkpoints (default <biprm cache>/replicate)")
    data_root: str = arg(
        help="folder holding processbench/, prmbench/, gsm8k/ ... (default $BIPRM_DATA or ../shared/data)",
        factory=default_data_root,
    )
    report_only: bool = arg(
        False, "write report.md, results.json and the figures from the runs finished so far; train nothing"
    )
    bf16: Literal["auto", "yes", "no"] = arg(
        "auto", "bf16 autocast; auto: where the CPU has native bf16 or a GPU is present"
    )
    top_layers: int | None = arg(
        None,
        "layers trained on top of the frozen, cached trunk (preset's if unset)",
        aliases=["--train-top-layers", "--train_top_layers"],
        min=1,
    )
    backbone: str = arg("smollm2-135m", "the backbone: a built-in name, a Hugging Face name or a folder")
    seeds: dict[str, int] | None = arg(
        None, "runs -> seeds per run, a run being a mode or a gate-study variant (preset's if unset)"
    )
    data: DataRecipe | None = arg(None, "the training-data mix (preset's if unset)")
    lr: float = arg(1e-4, "peak learning rate (AdamW, linear decay)", above=0)
    epochs: float = arg(1.0, "passes over the training data", above=0)
    batch_size: int = arg(16, "trajectories per optimizer step", min=1)
    warmup_ratio: float = arg(0.05, "share of steps spent warming up the learning rate", min=0, max=1)
    gate_lr_scale: float = arg(1.0, "the gate learns at lr x this", min=0)
    detach_gate_inputs: bool = arg(False, "train the gate on detached hidden states")
    aux_loss_weight: float = arg(0.0, "weight of the per-stream losses added to the fused one", min=0)
    max_length: int = arg(1024, "tokens per stream", min=1)
    processbench_subsets: tuple[str, ...] = arg(("gsm8k", "math"), "ProcessBench subsets evaluated")
    processbench_rows: int | None = arg(
        None, "ProcessBench rows per subset, evenly spaced within clean and erroneous rows (preset's if unset)", min=1
    )
    prmbench_rows: int | None = arg(
        None, "PRMBench test processes, evenly spaced over the classes (preset's if unset)", min=1
    )
    bon_questions: int | None = arg(None, "gsm8k_bon_small questions, 12 candidates each (preset's if unset)", min=1)
    long_chain_tokens: int = arg(512, "long-chain subset: sequences longer than this", min=1)
    save_every: int | None = arg(None, "optimizer steps between checkpoints (preset's if unset)", min=1)

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) is None and f.name in PRESETS.get(self.preset, {}):
                setattr(self, f.name, copy.deepcopy(PRESETS[self.preset][f.name]))
        from biprm.backbones import cache_root  # here, not at import: the CLI lists these settings without torch

        self.out = self.out or f"studies/replication/results/{self.preset}"
        self.work_dir = self.work_dir or str(cache_root() / "replicate")
