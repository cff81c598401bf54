"""Trajectories -> per-step scores (L2R, R2L, gate, fused) with batched, length-sorted passes.

Batches are filled up to a token budget in length order so padding stays small;
outputs come back in input order as a flat `StepScores`. Two layouts (measured in
benchmarks/, explained in docs/PERFORMANCE.md):
- default, one backbone call per batch of about `tokens_per_batch` tokens counted with
  padding: each trajectory's prompt once, then both of its streams,
  in rows of about `tokens_per_row` tokens. Rows stay short because the custom mask
  makes attention cost quadratic in the row; a trajectory too long for one row gets a
  plain causal row per stream instead.
- prompt cache: batches hold whole questions; one call
  encodes every distinct prompt of the batch once, then calls of about
  `tokens_per_call` tokens run the continuations of both streams,
  longest first, attending to their prompt through its KV cache. Cheapest for
  Best-of-N pools, where many candidates share a question, so `prefix_cache=None`
  (the default) picks it when the questions have CACHE_FROM candidates on average and
  no stream passes DENSE_MAX tokens (its rows' masks grow with the square of their length;
  the one-pass layout then runs plain causal rows, linear in length).

Unless set, the token budgets follow the device (`device_budgets`): on a CPU the ones
measured on 2 cores, on a GPU what a share of its free memory holds.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import torch
from tqdm.auto import tqdm

from biprm.checkpoint import check_layout
from biprm.folder import ModelFolder, NotACheckpoint, resolve
from biprm.config import DENSE_MAX, MAX_LENGTH, MODE_TABLE, TOKENS_PER_ROW, ScorerSettings
from biprm.data.encoding import Encoded, Unscorable, first_runs, step_windows, stream_order
from biprm.data.trajectory import DataError, Trajectory, validate
from biprm.implicit import ImplicitPRM, from_implicit
from biprm.modeling import BiPRMModel, BiPRMOutput, encoder_for, from_prm
from biprm.packing import check_tags, pack, pack_cached, token_runs
from biprm.scoring.step_scores import StepScores, concat, offsets_of, step_positions

log = logging.getLogger(__name__)
CACHE_FROM = 4  # candidates per question from which the prompt cache wins (benchmarks/, scaling plot)


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass(frozen=True)
class Budgets:
    """Tokens per backbone batch: one-pass (counted with padding), with the prompt cache (whole
    questions, real tokens), and per call of the prompt cache's continuations."""

    one_pass: int
    cached: int
    per_call: int


CPU_BUDGETS = Budgets(4096, 16384, 1024)  # measured on 2 cores (benchmarks/): larger batches only cost memory there
GPU_MEMORY_SHARE = 0.25  # of the memory free when the scorer starts; the rest is headroom for long rows and other work


def budgets_for_memory(free_bytes: int, backbone_config, dtype: torch.dtype) -> Budgets:
    """Budgets that fit a share of `free_bytes`, from what one token costs at inference: the widest
    layer's activations (only one layer's live at a time), its cached keys and values in every layer,
    and its row of the per-stream attention mask, broadcast over heads."""
    c = backbone_config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    width = 6 * c.hidden_size + 3 * c.intermediate_size + 2 * c.num_hidden_layers * kv_heads * head_dim
    per_token = dtype.itemsize * (width + TOKENS_PER_ROW * c.num_attention_heads)
    tokens = int(free_bytes * GPU_MEMORY_SHARE / per_token) // 1024 * 1024
    one = min(max(tokens, CPU_BUDGETS.one_pass), 1 << 18)
    return Budgets(one, 4 * one, one)


def device_budgets(model: BiPRMModel) -> Budgets:
    """The budgets of the device the model is on: a GPU's are read from its free memory at start."""
    if model.device.type != "cuda":
        return CPU_BUDGETS
    free, _ = torch.cuda.mem_get_info(model.device)
    return budgets_for_memory(free, model.config.backbone_config, model.dtype)


