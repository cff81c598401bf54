"""What each `biprm` command can be told, as plain dataclasses kept apart from the heavy modules.

The CLI turns every field into a flag with `HfArgumentParser` (help, default and choices
come from the field), and `--config run.yaml` fills the same fields. Nothing here imports
torch or transformers, so `biprm --help` answers at once.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, NamedTuple, get_args, get_origin, get_type_hints


class ModeSpec(NamedTuple):
    streams: tuple[str, ...]  # the streams the backbone runs, in the order a batch holds them
    fusion: Literal["gate", "static"] | None  # two streams -> one: a learned sigma, sigma = 0.5, or none (one stream)


# Every training mode, and the one place that says what it runs: the per-mode stream maps derive from it.
MODE_TABLE = {
    "l2r": ModeSpec(("l2r",), None),
    "r2l": ModeSpec(("r2l",), None),
    "bi-static": ModeSpec(("l2r", "r2l"), "static"),
    "bi": ModeSpec(("l2r", "r2l"), "gate"),
}
Mode = Literal[tuple(MODE_TABLE)]
MODES: tuple[str, ...] = get_args(Mode)
# How a PRM trained elsewhere is read without training (as shipped, its steps reversed, or the average of the two):
# every mode but a gated one, whose gate would be untrained (`biprm train --init-from` trains it).
ZeroShotMode = Literal[tuple(m for m, spec in MODE_TABLE.items() if spec.fusion != "gate")]
ZERO_SHOT_MODES: tuple[str, ...] = get_args(ZeroShotMode)
Objective = Literal["bce", "mse", "qrank"]
OBJECTIVES: tuple[str, ...] = get_args(Objective)
FORMATS = (
    "trl",
    "steps",
    "math-shepherd",
    "processbench",
    "prmbench",
    "bon",
    "trace",
)  # the layouts biprm.data.readers converts
Format = Literal[("auto", *FORMATS)]
# the projections of Llama/Mistral/Qwen2-style decoder layers (adapters go only under `backbone.`)
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
PROCESSBENCH_SUBSETS = ("gsm8k", "math", "olympiadbench", "omnimath")
CHECKPOINT_ROLES = ("l2r", "r2l", "bi-static", "bi", "l2r-2", "r2l-2")  # what `eval ablations` takes
TOKENS_PER_ROW = 512  # longer tree rows pay more in masked attention than the shared prompt saves (benchmarks/)
# a batch with a unit (tree or stream) past this many tokens gets one plain causal
# row per stream and no mask: memory linear in length, the causal kernel; below it
# the tree's shared prompt is faster (docs/LONG_TRACES.md has the measurement)
DENSE_MAX = 1024
MAX_LENGTH = (
    4096  # tokens per stream when scoring (score, eval, serve) unless set; trailing steps past it are not scored
)
# attention kernels that take biprm's per-stream mask; flash-attention 2 takes none (docs/PERFORMANCE.md)
ATTENTION = ("sdpa", "eager")
Attention = Literal[ATTENTION]
Overlength = Literal["head", "refuse", "tail", "window"]  # biprm.data.encoding.OVERLENGTH


SEGMENTERS = (
    "given",
    "paragraph",
    "lines",
    "markers",
    "tokens:N",
)  # how a trace is cut into steps (biprm.data.segment)
SPLIT_NAMES = (
    "auto",
    "newline",
    "double-newline",
    "ки",
)  # the readers' and the server's split rules, kept as they were


def default_data_root() -> str:
    """$BIPRM_DATA, else ../shared/data beside a source checkout (the folder the tests and docs use)."""
    return os.environ.get("BIPRM_DATA") or str(Path(__file__).resolve().parents[2] / "shared" / "data")


def check_choices(settings: Any) -> None:
    """Refuse a value outside its field's Literal choices: the parser checks flags, this checks Python callers."""
    for name, kind in get_type_hints(type(settings)).items():
        if get_origin(kind) is Literal and (value := getattr(settings, name)) not in get_args(kind):
            raise ValueError(
                f"--{name.replace('_', '-')} {value!r}: choose one of {', '.join(map(str, get_args(kind)))}"
            )


