"""What gets evaluated: score sources, each a labelled source of step probabilities.

A source is one stream of one checkpoint (a `bi` checkpoint gives three: its fused output
and its L2R and R2L streams), or the mean of several checkpoints' probabilities (the
paper's 2×L2R / 2×R2L ensembles). Every source reads its checkpoints through the score
cache, so the three sources of one checkpoint cost one scoring pass. (A checkpoint's
training mode, `checkpoint_mode`, is another thing: l2r, r2l, bi-static or bi.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from biprm.scoring.aggregate import mean_of_probabilities
from biprm.folder import resolve
from biprm.config import CHECKPOINT_ROLES, MODE_TABLE
from biprm.modeling import BiPRMConfig, encoder_for, prm_config
from biprm.data.trajectory import Trajectory
from biprm.evaluation.cache import FOREIGN_MODE, ScoreCache
from biprm.evaluation.ledger import refuse_unscorable
from biprm.data.names import distinct_labels, refuse_repeats
from biprm.scoring.step_scores import StepScores

# Ablation rows in the paper's order: (role, expected checkpoint mode, row label).
ROLES = (
    ("l2r", "l2r", "w/o R2L"),
    ("r2l", "r2l", "w/o L2R"),
    ("bi-static", "bi-static", "w/o Dynamic"),
    ("2xl2r", "l2r", "2×L2R"),
    ("2xr2l", "r2l", "2×R2L"),
    ("bi", "bi", "BiPRM"),
)


@dataclass
class ScoreSource:
    """`checkpoints` averaged (one for a plain model); `stream` picks fused, l2r or r2l."""

    key: str
    checkpoints: list[str]
    stream: str = "fused"

    @property
    def kind(self) -> str:
        """The checkpoint's training mode, or "ensemble"."""
        return checkpoint_mode(self.checkpoints[0]) if len(self.checkpoints) == 1 else "ensemble"

    def scores(self, cache: ScoreCache, trajs: list[Trajectory]) -> StepScores:
        """The source's logits in `fused`; a single checkpoint's fused view keeps its streams and gate."""
        parts = [cache.scores(c, trajs) for c in self.checkpoints]
        if len(parts) == 1 and self.stream == "fused":
            return parts[0]
        logits = [getattr(p, self.stream) for p in parts]
        if any(x is None for x in logits):
            raise ValueError(f"score source {self.key!r}: a checkpoint has no {self.stream!r} stream")
        return StepScores(parts[0].offsets, logits[0] if len(logits) == 1 else mean_of_probabilities(logits))


def checkpoint_config(ckpt: str, prm_kind: str | None = None) -> dict:
    """A biprm checkpoint's config.json (one trained `--init-from` another PRM records that PRM's `prm_kind` too), or
    for a PRM trained elsewhere (biprm.prms) the mode it is evaluated in and its kind as `trained_elsewhere`; any other
    folder is refused in one line (see biprm.folder.resolve)."""
    folder = resolve(ckpt, prm_kind)
    if folder.trained_elsewhere:
        return {"mode": FOREIGN_MODE, "trained_elsewhere": folder.kind}
    return folder.config


def checkpoint_mode(ckpt: str) -> str:
    return checkpoint_config(ckpt)["mode"]


def checkpoint_sources(ckpt: str, prefix: str = "", prm_kind: str | None = None) -> list[ScoreSource]:
    """A two-stream checkpoint's fused output and each of its streams, labelled so they cannot pass for separate
    models."""
    config = checkpoint_config(ckpt, prm_kind)
    mode, kind = config["mode"], config.get("trained_elsewhere")
    if kind:  # the training-free rows: what reversal alone does to this PRM
        streams = [
            ("l2r", f"{kind} (as shipped)"),
            ("r2l", f"{kind}: steps reversed, zero-shot"),
            ("fused", f"{kind}: static average, zero-shot"),
        ]
        return [ScoreSource(prefix + label, [ckpt], stream) for stream, label in streams]
    if MODE_TABLE[mode].fusion is None:
        return [ScoreSource(prefix + mode, [ckpt])]
    streams = [("fused", f"{mode} (fused)"), ("l2r", f"{mode}: L2R stream"), ("r2l", f"{mode}: R2L stream")]
    return [ScoreSource(prefix + label, [ckpt], stream) for stream, label in streams]