class Scorer:
    def __init__(
        self,
        model: BiPRMModel | ImplicitPRM,
        tokenizer,
        max_length: int = MAX_LENGTH,
        tokens_per_batch: int | None = None,
        tokens_per_row: int | None = TOKENS_PER_ROW,
        share_prefix: bool = True,
        prefix_cache: bool | None = None,
        tokens_per_call: int | None = None,
        overlength: str = "head",
    ):
        """`tokens_per_batch` and `tokens_per_call` default to the budgets of the model's device (`device_budgets`);
        `overlength` is what a trajectory past `max_length` gets (biprm.data.encoding.Encoder)."""
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.implicit = isinstance(model, ImplicitPRM)  # its own layout: plain causal rows, read from vocabulary logits
        if self.implicit and overlength == "window":
            raise ValueError(
                f"--overlength window: an implicit PRM ({model.config.prm_kind}) sums its log-ratios from the "
                "question on, so a window that starts later changes every score; use head, tail or refuse"
            )
        window = getattr(model.config.backbone_config, "max_position_embeddings", None)
        if (
            model.config.prm_kind != "biprm" and window and max_length > window
        ):  # a PRM trained elsewhere declares its window
            log.warning(
                "max_length %d is past the %s PRM's window of %d positions: each stream reads at most %d tokens, "
                "longer ones by the --overlength policy (%s)",
                max_length,
                model.config.prm_kind,
                window,
                window,
                overlength,
            )
            max_length = window
        self.encoder = encoder_for(model.config, tokenizer, max_length, overlength)
        self.budgets = device_budgets(model)
        self.tokens_per_batch = tokens_per_batch
        self.tokens_per_row = tokens_per_row
        self.share_prefix = share_prefix
        self.prefix_cache = prefix_cache
        self.tokens_per_call = tokens_per_call or self.budgets.per_call

    @classmethod
    def from_pretrained(
        cls,
        path: str | ModelFolder,
        device: str | torch.device | None = None,
        dtype: torch.dtype | None = None,
        max_length: int = MAX_LENGTH,
        attn_implementation: str = "sdpa",
        prm_kind: str | None = None,
        prm_mode: str | None = None,
        prm_reference: str | None = None,
        **kwargs,
    ) -> "Scorer":
        """A biprm checkpoint, in the mode it was trained in, or the folder of another PRM kind (biprm.prms: detected,
        or named by `prm_kind`), read as shipped (`prm_mode` l2r, the default) or zero-shot reversed (r2l) or both
        averaged (bi-static): `biprm.folder.reading_mode`. An implicit PRM (biprm.implicit) is read against the
        reference LM in `prm_reference`. `path` may be a folder `biprm.folder.resolve` has already resolved."""
        folder = path if isinstance(path, ModelFolder) else resolve(path, prm_kind, prm_mode, prm_reference)
        if folder.kind == "export":
            raise NotACheckpoint(f"{folder.path}: a vLLM export; serve it with --engine vllm or pass its checkpoint")
        device = torch.device(device) if device is not None else default_device()
        dtype = dtype or (torch.bfloat16 if device.type == "cuda" else torch.float32)
        tokenizer = folder.tokenizer
        if folder.implicit:
            model = from_implicit(folder, tokenizer, dtype, attn_implementation).to(device)
        elif folder.trained_elsewhere:
            model = from_prm(folder, dtype=dtype, attn_implementation=attn_implementation, tokenizer=tokenizer)
        else:
            model = BiPRMModel.from_pretrained(folder, dtype=dtype, attn_implementation=attn_implementation)
        check_layout(model.config, folder.path)
        return cls(model.to(device), tokenizer, max_length, **kwargs)

    @classmethod
    def from_settings(
        cls, path: str | ModelFolder, settings: ScorerSettings, device: str | torch.device | None = None
    ) -> "Scorer":
        """The scorer the flags of `score`, `eval` and `serve` describe (of a folder resolved with them, or of `path`
        resolved here); `device` overrides theirs."""
        return cls.from_pretrained(
            path,
            device=device or settings.device,
            max_length=settings.max_length,
            attn_implementation=settings.attn_implementation,
            prm_kind=settings.prm_kind,
            prm_mode=settings.prm_mode,
            prm_reference=settings.prm_reference,
            tokens_per_batch=settings.tokens_per_batch,
            tokens_per_call=settings.tokens_per_call,
            tokens_per_row=settings.tokens_per_row or None,
            overlength=settings.overlength,
        )

    @property
    def mode(self) -> str:
        return self.model.config.mode

    def batches(self, encs: list[Encoded], cached: bool) -> list[np.ndarray]:
        """Index batches, longest first, within `tokens_per_batch`.

        One-pass batches count padding (items x the longest), so long and short solutions
        do not share rows. With the prompt cache a question's trajectories are never split,
        so each prompt is encoded once, and the budget counts real tokens: the calls inside
        a batch sort rows by length themselves.
        """
        budget = self.tokens_per_batch or (self.budgets.cached if cached else self.budgets.one_pass)
        cost = np.array([e.n_tokens * len(self.model.streams) for e in encs])
        if not cached:
            order = np.argsort(-cost, kind="stable")
            return [order[a:b] for a, b in token_runs(cost[order], budget)]
        groups: dict[tuple[int, ...], list[int]] = {}
        for i, e in enumerate(encs):
            groups.setdefault(tuple(e.prompt), []).append(i)
        blocks = sorted(groups.values(), key=lambda g: -cost[g].max())
        runs = token_runs([cost[g].sum() for g in blocks], budget, padded=False)
        return [np.array([i for g in blocks[a:b] for i in g]) for a, b in runs]

    @property
    def max_length(self) -> int:
        """Tokens per stream; what a longer trajectory gets is the encoder's `overlength` policy."""
        return self.encoder.max_length

    def encode(
        self,
        trajs: list[Trajectory],
        names: list[str] | None = None,
        skip_invalid: bool = False,
        skip_unscorable: bool = False,
    ) -> tuple[list[Encoded], list[tuple[int, str]]]:
        """The encodings `score` takes, of every trajectory the model can read, in input order, and (index, one-line
        message) of each it cannot: an empty field, step-tag text, a first step past max_length. Such a trajectory
        raises DataError unless `skip_invalid` (or, for one past max_length only, `skip_unscorable`: evaluation counts
        those rows and goes on). Identical trajectories (common in sampled Best-of-N pools) share one
        encoding, which `score` then scores once; `names[i]` (default "trajectory i") starts each message."""
        names = names or [f"trajectory {i}" for i in range(len(trajs))]
        seen: dict[tuple, Encoded] = {}
        encs, problems, cut = [], [], []
        for i, (traj, where) in enumerate(zip(trajs, names, strict=True)):
            key = (traj.question, tuple(traj.steps))
            try:
                enc = seen[key] if key in seen else self.encoder.encode(validate(traj, where), where)
            except DataError as error:
                if not (skip_invalid or (skip_unscorable and isinstance(error, Unscorable))):
                    raise
                problems.append((i, str(error)))
                continue
            seen[key] = enc
            encs.append(enc)
            if enc.n_dropped or enc.windowed:
                cut.append(where)
        if cut:
            what = {
                "head": "their trailing steps are not scored",
                "tail": "their leading steps are not scored",
                "window": "every step is scored in overlapping windows",
            }[self.encoder.overlength]
            log.warning(
                "%d of %d trajectories exceed max_length=%d: %s (%s%s)",
                len(cut),
                len(encs),
                self.max_length,
                what,
                ", ".join(cut[:5]),
                " ..." if len(cut) > 5 else "",
            )
        return encs, problems

    def score(self, encs: list[Encoded], progress: bool = True) -> StepScores:
        """Scores of `encode`'s encodings, in their order; an encoding given twice (the same object) is scored once.
        A trajectory cut at `max_length` gets scores for the steps it kept only; a windowed one for every step."""
        first: dict[int, int] = {}
        which = np.array([first.setdefault(id(e), i) for i, e in enumerate(encs)], dtype=np.int64)
        distinct = np.unique(which)
        unique = [encs[i] for i in distinct]
        windowed = np.array([e.windowed for e in unique], dtype=bool)
        plain = [e for e in unique if not e.windowed]
        cached = False if self.implicit else self.prefix_cache  # an implicit PRM reads plain rows only
        if cached is None:  # past DENSE_MAX a row's own mask would grow with the square of its length
            shared = len(plain) >= CACHE_FROM * len({tuple(e.prompt) for e in plain})
            cached = shared and all(e.n_tokens <= DENSE_MAX for e in plain)
        scores = self._score(plain, cached, progress)
        if windowed.any():
            scores = concat([scores, self._windows([e for e in unique if e.windowed])])
            scores = scores.select(
                np.argsort(np.concatenate([np.flatnonzero(~windowed), np.flatnonzero(windowed)]), kind="stable")
            )
        return scores.select(np.searchsorted(distinct, which))

    @torch.inference_mode()
    def _windows(self, encs: list[Encoded]) -> StepScores:
        """Trajectories past max_length under the "window" policy. Each stream reads each step in the window where it
        has the most context: L2R in the first window (`step_windows`) that holds it, with the steps before it; R2L the
        same on the reversed steps, with the steps after it. The heads then fuse a step's two hidden states as in one
        pass."""
        states = {}
        for stream in self.model.streams:
            items, where, base = [], [], 0
            for enc in encs:
                T = len(enc.steps)
                runs = step_windows(
                    stream_order([len(s) for s in enc.steps], stream), self.max_length - len(enc.prompt)
                )
                sizes = np.array([b - a for a, b in runs])
                starts = base + np.cumsum(sizes) - sizes
                at = [starts[j] + (u if stream == "l2r" else sizes[j] - 1 - u) for j, u in first_runs(runs, T)]
                where += stream_order(at, stream)  # forward step order
                items += [
                    Encoded(enc.prompt, enc.steps[a:b] if stream == "l2r" else enc.steps[T - b : T - a], None)
                    for a, b in runs
                ]
                base += int(sizes.sum())
            cost = [e.n_tokens for e in items]
            found = []
            for a, b in token_runs(cost, self.tokens_per_batch or self.budgets.one_pass):
                batch = pack(items[a:b], stream, share_prefix=False, pad_id=self.tokenizer.pad_token_id)
                check_tags(batch, self.model.config.step_tag_id, self.encoder.template.unique_tag)
                keys = ("input_ids", "position_ids", "unit_ids", "stream_ids", f"{stream}_index")
                found.append(self.model.tag_states(**to_device({k: batch[k] for k in keys}, self.model.device)))
            states[stream] = torch.cat(found)[torch.tensor(where, device=self.model.device)]
        offsets = offsets_of([len(e.steps) for e in encs])
        out = self.model.heads(states.get("l2r"), states.get("r2l"), torch.from_numpy(offsets))
        host = lambda x: None if x is None else x.double().cpu().numpy()  # noqa: E731
        spec = MODE_TABLE[self.mode]
        return StepScores(
            offsets, host(out.fused), host(out.l2r), host(out.r2l), host(out.sigma) if spec.fusion else None
        )

    @torch.inference_mode()
    def _score(self, encs: list[Encoded], cached: bool, progress: bool) -> StepScores:
        lengths = np.array([len(e.steps) for e in encs], dtype=np.int64)
        collect = Collector(offsets_of(lengths), self.mode)
        device = self.model.device
        for idx in tqdm(self.batches(encs, cached), desc=f"scoring ({self.mode})", disable=not progress, unit="batch"):
            items, pad = [encs[i] for i in idx], self.tokenizer.pad_token_id
            if self.implicit:
                collect(idx, self.model(items))
                continue
            if cached:
                batch = pack_cached(items, self.mode, self.tokens_per_call, pad)
            else:
                batch = pack(items, self.mode, self.share_prefix, self.tokens_per_row, pad)
            check_tags(batch, self.model.config.step_tag_id, self.encoder.template.unique_tag)
            run = self.model.score_with_prefix if cached else self.model
            collect(idx, run(**to_device(batch, device)))
        return collect.scores()