EXTRAS = {  # pyproject extra: the modules it installs
    "tensorboard": ("tensorboard",),
    "wandb": ("wandb",),
    "deepspeed": ("deepspeed",),
    "peft": ("peft",),
    "serve": ("fastapi", "uvicorn"),
    "vllm": ("vllm",),
    "trl": ("trl",),
}


def check_extras(needed: dict[str, str]) -> None:
    """Refuse at once, naming its install command, a flag whose optional extra is missing (extra -> the flag that needs
    it): otherwise it fails minutes later, after the backbone and data have loaded, in a long traceback."""
    for extra, flag in needed.items():
        missing = [m for m in EXTRAS[extra] if importlib.util.find_spec(m) is None]
        if missing:
            raise ValueError(f'{flag} needs {", ".join(missing)}, which is not installed: pip install -e ".[{extra}]"')


def arg(
    default: Any = MISSING, help: str = "", factory: Any = MISSING, aliases: tuple[str, ...] = (), **flag: Any
) -> Any:
    """A dataclass field with the help text its flag shows, other flags that also set it (`aliases`), the range a number
    must lie in (`min`, `max` inclusive; `above`, `below` exclusive: see `check_ranges`), `commas=True` for a str that
    holds a comma-separated list, `group` for its section of --help, and other argparse settings in `flag` (action,
    choices, metavar)."""
    return field(
        default=default,
        default_factory=factory,
        metadata={"help": help, **flag} | ({"aliases": list(aliases)} if aliases else {}),
    )


BOUNDS = {
    "min": ("at least", lambda v, b: v >= b),
    "max": ("at most", lambda v, b: v <= b),
    "above": ("above", lambda v, b: v > b),
    "below": ("below", lambda v, b: v < b),
}  # arg()'s range keys


def range_text(metadata: Any) -> str:
    """A field's declared range in words ("at least 0 and below 1"), or "" if it has none."""
    return " and ".join(f"{BOUNDS[k][0]} {metadata[k]}" for k in BOUNDS if k in metadata)


def check_ranges(settings: type, values: dict[str, Any]) -> None:
    """Refuse a number outside its field's declared range, naming the flag, before anything loads: a 0 or a negative
    otherwise surfaces minutes later, after the model loads, as an arithmetic error far from the flag that caused it.
    `values` are the settings' field values (a list is checked item by item; None is "unset" and passes)."""
    for f in fields(settings):
        value = values.get(f.name)
        for v in value if isinstance(value, list) else [] if value is None else [value]:
            if not all(BOUNDS[k][1](v, f.metadata[k]) for k in BOUNDS if k in f.metadata):
                aliases = f" ({', '.join(f.metadata['aliases'])})" if f.metadata.get("aliases") else ""
                raise ValueError(f"--{f.name.replace('_', '-')}{aliases} {v}: must be {range_text(f.metadata)}")


