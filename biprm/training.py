"""Training recipe: read top to bottom.

Built on `transformers.Trainer`, so one code path runs on a laptop CPU, on one GPU in
bf16, and on many GPUs through `accelerate launch` (DDP, DeepSpeed ZeRO, FSDP):
checkpointing, exact resume (optimizer, scheduler, RNG and data position), logging
to TensorBoard/W&B and the progress bar come from the library. Our custom pieces are
the collator, which packs both streams of every trajectory into one batch, and, with
--train-top-layers, the trunk cache's dataset and collator (`biprm.trunk`), on which
The studies beside the package train through it too: one loop for every training run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from functools import partial
from pathlib import Path

import datasets
import numpy as np
import torch
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase, Trainer, TrainerCallback, TrainingArguments, set_seed
from transformers.trainer_pt_utils import LengthGroupedSampler

from biprm.backbones import cache_root, load_tokenizer, resolve_backbone
from biprm.config import TrainConfig
from biprm.checkpoint import share, stamp, write_model_card
from biprm.data.arrow import encoded_dataset, streamed_dataset, to_encoded
from biprm.run_folder import (
    RECORD,
    finished,
    kept,
    plan,
    publish,
    run_record,
    same_data,
    start,
    undone_if_nothing_trained,
)
from biprm.data.encoding import Encoded, Encoder
from biprm.lora import lora_head_masters, save_merged, with_lora
from biprm.data.readers import check_rows
from biprm.data.segment import Segmenter
from biprm.modeling import BiPRMModel, encoder_for, from_backbone, from_prm, head_masters
from biprm.folder import ModelFolder, resolve
from biprm.packing import pack
from biprm.trunk import TrunkCache, TrunkCollator, TrunkData, freeze_bottom

log = logging.getLogger(__name__)
# BiPRMTrainer runs trunk-cache steps through the model's own forward_features,
# around the DDP wrapper, whose gradient sync arms only in the wrapper's forward:
# several processes would each train alone. DeepSpeed and FSDP also expect theirs.
TRUNK_ALONE = (
    "--train-top-layers trains on the trunk cache in one process, without DeepSpeed or FSDP; launch one process, "
    "or add --no-trunk-cache to train the top layers in several"
)
SAVE_EVERY_MOST = 500  # optimizer steps between the checkpoints of a run whose --save-steps is left to its default


def default_save_steps(steps: int) -> int:
    """The checkpoint interval of a run of `steps` optimizer steps without --save-steps: a tenth of them, at most
    500."""
    return max(1, min(SAVE_EVERY_MOST, math.ceil(steps / 10)))


class BiPRMTrainer(Trainer):
    """`Trainer` for BiPRM's two training layouts: `BiPRMTrainer(model, args, train_dataset=ds).train()` works alone.

    - The default collator follows the data and the model's mode: `pack` for encoded rows
      (`encoded_dataset`), `TrunkCollator` for `TrunkData` (features of a frozen trunk).
    - `gate_lr_scale`: the gate's parameters get their own group at that x lr; the linear
      schedule scales both groups alike. (A DeepSpeed config that defines its own optimizer
      or scheduler would bypass this, so `check_deepspeed_config` refuses it.)
    - On `TrunkData` the batches are its seeded length-grouped ones over every epoch, each
      run as micro-batches of bounded size; it trains in one process, through the model's
      `forward_features`, and unless given, the step count and a warm-up ratio are counted on
      those batches (warm-up rounded, as the replication studies always did).
    - `save_steps`: the run's step count -> its checkpoint (and validation) interval, set once
      that count is known, in place of the arguments' `save_steps` (`train` passes
      `default_save_steps` when --save-steps is not given).
    """

    def __init__(
        self,
        model: BiPRMModel,
        args: TrainingArguments | None = None,
        data_collator=None,
        train_dataset=None,
        *rest,
        gate_lr_scale: float = 1.0,
        save_steps: Callable[[int], int] | None = None,
        **kwargs,
    ):
        if data_collator is None and train_dataset is not None:
            data_collator = default_collator(model, train_dataset, kwargs.get("processing_class"))
        super().__init__(model, args, data_collator, train_dataset, *rest, **kwargs)
        self.gate_lr_scale = gate_lr_scale
        self.save_steps = save_steps
        self.head_masters: dict[str, torch.Tensor] = {}  # set by `save_model` under DeepSpeed, written by `_save`
        if isinstance(self.train_dataset, TrunkData):
            if self.args.world_size > 1:
                raise ValueError(TRUNK_ALONE)
            self.batches = self.train_dataset.batches(
                self.args.per_device_train_batch_size, self.args.num_train_epochs, self.args.seed
            )
            if self.args.max_steps <= 0:  # every batch: the last step takes what is left (fewer than --grad-accum)
                self.args.max_steps = math.ceil(len(self.batches) / self.args.gradient_accumulation_steps)
            if 0 < self.args.warmup_steps < 1:
                self.args.warmup_steps = round(self.args.warmup_steps * self.args.max_steps)

    def set_initial_training_values(self, args: TrainingArguments, dataloader: DataLoader) -> tuple:
        """transformers' step counts (the last is the run's optimizer steps); the interval `save_steps` makes of them is
        set here, before the Trainer copies it into its state and compares it with a resumed checkpoint's."""
        values = super().set_initial_training_values(args, dataloader)
        if self.save_steps is not None:
            args.save_steps = args.eval_steps = self.save_steps(values[-1])
        return values

    def create_optimizer(self, model=None):
        optimizer = super().create_optimizer(model)
        gate = getattr(self.model, "gate", None)
        if self.gate_lr_scale == 1.0 or gate is None:
            return optimizer
        ids = {id(p) for p in gate.parameters()}
        for group in [g for g in optimizer.param_groups if not g.get("gate")]:  # a second call finds the split done
            mine = [p for p in group["params"] if id(p) in ids]
            if mine:
                group["params"] = [p for p in group["params"] if id(p) not in ids]
                optimizer.add_param_group(
                    {**group, "params": mine, "lr": group["lr"] * self.gate_lr_scale, "gate": True}
                )
        return optimizer

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False) -> None:
        """transformers' save; under DeepSpeed the heads are written from the optimizer's fp32 masters, gathered here on
        every rank before `_save`, where only the writer goes on (without this they were saved bf16-rounded)."""
        self.head_masters = head_masters(self.model) if self.is_deepspeed_enabled else {}
        super().save_model(output_dir, _internal_call)

    def _save(self, output_dir: str | None = None, state_dict: dict | None = None) -> None:
        if self.head_masters and state_dict is not None:
            state_dict = {**state_dict, **self.head_masters}
        super()._save(output_dir, state_dict)

    def _remove_unused_columns(self, dataset, description=None):
        return dataset  # the collator reads every column of an encoded row

    def _get_train_sampler(self, train_dataset=None):
        """The length-grouped sampler, given its lengths as one array read in one go.

        Left to itself, Trainer hands the sampler `dataset[column]`, which datasets 5
        reads lazily at about 0.5 ms per row: minutes at Math-Shepherd size before the first step.
        """
        data = self.train_dataset if train_dataset is None else train_dataset
        column = self.args.length_column_name
        if (
            self.args.train_sampling_strategy != "group_by_length"
            or not isinstance(data, datasets.Dataset)
            or column not in data.column_names
        ):
            return super()._get_train_sampler(train_dataset)
        lengths = data.select_columns([column]).with_format("numpy")[:][column].tolist()
        # grouped by the global batch: the same order in any number of processes, so a resume may change that number
        global_batch = self.args.train_batch_size * self.args.world_size * self.args.gradient_accumulation_steps
        return EpochGroupedSampler(global_batch, lengths, self.args.seed, lambda: self.state.epoch)

    def get_train_dataloader(self) -> DataLoader:
        if not isinstance(self.train_dataset, TrunkData):
            return super().get_train_dataloader()
        return self.accelerator.prepare(
            DataLoader(self.train_dataset, batch_sampler=self.batches, collate_fn=self.data_collator)
        )

    def training_step(self, model, inputs: dict, num_items_in_batch=None) -> torch.Tensor:
        """A `TrunkCollator` batch: one backward pass per micro-batch, its loss weighted by its share of the
        trajectories."""
        if "parts" not in inputs:
            return super().training_step(model, inputs, num_items_in_batch)
        model.train()
        inputs = self._prepare_inputs(inputs)
        features = self.accelerator.unwrap_model(model).forward_features
        total = torch.zeros((), device=self.args.device)
        # the batches of this optimizer step: fewer than --grad-accum
        # in a short last step (set by `train`; a full step outside it)
        accumulated = getattr(self, "current_gradient_accumulation_steps", self.args.gradient_accumulation_steps)
        for part, weight in zip(inputs["parts"], inputs["shares"]):
            with torch.autocast(self.args.device.type, dtype=torch.bfloat16, enabled=self.args.bf16):
                loss = features(**part).loss * weight / accumulated
            self.accelerator.backward(loss)
            total += loss.detach()
        return total


