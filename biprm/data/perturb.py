"""Step-boundary perturbations of labelled trajectories (the paper's robustness study).

Protocol: `perturb_dataset(trajs, seed)` perturbs trajectory i with
`perturb(traj, mix_seed(seed, i))`, so each row's perturbation depends only on (seed, i)
and not on the rows around it. `perturb` seeds one `random.Random`, draws one kind
uniformly among those of `kinds` that apply (merge needs >= 2 steps, split a step with
an inner space, noise always applies), and the chosen function draws its position from
that same generator.

The first error f (0-based, -1 = none) is re-mapped so it still points at the wrong
reasoning, and labels are rebuilt ProcessBench-style from it (1 before f, 0 from f on):
merge of (t, t+1): f <= t keeps f, f >= t+1 becomes f-1 (a merged step holding the error
is the error); split of step t: f <= t keeps f (the FIRST half of a split error step
is the error, the earliest point where the wrong text starts), f > t becomes f+1; noise
at position p: p <= f shifts f to f+1, otherwise f is kept, so the filler is labelled 1
before the error or in a clean trajectory and 0 after the error.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import replace

from biprm.data.trajectory import Trajectory, labels_from_first_error

KINDS = ("merge", "split", "noise")
FILLERS = (
    "Let me double-check the previous step.",
    "Now continue with the next part.",
    "Let me organize what we know so far.",
    "We proceed step by step.",
)
_SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+")
_SPACE = re.compile(r"\s+")


def mix_seed(seed: int, index: int) -> int:
    """A per-row seed that is stable across runs and Python hash randomisation."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{index}".encode()).digest()[:8], "big")


def _first_error(traj: Trajectory) -> int:
    if traj.labels is not None:
        return traj.first_error
    if "first_error" in traj.meta:
        return int(traj.meta["first_error"])
    raise ValueError("a perturbation needs step labels or meta['first_error']")


def _rebuild(traj: Trajectory, steps: list[str], first_error: int, kind: str, step: int) -> Trajectory:
    """A new Trajectory; the input (and its meta dict) stays untouched."""
    meta = {**traj.meta, "first_error": first_error, "perturbation": {"kind": kind, "step": step}}
    return replace(traj, steps=steps, labels=labels_from_first_error(first_error, len(steps)), meta=meta)


def merge_steps(traj: Trajectory, rng: random.Random) -> Trajectory:
    """Join a random adjacent pair (t, t+1) into one step with a space."""
    if len(traj.steps) < 2:
        raise ValueError("merge needs at least two steps")
    t = rng.randrange(len(traj.steps) - 1)
    f = _first_error(traj)
    merged = f"{traj.steps[t].rstrip()} {traj.steps[t + 1].lstrip()}"
    steps = traj.steps[:t] + [merged] + traj.steps[t + 2 :]
    return _rebuild(traj, steps, f if f <= t else f - 1, "merge", t)


def split_step(traj: Trajectory, rng: random.Random) -> Trajectory:
    """Cut a random multi-sentence step at its sentence break nearest the middle; with no
    such step, cut a step with an inner space at the space nearest its middle."""
    for pattern in (_SENTENCE_BREAK, _SPACE):
        candidates = [t for t, s in enumerate(traj.steps) if pattern.search(s.strip())]
        if candidates:
            break
    else:
        raise ValueError("split needs a step with an inner space")
    t = rng.choice(candidates)
    text = traj.steps[t].strip()
    cut = min(pattern.finditer(text), key=lambda m: abs(m.start() + m.end() - len(text)))
    steps = traj.steps[:t] + [text[: cut.start()], text[cut.end() :]] + traj.steps[t + 1 :]
    f = _first_error(traj)
    return _rebuild(traj, steps, f if f <= t else f + 1, "split", t)


def insert_noise(traj: Trajectory, rng: random.Random) -> Trajectory:
    """Insert a content-free filler so it becomes step p (p = len(steps) appends it)."""
    p = rng.randint(0, len(traj.steps))
    steps = traj.steps[:p] + [rng.choice(FILLERS)] + traj.steps[p:]
    f = _first_error(traj)
    return _rebuild(traj, steps, f + 1 if p <= f else f, "noise", p)


PERTURBATIONS: dict[str, Callable[[Trajectory, random.Random], Trajectory]] = {
    "merge": merge_steps,
    "split": split_step,
    "noise": insert_noise,
}


def _applies(kind: str, traj: Trajectory) -> bool:
    if kind not in PERTURBATIONS:
        raise ValueError(f"unknown perturbation {kind!r}; choose from {KINDS}")
    if kind == "merge":
        return len(traj.steps) >= 2
    if kind == "split":
        return any(_SPACE.search(s.strip()) for s in traj.steps)
    return True


def perturb(traj: Trajectory, seed: int, kinds: Sequence[str] = KINDS) -> Trajectory:
    """One perturbation, kind and position both drawn from random.Random(seed)."""
    usable = [k for k in kinds if _applies(k, traj)]
    if not usable:
        raise ValueError(f"none of {tuple(kinds)} applies to this trajectory")
    rng = random.Random(seed)
    return PERTURBATIONS[rng.choice(usable)](traj, rng)


def perturb_dataset(trajs: Sequence[Trajectory], seed: int, kinds: Sequence[str] = KINDS) -> list[Trajectory]:
    """Perturb row i with mix_seed(seed, i): same seed, same perturbed benchmark."""
    return [perturb(t, mix_seed(seed, i), kinds) for i, t in enumerate(trajs)]