@dataclass
class TrainConfig:
    """Defaults are the paper's (Appendix A): AdamW, linear schedule, lr 3e-5, 1 epoch, seed 1106."""

    backbone: str = arg(
        "tiny", "a Hugging Face causal LM (name or folder), or a built-in: tiny, smollm2-135m", group="model"
    )
    init_from: str | None = arg(
        None,
        "a PRM folder of any kind biprm reads (docs/PRMS.md) to start from instead of --backbone: "
        "its body, and its read-out as the value head both streams share",
        group="model",
    )
    prm_kind: str | None = arg(
        None, "with --init-from: the PRM's kind (default: detected from its config.json)", group="model"
    )
    gate_init: float = arg(
        8.0,
        "with --init-from: the gate starts at sigma = sigmoid(this) on every step, so the fused score "
        "starts as the source PRM's (8: within 1e-3 in probability)",
        group="model",
    )
    data: str = arg(
        "synthetic:2000", "a JSONL/JSON/Parquet file (.gz too), a Hub dataset name, or synthetic:N", group="data"
    )
    format: Format = arg("auto", "the data layout; auto detects it from the first row", group="data")
    output_dir: str = arg("runs/biprm", "where checkpoints, logs and the final model go", group="output")
    mode: Mode = arg(
        "bi", "l2r/r2l: one stream; bi: both, fused by the learned gate; bi-static: both, averaged", group="model"
    )
    objective: Objective = arg(
        "bce", "step loss: bce (the paper), mse, or qrank (ranking with margin zeta)", group="model"
    )
    zeta: float = arg(4.0, "qrank margin", min=0, group="model")
    learning_rate: float = arg(
        3e-5, "peak learning rate (AdamW, linear decay)", aliases=("--lr",), above=0, group="optimisation"
    )
    num_train_epochs: float = arg(1.0, "passes over the data", aliases=("--epochs",), above=0, group="optimisation")
    max_steps: int = arg(-1, "optimizer steps; > 0 overrides --num-train-epochs", min=-1, group="optimisation")
    per_device_train_batch_size: int = arg(
        2,
        "trajectories per device per micro-batch",
        aliases=("--batch-size", "--batch_size"),
        min=1,
        group="optimisation",
    )
    gradient_accumulation_steps: int = arg(
        4, "micro-batches per optimizer step", aliases=("--grad-accum", "--grad_accum"), min=1, group="optimisation"
    )
    warmup_ratio: float = arg(
        0.0, "share of steps spent warming up the learning rate", min=0, max=1, group="optimisation"
    )
    weight_decay: float = arg(0.0, "AdamW weight decay", min=0, group="optimisation")
    seed: int = arg(1106, "seed of the data order and the new weights", min=0, group="optimisation")
    max_length: int = arg(
        2048, "tokens per stream; trailing steps past it are not trained on (and are reported)", min=1, group="data"
    )
    max_tokens_per_row: int | None = arg(
        None, "pack several trajectories' streams into rows of this many tokens", min=1, group="compute"
    )
    share_prefix: bool = arg(True, "encode the shared question once for both streams (tree attention)", group="compute")
    bf16: bool = arg(False, "bf16 autocast with fp32 master weights (GPU, or CPU autocast)", group="compute")
    save_steps: int | None = arg(
        None,
        "optimizer steps between checkpoints (default: a tenth of the run's steps, at most 500, "
        "so that an interrupted run can --resume)",
        min=1,
        group="output",
    )
    save_total_limit: int | None = arg(2, "checkpoints kept; older ones are deleted", min=1, group="output")
    logging_steps: int = arg(10, "optimizer steps between log lines", min=1, group="output")
    eval_fraction: float = arg(
        0.0,
        "rows held out for a validation loss at every save (the paper holds out 5 %%)",
        min=0,
        below=1,
        group="output",
    )
    resume: bool = arg(
        False, "continue this run from its newest complete checkpoint (the folder's record must match)", group="output"
    )
    overwrite: bool = arg(False, "replace the run this folder holds", group="output")
    detach_gate_inputs: bool = arg(
        False, "train the gate on detached hidden states (a side effect of the reference code)", group="model"
    )
    aux_loss_weight: float = arg(0.0, "weight of the per-stream losses added to the fused one", min=0, group="model")
    gate_lr_scale: float = arg(
        1.0, "the gate learns at lr x this; < 1 keeps it from saturating at a high lr", min=0, group="optimisation"
    )
    train_top_layers: int | None = arg(
        None, "freeze the embeddings and all but the top K layers (Llama/Mistral/Qwen2 bodies)", min=1, group="model"
    )
    trunk_cache: bool = arg(
        True,
        "with --train-top-layers: compute the frozen layers once into an on-disk cache and train on it "
        "(--no-trunk-cache recomputes them at every step)",
        group="compute",
    )
    trunk_cache_dir: str = arg("", "where the trunk cache lives (default: <biprm cache>/trunk)", group="compute")
    heads_only: bool = arg(
        False,
        "with --train-top-layers: freeze the top layers too and train only the value head and gate (a probe)",
        group="model",
    )
    lora_r: int = arg(
        0, "> 0: LoRA adapters of this rank; the value head, gate and step-tag row train in full", min=0, group="model"
    )
    lora_alpha: float = arg(32.0, "LoRA scaling", above=0, group="model")
    lora_dropout: float = arg(0.0, "LoRA dropout", min=0, below=1, group="model")
    lora_targets: str = arg(
        ",".join(LORA_TARGETS),
        "the backbone's linear layers that get adapters, comma-separated",
        commas=True,
        group="model",
    )
    skip_invalid: bool = arg(
        False, "skip bad rows (each reported with file, row and field) instead of stopping", group="data"
    )
    segmenter: str = arg(
        "given",
        "how the training rows' steps were cut (given, paragraph, lines, markers, tokens:N): recorded in "
        "the checkpoint, and the default when a trace given as one string is scored with it",
        group="data",
    )
    num_proc: int | None = arg(
        None, "processes that encode the data (default: up to 8 for 20,000+ rows, else 1)", min=1, group="compute"
    )
    group_by_length: bool = arg(
        True, "batches of similar lengths (less padding), in a seeded random order", group="compute"
    )
    streaming: bool = arg(
        False, "read and encode the data as training consumes it (huge Hub sets); needs --max-steps", group="data"
    )
    report_to: str = arg(
        "none", "none, or trackers separated by commas: tensorboard,wandb", commas=True, group="output"
    )
    gradient_checkpointing: bool = arg(
        False, "recompute activations in the backward pass (less memory, more time)", group="compute"
    )
    attn_implementation: Attention = arg(
        "sdpa", "the backbone's attention kernel (both take the per-stream mask)", group="compute"
    )
    deepspeed: str | None = arg(
        None,
        "a DeepSpeed JSON config, e.g. configs/ds_zero3.json (launch with accelerate or deepspeed)",
        group="compute",
    )
    show_progress: bool = arg(True, "a progress bar", group="output")
    training_args: dict[str, Any] = arg(
        help="any other transformers.TrainingArguments option, by its name; in a --config "
        "file, such a key at the top level lands here (e.g. lr_scheduler_type: cosine)",
        factory=dict,
        group="optimisation",
    )

    def __post_init__(self) -> None:
        """Refuse a misspelt choice at once, before any backbone or data loads."""
        check_choices(self)
        check_segmenter(self.segmenter)
        if self.streaming and (self.max_steps <= 0 or self.eval_fraction):
            raise ValueError("--streaming data has no length: give --max-steps, and hold out no --eval-fraction")
        if self.heads_only and not self.train_top_layers:
            raise ValueError("--heads-only needs --train-top-layers K (the cut whose features the heads read)")
        self.check_combinations()
        trackers = {t.strip() for t in self.report_to.split(",")} - {"", "none"}
        check_extras(
            {t: f"--report-to {t}" for t in sorted(trackers & EXTRAS.keys())}
            | ({"deepspeed": f"--deepspeed {self.deepspeed}"} if self.deepspeed else {})
            | ({"peft": "--lora-r"} if self.lora_r else {})
        )

    def check_combinations(self) -> None:
        """Refuse settings that cannot go together here, before torch and transformers load (seconds, where the
        recipe's own checks came after the backbone loaded)."""
        if self.resume and self.overwrite:
            raise ValueError(f"--resume continues the run in {self.output_dir} and --overwrite deletes it; choose one")
        if self.lora_r and self.train_top_layers:
            raise ValueError("--lora-r and --train-top-layers are two ways to train part of the backbone; choose one")
        if self.train_top_layers and self.trunk_cache and (self.eval_fraction or self.streaming):
            raise ValueError(
                "--train-top-layers trains on the trunk cache, which takes no --eval-fraction or --streaming; add "
                "--no-trunk-cache"
            )


