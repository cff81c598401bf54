"""Settings of `biprm replicate`: one dataclass, parsed by `HfArgumentParser` like every command, and the presets.

A preset fixes the sizes of the study (seeds, data caps, evaluation rows); every field left unset (None) takes the
preset's value, and a value given as a flag or in `--config FILE` wins over it. The method itself (optimizer,
budget, lengths) is the same in every preset. Nothing here imports torch, so `biprm --help` stays quick.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from biprm.config import arg, default_data_root


@dataclass
class DataRecipe:
    """What `replication.data.build` mixes; caps pick evenly spaced items before the step-count and evaluation filters."""

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
PRESETS = {  # what each preset sets; the mechanism preset is its own study (replication.mechanism_study)
    # one seed per mode, small sets; a smoke test of the whole recipe
    "quick": dict(seeds={"l2r": 1, "r2l": 1, "bi-static": 1, "bi": 1}, data=DataRecipe(prmbench_rows=100, gsm8k_questions=80),
                  processbench_rows=30, prmbench_rows=60, bon_questions=12, save_every=20, top_layers=2),
    # the paper's comparison with 3 seeds for l2r and bi
    "full": dict(seeds=PAPER_SEEDS, data=DataRecipe(prmbench_rows=1200, gsm8k_questions=600),
                 processbench_rows=200, prmbench_rows=400, bon_questions=80, save_every=25, top_layers=2),
}
NOT_STUDIED = ("out", "work_dir", "data_root", "report_only")  # where the study reads and writes, and what to do: not what it studies


@dataclass
class ReplicateConfig:
    """Every number of the study; fields left None take the preset's value."""

    preset: Literal["quick", "full", "mechanism", "mechanism-v2", "mechanism-v3"] = arg(
        "quick", "quick: 1 seed per mode, a smoke test of the recipe (docs/REPLICATION.md gives its wall clock); "
        "full: 3 seeds for l2r and bi, hours on a CPU; mechanism: the controlled future-only-error test (docs/MECHANISM.md), "
        "which takes only the folders, --bf16 and --top-layers from these settings; mechanism-v2: its second version, "
        "pre-registered in docs/MECHANISM.md, which takes the same; mechanism-v3: its third version, whose whole design is "
        "--mechanism (configs/replicate-mechanism-v3.yaml)")
    out: str = arg("", "results folder (default results/replication/<preset>; results/mechanism for mechanism)")
    work_dir: str = arg("", "trunk caches and run checkpoints (default <biprm cache>/replicate)")
    data_root: str = arg(help="folder holding processbench/, prmbench/, gsm8k/ ... (default $BIPRM_DATA or ../shared/data)",
                         factory=default_data_root)
    report_only: bool = arg(False, "write report.md, results.json and the figures from the runs finished so far; train nothing")
    bf16: Literal["auto", "yes", "no"] = arg("auto", "bf16 autocast; auto: where the CPU has native bf16 or a GPU is present")
    top_layers: int | None = arg(None, "layers trained on top of the frozen, cached trunk (preset's if unset)",
                                 aliases=["--train-top-layers", "--train_top_layers"])
    backbone: str = arg("smollm2-135m", "the backbone: a built-in name, a Hugging Face name or a folder")
    seeds: dict[str, int] | None = arg(None, "runs -> seeds per run, a run being a mode or a gate-study variant (preset's if unset)")
    data: DataRecipe | None = arg(None, "the training-data mix (preset's if unset)")
    lr: float = arg(1e-4, "peak learning rate (AdamW, linear decay)")
    epochs: float = arg(1.0, "passes over the training data")
    batch_size: int = arg(16, "trajectories per optimizer step")
    warmup_ratio: float = arg(0.05, "share of steps spent warming up the learning rate")
    gate_lr_scale: float = arg(1.0, "the gate learns at lr x this")
    detach_gate_inputs: bool = arg(False, "train the gate on detached hidden states")
    aux_loss_weight: float = arg(0.0, "weight of the per-stream losses added to the fused one")
    max_length: int = arg(1024, "tokens per stream")
    processbench_subsets: tuple[str, ...] = arg(("gsm8k", "math"), "ProcessBench subsets evaluated")
    processbench_rows: int | None = arg(None, "ProcessBench rows per subset, evenly spaced within clean and erroneous rows (preset's if unset)")
    prmbench_rows: int | None = arg(None, "PRMBench test processes, evenly spaced over the classes (preset's if unset)")
    bon_questions: int | None = arg(None, "gsm8k_bon_small questions, 12 candidates each (preset's if unset)")
    long_chain_tokens: int = arg(512, "long-chain subset: sequences longer than this")
    save_every: int | None = arg(None, "optimizer steps between checkpoints (preset's if unset)")
    mechanism: dict[str, Any] | None = arg(None, "mechanism presets: MechanismConfig fields over the preset's (mechanism-v3 reads its "
                                       "whole design here: configs/replicate-mechanism-v3.yaml)")

    def __post_init__(self) -> None:
        if self.preset.startswith("mechanism"):
            return  # its own study: the mechanism settings fill what is unset
        for f in fields(self):
            if getattr(self, f.name) is None and f.name in PRESETS.get(self.preset, {}):
                setattr(self, f.name, copy.deepcopy(PRESETS[self.preset][f.name]))
        from biprm.backbones import cache_root  # here, not at import: the CLI lists these settings without torch

        self.out = self.out or f"results/replication/{self.preset}"
        self.work_dir = self.work_dir or str(cache_root() / "replicate")