class SaveOnInterrupt(TrainerCallback):
    """Ctrl-C (SIGINT) while one process trains, in `listening`: the step under way finishes, is saved as a checkpoint,
    and training stops (`asked`); a second Ctrl-C stops at once. With several processes Ctrl-C stops at once, as before:
    a save is collective, and each rank would see the signal at another step."""

    def __init__(self) -> None:
        self.asked = False

    @contextmanager
    def listening(self, alone: bool) -> Iterator[None]:
        if not alone or threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            yield
            return

        def ask(signum: int, frame: object) -> None:
            self.asked = True
            signal.signal(signal.SIGINT, before)

        before = signal.signal(signal.SIGINT, ask)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, before)

    def on_step_end(self, args: TrainingArguments, state, control, **kwargs):
        if self.asked:
            control.should_save = control.should_training_stop = True
        return control


class EpochGroupedSampler(LengthGroupedSampler):
    """Length-grouped batches in an order drawn from (seed, epoch) alone. transformers' sampler draws from the global
    generator, which a resumed run restores only after it has drawn the resumed epoch's order: a resume in epoch 2 or
    later replayed the first epoch's order and skipped the wrong rows. `epoch` reads the trainer's (restored) epoch."""

    def __init__(self, batch_size: int, lengths: list[int], seed: int, epoch: Callable[[], float | None]):
        super().__init__(batch_size, lengths=lengths)
        self.seed, self.epoch = seed, epoch

    def __iter__(self):
        self.generator = torch.Generator().manual_seed(self.seed + int(self.epoch() or 0))
        return super().__iter__()


