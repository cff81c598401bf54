"""Frozen trunk: train only the top K layers, on bottom-layer features cached on disk.

With the embeddings and the bottom N-K layers frozen, their output for a token never
changes during training, so it is computed once per trajectory and stream and kept in
a memory-mapped file. Training and scoring then run only the top K layers, the value
head and the gate. Every mode and seed shares one cache: `l2r` and `r2l` read their
half of it.

Layout of one trajectory in the cache (rows of H features, in the body's dtype):

    [ prompt (P) | L2R continuation s_1..s_T (C) | R2L continuation s_T..s_1 (C) ]

The prompt part is taken from the L2R row; under a causal mask the R2L row computes
the same values for it. The cached forward rebuilds, for each stream, the plain row
`prompt + continuation` that the full model would see and runs the top layers on it,
so both give the same losses, gradients and scores (tests/test_trunk.py).

The split is done on the body itself (`biprm.modeling.split`): two shallow views that
share its modules, one with the bottom layers and no final norm, one with the top
layers and the norm. That only works for bodies whose forward is "embed, layers,
norm" with a per-layer mask, which is true of the Llama family (Llama, Mistral, Qwen2).

Training reads the cache as a dataset (`TrunkData`: seeded length-grouped batches)
and a collator (`TrunkCollator`: micro-batches within a token budget), which
`BiPRMTrainer` runs through `BiPRMModel.forward_features`.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset
from tqdm.auto import tqdm

from biprm.data.encoding import Encoded, tag_ends
from biprm.data.writer import atomic_write
from biprm.modeling import BiPRMModel, split
from biprm.packing import token_runs
from biprm.offsets import offsets_of
from biprm.scoring.step_scores import StepScores
from biprm.scoring.scorer import Collector

_STORE = {torch.float32: np.float32, torch.bfloat16: np.uint16, torch.float16: np.float16}  # bf16 kept as raw bits

log = logging.getLogger(__name__)


def freeze_bottom(model: BiPRMModel, top_layers: int) -> None:
    """Stop gradients into the embeddings and the bottom N-K layers (what the cache stands for)."""
    split(model, top_layers)  # refuses other architectures and a bad K before anything changes
    body = model.backbone
    cut = body.config.num_hidden_layers - top_layers
    for module in [body.get_input_embeddings(), *body.layers[:cut]]:
        module.requires_grad_(False)


def _digest(*arrays: np.ndarray | bytes) -> str:
    h = hashlib.sha256()
    for a in arrays:
        h.update(a if isinstance(a, bytes) else np.ascontiguousarray(a).tobytes())
    return h.hexdigest()


def trunk_digest(model: BiPRMModel, top_layers: int) -> str:
    """Content hash of everything the cached features depend on: the frozen weights, the cut, the dtype, and the
    backbone's config (rope_theta, rms_norm_eps and the like change the features and are in no weight)."""
    bottom, _ = split(model, top_layers)
    config = {
        k: v for k, v in model.config.backbone_config.to_dict().items() if k != "_name_or_path"
    }  # where it was read from
    h = hashlib.sha256(f"{top_layers}:{model.dtype}:{json.dumps(config, sort_keys=True, default=str)}".encode())
    for name, tensor in sorted(bottom.state_dict().items()):
        h.update(name.encode())
        h.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