@dataclass
class MechanismConfig:
    """The settings of `biprm replicate --preset mechanism` (docs/MECHANISM.md): a study of its own."""

    out: str = "results/mechanism"
    work_dir: str = ""  # trunk caches, checkpoints and final states (never committed); default <biprm cache>/mechanism
    data_root: str = field(default_factory=default_data_root)
    backbone: str = "smollm2-135m"
    top_layers: int = 8  # the go/no-go pilot with 4 found no separation on validation (docs/MECHANISM.md)
    train_questions: int = 600  # GSM8K-train questions tried (those with no eligible step are dropped)
    valid_questions: int = 100
    test_questions: int = 300  # GSM8K-test questions tried
    data_seed: int = 1106
    seeds: dict[str, int] = field(default_factory=lambda: {"l2r": 3, "r2l": 1, "bi-static": 1, "bi": 3})
    probe_seeds: int = 3  # heads-only runs per mode on the frozen full-depth features
    lr: float = 1e-4
    epochs: float = 3.0
    batch_size: int = 16
    warmup_ratio: float = 0.05
    gate_lr_scale: float = 1.0
    save_every: int = 25
    max_length: int = 1024
    processbench_rows: int | None = None  # ProcessBench GSM8K rows; None = all 400
    bon_questions: int = 100  # gsm8k_bon_small questions, evenly spaced
    bf16: str = "auto"
    version: int = 1
    labels: str = "first-error"  # "own" (version 2): each step labelled by whether it is itself correct
    keep_roundness: bool = False  # version 2: the wrong value keeps the right one's roundness class
    # version 2: trained at (lr, epochs) unless the pilot finds no learning there; then at these (docs/MECHANISM.md)
    fallback_lr: float = 1e-4
    fallback_epochs: float = 3.0
    pilot: bool = True  # version 2's pilot before the runs (version 3 has none)
    first_seed: int = 1106  # seeds first_seed, first_seed + 1, ... per arm
    # version 3 (docs/MECHANISM.md): the verdict's arm, interval level, each prediction's margin (held: the interval's low
    # end above it; contradicted: its high end below it), the true values its power is given at, and the one device kind
    # every run trains on ("" = any)
    verdict_arm: str = ""
    level: float = 0.975
    margins: dict[str, float] | None = None
    power_at: dict[str, list[float]] | None = None
    device: str = ""

    def __post_init__(self) -> None:
        from biprm.backbones import cache_root  # here, not at import: the CLI lists settings without torch

        self.work_dir = self.work_dir or str(cache_root() / ("mechanism" if self.version == 1 else f"mechanism-v{self.version}"))


# Version 2 (docs/MECHANISM.md, pre-registered): labels each stream can fit, no roundness cue, the paper's lr and
# epochs (pilot permitting), 3 seeds of every arm, the gate arm `bi-gate-lr0.1` (VARIANTS), no probes.
MECHANISM_V2 = dict(
    version=2, out="results/mechanism-v2", labels="own", keep_roundness=True, lr=3e-5, epochs=1.0, probe_seeds=0, test_questions=400,
    seeds={"l2r": 3, "r2l": 3, "bi-static": 3, "bi": 3, "bi-gate-lr0.1": 3},
)

# Version 3 (docs/MECHANISM.md, pre-registered): every number of its design is in configs/replicate-mechanism-v3.yaml,
# none here; the preset only names the version, and refuses to run without the design (V3_DESIGN).
MECHANISM_PRESETS = {"mechanism": {}, "mechanism-v2": MECHANISM_V2, "mechanism-v3": dict(version=3, out="results/mechanism-v3")}
V3_DESIGN = ("labels", "keep_roundness", "data_seed", "train_questions", "valid_questions", "test_questions", "backbone", "lr",
             "epochs", "batch_size", "warmup_ratio", "max_length", "pilot", "probe_seeds", "first_seed", "seeds", "verdict_arm", "level", "margins", "power_at", "device")


def mechanism_config(cfg: ReplicateConfig) -> MechanismConfig:
    """The mechanism study's settings from `biprm replicate`'s: the preset's, then --mechanism's, then the folders, --bf16
    and --top-layers where given. mechanism-v3 needs every field of its design in --mechanism (V3_DESIGN)."""
    given = dict(out=cfg.out, work_dir=cfg.work_dir, data_root=cfg.data_root, bf16=cfg.bf16, top_layers=cfg.top_layers)
    design = dict(cfg.mechanism or {})
    unknown = sorted(set(design) - {f.name for f in fields(MechanismConfig)})
    if unknown:
        raise ValueError(f"--mechanism: unknown setting {', '.join(unknown)}; known: {', '.join(f.name for f in fields(MechanismConfig))}")
    missing = [k for k in V3_DESIGN if k not in design] if cfg.preset == "mechanism-v3" else []
    if missing:
        raise ValueError(f"--preset mechanism-v3 reads its whole design from --mechanism, which lacks {', '.join(missing)}: "
                         "run biprm replicate --config configs/replicate-mechanism-v3.yaml")
    return MechanismConfig(**MECHANISM_PRESETS[cfg.preset] | design | {k: v for k, v in given.items() if v})