def sources_of(ckpts: list[str], prm_kind: str | None = None) -> list[ScoreSource]:
    """The sources of several checkpoints; with more than one, keys start with the folder's label (`models_given`),
    so two folders of one name never share rows."""
    labels = [m["label"] for m in models_given(ckpts, prm_kind)]
    return [
        m for c, label in zip(ckpts, labels) for m in checkpoint_sources(c, f"{label}: " * (len(ckpts) > 1), prm_kind)
    ]


def models_given(ckpts: list[str], prm_kind: str | None = None) -> list[dict]:
    """Per --model: its label (the shortest distinct tail of its resolved path), that path and its kind (a training
    mode, or the kind of a PRM trained elsewhere), as the results record them; a folder given twice is refused."""
    paths = refuse_repeats(ckpts, "--model")
    configs = [checkpoint_config(c, prm_kind) for c in ckpts]
    return [
        {"label": label, "path": path, "kind": config.get("trained_elsewhere") or config["mode"]}
        for label, path, config in zip(distinct_labels(paths), paths, configs)
    ]


def ablation_sources(ckpts: dict[str, str]) -> list[ScoreSource]:
    """Separately trained models keyed by role (l2r, r2l, bi-static, bi, optional l2r-2 / r2l-2), paper row order.

    A checkpoint whose mode does not match its role is refused: a swapped flag would silently mislabel a row.
    """
    unknown = set(ckpts) - set(CHECKPOINT_ROLES)
    if unknown:
        raise ValueError(f"unknown ablation role(s) {sorted(unknown)}; use {', '.join(CHECKPOINT_ROLES)}")
    members = {role: [ckpts[role]] for role in ("l2r", "r2l", "bi-static", "bi") if role in ckpts}
    for base in ("l2r", "r2l"):
        if f"{base}-2" in ckpts:
            if base not in ckpts:
                raise ValueError(f"--{base}-2 needs --{base}: the ensemble averages the two")
            members[f"2x{base}"] = [ckpts[base], ckpts[f"{base}-2"]]
    sources = []
    for role, expected, _ in ROLES:
        for ckpt in members.get(role, []):
            if checkpoint_mode(ckpt) != expected:
                raise ValueError(
                    f"{ckpt} is a {checkpoint_mode(ckpt)!r} checkpoint, but the {role!r} row needs {expected!r}"
                )
        if role in members:
            sources.append(ScoreSource(role, members[role]))
    return sources


def score_sources(sources: list[ScoreSource], cache: ScoreCache, trajs: list[Trajectory]) -> dict[str, StepScores]:
    """Every source's scores; under --on-overlength refuse, a row some source could not score at all stops here, for
    every eval command alike, fresh or from the cache."""
    scores = {m.key: m.scores(cache, trajs) for m in sources}
    if getattr(cache.settings, "on_overlength", "flag") == "refuse":
        refuse_unscorable(trajs, scores, cache.settings.max_length)
    return scores


def token_lengths(ckpt: str, trajs: list[Trajectory], cache: ScoreCache) -> np.ndarray:
    """Tokens of one stream (prompt + all steps) per trajectory, with the checkpoint's own tokenizer."""

    def compute() -> np.ndarray:
        folder = resolve(ckpt)
        tokenizer = folder.tokenizer
        config = prm_config(folder, tokenizer) if folder.trained_elsewhere else BiPRMConfig.from_pretrained(ckpt)
        encoder = encoder_for(config, tokenizer, max_length=2**62)
        return np.array([encoder.encode(t).n_tokens for t in trajs])

    return cache.array("lengths", ckpt, trajs, "n_tokens", compute)