def backend(cfg: TrainConfig) -> str:
    """What the run asked to train with: deepspeed (--deepspeed, or `accelerate launch` with a DeepSpeed config),
    fsdp (training_args' fsdp, or `accelerate launch` with an FSDP config), else plain (one process or DDP)."""

    def launched_with(name: str) -> bool:
        return os.environ.get(f"ACCELERATE_USE_{name}", "").lower() == "true"

    if cfg.deepspeed or launched_with("DEEPSPEED"):
        return "deepspeed"
    return "fsdp" if cfg.training_args.get("fsdp") or launched_with("FSDP") else "plain"


def cpu_only() -> bool:
    """No CUDA or MPS device: the Trainer runs on the CPU (gloo between processes, CPU autocast for --bf16)."""
    return not (torch.cuda.is_available() or torch.backends.mps.is_available())


def default_collator(model: BiPRMModel, data, tokenizer=None):
    """The collator of the data's layout, for the model's mode."""
    if isinstance(data, TrunkData):
        return TrunkCollator(data, model.streams)
    pad_id = getattr(tokenizer, "pad_token_id", None)
    return partial(collate, mode=model.config.mode, pad_id=0 if pad_id is None else pad_id)


def holdout(data: datasets.Dataset, fraction: float, seed: int) -> tuple[datasets.Dataset, datasets.Dataset | None]:
    """(train, validation): a seeded random `fraction` of the rows, at least one, is held out."""
    if not fraction:
        return data, None
    n_eval = max(1, round(len(data) * fraction))
    if not 0 < fraction < 1 or n_eval >= len(data):
        raise ValueError(f"eval_fraction={fraction} leaves no training rows out of {len(data)}")
    held = np.zeros(len(data), dtype=bool)
    held[np.random.default_rng(seed).permutation(len(data))[:n_eval]] = True
    return data.select(np.flatnonzero(~held)), data.select(np.flatnonzero(held))