@dataclass
class Layout:
    """Where each trajectory's prompt and continuations sit in the feature file.

    Trajectories are stored shortest first (`order`), so a build runs in nearly
    padding-free batches and its progress is one number: how many of `order` are done.
    """

    tokens: np.ndarray  # token ids of every feature row, in file order
    starts: np.ndarray  # [n] first row of each trajectory
    order: np.ndarray  # [n] trajectories in file order
    prompt_lengths: np.ndarray  # [n]
    step_lengths: np.ndarray  # flat token count of every step
    step_offsets: np.ndarray  # [n+1] into step_lengths

    @classmethod
    def of(cls, encs: list[Encoded]) -> "Layout":
        sizes = np.array([len(e.prompt) + 2 * (e.n_tokens - len(e.prompt)) for e in encs], dtype=np.int64)
        order = np.argsort(sizes, kind="stable")
        starts = np.empty(len(encs), dtype=np.int64)
        starts[order] = np.concatenate([[0], np.cumsum(sizes[order])[:-1]])
        tokens = np.fromiter(
            (t for i in order for t in encs[i].stream("l2r") + encs[i].continuation("r2l")), dtype=np.int64
        )
        return cls(
            tokens=tokens,
            starts=starts,
            order=order,
            prompt_lengths=np.array([len(e.prompt) for e in encs], dtype=np.int64),
            step_lengths=np.array([len(s) for e in encs for s in e.steps], dtype=np.int64),
            step_offsets=offsets_of([len(e.steps) for e in encs]),
        )

    @property
    def n_rows(self) -> int:
        return len(self.tokens)

    @property
    def sizes(self) -> np.ndarray:
        """Feature rows of every trajectory (prompt + both continuations), in input order."""
        tokens = np.add.reduceat(self.step_lengths, self.step_offsets[:-1]) if len(self.step_lengths) else 0
        return self.prompt_lengths + 2 * tokens

    def rows(self, i: int, stream: str) -> tuple[np.ndarray, np.ndarray]:
        """Feature rows of trajectory i's plain `stream` row, and its step-tag columns in forward step order."""
        o, P = self.starts[i], self.prompt_lengths[i]
        lengths = self.step_lengths[self.step_offsets[i] : self.step_offsets[i + 1]]
        C = int(lengths.sum())
        start = o + P if stream == "l2r" else o + P + C
        rows = np.concatenate([np.arange(o, o + P), np.arange(start, start + C)])
        return rows, tag_ends(lengths, stream, P)


