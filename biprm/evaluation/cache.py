"""Step scores cached per (model, dataset), so no trajectory is ever scored twice.

Keys are content hashes, never paths: a model is its config.json plus the bytes of its
safetensors weights, a dataset is its questions and steps. Copying a checkpoint keeps
its scores; retraining into the same folder, or editing one step, invalidates them.
Weight files are hashed once per (path, size, mtime), remembered in the cache folder.
Scores live as `<root>/<model key>/scores-<dataset key>-logits-<settings>.npz` (float64
logits); the settings part holds what changes the numbers (device type, hence dtype, max_length, the attention kernel
and the overlength policy). A segmenter changes the steps, hence the dataset key: two cuts never share scores.
While a model scores a dataset, each chunk of 1024 trajectories (per process) is kept in `<same name>.parts/` as it
is computed, so Ctrl-C or a kill loses at most the chunk in flight and the same command goes on from there.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch

from biprm.config import ScorerSettings
from biprm.folder import resolve
from biprm.prms import weight_files
from biprm.data.trajectory import Trajectory
from biprm.data.writer import atomic_write
from biprm.evaluation.sharing import score_shared
from biprm.scoring.process_group import process_state
from biprm.scoring.score_file import chunks
from biprm.scoring.scorer import Scorer, default_device
from biprm.scoring.step_scores import StepScores, concat, load_scores, save_scores

log = logging.getLogger(__name__)

CHUNK = 1 << 24
FOREIGN_MODE = "bi-static"  # a PRM trained elsewhere is evaluated as shipped, reversed (zero-shot) and their average


def load_scorer(settings: ScorerSettings, ckpt: str) -> Scorer:
    """A scorer on this process's device: under `accelerate launch` one GPU per process, also for `device="cuda"`."""
    own = process_state().device
    device = torch.device(settings.device) if settings.device else own
    device = own if device.type == own.type and device.index is None else device
    folder = resolve(ckpt, settings.prm_kind, None, settings.prm_reference)
    return Scorer.from_settings(folder.reading(FOREIGN_MODE) if folder.trained_elsewhere else folder, settings, device)


def scorer_loader(settings: ScorerSettings) -> Callable[[str], Scorer]:
    """checkpoint -> its Scorer, loaded on first use only: a fully cached run never loads a model."""
    loaded: dict[str, Scorer] = {}

    def scorer(ckpt: str) -> Scorer:
        if ckpt not in loaded:
            loaded[ckpt] = load_scorer(settings, ckpt)
        return loaded[ckpt]

    return scorer


def dataset_key(trajs: list[Trajectory]) -> str:
    """Hash of questions and steps: what the scorer reads (labels and metadata do not change scores)."""
    h = hashlib.sha256()
    h.update(json.dumps([[t.question, t.steps] for t in trajs], ensure_ascii=False).encode())
    return h.hexdigest()


T = TypeVar("T")


def _read(path: Path, load: Callable[[Path], T]) -> T | None:
    """What `load` reads from a cache file; None when it is absent, or damaged (then it is named, removed and
    rebuilt)."""
    if not path.is_file():
        return None
    try:
        return load(path)
    except (
        Exception
    ) as error:  # a torn or corrupted .npz: zipfile.BadZipFile, EOFError, ValueError, a missing array ...
        log.warning(
            "cache file %s is damaged (%s: %s); removing it and computing it again", path, type(error).__name__, error
        )
        path.unlink(missing_ok=True)
        return None


def _kept_parts(parts: Path) -> list[StepScores]:
    """The chunks an interrupted scoring kept, in order, each named by its first trajectory; from the first one
    missing or damaged on, they are scored again."""
    kept, done = [], 0
    while (part := _read(parts / f"part-{done:09d}.npz", lambda p: load_scores(p)[""])) is not None:
        kept.append(part)
        done += len(part)
    return kept


class ScoringStopped(KeyboardInterrupt):
    """Ctrl-C during a scoring, saying how many trajectories of which model the cache keeps."""


def _value(path: Path) -> np.ndarray:
    with np.load(path) as z:
        return z["value"]