def collate(rows: list[dict], **pack_options) -> dict[str, torch.Tensor]:
    return pack([to_encoded(r) for r in rows], **pack_options)


# transformers 5.20 renamed the flag (the old name warns); vLLM needs transformers < 5.20, so both must work
CHECKPOINTING = (
    "activation_checkpointing"
    if "activation_checkpointing" in TrainingArguments.__dataclass_fields__
    else "gradient_checkpointing"
)


def training_arguments(cfg: TrainConfig) -> TrainingArguments:
    """`cfg` as TrainingArguments; `cfg.training_args` sets any other of their options, or replaces one of ours."""
    for name in cfg.training_args:
        if name not in TrainingArguments.__dataclass_fields__:
            raise ValueError(f"training_args: {name!r} is not a transformers.TrainingArguments option")
        if name in TrainConfig.__dataclass_fields__:
            raise ValueError(f"training_args: {name!r} is a setting of its own; set it as --{name.replace('_', '-')}")
    ours = dict(
        output_dir=cfg.output_dir,
        learning_rate=cfg.learning_rate,
        num_train_epochs=cfg.num_train_epochs,
        max_steps=cfg.max_steps,
        per_device_train_batch_size=cfg.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.gradient_accumulation_steps,
        lr_scheduler_type="linear",
        warmup_steps=cfg.warmup_ratio,  # a float in [0, 1) is a ratio of total steps
        weight_decay=cfg.weight_decay,
        optim="adamw_torch",
        seed=cfg.seed,
        bf16=cfg.bf16,
        use_cpu=cpu_only(),
        save_strategy="steps",
        save_steps=cfg.save_steps
        or SAVE_EVERY_MOST,  # without --save-steps, BiPRMTrainer sets it from the run's length
        save_total_limit=cfg.save_total_limit,
        logging_steps=cfg.logging_steps,
        eval_strategy="steps" if cfg.eval_fraction else "no",
        eval_steps=cfg.save_steps or SAVE_EVERY_MOST,
        per_device_eval_batch_size=cfg.per_device_train_batch_size,
        prediction_loss_only=True,
        report_to=[t.strip() for t in cfg.report_to.split(",") if t.strip() and t.strip() != "none"],
        remove_unused_columns=False,
        # every trainable parameter gets a gradient at every step in every mode (a frozen one is no DDP parameter,
        # and a mode without the gate has none), so DDP's search for unused ones would only cost a graph walk
        ddp_find_unused_parameters=False,
        dataloader_drop_last=False,
        **{CHECKPOINTING: cfg.gradient_checkpointing},
        dataloader_pin_memory=torch.cuda.is_available(),
        deepspeed=cfg.deepspeed,
        disable_tqdm=not cfg.show_progress,
        train_sampling_strategy="group_by_length" if cfg.group_by_length and not cfg.streaming else "random",
        length_column_name="n_tokens",
        # each process reads its own rows: dispatching a streamed batch would cut every tensor to the first one's length
        accelerator_config={"dispatch_batches": False},
    )
    return TrainingArguments(**ours | cfg.training_args)


