"""Settings of the mechanism study (`python -m studies.mechanism --config studies/mechanism/v2.yaml`).

The defaults are version 1's design; versions 2 and 3 are the shipped files v2.yaml and v3_amended.yaml, which hold
every number of their designs (pre-registered in studies/mechanism/README.md and PREREGISTRATION_v3_amended.md).
Nothing here imports torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from biprm.config import arg, default_data_root

V3_DESIGN = ("verdict_arm", "margins", "power_at")  # what version 3 cannot run without (all in v3_amended.yaml)


@dataclass
class MechanismConfig:
    """The controlled future-only-error test of the R2L stream and the gate: every number of one version's design."""

    out: str = arg(
        "studies/mechanism/results/v1", "results folder: report.md, results.json, figures and per-run logits"
    )
    work_dir: str = arg(
        "", "trunk caches, checkpoints and final states, never committed (default <biprm cache>/mechanism[-vN])"
    )
    data_root: str = arg(
        help="folder holding gsm8k/, processbench/ and gsm8k_bon_small/ (default $BIPRM_DATA or ../shared/data)",
        factory=default_data_root,
    )
    report_only: bool = arg(False, "write the report from the runs finished so far; train nothing")
    version: int = arg(1, "the design: 1, 2 or 3 (the shipped v1.yaml, v2.yaml, v3.yaml)", min=1, max=3)
    backbone: str = arg("smollm2-135m", "the backbone: a built-in name, a Hugging Face name or a folder")
    top_layers: int = arg(
        8,
        "layers trained on the frozen, cached trunk (a pilot with 4 found no separation on validation)",
        aliases=["--train-top-layers", "--train_top_layers"],
        min=1,
    )
    train_questions: int = arg(600, "GSM8K-train questions tried (those with no eligible step are dropped)", min=1)
    valid_questions: int = arg(100, "validation questions tried", min=1)
    test_questions: int = arg(300, "GSM8K-test questions tried", min=1)
    data_seed: int = arg(1106, "seed of the rows' construction", min=0)
    seeds: dict[str, int] = arg(
        help="arm -> seeds per arm (an arm is a mode or a gate variant)",
        factory=lambda: {"l2r": 3, "r2l": 1, "bi-static": 1, "bi": 3},
    )
    probe_seeds: int = arg(3, "heads-only runs per mode on the frozen full-depth features", min=0)
    lr: float = arg(1e-4, "peak learning rate (AdamW, linear decay)", above=0)
    epochs: float = arg(3.0, "passes over the training rows", above=0)
    batch_size: int = arg(16, "trajectories per optimizer step", min=1)
    warmup_ratio: float = arg(0.05, "share of steps spent warming up the learning rate", min=0, max=1)
    gate_lr_scale: float = arg(1.0, "the gate learns at lr x this", min=0)
    save_every: int = arg(25, "optimizer steps between checkpoints", min=1)
    max_length: int = arg(1024, "tokens per stream", min=1)
    processbench_rows: int | None = arg(None, "ProcessBench GSM8K rows (default: all 400)", min=1)
    bon_questions: int = arg(100, "gsm8k_bon_small questions, evenly spaced", min=1)
    bf16: Literal["auto", "yes", "no"] = arg(
        "auto", "bf16 autocast; auto: where the CPU has native bf16 or a GPU is present"
    )
    labels: Literal["first-error", "own"] = arg(
        "first-error",
        "step labels: first-error (version 1), or own (each step by whether it is itself correct, version 2 on)",
    )
    keep_roundness: bool = arg(False, "the wrong value keeps the right one's roundness class (version 2 on)")
    fallback_lr: float = arg(1e-4, "version 2: the lr trained at if the pilot finds no learning at --lr", above=0)
    fallback_epochs: float = arg(
        3.0, "version 2: the epochs trained for if the pilot finds no learning at --epochs", above=0
    )
    pilot: bool = arg(True, "version 2's pilot before the runs (version 3 has none)")
    first_seed: int = arg(1106, "seeds first_seed, first_seed + 1, ... per arm", min=0)
    verdict_arm: str = arg("", "version 3: the arm whose predictions decide the verdict")
    level: float = arg(0.975, "version 3: the intervals' level", above=0, below=1)
    margins: dict[str, float] | None = arg(
        None,
        "version 3: each prediction's margin (held: the interval's low end above it; "
        "contradicted: its high end below it)",
    )
    power_at: dict[str, list[float]] | None = arg(
        None, "version 3: the true values each prediction's power is given at"
    )
    device: str = arg("", "version 3: the one device kind every run trains on ('' = any)")
    workers: int = arg(
        1, "runs trained side by side on the one device, each worker reading the same trunk cache (same logits)", min=1
    )

    def __post_init__(self) -> None:
        from biprm.backbones import cache_root  # here, not at import: --help lists the settings without torch

        if self.version == 3 and (missing := [k for k in V3_DESIGN if not getattr(self, k)]):
            raise ValueError(
                f"version 3 reads its whole design from its file, and {', '.join(missing)} is missing: "
                "run python -m studies.mechanism --config studies/mechanism/v3_amended.yaml"
            )
        self.work_dir = self.work_dir or str(
            cache_root() / ("mechanism" if self.version == 1 else f"mechanism-v{self.version}")
        )


def design(version: int) -> dict[str, Any]:
    """The settings a version's shipped file holds (v1.yaml, v2.yaml, v3.yaml), for code that builds the study's config
    itself (tests, the search study's PRMs)."""
    import yaml

    return yaml.safe_load((Path(__file__).parent / f"v{version}.yaml").read_text())
