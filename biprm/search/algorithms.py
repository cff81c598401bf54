"""Best-of-N, beam search, DVTS and particle filtering over partial solutions, batched across questions.

Every level of every algorithm is one policy call and one PRM call for all live paths of
all questions in the batch (its_hub and search-and-learn loop over questions). The
semantics follow its_hub 1.2.0 and search-and-learn; docs/SEARCH.md lists where they
differ and why. Scores are step logits (as `StepScores`); a path's score is their
aggregate (`biprm.scoring.aggregate`, default "last" as in its_hub/reward-hub and search-and-learn).

Strategies say which PRM stream ranks paths while expanding and which one picks at the end:
fused/fused, l2r/fused (one fused rerank of the final paths), l2r/l2r.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol, Sequence

import numpy as np

from biprm.scoring.aggregate import aggregate
from biprm.scoring.step_scores import offsets_of
from biprm.search.config import Strategy
from biprm.data.segment import Segmenter
from biprm.search.policy import StepOut, recut
from biprm.search.steps import STEP_TOKEN
from biprm.scoring.paths import PathScore, PathScorer


class Policy(Protocol):
    """What a search asks of a policy: `biprm.search.policy.StepPolicy` implements it, tests script it."""

    tokens: int
    calls: int

    def prompt(self, question: str, steps: Sequence[str]) -> str: ...

    def reseed(self, seed: int) -> None: ...

    def state(self) -> dict: ...

    def restore(self, state: dict) -> None: ...

    def generate_step(self, prompts: list[str], n: int) -> list[StepOut]: ...

    def generate_solution(self, prompts: list[str], n: int, max_steps: int) -> list[list[StepOut]]: ...


@dataclass
class SearchPath:
    """A partial solution of question `q` (and of DVTS subtree `group`), with its latest scores."""

    q: int
    group: int = 0
    steps: tuple[str, ...] = ()
    capped: tuple[bool, ...] = ()  # per step: closed at the token cap
    finished: bool = False
    cut: bool = False  # finished by --max-depth, not by the policy: its text stops mid-solution
    tokens: int = 0  # policy tokens along this path
    scored: PathScore | None = None
    score: float = -np.inf  # aggregate of the ranking stream; -inf until scored or when no step fits the PRM

    def child(self, out: StepOut, max_depth: int) -> "SearchPath":
        steps, capped = (
            (self.steps + (out.text,), self.capped + (out.capped,)) if out.text else (self.steps, self.capped)
        )
        return replace(
            self,
            steps=steps,
            capped=capped,
            finished=out.finished or len(steps) >= max_depth,
            cut=not out.finished and len(steps) >= max_depth,
            tokens=self.tokens + out.tokens,
            scored=None,
            score=-np.inf,
        )


@dataclass
class Budget:
    """Cost per question. A call serves many questions, so its time and PRM tokens are split by each
    question's share of the call's work (generated tokens; characters scored); policy tokens are exact."""

    n: int
    values: dict[str, np.ndarray] = field(default_factory=dict)

    def charge(self, kind: str, qs: np.ndarray, work: np.ndarray, seconds: float, totals: dict[str, float]) -> None:
        share = np.bincount(qs, weights=work + 1e-9, minlength=self.n)
        share /= share.sum()
        for name, total in {f"{kind}_calls": None, f"{kind}_s": seconds, **totals}.items():
            add = (share > 0).astype(float) if total is None else total * share
            self.values[name] = self.values.get(name, np.zeros(self.n)) + add

    def to_json(self) -> dict[str, list[float]]:
        return {k: v.tolist() for k, v in self.values.items()}

    def restore(self, saved: dict[str, list[float]]) -> None:
        """Takes up the costs `to_json` gave (a resumed run's, from its checkpoint)."""
        self.values = {k: np.array(v) for k, v in saved.items()}

    def row(self, q: int, scale: float = 1.0) -> dict[str, float]:
        """Question q's costs, all but the call counts scaled (a part of a pool still took every call)."""
        return {
            k: round(float(v[q]) * (1.0 if k.endswith("_calls") else scale), 4) for k, v in sorted(self.values.items())
        }


class Search:
    """One search over a batch of questions: expands with the policy, scores with the PRM, keeps the accounts."""

    def __init__(
        self,
        questions: list[str],
        policy: Policy,
        scorer: PathScorer,
        max_depth: int = 16,
        aggregation: str = "last",
        strategy: Strategy = "fused",
        note: Callable[[str], None] = lambda _: None,
        segmenter: Segmenter | None = None,
        step_token: str = STEP_TOKEN,
    ):
        """`segmenter`, where given, cuts each solution drawn whole again (`recut`); `step_token` joins its pieces."""
        self.questions, self.policy, self.scorer, self.max_depth = questions, policy, scorer, max_depth
        self.segmenter, self.step_token = segmenter, step_token
        self.aggregation, self.strategy, self.note = (
            aggregation,
            strategy,
            note,
        )  # note: says what runs now (a progress bar's status)
        self.budget = Budget(len(questions))

    @property
    def ranking_stream(self) -> str:
        return "fused" if self.strategy == "fused" else "l2r"

    def roots(self, groups: int = 1) -> list[SearchPath]:
        return [SearchPath(q, g) for q in range(len(self.questions)) for g in range(groups)]

    def prompts(self, paths: list[SearchPath]) -> list[str]:
        return [self.policy.prompt(self.questions[p.q], p.steps) for p in paths]

    def charge_policy(self, paths: list[SearchPath], k: int, tokens: np.ndarray, start: float) -> None:
        """A policy call that gave k outputs per path (`tokens` each, path-major), charged to their questions."""
        qs = np.repeat([p.q for p in paths], k).astype(np.int64)
        self.budget.charge("policy", qs, tokens, time.perf_counter() - start, {"policy_tokens": tokens.sum()})

    def expand(self, paths: list[SearchPath], k: int) -> list[SearchPath]:
        """k children of every path in one policy call, path-major."""
        self.note(f"policy: {len(paths) * k} steps at depth {1 + max(len(p.steps) for p in paths)}")
        start = time.perf_counter()
        outs = self.policy.generate_step(self.prompts(paths), k)
        self.charge_policy(paths, k, np.array([o.tokens for o in outs], dtype=float), start)
        return [paths[i // k].child(o, self.max_depth) for i, o in enumerate(outs)]

    def draw(self, paths: list[SearchPath], k: int) -> list[SearchPath]:
        """k whole solutions from every path in one policy call, path-major (best-of-N's pool, `--pool-draw whole`)."""
        self.note(f"policy: {len(paths) * k} whole solutions")
        start = time.perf_counter()
        solutions = self.policy.generate_solution(self.prompts(paths), k, self.max_depth)
        if self.segmenter is not None:
            solutions = [recut(steps, self.segmenter, self.step_token, self.max_depth) for steps in solutions]
        self.charge_policy(
            paths, k, np.array([sum(o.tokens for o in steps) for steps in solutions], dtype=float), start
        )
        children = []
        for i, steps in enumerate(solutions):
            child = paths[i // k]
            for out in steps:
                child = child.child(out, self.max_depth)
            children.append(child)
        return children

    def score(self, paths: list[SearchPath], stream: str) -> None:
        """Score `paths` in one PRM call and set their scores; a path with no steps stays at -inf."""
        todo = [p for p in paths if p.steps]
        if not todo:
            return
        self.note(f"PRM: {len(todo)} paths")
        before, start = dict(self.scorer.tokens), time.perf_counter()
        results = self.scorer.score(
            [self.questions[p.q] for p in todo],
            [list(p.steps) for p in todo],
            streams="l2r" if stream == "l2r" else "fused",
        )
        spent = {f"prm_tokens_{s}": t - before.get(s, 0) for s, t in self.scorer.tokens.items()}
        chars = np.array([sum(map(len, p.steps)) for p in todo], dtype=float)
        self.budget.charge("prm", np.array([p.q for p in todo]), chars, time.perf_counter() - start, spent)
        for p, r, s in zip(todo, results, self.aggregate(results, stream)):
            p.scored, p.score = r, s

    def aggregate(self, results: list[PathScore], stream: str) -> np.ndarray:
        """One score per path from the stream's step logits; -inf where no step fit the PRM."""
        values = [ranked(r, stream) for r in results]
        lengths = np.array([len(v) for v in values])
        out = np.full(len(values), -np.inf)
        if lengths.any():
            kept = lengths > 0
            offsets = offsets_of(lengths[kept])
            out[kept] = aggregate(np.concatenate([v for v in values if len(v)]), offsets, self.aggregation)
        return out

    def finish(self, paths: list[SearchPath]) -> list[SearchPath]:
        """The final rerank of l2r-rerank: the finished paths scored once with both streams."""
        if self.strategy == "l2r-rerank":
            self.score(paths, "fused")
        return paths


def ranked(result: PathScore, stream: str) -> np.ndarray:
    """The step logits of `stream`; a PRM without that stream (an l2r checkpoint) ranks by its fused output."""
    values = getattr(result, stream, None)
    return np.asarray(result.fused if values is None else values, dtype=np.float64)


def top(paths: list[SearchPath], keep: int) -> list[SearchPath]:
    """The `keep` best paths of each (question, group), best first; ties keep their order."""
    qs, groups = np.array([p.q for p in paths]), np.array([p.group for p in paths])
    key = qs * (groups.max() + 1) + groups
    order = np.lexsort((-np.array([p.score for p in paths]), key))
    sorted_key = key[order]
    rank = np.arange(len(order)) - np.searchsorted(sorted_key, sorted_key, side="left")
    return [paths[i] for i in order[rank < keep]]


def grow(s: Search, paths: list[SearchPath]) -> list[SearchPath]:
    """One more step for every unfinished path, in place of it (order kept)."""
    live = [i for i, p in enumerate(paths) if not p.finished]
    paths = list(paths)
    for i, child in zip(live, s.expand([paths[i] for i in live], 1)):
        paths[i] = child
    return paths


def sample(
    s: Search,
    n: int,
    paths: list[SearchPath] | None = None,
    save: Callable[[list[SearchPath]], None] = lambda _: None,
    whole: bool = False,
) -> list[SearchPath]:
    """n independent solutions per question, unscored: the best-of-N pool, question-major, that every PRM then scores
    (the pick: the highest score, or `vote` weighted by probability). Drawn a level at a time, or `whole` in one call.
    `paths`, a pool part-drawn by a killed run, goes on from its last level; `save` gets the pool after every level."""
    if paths is None:
        paths = s.draw(s.roots(), n) if whole else s.expand(s.roots(), n)
        save(paths)
    while any(not p.finished for p in paths):
        paths = grow(s, paths)
        save(paths)
    return paths


def tree_search(s: Search, keep: int, k: int, groups: int) -> list[SearchPath]:
    """Keep the `keep` best paths of each group, give each unfinished one k children, repeat until all kept are
    finished.

    A finished path stays in the running for its group's slots (as in its_hub) but is never copied."""
    kept = s.roots(groups)
    while live := [p for p in kept if not p.finished]:
        children = s.expand(live, k)
        s.score(children, s.ranking_stream)
        kept = top(children + [p for p in kept if p.finished], keep)
    return s.finish(kept)


def beam_search(s: Search, n: int, width: int) -> list[SearchPath]:
    """its_hub's BeamSearch: `width` beams, each expanded n / width ways (the root too)."""
    if n % width:
        raise ValueError(f"beam search: N ({n}) must be a multiple of the width ({width})")
    return tree_search(s, keep=width, k=n // width, groups=1)


def dvts(s: Search, n: int, width: int) -> list[SearchPath]:
    """search-and-learn's DVTS: n / width independent subtrees, each keeping its best of `width` children per level."""
    if n % width:
        raise ValueError(f"DVTS: N ({n}) must be a multiple of the width ({width})")
    return tree_search(s, keep=1, k=width, groups=n // width)


def resample(paths: list[SearchPath], n: int, rng: np.random.Generator) -> list[SearchPath]:
    """n draws with replacement per question, weights softmax(score) (its_hub's multinomial resampling).
    `paths` holds n particles per question, question-major; a question whose particles all score -inf draws
    uniformly."""
    scores = np.array([p.score for p in paths]).reshape(-1, n)
    scores = np.where(np.isneginf(scores).all(1, keepdims=True), 0.0, scores)
    w = np.exp(scores - scores.max(1, keepdims=True))
    cdf = np.cumsum(w / w.sum(1, keepdims=True), axis=1)
    picks = np.minimum((rng.random(scores.shape)[:, :, None] > cdf[:, None, :]).sum(-1), n - 1)
    flat = (picks + n * np.arange(len(scores))[:, None]).ravel()
    return [replace(paths[i]) for i in flat]


def particle_filter(s: Search, n: int, rng: np.random.Generator) -> list[SearchPath]:
    """its_hub's ParticleFiltering: n particles; each level extends the unfinished ones and resamples all by weight
    exp(score) (the logit of the aggregated probability, as its_hub's inverse sigmoid). Finished ones keep their
    weight."""
    particles = s.expand(s.roots(), n)
    s.score(particles, s.ranking_stream)
    particles = resample(particles, n, rng)
    while any(not p.finished for p in particles):
        particles = grow(s, particles)
        s.score([p for p in particles if p.scored is None], s.ranking_stream)
        particles = resample(particles, n, rng)
    return s.finish(particles)


def choose(paths: list[SearchPath]) -> dict[int, int]:
    """question -> index in `paths` of its best path (the first of equals)."""
    best: dict[int, int] = {}
    for i in np.lexsort((-np.array([p.score for p in paths]), [p.q for p in paths])):
        best.setdefault(paths[i].q, int(i))
    return best


def vote(keys: Sequence[str], weights: Sequence[float]) -> int:
    """Index of the first path whose answer has the largest total weight (weights 1: majority vote)."""
    total: dict[str, float] = defaultdict(float)
    for key, w in zip(keys, weights):
        total[key] += w
    winner = max(total, key=total.__getitem__)  # dicts keep first-seen order, so ties go to the first answer seen
    return list(keys).index(winner)