def check_deepspeed_config(path: str, gate_lr_scale: float, lora_r: int = 0, bf16: bool = False) -> None:
    """Refuse, before anything loads, a DeepSpeed config that would lose an option or the final weights; warn of one
    that accumulates bf16 gradients in bf16."""
    try:
        ds = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ValueError(f"--deepspeed {path}: cannot read it as JSON ({error})") from None
    own = [k for k in ("optimizer", "scheduler") if k in ds]
    if gate_lr_scale != 1.0 and own:
        raise ValueError(
            f"--deepspeed {path} defines its own {' and '.join(own)}, so --gate-lr-scale {gate_lr_scale} would be "
            "ignored; remove those blocks (the Trainer then builds AdamW and the linear schedule with the gate's "
            "group) or drop --gate-lr-scale"
        )
    if bf16 and ds.get("data_types", {}).get("grad_accum_dtype") not in ("fp32", "float32", "float", "torch.float32"):
        log.warning(
            '--deepspeed %s: without "data_types": {"grad_accum_dtype": "fp32"} DeepSpeed sums the micro-batches\' '
            "gradients in bf16 (configs/ds_zero*.json set it)",
            path,
        )
    zero = ds.get("zero_optimization", {})
    if lora_r and zero.get("stage") == 3:
        raise ValueError(
            f"--deepspeed {path}: --lora-r with ZeRO-3 is not supported (the merged save needs the full weights "
            "on one process); use ZeRO-2, which keeps the base weights whole on every rank"
        )
    if zero.get("stage") == 3 and zero.get("stage3_gather_16bit_weights_on_model_save") is not True:
        raise ValueError(
            f'--deepspeed {path}: ZeRO-3 without "stage3_gather_16bit_weights_on_model_save": true saves no usable '
            "weights at the end of training; set it in zero_optimization (configs/ds_zero3.json does)"
        )


def train(
    cfg: TrainConfig, callbacks: list[TrainerCallback] | None = None, encoded: list[Encoded] | None = None
) -> str:
    """Train one model into `cfg.output_dir`; `encoded`, if given, is the data instead of `cfg.data`: a study's
    training set, encoded once for all its runs with this backbone's tokenizer (it needs the trunk cache:
    --train-top-layers). Ctrl-C ends in a KeyboardInterrupt whose message says which checkpoint the folder keeps and
    how to go on from it."""
    try:
        return _train(cfg, callbacks, encoded)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(kept(cfg.output_dir)) from None