def to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    """The batch on `device`, copied from pinned memory without waiting on a GPU. `chunks` stays on the host:
    the prompt cache loops over it, and reading it from a GPU would wait for every call before."""
    if device.type != "cuda":
        return {k: v.to(device) for k, v in batch.items()}
    return {k: v if k == "chunks" else v.pin_memory().to(device, non_blocking=True) for k, v in batch.items()}


class Collector:
    """Model outputs of batches in any order -> one StepScores in input order (float64 logits; sigma as is).

    Logits are kept rather than probabilities: in float32, sigmoids of logits above about
    9 round to a few values, and Best-of-N would then choose among tied candidates by pool order.
    The outputs stay on the model's device until `scores`, so a GPU is never waited on per batch.
    """

    KEYS = ("fused", "l2r", "r2l", "sigma")

    def __init__(self, offsets: np.ndarray, mode: str):
        self.offsets, self.mode = offsets, mode
        self.dest: list[np.ndarray] = []
        self.parts: dict[str, list[torch.Tensor]] = {k: [] for k in self.KEYS}

    def __call__(self, idx: np.ndarray, result: BiPRMOutput) -> None:
        self.dest.append(step_positions(self.offsets, idx))
        for key, parts in self.parts.items():
            value = getattr(result, key)
            if value is not None:
                parts.append(value.detach())

    def scores(self) -> StepScores:
        spec, out = MODE_TABLE[self.mode], {}
        dest = np.concatenate(self.dest) if self.dest else np.zeros(0, dtype=np.int64)
        for key, parts in self.parts.items():
            out[key] = np.zeros(self.offsets[-1])
            if parts:
                out[key][dest] = torch.cat(parts).double().cpu().numpy()
        return StepScores(
            offsets=self.offsets,
            fused=out["fused"],
            l2r=out["l2r"] if "l2r" in spec.streams else None,
            r2l=out["r2l"] if "r2l" in spec.streams else None,
            sigma=out["sigma"] if spec.fusion is not None else None,
        )