@dataclass(kw_only=True)
class ScorerSettings:
    """How a checkpoint is run when scoring (`Scorer.from_settings`): score, eval and serve take these flags."""

    device: str | None = arg(None, "cuda, cuda:1, cpu (default: cuda if present)", group="compute")
    max_length: int = arg(
        MAX_LENGTH, "tokens per stream; what a longer trajectory gets is --overlength's", min=1, group="data"
    )
    overlength: Overlength = arg(
        "head",
        "past --max-length: head keeps the question and the first steps that fit, tail the "
        "last ones (the steps dropped are counted: n_dropped), refuse stops naming the row "
        "and its length, window scores every step in overlapping windows (docs/LONG_TRACES.md)",
        group="data",
    )
    tokens_per_batch: int | None = arg(
        None,
        "tokens per backbone batch (default: sized to the device, see docs/PERFORMANCE.md)",
        min=1,
        group="compute",
    )
    tokens_per_call: int | None = arg(
        None,
        "with the prompt cache: continuation tokens per backbone call (default: sized to the device)",
        min=1,
        group="compute",
    )
    tokens_per_row: int = arg(
        TOKENS_PER_ROW, "packed row length; 0 gives every question its own row", min=0, group="compute"
    )
    attn_implementation: Attention = arg(
        "sdpa", "the backbone's attention kernel (both take the per-stream mask)", group="compute"
    )
    prm_kind: str | None = arg(
        None,
        "for a PRM trained elsewhere: its kind (qwen-prm, skywork-prm, math-shepherd, rlhflow, "
        "eurus-prm, token-classification; default: detected from its config.json, see docs/PRMS.md)",
        group="model",
    )
    prm_reference: str | None = arg(
        None,
        "for an implicit PRM (eurus-prm): the folder of the reference LM its log-ratio is "
        "taken against (EurusPRM's cards use Qwen2.5-Math-7B-Instruct)",
        group="model",
    )
    prm_mode: ZeroShotMode | None = arg(
        None,
        "for a PRM trained elsewhere: l2r reads it as shipped (the default), r2l reads its steps reversed, "
        "bi-static averages the two (both zero-shot; `eval` always reports all three); a biprm checkpoint keeps the "
        "mode it was trained in",
        group="model",
    )
    segmenter: str | None = arg(
        None,
        "how a trace given as one string (and a candidate's text) is cut into steps: paragraph, "
        "lines, markers, tokens:N, or a split rule (auto, newline, double-newline); default: what "
        "the model was trained with, auto where its steps were given (tags, else paragraphs, else lines)",
        aliases=("--split", "--split-rule"),
        group="data",
    )

    def __post_init__(self) -> None:
        check_choices(self)
        if self.segmenter is not None:
            check_segmenter(self.segmenter)