def _train(cfg: TrainConfig, callbacks: list[TrainerCallback] | None, encoded: list[Encoded] | None) -> str:
    cfg.check_combinations()  # again: a caller may have set a field after the settings were made
    set_seed(cfg.seed)  # before the model is built: the seed fixes every new weight
    engine, source = check_before_loading(cfg, encoded)
    # The arguments come first: with a ZeRO-3 config they switch on partitioned init, so the
    # backbone below is loaded straight into shards instead of whole into every rank's RAM.
    args = training_arguments(cfg)
    if cfg.train_top_layers and cfg.trunk_cache and (args.world_size > 1 or engine != "plain"):
        raise ValueError(TRUNK_ALONE)  # before any rank builds the cache
    # the folder is judged before the model loads and the data are encoded: a refused resume costs seconds, not minutes
    record = run_record(asdict(cfg), None, args.world_size, engine_facts(cfg, engine))
    resume_from = plan(cfg.output_dir, record, cfg.resume, cfg.overwrite, engine)
    backbone_dir = cfg.init_from or resolve_backbone(cfg.backbone)
    tokenizer = source.tokenizer if source else load_tokenizer(backbone_dir)
    model = build_model(cfg, engine, backbone_dir, tokenizer, source)
    encoder = encoder_for(model.config, tokenizer, cfg.max_length)
    train_set, eval_set, record["data_fingerprint"] = training_data(cfg, args, model, encoder, encoded)
    if cfg.resume:
        same_data(cfg.output_dir, record["data_fingerprint"])
    if finished(
        cfg.output_dir, resume_from
    ):  # the Trainer would run one more step at lr 0 and log it over the real run
        log.warning("%s: this run has finished; its model and train_log.json stay as they are", cfg.output_dir)
        end_processes(args)
        return cfg.output_dir
    options = dict(
        mode=cfg.mode, share_prefix=cfg.share_prefix, max_tokens=cfg.max_tokens_per_row, pad_id=tokenizer.pad_token_id
    )
    interrupt = SaveOnInterrupt()
    trainer = (
        BiPRMTrainer(  # built before the folder is touched: a tracker or launcher that fails here leaves nothing behind
            model=model,
            args=args,
            train_dataset=train_set,
            eval_dataset=eval_set,
            data_collator=None if isinstance(train_set, TrunkData) else partial(collate, **options),
            processing_class=tokenizer,
            callbacks=[*(callbacks or []), interrupt],
            gate_lr_scale=cfg.gate_lr_scale,
            save_steps=None if cfg.save_steps else default_save_steps,
        )
    )
    created = args.process_index == 0 and (cfg.overwrite or not Path(cfg.output_dir, RECORD).is_file())
    args.distributed_state.wait_for_everyone()  # every rank has looked at the folder before the first one writes to it
    if args.process_index == 0:
        start(cfg.output_dir, record, cfg.overwrite)
    args.distributed_state.wait_for_everyone()
    if not cfg.streaming:
        log.info(
            "training %s/%s on %d trajectories from %s (%d held out)",
            cfg.mode,
            cfg.objective,
            len(train_set),
            cfg.data,
            len(eval_set) if eval_set is not None else 0,
        )
    with (
        undone_if_nothing_trained(cfg.output_dir, created, lambda: trainer.state.global_step),
        interrupt.listening(args.world_size == 1),
    ):
        trainer.train(resume_from_checkpoint=resume_from)
    if interrupt.asked and trainer.state.global_step < trainer.state.max_steps:
        raise KeyboardInterrupt  # stopped early, its last step saved
    save_final(cfg, trainer, model, tokenizer, args.world_size, resume_from)
    end_processes(args)
    return cfg.output_dir


def end_processes(args: TrainingArguments) -> None:
    """Close the process group once every rank is done: a rank that exits with it open can abort in gloo's teardown
    ("terminate called without an active exception"), and torchrun then reports a run that trained and saved as
    failed."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        args.distributed_state.wait_for_everyone()
        torch.distributed.destroy_process_group()


def check_before_loading(cfg: TrainConfig, encoded: list[Encoded] | None) -> tuple[str, ModelFolder | None]:
    """The distributed engine (plain, deepspeed, fsdp) and the --init-from PRM's folder, once the data source and the
    engine's config are known to work: a mistake there is cheaper to hear before the backbone loads."""
    if encoded is None:
        check_rows(cfg.data)
    source = resolve(cfg.init_from, cfg.prm_kind) if cfg.init_from else None
    if cfg.deepspeed:
        check_deepspeed_config(cfg.deepspeed, cfg.gate_lr_scale, cfg.lora_r, cfg.bf16)
    engine = backend(cfg)
    if engine != "plain" and cpu_only():
        raise ValueError(
            f"{engine} needs a GPU: accelerate starts it only on accelerator devices (on a CPU, DeepSpeed fails to "
            "start and FSDP trains as plain DDP); train on a CPU without it (one process, or DDP: torchrun "
            "--nproc_per_node N)"
        )
    return engine, source


def engine_facts(cfg: TrainConfig, engine: str) -> dict:
    """The backend, and for DeepSpeed what its checkpoints hold, for the run record: a resume judges a DeepSpeed
    checkpoint by the ZeRO stage and process count that wrote it, not by the files present (a lost last rank would go
    unseen), and expects the Trainer's scheduler.pt unless the DeepSpeed config builds its own scheduler."""
    if engine != "deepspeed":
        return {"backend": engine}
    path = cfg.deepspeed or os.environ.get(
        "ACCELERATE_DEEPSPEED_CONFIG_FILE"
    )  # `accelerate launch` with a DeepSpeed config
    ds = json.loads(Path(path).read_text()) if path and Path(path).is_file() else {}
    stage = ds.get("zero_optimization", {}).get("stage", os.environ.get("ACCELERATE_DEEPSPEED_ZERO_STAGE"))
    return {
        "backend": engine,
        "zero_stage": None if stage in (None, "auto") else int(stage),
        "scheduler_in_config": "scheduler" in ds,
    }