class TrunkCache:
    """Memory-mapped bottom-layer features of a list of encodings, built once and resumable.

    The folder name is a hash of the frozen weights, the compute dtype and the token
    ids, so a changed backbone, cut, precision or dataset can never read stale features.
    `dtype=torch.bfloat16` runs the trunk under bf16 autocast and stores bf16 (half the
    disk); None runs and stores in the model's own dtype, bit for bit what the full
    model computes. A build writes into the final file and records after every flushed
    batch how far it got; a killed build resumes there.
    """

    def __init__(
        self,
        root: str | Path,
        model: BiPRMModel,
        top_layers: int,
        encs: list[Encoded],
        dtype: torch.dtype | None = None,
    ):
        self.model: BiPRMModel | None = model
        self.top_layers = top_layers
        self.dtype = dtype or model.dtype
        self.autocast = dtype is not None and dtype != model.dtype
        self.layout = Layout.of(encs)
        layout = self.layout
        key = _digest(
            f"{trunk_digest(model, top_layers)}:{self.dtype}:{self.autocast}".encode(),
            layout.tokens,
            layout.starts,
            layout.prompt_lengths,
            layout.step_lengths,
            layout.step_offsets,
        )
        self.dir = Path(root) / key[:24]
        self.hidden = model.config.backbone_config.hidden_size
        self._features: np.memmap | None = None

    @property
    def complete(self) -> bool:
        return (self.dir / "done").exists()

    def build(self, tokens_per_batch: int = 8192, progress: bool = True) -> "TrunkCache":
        """Compute the features not yet on disk. Only this needs the model: the cache lets go of it
        afterwards, so that a caller who drops the model frees its memory while the cache stays in use.
        Another process building the same cache (two runs on the same data) holds its lock: this one waits,
        then finds the features built, rather than writing into the same file."""
        if not self.complete:
            self.dir.mkdir(parents=True, exist_ok=True)
            with open(self.dir / "lock", "w") as lock:
                try:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    log.warning("trunk cache %s: another process is building it; waiting for it", self.dir)
                    fcntl.flock(lock, fcntl.LOCK_EX)
                if not self.complete:
                    self._build(tokens_per_batch, progress)
        self.model = None
        return self

    def _build(self, tokens_per_batch: int, progress: bool) -> None:
        layout = self.layout
        path, state = self.dir / "features.bin", self.dir / "progress.json"
        done = json.loads(state.read_text())["done"] if state.exists() and path.exists() else 0
        out = np.memmap(path, dtype=_STORE[self.dtype], mode="r+" if done else "w+", shape=(layout.n_rows, self.hidden))
        bottom, _ = split(self.model, self.top_layers)
        sizes = layout.sizes[layout.order]
        device = self.model.device
        with (
            torch.inference_mode(),
            torch.autocast(device.type, dtype=self.dtype, enabled=self.autocast),
            tqdm(total=len(sizes), initial=done, desc="trunk cache", unit="traj", disable=not progress) as bar,
        ):
            for a, b in _runs(sizes, done, tokens_per_batch):
                rows = [layout.rows(int(i), s) for i in layout.order[a:b] for s in ("l2r", "r2l")]
                ids = _pad([layout.tokens[r] for r, _ in rows]).to(device)
                hidden = bottom(input_ids=ids, position_ids=_positions(ids), use_cache=False).last_hidden_state
                for k, (r, _) in enumerate(rows):
                    out[r] = _to_store(hidden[k, : len(r)].to(self.dtype))
                out.flush()
                atomic_write(state, lambda f: f.write(json.dumps({"done": b}).encode()))
                bar.update(b - a)
        (self.dir / "done").write_text("ok\n")

    @property
    def features(self) -> np.memmap:
        if self._features is None:
            if not self.complete:
                raise RuntimeError(f"trunk cache {self.dir} is not built; call build() first")
            shape = (self.layout.n_rows, self.hidden)
            self._features = np.memmap(self.dir / "features.bin", dtype=_STORE[self.dtype], mode="r", shape=shape)
        return self._features

    def batch(
        self,
        idx: np.ndarray,
        streams: tuple[str, ...],
        labels: list[list[float]] | None = None,
        device: torch.device | str = "cpu",
    ) -> dict[str, torch.Tensor]:
        """`model.forward_features` inputs for trajectories `idx` on `device`: one plain row per stream, features
        gathered from the file."""
        pieces = [(s, self.layout.rows(int(i), s)) for s in streams for i in idx]
        width = max(len(r) for _, (r, _) in pieces)
        feats = np.zeros((len(pieces), width, self.hidden), dtype=self.features.dtype)
        for k, (_, (r, _)) in enumerate(pieces):
            feats[k, : len(r)] = self.features[r]
        n_steps = self.layout.step_offsets[idx + 1] - self.layout.step_offsets[idx]
        batch = {
            "features": _from_store(feats, self.dtype),
            "position_ids": torch.arange(width).expand(len(pieces), width),
            "step_offsets": torch.from_numpy(offsets_of(n_steps)),
            "top_layers": self.top_layers,
        }
        for s in streams:
            batch[f"{s}_index"] = torch.from_numpy(
                np.concatenate([k * width + ends for k, (t, (_, ends)) in enumerate(pieces) if t == s]).astype(np.int64)
            )
        if labels is not None:
            batch["labels"] = torch.tensor([y for i in idx for y in labels[int(i)]], dtype=torch.float32)
        return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


@torch.inference_mode()
def cached_scores(
    model: BiPRMModel, cache: TrunkCache, tokens_per_batch: int = 8192, progress: bool = False
) -> StepScores:
    """Scorer.score from the cache: probabilities per step in input order, in length-sorted batches."""
    layout, streams = cache.layout, model.streams
    collect = Collector(layout.step_offsets.copy(), model.config.mode)
    for a, b in tqdm(
        _runs(layout.sizes[layout.order], 0, tokens_per_batch), desc="scoring", disable=not progress, unit="batch"
    ):
        idx = layout.order[a:b]
        collect(idx, model.forward_features(**cache.batch(idx, streams, device=model.device)))
    return collect.scores()