class ScoreCache:
    def __init__(self, root: str | Path, settings: ScorerSettings | None = None):
        self.root = Path(root)
        self.settings = settings or ScorerSettings()
        self._memo_path = self.root / "file_hashes.json"
        self._memo: dict[str, str] = json.loads(self._memo_path.read_text()) if self._memo_path.is_file() else {}
        self.scorer = scorer_loader(self.settings)
        self._model_keys: dict[str, str] = {}
        self.chunk = 1024  # trajectories scored and kept at a time, per process

    def file_hash(self, path: Path) -> str:
        stat = path.stat()
        memo = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"
        if memo not in self._memo:
            h = hashlib.sha256()
            with open(path, "rb") as f:
                while chunk := f.read(CHUNK):
                    h.update(chunk)
            self._memo[memo] = h.hexdigest()
            atomic_write(self._memo_path, lambda f: f.write(json.dumps(self._memo, indent=0).encode()))
        return self._memo[memo]

    def model_key(self, ckpt: str) -> str:
        if ckpt not in self._model_keys:
            folder = Path(ckpt)
            weights = weight_files(folder)
            if not (folder / "config.json").is_file() or not weights:
                raise FileNotFoundError(
                    f"{ckpt}: not a checkpoint folder (needs config.json and weights: *.safetensors or *.bin)"
                )
            h = hashlib.sha256((folder / "config.json").read_bytes())
            for w in weights:
                h.update(f"{w.name}:{self.file_hash(w)}".encode())
            self._model_keys[ckpt] = h.hexdigest()
        return self._model_keys[ckpt]

    def _path(self, kind: str, ckpt: str | None, trajs: list[Trajectory], tag: str) -> Path:
        model = self.model_key(ckpt)[:20] if ckpt else "data"
        return self.root / model / f"{kind}-{dataset_key(trajs)[:20]}-{tag}.npz"

    def scores(self, ckpt: str, trajs: list[Trajectory]) -> StepScores:
        device = torch.device(self.settings.device) if self.settings.device else default_device()
        kernel = (
            "" if self.settings.attn_implementation == "sdpa" else f"-{self.settings.attn_implementation}"
        )  # sdpa: the keys before the choice
        policy = (
            "" if self.settings.overlength == "head" else f"-{self.settings.overlength}"
        )  # head: the keys before the choice
        reference = (  # an implicit PRM's scores are its log-ratios to the reference LM: another reference, others
            f"-ref{self.model_key(self.settings.prm_reference)[:12]}" if self.settings.prm_reference else ""
        )
        tag = f"logits-{device.type}-len{self.settings.max_length}{kernel}{policy}{reference}"
        path = self._path("scores", ckpt, trajs, tag)
        if (cached := _read(path, lambda p: load_scores(p)[""])) is not None:
            return cached
        if not trajs:
            return score_shared(self.scorer, ckpt, trajs)
        scores = concat(self._score_in_chunks(ckpt, trajs, path.with_suffix(".parts")))
        save_scores(path, {"": scores})
        shutil.rmtree(path.with_suffix(".parts"))  # after the whole file: a kill in between loses nothing
        return scores

    def _score_in_chunks(self, ckpt: str, trajs: list[Trajectory], parts: Path) -> list[StepScores]:
        """The scores of `trajs`, a chunk of `self.chunk` trajectories per process at a time, each kept in `parts` as
        soon as it is computed (on every process of the launch, if there are several): an interrupted scoring goes on
        from the first chunk it lacks."""
        kept = _kept_parts(parts)
        done = sum(len(s) for s in kept)
        if done:
            log.info("%s: %d of %d trajectories already scored, in %s", ckpt, done, len(trajs), parts)
        size = self.chunk * process_state().num_processes
        try:
            for a, b in chunks(done, len(trajs), size, f"scoring {Path(ckpt).name}"):
                kept.append(score_shared(self.scorer, ckpt, trajs[a:b], progress=False))
                save_scores(parts / f"part-{a:09d}.npz", {"": kept[-1]})
                done = b
        except KeyboardInterrupt:
            raise ScoringStopped(
                f"scoring {ckpt}: {done} of {len(trajs)} trajectories are kept in {parts} (and every score finished "
                f"before, in {self.root}); the same command scores only the other {len(trajs) - done}"
            ) from None
        return kept

    def array(
        self,
        kind: str,
        ckpt: str | None,
        trajs: list[Trajectory],
        extra: str,
        compute: Callable[[], np.ndarray],
        retry: Callable[[np.ndarray], bool] | None = None,
    ) -> np.ndarray:
        """Any other per-trajectory array worth keeping (grades, token lengths), keyed like scores plus `extra`;
        a cached value for which `retry` is true (e.g. it holds timeouts) is computed again."""
        path = self._path(kind, ckpt, trajs, hashlib.sha256(extra.encode()).hexdigest()[:12])
        cached = _read(path, _value)
        if cached is not None and not (retry and retry(cached)):
            return cached
        value = np.asarray(compute())
        atomic_write(path, lambda f: np.savez(f, value=value))
        return value