def build_model(
    cfg: TrainConfig,
    engine: str,
    backbone_dir: str,
    tokenizer: PreTrainedTokenizerBase,
    source: ModelFolder | None = None,
) -> BiPRMModel:
    """A fresh BiPRM on the backbone, with only the parameters this run trains left trainable (LoRA, top layers,
    heads)."""
    # fp32 master weights everywhere; --bf16 is autocast (CUDA or CPU), never bf16 weights,
    # which would round most updates at the paper's lr away (0.02 + 3e-5 == 0.02 in bf16)
    options = dict(
        mode=cfg.mode,
        objective=cfg.objective,
        zeta=cfg.zeta,
        dtype=torch.float32,
        attn_implementation=cfg.attn_implementation,
        detach_gate_inputs=cfg.detach_gate_inputs,
        aux_loss_weight=cfg.aux_loss_weight,
        segmenter=cfg.segmenter,
    )
    if source:  # another PRM made bidirectional: its L2R stream is the source exactly, and the gate leans on it
        model = from_prm(source, tokenizer=tokenizer, gate_init=cfg.gate_init, **options)
    else:
        model = from_backbone(backbone_dir, tokenizer, **options)
    if cfg.lora_r and engine == "fsdp":
        raise ValueError(
            "--lora-r with FSDP is not supported (the merged save needs the full weights on one process); use DDP or "
            "ZeRO-2"
        )
    if cfg.lora_r:
        model = with_lora(model, cfg.lora_r, cfg.lora_alpha, cfg.lora_dropout, tuple(cfg.lora_targets.split(",")))
        trainable, total = model.get_nb_trainable_parameters()
        log.info("LoRA r=%d: training %d of %d parameters", cfg.lora_r, trainable, total)
    if cfg.train_top_layers:
        freeze_bottom(model, cfg.train_top_layers)
        if cfg.heads_only:
            model.backbone.requires_grad_(False)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
        log.info(
            "training the top %d layers, value head and gate: %d of %d parameters",
            cfg.train_top_layers,
            trainable,
            model.num_parameters(),
        )
    return model


def row_segmenter(cfg: TrainConfig, encoder: Encoder) -> Segmenter:
    """What cuts a training row given as one string (a 'trace' row): --segmenter, the name the checkpoint records; under
    'given' such a row is refused, naming it (it has no steps of its own)."""
    return Segmenter(cfg.segmenter, encoder.tokenizer)


def training_data(
    cfg: TrainConfig, args: TrainingArguments, model: BiPRMModel, encoder: Encoder, encoded: list[Encoded] | None
) -> tuple[object, object | None, str]:
    """(training rows, held-out rows or None, their fingerprint for the run record): trunk features, a stream, or an
    encoded file."""
    if cfg.train_top_layers and cfg.trunk_cache:
        # computed where training runs (the Trainer would move the model there next), not on the CPU of a GPU node
        train_set, fingerprint = trunk_set(cfg, model.to(args.device), encoder, encoded)
        return train_set, None, fingerprint
    if encoded is not None:
        raise ValueError("training on encodings given in Python needs the trunk cache (--train-top-layers K)")
    if cfg.streaming:
        stream = streamed_dataset(
            cfg.data, encoder, fmt=cfg.format, skip_invalid=cfg.skip_invalid, segmenter=row_segmenter(cfg, encoder)
        )
        return stream, None, f"stream:{cfg.data}"
    with args.main_process_first(desc="encoding the training data"):  # rank 0 builds the cache, the others map it
        data = encoded_dataset(
            cfg.data,
            encoder,
            fmt=cfg.format,
            skip_invalid=cfg.skip_invalid,
            num_proc=cfg.num_proc,
            segmenter=row_segmenter(cfg, encoder),
        )
    train_set, eval_set = holdout(data, cfg.eval_fraction, cfg.seed)
    return train_set, eval_set, data._fingerprint