def check_segmenter(name: str) -> None:
    """Refuse an unknown segmenter name at once, before anything loads (biprm.data.segment reads these names from
    here)."""
    tokens_per_step(name)
    if not name.startswith("tokens:") and name not in (*SEGMENTERS, *SPLIT_NAMES):
        raise ValueError(
            f"unknown segmenter {name!r}; choose from {', '.join(SEGMENTERS[:-1] + SPLIT_NAMES)} or tokens:N (N > 0)"
        )


def tokens_per_step(name: str) -> int | None:
    """N of "tokens:N", None for any other name; a bad N is refused."""
    if not name.startswith("tokens:"):
        return None
    n = name.removeprefix("tokens:")
    if not n.isdigit() or int(n) <= 0:
        raise ValueError(f"segmenter {name!r}: tokens:N needs a whole number N > 0")
    return int(n)


@dataclass
class DemoConfig:
    output_dir: str = arg("out/demo", "where results.json, the data and the gate plot go", group="output")
    modes: str = arg("l2r,r2l,bi-static,bi", "modes to train and compare, comma-separated", commas=True, group="model")
    n_train: int = arg(4800, "synthetic training solutions", min=1, group="data")
    n_test: int = arg(600, "held-out labelled solutions for first-error F1", min=1, group="data")
    bon_questions: int = arg(150, "held-out Best-of-N questions", min=1, group="data")
    bon_candidates: int = arg(16, "candidates per Best-of-N question", min=1, group="data")
    events: list[int] = arg(
        help="least and most events per problem: short problems a tiny model learns within minutes",
        factory=lambda: [2, 3],
        min=1,
        group="data",
    )
    mix: list[float] = arg(
        help="shares of correct, calculation-error and claim-error solutions (calc-heavy, as Best-of-N pools are)",
        factory=lambda: [0.4, 0.4, 0.2],
        min=0,
        max=1,
        group="data",
    )
    epochs: float = arg(2.0, "passes over the training data", above=0, group="optimisation")
    lr: float = arg(3e-3, "100x the paper's, to learn something in minutes ...", above=0, group="optimisation")
    gate_lr_scale: float = arg(
        0.1,
        "... at which a full-lr gate saturates (sigma -> 0 or 1) within the first steps",
        min=0,
        group="optimisation",
    )
    batch_size: int = arg(16, "trajectories per step", min=1, group="optimisation")
    seed: int = arg(1106, "seed of the data and the weights", min=0, group="optimisation")

    def __post_init__(self) -> None:
        """The task's shape, refused before anything trains: shares that do not sum to 1 were read as relative weights,
        so the task trained was not the one the flag said."""
        if len(self.events) != 2 or self.events[0] > self.events[1]:
            raise ValueError(
                f"--events {' '.join(map(str, self.events))}: give two numbers, the least events per problem, then the "
                "most"
            )
        if len(self.mix) != 3 or abs(sum(self.mix) - 1) > 1e-6:
            raise ValueError(
                f"--mix {' '.join(map(str, self.mix))}: give three shares (correct, calculation error, claim error) "
                f"that sum to 1, not {sum(self.mix):g}"
            )


