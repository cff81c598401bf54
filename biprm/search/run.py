"""`biprm search`: PRM-guided search over a question set beside its baselines at the same budget, resumable.

Questions run in batches (one policy and one PRM call per level for the whole batch).
Each batch first draws N independent solutions per question: the pool that majority
vote, random pick, pass@N and best-of-N read (their first n for every n of --n). Every
PRM scores that one pool, so PRMs are compared on the same samples and generation is
paid once. Then every search method runs once per PRM and once with the text-free
noise scorer. A finished batch is appended to questions.jsonl in one write; a rerun skips the
questions already there. The pool is saved after every level and each PRM's scores of it
after every call (`BatchCheckpoint`), so a kill while they run loses one level or one call;
a kill in the tree searches after them loses those searches.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm.auto import tqdm

from biprm.folder import NotACheckpoint, recorded, resolve
from biprm.data.benchmarks import question_golds, spread
from biprm.data.segment import Segmenter
from biprm.data.writer import atomic_write
from biprm.evaluation.pools import answer_key
from biprm.evaluation.grading import grade_many, read_answer
from biprm.scoring.aggregate import sigmoid
from biprm.search.algorithms import SearchPath
from biprm.search.algorithms import Budget, Search, beam_search, choose, dvts, particle_filter, sample, vote
from biprm.run_folder import claim_results
from biprm.search.config import SearchConfig
from biprm.search.noise import NoiseScorer
from biprm.search.policy import StepPolicy
from biprm.scoring.paths import PathScore, PathScorer
from biprm.search.report import method_name, summarize
from biprm.search.synthetic import SyntheticPolicy, synthetic_problems

log = logging.getLogger(__name__)
POOL_CHUNK = 64  # finished paths per PRM call when a best-of-N pool is scored (see Batch.score_pool)
RESULTS = (
    "data",
    "limit",
    "policy",
    "policy_model",
    "policy_tokenizer",
    "prm",
    "prm_kind",
    "prm_max_length",
    "algorithms",
    "n",
    "width",
    "strategies",
    "aggregation",
    "max_depth",
    "max_step_tokens",
    "step_token",
    "calc_rate",
    "claim_rate",
    "temperature",
    "top_p",
    "seed",
    "pool_draw",
    "segmenter",
    "grade_cut_paths",
    "policy_batch_size",
)  # settings a resumed run must share (the batch size only with --policy hf, where it changes the draws)
# what a search writes in --out (its record, results, batch checkpoint, summary and plot, a killed atomic write's
# scratch file): all that --overwrite deletes, and all the folder may hold
FILES = re.compile(r"settings\.json|questions\.jsonl|batch-in-flight\.json|summary\.(md|json)|accuracy\.png|\..*\.tmp")


def load_questions(data: str, data_root: str, limit: int | None) -> list[dict]:
    """{"index", "question", "gold"} of the chosen questions (--data's values), `limit` of them evenly spread."""
    problems = synthetic_problems(data)
    golds = (
        [(p.question, str(p.answer)) for p in problems] if problems is not None else question_golds(data, data_root)[0]
    )
    return [{"index": int(i), "question": golds[i][0], "gold": golds[i][1]} for i in spread(len(golds), limit)]


def build_policy(cfg: SearchConfig) -> StepPolicy:
    kw = dict(
        step_token=cfg.step_token, max_step_tokens=cfg.max_step_tokens, temperature=cfg.temperature, top_p=cfg.top_p
    )
    if cfg.policy == "server":
        from biprm.backbones import load_tokenizer
        from biprm.search.policy import ServerPolicy

        return ServerPolicy(
            cfg.policy_url,
            cfg.policy_model,
            load_tokenizer(cfg.policy_tokenizer or cfg.policy_model),
            retries=cfg.retries,
            timeout=cfg.policy_timeout,
            **kw,
        )
    if cfg.policy == "synthetic":
        from biprm.backbones import load_tokenizer

        return SyntheticPolicy(
            synthetic_problems(cfg.data),
            cfg.calc_rate,
            cfg.claim_rate,
            cfg.seed,
            load_tokenizer(cfg.policy_model),
            **kw,
        )
    if cfg.policy == "vllm":
        from biprm.search.policy import VLLMPolicy

        return VLLMPolicy(cfg.policy_model, seed=cfg.seed, **kw)
    from biprm.search.policy import HFPolicy

    return HFPolicy.from_pretrained(cfg.policy_model, batch_size=cfg.policy_batch_size, **kw)


def build_scorer(cfg: SearchConfig, prm: str) -> PathScorer:
    """One --prm value as a `PathScorer`: the text-free noise scorer, or a checkpoint with incremental L2R
    (biprm.scoring.prefix)."""
    if prm == "noise":
        return NoiseScorer(cfg.seed)
    from biprm.scoring.prefix import PrefixScorer  # lazily: the prefix scorer loads torch and the checkpoint

    return PrefixScorer.from_pretrained(
        prm,
        max_cache_mb=cfg.prm_cache_mb,
        prm_kind=kind_of(cfg, prm),
        prm_reference=cfg.prm_reference,
        **({"max_length": cfg.prm_max_length} if cfg.prm_max_length else {}),
    )


def kind_of(cfg: SearchConfig, prm: str) -> str | None:
    """--prm-kind for a --prm folder biprm did not train; a biprm checkpoint among them keeps its own kind."""
    if cfg.prm_kind is None or recorded(prm, "model_type") == "biprm":
        return None
    return cfg.prm_kind


def scores_row(p: SearchPath) -> dict:
    """What a PRM said of a path: per-step probabilities of every stream it gave, the path score, steps it could not
    read."""
    if p.scored is None:
        return {}
    row = {
        stream: np.round(sigmoid(x), 4).tolist()
        for stream in ("l2r", "r2l", "fused")
        if (x := getattr(p.scored, stream)) is not None
    }
    return row | {"score": round(float(sigmoid(p.score)), 6), "n_dropped": p.scored.n_dropped}


def reading(p: SearchPath, grade_cut: bool) -> tuple[str | None, str | None]:
    """A path's answer and how it was read (marked, fallback: biprm.evaluation.grading.read_answer); a path cut at
    --max-depth has none ("cut") unless --grade-cut-paths: its last number is wherever the text stopped."""
    return (None, "cut") if p.cut and not grade_cut else read_answer("\n".join(p.steps))


def path_row(p: SearchPath, answer: str | None, read: str | None, correct: bool | None) -> dict:
    """A path as the JSONL keeps it: steps, flags, its answer and how it was read (marked, fallback or cut), grade, and
    the PRM's scores."""
    return {
        "steps": list(p.steps),
        "finished": p.finished,
        "cut": p.cut,
        "capped": list(p.capped),
        "tokens": p.tokens,
        "answer": answer,
        "read": read,
        "correct": correct,
        **scores_row(p),
    }


def add(total: dict[str, float], row: dict[str, float]) -> None:
    """Adds a cost row into a question's total, key by key (keys missing on one side count as 0)."""
    for k, v in row.items():
        total[k] = total.get(k, 0.0) + v


class BatchCheckpoint:
    """What the batch in flight has done: its pool as drawn so far (saved after every level) and each PRM's scores of it
    (after every call), with their costs. Drawing and scoring the pool is nearly all of a best-of-N batch's time (30 and
    18 of 49 minutes for 25 GSM8K questions on 2 cores), so a kill loses one level or one PRM call of it; the level or
    call in flight is run again, and the time it had taken is not counted. Removed once the batch is in
    questions.jsonl."""

    def __init__(self, file: Path):
        self.file, self.data = file, {}

    def indices(self) -> list[int] | None:
        """The questions of the batch a killed run left, if any."""
        return json.loads(self.file.read_text())["indices"] if self.file.exists() else None

    def open(self, indices: list[int]) -> None:
        """Take up what a killed run saved for these questions, or start afresh."""
        saved = json.loads(self.file.read_text()) if self.file.exists() else {}
        self.data = saved if saved.get("indices") == indices else {"indices": indices}
        if "pool" in self.data:
            depth = max(len(p["steps"]) for p in self.data["pool"]["paths"])
            log.warning(
                "%s: resuming questions %d-%d, their pool at depth %d, scored by %s",
                self.file,
                indices[0],
                indices[-1],
                depth,
                ", ".join(self.data.get("scores", {})) or "no PRM yet",
            )

    def write(self) -> None:
        atomic_write(
            self.file, lambda f: f.write(json.dumps(self.data).encode())
        )  # a kill mid-write leaves the last file whole

    def restore_pool(self, budget: Budget, policy: StepPolicy) -> list[SearchPath] | None:
        """The saved pool, its costs so far put into `budget` and the policy's draw state into `policy`; None if none
        was drawn."""
        if "pool" not in self.data:
            return None
        saved = self.data["pool"]
        budget.restore(saved["budget"])
        policy.restore(saved["policy"])
        return [SearchPath(**(p | {"steps": tuple(p["steps"]), "capped": tuple(p["capped"])})) for p in saved["paths"]]

    def save_pool(self, budget: Budget, policy: StepPolicy, paths: list[SearchPath]) -> None:
        rows = [
            {
                "q": p.q,
                "group": p.group,
                "steps": p.steps,
                "capped": p.capped,
                "finished": p.finished,
                "cut": p.cut,
                "tokens": p.tokens,
            }
            for p in paths
        ]
        self.data["pool"] = {"budget": budget.to_json(), "policy": policy.state(), "paths": rows}
        self.write()

    def restore_scores(self, prm: str, budget: Budget, paths: list[SearchPath]) -> int:
        """Puts `prm`'s saved scores on the first paths of the pool and its costs into `budget`; returns how many it
        had."""
        saved = self.data.get("scores", {}).get(prm)
        if saved is None:
            return 0
        budget.restore(saved["budget"])
        for p, row in zip(paths, saved["paths"]):
            if row is not None:
                arrays = {k: None if row[k] is None else np.array(row[k]) for k in ("l2r", "r2l", "fused")}
                p.scored, p.score = PathScore(**arrays, n_dropped=row["n_dropped"]), row["score"]
        return len(saved["paths"])

    def save_scores(self, prm: str, budget: Budget, paths: list[SearchPath]) -> None:
        """`prm`'s scores of the pool's first paths (None for a path with no step, which is never scored)."""
        rows = [
            None
            if p.scored is None
            else {k: None if (x := getattr(p.scored, k)) is None else x.tolist() for k in ("l2r", "r2l", "fused")}
            | {"n_dropped": p.scored.n_dropped, "score": p.score}
            for p in paths
        ]
        self.data.setdefault("scores", {})[prm] = {"budget": budget.to_json(), "paths": rows}
        self.write()

    def clear(self) -> None:
        self.file.unlink(missing_ok=True)
        self.data = {}


def batches(todo: list[dict], size: int, checkpoint: BatchCheckpoint) -> list[list[dict]]:
    """`todo` in batches of `size`, the batch a killed run left first, as it was (a checkpoint whose questions are no
    longer all to do, as when a kill came between the append and the clear, is removed)."""
    pending = checkpoint.indices() or []
    first = [it for it in todo if it["index"] in pending]
    if len(first) != len(pending):
        log.warning(
            "%s: %d of its %d questions are already in questions.jsonl; removing it, the rest are searched afresh",
            checkpoint.file,
            len(pending) - len(first),
            len(pending),
        )
        checkpoint.clear()
        first = []
    rest = [it for it in todo if it not in first]
    return ([first] if first else []) + [rest[i : i + size] for i in range(0, len(rest), size)]


class Batch:
    """One batch of questions: its pool, its searches, then grades and one record per question."""

    def __init__(
        self,
        items: list[dict],
        cfg: SearchConfig,
        policy: StepPolicy,
        scorers: dict[str, PathScorer],
        noise: NoiseScorer,
        checkpoint: BatchCheckpoint,
        note: Callable[[str], None] = lambda _: None,
    ):
        self.items, self.cfg, self.policy, self.scorers, self.noise, self.note = (
            items,
            cfg,
            policy,
            scorers,
            noise,
            note,
        )
        self.checkpoint = checkpoint
        checkpoint.open([it["index"] for it in items])
        self.questions = [it["question"] for it in items]
        self.rng = np.random.default_rng([cfg.seed, items[0]["index"]])
        self.methods: dict[
            str, list[dict]
        ] = {}  # name -> per question {"pick" (pool index) | "any" (pool indices: pass@n) | "paths" + "pick", "budget"}
        self.searched: dict[str, list[SearchPath]] = {}
        self.scored: dict[
            str, tuple[list[SearchPath], Search]
        ] = {}  # PRM name -> its scored copy of the pool, and its accounts
        self.noise_pool: list[SearchPath] = []  # the pool scored by the noise scorer
        # what cuts a solution drawn whole (tokens:N counts the policy's tokens); None: the step token, as drawn
        self.segmenter = Segmenter(cfg.segmenter, getattr(policy, "tokenizer", None)) if cfg.segmenter else None

    def label(self, prm: str) -> str | None:
        """The PRM's name in method names; none with one PRM, so a one-PRM run keeps the names it always had."""
        return prm if len(self.scorers) > 1 else None

    def search(self, scorer, strategy: str) -> Search:
        c = self.cfg
        return Search(
            self.questions,
            self.policy,
            scorer,
            c.max_depth,
            c.aggregation,
            strategy,
            self.note,
            self.segmenter,
            c.step_token,
        )

    def run(self) -> list[dict]:
        self.policy.reseed(self.cfg.seed + self.items[0]["index"])
        self.draw_pool()
        self.pool_methods()
        for algorithm in self.cfg.algorithms:
            if algorithm != "bon":
                for n in self.cfg.n:
                    for prm, scorer in self.scorers.items():
                        for strategy in self.cfg.strategies:
                            self.tree_method(algorithm, n, strategy, scorer, prm)
                    self.tree_method(algorithm, n, "fused", self.noise)
        return self.records()

    def draw_pool(self) -> None:
        """max(--n) samples per question, resumed from the checkpoint and saved to it after every level, with their
        answers; when best-of-N runs, every PRM's scores of them and the noise scorer's."""
        c = self.cfg
        s = self.search(self.noise, "fused")  # sampling never scores: the scorer goes unused
        drawn = self.checkpoint.restore_pool(s.budget, self.policy)
        self.pool = sample(
            s,
            max(c.n),
            drawn,
            lambda paths: self.checkpoint.save_pool(s.budget, self.policy, paths),
            c.pool_draw == "whole",
        )
        self.pool_budget = s.budget
        readings = [reading(p, c.grade_cut_paths) for p in self.pool]
        self.answers, self.reads = (
            [a for a, _ in readings],
            [r for _, r in readings],
        )  # r: marked or fallback (biprm.evaluation.grading)
        self.keys = [answer_key(a, i) for i, a in enumerate(self.answers)]
        if "bon" in c.algorithms:
            self.scored = {
                prm: self.score_pool(scorer, "l2r" if c.strategies == ["l2r"] else "fused", prm)
                for prm, scorer in self.scorers.items()
            }
            self.noise_pool, _ = self.score_pool(self.noise, "fused")

    def pool_methods(self) -> None:
        """Majority vote, random pick and pass@n over the pool's first n; best-of-N by every PRM and by noise when
        asked."""
        c, nmax = self.cfg, max(self.cfg.n)
        for n in c.n:
            gen = {q: self._pool_budget(q, n) for q in range(len(self.items))}
            first = [range(q * nmax, q * nmax + n) for q in range(len(self.items))]
            self.methods[f"pass@{n}"] = [{"any": list(f), "budget": gen[q]} for q, f in enumerate(first)]
            self.methods[f"majority@{n}"] = [
                {"pick": f[vote([self.keys[i] for i in f], [1.0] * n)], "budget": gen[q]} for q, f in enumerate(first)
            ]
            self.methods[f"random@{n}"] = [
                {"pick": f[int(self.rng.integers(n))], "budget": gen[q]} for q, f in enumerate(first)
            ]
            if "bon" not in c.algorithms:
                continue
            for prm, (paths, scoring) in self.scored.items():
                full = {q: self._pool_budget(q, n, scoring) for q in range(len(self.items))}
                for stream in dict.fromkeys(
                    "l2r" if st == "l2r" else "fused" for st in c.strategies
                ):  # finished paths: l2r-rerank is fused
                    scores = self._scores(scoring, paths, stream)
                    self.methods[method_name(f"bon-max/{stream}", n, self.label(prm))] = [
                        {"pick": f[int(np.argmax(scores[list(f)]))], "budget": full[q]} for q, f in enumerate(first)
                    ]
                    probs = sigmoid(scores)
                    self.methods[method_name(f"bon-vote/{stream}", n, self.label(prm))] = [
                        {"pick": f[vote([self.keys[i] for i in f], probs[list(f)])], "budget": full[q]}
                        for q, f in enumerate(first)
                    ]
            noise_scores = np.array([p.score for p in self.noise_pool])
            self.methods[f"noise:bon-max@{n}"] = [
                {"pick": f[int(np.argmax(noise_scores[list(f)]))], "budget": gen[q]} for q, f in enumerate(first)
            ]

    def score_pool(self, scorer: PathScorer, stream: str, prm: str | None = None) -> tuple[list[SearchPath], Search]:
        """A copy of the pool scored by `scorer` (`prm` None: the noise scorer), and the search that holds the cost; a
        PRM's scores are checkpointed after every call. Finished paths never grow, so a PRM takes them in calls of
        POOL_CHUNK paths: a `PrefixScorer` bounds the keys and values it keeps between calls (max_cache_mb), but holds
        every new L2R row's during a call (R2L rows' it drops at once), and one call over a pool of 400 ten-step GSM8K
        paths grew past 10 GB of them."""
        s, paths = self.search(scorer, stream), [replace(p) for p in self.pool]
        if prm is None:  # the noise scorer: no cache to bound, and it tells identical paths apart only within a call
            s.score(paths, stream)
            return paths, s
        done = self.checkpoint.restore_scores(prm, s.budget, paths)
        for start in range(done, len(paths), POOL_CHUNK):
            s.score(paths[start : start + POOL_CHUNK], stream)
            self.checkpoint.save_scores(prm, s.budget, paths[: start + POOL_CHUNK])
        return paths, s

    @staticmethod
    def _scores(s: Search, paths: list[SearchPath], stream: str) -> np.ndarray:
        """The path scores in `stream`; a path with no step (an empty first step) is -inf."""
        scores, has = np.full(len(paths), -np.inf), [i for i, p in enumerate(paths) if p.scored is not None]
        if has:
            scores[has] = s.aggregate([paths[i].scored for i in has], stream)
        return scores

    def _pool_budget(self, q: int, n: int, scoring: Search | None = None) -> dict:
        """The pool's cost for its first n, plus what `scoring` spent scoring it: policy tokens exact, calls as they
        were, the rest in proportion n / N."""
        nmax = max(self.cfg.n)
        row = self.pool_budget.row(q, n / nmax) | (scoring.budget.row(q, n / nmax) if scoring else {})
        row["policy_tokens"] = float(sum(p.tokens for p in self.pool[q * nmax : q * nmax + n]))
        return row

    def tree_method(self, algorithm: str, n: int, strategy: str, scorer: PathScorer, prm: str | None = None) -> None:
        """One tree search of every question in the batch; `prm` names the scorer (None: the noise twin)."""
        s = self.search(scorer, strategy)
        c = self.cfg
        if algorithm == "beam":
            paths = beam_search(s, n, c.width)
        elif algorithm == "dvts":
            paths = dvts(s, n, c.width)
        else:
            paths = particle_filter(s, n, self.rng)
        name = (
            method_name(f"noise:{algorithm}", n)
            if prm is None
            else method_name(f"{algorithm}/{strategy}", n, self.label(prm))
        )
        best = choose(paths)
        self.searched[name] = paths
        mine = [[i for i, p in enumerate(paths) if p.q == q] for q in range(len(self.items))]
        self.methods[name] = [
            {"paths": m, "pick": m.index(best[q]), "budget": s.budget.row(q)} for q, m in enumerate(mine)
        ]

    def records(self) -> list[dict]:
        """Grade every path once (a timed-out grade is None: unknown) and write one record per question."""
        self.note("grading")
        searched = {
            name: [reading(p, self.cfg.grade_cut_paths) for p in paths] for name, paths in self.searched.items()
        }
        golds = [it["gold"] for it in self.items]
        pairs = [(golds[p.q], a) for p, a in zip(self.pool, self.answers)]
        pairs += [(golds[p.q], a) for name, paths in self.searched.items() for p, (a, _) in zip(paths, searched[name])]
        verdicts = grade_many(pairs, self.cfg.grade_workers, self.cfg.grade_timeout)
        pool_ok, rest = verdicts[: len(self.pool)], iter(verdicts[len(self.pool) :])
        search_ok = {name: [next(rest) for _ in paths] for name, paths in self.searched.items()}
        nmax = max(self.cfg.n)
        out = []
        for q, it in enumerate(self.items):
            own = slice(q * nmax, (q + 1) * nmax)
            record = {
                **it,
                "pool": [self.pool_row(i, pool_ok[i]) for i in range(own.start, own.stop)],
                "methods": {},
                "budget": self.pool_budget.row(q),
            }  # what this question cost in all: the pool, every PRM's scoring, every search
            for _, scoring in self.scored.values():
                add(record["budget"], scoring.budget.row(q))
            for name in self.searched:
                add(record["budget"], self.methods[name][q]["budget"])
            for name, per_question in self.methods.items():
                m = per_question[q]
                if "any" in m:
                    seen = [pool_ok[i] for i in m["any"]]
                    read = (
                        "marked"
                        if any(pool_ok[i] and self.reads[i] == "marked" for i in m["any"])
                        else "fallback"
                        if any(seen)
                        else None
                    )
                    record["methods"][name] = {
                        "correct": True if any(seen) else None if None in seen else False,
                        "read": read,
                        "budget": m["budget"],
                    }
                elif "paths" in m:
                    paths = [
                        path_row(self.searched[name][i], *searched[name][i], search_ok[name][i]) for i in m["paths"]
                    ]
                    chosen = paths[m["pick"]]
                    record["methods"][name] = {
                        "pick": m["pick"],
                        "solution": "\n\n".join(chosen["steps"]),
                        "answer": chosen["answer"],
                        "read": chosen["read"],
                        "correct": chosen["correct"],
                        "budget": m["budget"],
                        "paths": paths,
                    }
                else:
                    i = m["pick"]
                    record["methods"][name] = {
                        "pick": i - q * nmax,
                        "solution": "\n\n".join(self.pool[i].steps),
                        "answer": self.answers[i],
                        "read": self.reads[i],
                        "correct": pool_ok[i],
                        "budget": m["budget"],
                    }
            out.append(record)
        return out

    def pool_row(self, i: int, correct: bool | None) -> dict:
        """Pool sample i with its PRM scores: beside the steps with one PRM (as before several could be given), by name
        under "prms" with several."""
        row = path_row(self.pool[i], self.answers[i], self.reads[i], correct)
        scores = {prm: scores_row(paths[i]) for prm, (paths, _) in self.scored.items()}
        if len(self.scorers) == 1:
            row |= next(iter(scores.values()), {})
        elif scores:
            row["prms"] = scores
        return row


def done_indices(path: Path) -> set[int]:
    """Questions already in the output; a last line cut by a kill is dropped so the file stays valid JSONL."""
    if not path.exists():
        return set()
    text = path.read_text()
    lines = text.split("\n")
    complete, tail = lines[:-1], lines[-1]
    if tail:
        log.warning("%s: dropping an unfinished last line (%d characters) left by an interrupted run", path, len(tail))
        path.write_text("".join(line + "\n" for line in complete))
    return {json.loads(line)["index"] for line in complete if line}


def append(path: Path, records: list[dict]) -> None:
    """All of a batch's lines in one write, flushed to disk before the next batch starts."""
    with path.open("a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in records))
        f.flush()
        os.fsync(f.fileno())


def check_settings(out: Path, cfg: SearchConfig) -> None:
    """A resumed run must be the same experiment: refuse, naming the setting, if one that shapes results changed."""
    settings = {
        k: v for k, v in asdict(cfg).items() if k in RESULTS and (k != "policy_batch_size" or cfg.policy == "hf")
    }
    saved = out / "settings.json"
    claim_results(out, "biprm search", FILES, FILES, _changed(saved, settings), cfg.overwrite)
    saved.write_text(json.dumps(settings, indent=1))


def _changed(saved: Path, settings: dict) -> str | None:
    """The first setting that shapes results and differs from those `saved` records, as "--k was A, now B"; None when
    the folder's results are this search's own to resume (or there is no record: then there are none, as the record
    is written first)."""
    if not saved.exists():
        return None
    before = json.loads(saved.read_text())
    if isinstance(before.get("prm"), str):  # written when --prm took one value
        before["prm"] = [before["prm"]]
    changed = [k for k in RESULTS if k in before and k in settings and before[k] != settings[k]]
    return next((f"--{k.replace('_', '-')} was {before[k]!r}, now {settings[k]!r}" for k in changed), None)


def run_search(cfg: SearchConfig, policy: StepPolicy | None = None, scorers: list[PathScorer] | None = None) -> str:
    """Search every question not yet in questions.jsonl, then write the summary and the plot; returns the summary.
    `scorers` stand in for --prm's values, one each, in order."""
    questions = load_questions(
        cfg.data, cfg.data_root, cfg.limit
    )  # bad inputs are refused before --out is touched or anything loads
    if not questions:
        raise ValueError(f"--data {cfg.data}: holds no question")
    for prm in [p for p in cfg.prm if p != "noise"] if scorers is None else []:
        try:  # any kind biprm reads, its tokenizer and reference checked, named before the policy loads
            folder = resolve(prm, kind_of(cfg, prm), None, cfg.prm_reference)
            folder.check_reference()
            if folder.trained_elsewhere:
                folder.tokenizer  # a kind that does not fit its tokenizer
        except (OSError, ValueError) as error:
            raise NotACheckpoint(f"--prm {error}") from None
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    check_settings(out, cfg)
    results = out / "questions.jsonl"
    done = done_indices(results)
    todo = [it for it in questions if it["index"] not in done]
    checkpoint = BatchCheckpoint(out / "batch-in-flight.json")
    if not todo:
        checkpoint.clear()  # left by a kill between the last batch's append and its removal
    else:
        policy, noise = policy or build_policy(cfg), NoiseScorer(cfg.seed)
        scorers = dict(zip(cfg.prm_names, scorers or [build_scorer(cfg, prm) for prm in cfg.prm], strict=True))
        with tqdm(total=len(todo), desc="questions", unit="q", disable=not cfg.show_progress) as bar:
            for items in batches(todo, cfg.batch_questions, checkpoint):
                append(results, Batch(items, cfg, policy, scorers, noise, checkpoint, bar.set_postfix_str).run())
                checkpoint.clear()
                bar.update(len(items))
    return summarize(out, cfg.seed)