def save_final(
    cfg: TrainConfig,
    trainer: BiPRMTrainer,
    model: BiPRMModel,
    tokenizer: PreTrainedTokenizerBase,
    world_size: int,
    resumed_from: str | None = None,
) -> None:
    """The final model with its record, log and card, written to a scratch folder and moved into the output folder
    whole; `resumed_from`, the checkpoint this run went on from, is marked in the log."""
    stamp(model.config)
    scratch = Path(cfg.output_dir, ".final")  # the final save lands here first, then moves in (run_folder.publish)
    if cfg.lora_r:  # under DeepSpeed the heads come from the fp32 masters, gathered on every rank before rank 0 writes
        heads = lora_head_masters(trainer.model) if trainer.is_deepspeed_enabled else {}
        if trainer.is_world_process_zero():
            save_merged(trainer.model, tokenizer, scratch, heads)
    else:
        trainer.save_model(str(scratch))
    if trainer.is_world_process_zero():
        Path(scratch, "biprm_train.json").write_text(
            json.dumps({**asdict(cfg), "world_size": world_size, "fsdp": trainer.is_fsdp_enabled}, indent=2)
        )
        Path(scratch, "train_log.json").write_text(
            json.dumps(logged(trainer.state.log_history, resumed_from), indent=2)
        )
        write_model_card(scratch, asdict(cfg), trainer.state.log_history)
        publish(scratch, cfg.output_dir)
        share(cfg.output_dir)


def logged(history: list[dict], resumed_from: str | None) -> list[dict]:
    """The log as train_log.json holds it: where the run resumed, an entry at that step says so, since transformers
    restarts its running loss there (the first loss logged after it averages only the steps since the resume, where an
    uninterrupted run's averages every step since its last log). Checkpoints keep the log unmarked, so a resumed
    checkpoint's trainer state still equals an uninterrupted run's."""
    if resumed_from is None:
        return history
    step = int(Path(resumed_from).name.split("-")[1])
    at = next((i for i, entry in enumerate(history) if entry.get("step", 0) > step), len(history))
    mark = {"step": step, "resumed_from": Path(resumed_from).name, "running_loss": "restarts here"}
    return [*history[:at], mark, *history[at:]]


def trunk_set(
    cfg: TrainConfig, model: BiPRMModel, encoder: Encoder, encoded: list[Encoded] | None
) -> tuple[TrunkData, str]:
    """(the training rows as features of the frozen trunk, their fingerprint). The features are computed
    once into the on-disk cache, which every run cutting the same weights at the same layer shares."""
    if encoded is None:
        encs = [
            to_encoded(r)
            for r in encoded_dataset(
                cfg.data,
                encoder,
                fmt=cfg.format,
                skip_invalid=cfg.skip_invalid,
                num_proc=cfg.num_proc,
                segmenter=row_segmenter(cfg, encoder),
            )
        ]
    else:
        encs = encoded
        bad = next(
            (
                i
                for i, e in enumerate(encs)
                if e.n_tokens > encoder.max_length or any(s[-1] != encoder.step_tag_id for s in e.steps)
            ),
            None,
        )
        if bad is not None:
            raise ValueError(
                f"encoded row {bad + 1} was not encoded for this model (step tag {encoder.step_tag_id}, max_length "
                f"{encoder.max_length})"
            )
    root = cfg.trunk_cache_dir or cache_root() / "trunk"
    cache = TrunkCache(root, model, cfg.train_top_layers, encs, dtype=torch.bfloat16 if cfg.bf16 else None).build(
        progress=cfg.show_progress
    )
    labels = [e.labels for e in encs]
    return TrunkData(
        cache, labels
    ), f"trunk:{cache.dir.name}:{hashlib.sha256(json.dumps(labels).encode()).hexdigest()[:16]}"