class TrunkData(Dataset):
    """A built cache's trajectories with their labels, as a training set: item i is the index i,
    and `TrunkCollator` gathers the features of a batch of indices."""

    def __init__(self, cache: TrunkCache, labels: list[list[float]]):
        self.cache, self.labels = cache, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> int:
        return i

    def batches(self, batch_size: int, epochs: float, seed: int) -> list[np.ndarray]:
        return grouped_batches(self.cache.layout.sizes, batch_size, epochs, seed)


def grouped_batches(lengths: np.ndarray, batch_size: int, epochs: float, seed: int) -> list[np.ndarray]:
    """Seeded length-grouped batches over every epoch: shuffle, sort within windows of 8 batches
    (less padding), then shuffle the batches of all epochs together."""
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    for _ in range(math.ceil(epochs)):
        perm = rng.permutation(len(lengths))
        window = 8 * batch_size
        for a in range(0, len(perm), window):
            chunk = perm[a : a + window]
            chunk = chunk[np.argsort(-lengths[chunk], kind="stable")]
            out += [chunk[b : b + batch_size] for b in range(0, len(chunk), batch_size)]
    head = out[: round(math.ceil(len(lengths) / batch_size) * epochs)]
    return [head[i] for i in rng.permutation(len(head))]


MICRO_TOKENS = 4096  # feature rows (both streams, padded) per backward pass: bounds activation memory on long rows


def micro_batches(sizes: np.ndarray, batch: np.ndarray, budget: int = MICRO_TOKENS) -> list[np.ndarray]:
    """`batch` cut into consecutive parts of at most `budget` padded feature rows (at least one trajectory each)."""
    return [batch[a:b] for a, b in token_runs(sizes[batch], budget)]


@dataclass
class TrunkCollator:
    """Indices of `TrunkData` -> the batch cut into micro-batches within `budget` feature rows.

    `BiPRMTrainer` runs one backward pass per part, its loss weighted by its share of the
    batch's trajectories: every objective is a mean over trajectories, so the summed
    gradient is the whole batch's.
    """

    data: TrunkData
    streams: tuple[str, ...]
    budget: int = MICRO_TOKENS

    def __call__(self, idx: list[int]) -> dict[str, list]:
        batch = np.asarray(idx, dtype=np.int64)
        parts = micro_batches(self.data.cache.layout.sizes, batch, self.budget)
        return {
            "parts": [self.data.cache.batch(p, self.streams, self.data.labels) for p in parts],
            "shares": [len(p) / len(batch) for p in parts],
        }


def _runs(sizes: np.ndarray, start: int, budget: int) -> list[tuple[int, int]]:
    """[a, b) runs of the (ascending) `sizes` from `start` within `budget` tokens: two padded rows per trajectory."""
    return token_runs(2 * sizes, budget, start=start)


def _pad(rows: list[np.ndarray]) -> torch.Tensor:
    """Right-padded [R, L] ids; under the plain causal mask the padding is invisible to real tokens."""
    width = max(len(r) for r in rows)
    out = np.zeros((len(rows), width), dtype=np.int64)
    for k, r in enumerate(rows):
        out[k, : len(r)] = r
    return torch.from_numpy(out)


def _positions(ids: torch.Tensor) -> torch.Tensor:
    return torch.arange(ids.shape[1], device=ids.device).expand_as(ids)


def _to_store(x: torch.Tensor) -> np.ndarray:
    x = x.detach().cpu()
    return x.view(torch.int16).numpy().view(np.uint16) if x.dtype == torch.bfloat16 else x.numpy()


def _from_store(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.view(torch.int16).view(torch.bfloat16) if dtype == torch.bfloat16 else t