@dataclass
class ScoreConfig(ScorerSettings):
    model: str = arg(
        help="checkpoint folder written by `biprm train`, or a PRM trained elsewhere (docs/PRMS.md)", group="model"
    )
    input: str = arg(help="data file, Hub dataset name or synthetic[:N]", group="data")
    output: str = arg("scores.jsonl", "JSONL file, or - for stdout", group="output")
    format: Format = arg("auto", "the input's layout; auto detects it from the first row", group="data")
    skip_invalid: bool = arg(
        False, "skip bad rows (reported with file, row and field) instead of stopping", group="data"
    )
    chunk: int = arg(1024, "rows scored and written to disk at a time; a kill loses at most one", min=1, group="output")
    resume: bool = arg(False, "continue a killed run from its OUTPUT.parts folder", group="output")
    overwrite: bool = arg(
        False, "replace an --output file that exists, once the new scores are complete", group="output"
    )


@dataclass
class CheckConfig:
    train_config: str = arg(
        "configs/train-paper-qwen2.5-math-1.5b.yaml",
        "the training config a job would run ('' for none): "
        "its launcher settings, precision and DeepSpeed config are what is checked; "
        "a shipped configs/ file is found from any directory",
        group="data",
    )
    backbone: str = arg(
        "Qwen/Qwen2.5-Math-1.5B",
        "the body to train (a Hub name, a folder, or a built-in: tiny, smollm2-135m)",
        group="model",
    )
    data: str = arg(
        "trl-lib/math_shepherd",
        "training rows: a file (its first --rows are used), a Hub name, or synthetic:N",
        group="data",
    )
    rows: int = arg(64, "trajectories of a data file to train and score on", min=1, group="data")
    processes: int | None = arg(
        None,
        "training processes, launched with torchrun (one per GPU); default 1, and 2 with --smoke",
        min=1,
        group="compute",
    )
    latency_solutions: int = arg(
        16, "solutions scored one at a time per mode for the latency ratio", min=1, group="check"
    )
    out: str = arg("check", "where check.{json,md} and the logs go", group="output")
    smoke: bool = arg(
        False,
        "every item on the tiny backbone and the synthetic task on the CPU in 2 processes, in a minute or two "
        "(what the tests run)",
        group="check",
    )

    def __post_init__(self) -> None:
        if self.smoke:  # the same items on what any machine has, unless a body or data is named
            defaults = {f.name: f.default for f in fields(self)}
            self.train_config = ""
            self.backbone = "tiny" if self.backbone == defaults["backbone"] else self.backbone
            self.data = f"synthetic:{self.rows}" if self.data == defaults["data"] else self.data
        if self.processes is None:
            self.processes = 2 if self.smoke else 1
