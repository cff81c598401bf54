"""A local BiPRM as a search's PathScorer: L2R grows on its KV cache across depths, R2L is rerun.

A search scores the same prefixes again and again: at depth D every path is a depth-(D-1)
path it scored at the last call plus one new step. L2R's step scores of a prefix never
change when a step is added, so each scored step is kept as a node of a prefix tree: its
keys and values in every layer, and its hidden state at the step tag. A path then runs
only its new step's tokens on top of its parent's cached keys, O(D) tokens over a search
of depth D. R2L reads the steps newest first, so its input changes at every depth and it
is rerun on every call (on top of the question's cached prompt), O(D^2) tokens. The gate
then fuses the cached L2R tag states with the fresh R2L ones, as the model does at training.

Nodes are keyed by the path's text (question, step 1, ..., step j). After each call only
the nodes on the paths of that call are kept, so memory follows the live paths of the
search, not its history, and at most `max_cache_mb` of step nodes stay: past it, the steps
of the call's last paths are dropped, and those paths rerun from their prompt if they grow.
`incremental=False` drops every node before each call: L2R from scratch, each question's
prompt still run once per call, for comparison. An implicit PRM (biprm.implicit) reads every path whole.
"""

from __future__ import annotations

import logging
from typing import NamedTuple, Sequence

import numpy as np
import torch
from transformers import DynamicCache

from biprm.data.encoding import Encoded
from biprm.data.trajectory import DataError, Trajectory
from biprm.modeling import cache_argument
from biprm.packing import continuation, cached_attention_mask
from biprm.scoring.scorer import Scorer
from biprm.scoring.step_scores import offsets_of
from biprm.scoring.paths import PathScore, check_streams, path_scores

log = logging.getLogger(__name__)
Key = tuple[str, ...]  # (question, step 1, ..., step j)


class Node:
    """One piece of an L2R sequence (the prompt, or one step) with what later pieces need of it."""

    def __init__(self, kv: torch.Tensor, tag: torch.Tensor | None, parent: Node | None):
        self.kv = kv  # [2 x layers, kv heads, tokens, head dim]: this piece's keys and values in every layer
        self.tag = tag  # L2R hidden state at the step tag; None for the prompt
        self.parent = parent

    def chain(self) -> list[Node]:
        """The prompt's node first, this one last."""
        nodes, node = [], self
        while node is not None:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]


class Row(NamedTuple):
    """Tokens to run on top of cached pieces; `ends` are the offsets of their step tags. `cached`: whether the
    new tokens' keys and values are kept; R2L rows are rerun every call, so theirs are dropped at once."""

    past: list[Node]
    ids: np.ndarray
    ends: np.ndarray
    cached: bool = True


class PrefixScorer:
    """`PathScorer` over a `Scorer`'s model (any mode); `tokens` counts the tokens run: prompt, l2r, r2l."""

    def __init__(self, scorer: Scorer, incremental: bool = True, max_cache_mb: float = 4096):
        self.scorer, self.model, self.incremental, self.max_cache_mb = (
            scorer,
            scorer.model.eval(),
            incremental,
            max_cache_mb,
        )
        self.nodes: dict[Key, Node] = {}
        self.tokens = {"prompt": 0, "l2r": 0, "r2l": 0}
        self.calls = 0

    @classmethod
    def from_pretrained(cls, path: str, incremental: bool = True, max_cache_mb: float = 4096, **kwargs) -> PrefixScorer:
        """`Scorer.from_pretrained`'s arguments (device, dtype, max_length, ...)."""
        return cls(Scorer.from_pretrained(path, **kwargs), incremental, max_cache_mb)

    @property
    def mode(self) -> str:
        return self.scorer.mode

    @torch.inference_mode()
    def score(
        self, questions: Sequence[str], paths: Sequence[Sequence[str]], streams: str = "fused"
    ) -> list[PathScore]:
        """Per-step logits of every path. A path past max_length is scored on the steps that fit, and `n_dropped`
        says how many did not (all of them, with no score, when the prompt and first step alone are too long)."""
        check_streams(streams)
        run_l2r = "l2r" in self.model.streams
        run_r2l = "r2l" in self.model.streams and (streams == "fused" or not run_l2r)
        if streams == "l2r" and not run_l2r:
            raise ValueError(f"streams='l2r' needs a model with an L2R stream; this one is {self.mode!r}")
        trajs = [Trajectory(q, list(p)) for q, p in zip(questions, paths, strict=True)]
        encs, problems = self.scorer.encode(
            trajs, [f"path {i} (question {q[:40]!r})" for i, q in enumerate(questions)], skip_invalid=True
        )
        unfit = {i for i, message in problems if "max_length" in message}
        if other := [message for i, message in problems if i not in unfit]:
            raise DataError(other[0])
        if unfit:
            log.warning(
                "%d of %d paths have no step that fits max_length=%d: they get no score (n_dropped = all their steps)",
                len(unfit),
                len(trajs),
                self.scorer.max_length,
            )
        fits = [i for i in range(len(trajs)) if i not in unfit]
        keys = [(trajs[i].question, *trajs[i].steps[: len(e.steps)]) for i, e in zip(fits, encs)]
        lengths, dropped = np.zeros(len(trajs), dtype=np.int64), np.array([len(t.steps) for t in trajs], dtype=np.int64)
        lengths[fits], dropped[fits] = [len(e.steps) for e in encs], [e.n_dropped for e in encs]
        if not self.incremental:
            self.nodes = {}
        self.calls += 1
        if not encs:  # nothing fits: every path is flagged, none scored
            none = lambda s: np.zeros(0) if s in self.model.streams else None  # noqa: E731
            return path_scores(lengths, dropped, none("l2r"), none("r2l"), np.zeros(0), streams)
        if self.scorer.implicit:  # two LMs and no tag states to cache: each path is read whole, from its question on
            scores = self.scorer.score(encs, progress=False)
            for stream in self.model.streams:
                self.tokens[stream] += sum(e.n_tokens for e in encs)
            return path_scores(lengths, dropped, scores.l2r, scores.r2l, scores.fused, streams)
        return self._path_scores(*self._tag_states(keys, encs, run_l2r, run_r2l), lengths, dropped, streams)

    def _tag_states(
        self, keys: list[Key], encs: list[Encoded], run_l2r: bool, run_r2l: bool
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Hidden states at every step tag of each stream, flat in path order: L2R from the cache after running what
        is new, R2L rerun whole (once per distinct path in the call); then only the nodes of these paths stay cached."""
        self._cache_prompts(keys, encs)
        l2r_rows = self._l2r_rows(keys, encs) if run_l2r else {}
        distinct = dict(zip(keys, encs)) if run_r2l else {}  # a path given twice is read once
        r2l_rows = [
            Row([self.nodes[k[:1]]], *continuation(e, "r2l", shared=True), cached=False) for k, e in distinct.items()
        ]
        tags, kvs = self._run(list(l2r_rows.values()) + r2l_rows)
        for (key, row), tag, kv in zip(l2r_rows.items(), tags, kvs):
            self._add_nodes(key, row, tag, kv)
        self.tokens["l2r"] += sum(len(r.ids) for r in l2r_rows.values())
        self.tokens["r2l"] += sum(len(r.ids) for r in r2l_rows)
        self.nodes = {k[:j]: self.nodes[k[:j]] for k in keys for j in range(1, len(k) + 1) if k[:j] in self.nodes}
        h_l2r = torch.cat([torch.stack([n.tag for n in self.nodes[k].chain()[1:]]) for k in keys]) if run_l2r else None
        r2l_tags = dict(zip(distinct, tags[len(l2r_rows) :]))
        h_r2l = torch.cat([r2l_tags[k] for k in keys]) if run_r2l else None
        self._bound_cache()
        return h_l2r, h_r2l

    def _bound_cache(self) -> None:
        """Keep the prompts, then the step nodes in path order while they fit in max_cache_mb; a node stays only with
        its parent."""
        room, kept = self.max_cache_mb * 2**20, {}
        for key, node in self.nodes.items():  # parents come before their children (see _tag_states)
            if len(key) == 1:
                kept[key] = node
            elif key[:-1] in kept and node.kv.nbytes <= room:
                kept[key] = node
                room -= node.kv.nbytes
        self.nodes = kept

    def _cache_prompts(self, keys: list[Key], encs: list[Encoded]) -> None:
        """Run each question whose prompt is not cached yet, once, however many paths it has."""
        new = {k[:1]: e.prompt for k, e in zip(keys, encs) if k[:1] not in self.nodes}
        rows = [Row([], np.array(p, dtype=np.int64), np.zeros(0, dtype=np.int64)) for p in new.values()]
        _, kvs = self._run(rows)
        for key, kv in zip(new, kvs):
            self.nodes[key] = Node(kv.clone(), None, None)
        self.tokens["prompt"] += sum(len(p) for p in new.values())

    def _l2r_rows(self, keys: list[Key], encs: list[Encoded]) -> dict[Key, Row]:
        """Per path not cached whole: the steps after its longest cached prefix, on that prefix's cache."""
        rows = {}
        for key, enc in zip(keys, encs):
            j = next(j for j in range(len(key), 0, -1) if key[:j] in self.nodes)  # the prompt (j = 1) is always there
            if j < len(key) and key not in rows:
                rows[key] = Row(
                    self.nodes[key[:j]].chain(),
                    *continuation(Encoded(enc.prompt, enc.steps[j - 1 :], None), "l2r", shared=True),
                )
        return rows

    def _add_nodes(self, key: Key, row: Row, tags: torch.Tensor, kv: torch.Tensor) -> None:
        """One node per new step of `row`, each holding its own slice of the row's keys and values."""
        parent, first = row.past[-1], len(key) - len(row.ends)
        starts = np.concatenate([[0], row.ends[:-1] + 1])
        for s, (a, b) in enumerate(zip(starts, row.ends + 1)):
            parent = self.nodes[key[: first + s + 1]] = Node(kv[:, :, a:b].clone(), tags[s], parent)

    def _run(self, rows: list[Row]) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """Hidden states at each row's tags and the keys and values of its new tokens (None where not `cached`), in row
        order; rows run longest first, in calls of about the scorer's `tokens_per_call` tokens counted with padding."""
        tags: list[torch.Tensor] = [None] * len(rows)
        kvs: list[torch.Tensor | None] = [None] * len(rows)
        order = sorted(range(len(rows)), key=lambda r: -len(rows[r].ids))
        start = 0
        while start < len(order):
            width = len(rows[order[start]].ids)
            stop = start + max(1, self.scorer.tokens_per_call // max(width, 1))
            chunk = order[start:stop]
            for r, tag, kv in zip(chunk, *self._forward([rows[r] for r in chunk])):
                tags[r], kvs[r] = tag, kv
            start = stop
        return tags, kvs

    def _forward(self, rows: list[Row]) -> tuple[list[torch.Tensor], list[torch.Tensor | None]]:
        """One backbone call: each row attends to its own cached pieces (right-padded to the longest) and itself.
        Only the `cached` rows' new keys and values are copied out of the call's cache."""
        device, body = self.model.device, self.model.backbone
        past_lengths = [sum(n.kv.shape[2] for n in r.past) for r in rows]
        B, P, N = len(rows), max(past_lengths), max(len(r.ids) for r in rows)
        real = torch.arange(N) < torch.tensor([len(r.ids) for r in rows])[:, None]
        ids = torch.full((B, N), self.scorer.tokenizer.pad_token_id, dtype=torch.long)
        ids[real] = torch.from_numpy(np.concatenate([r.ids for r in rows]))
        units = torch.where(real, torch.arange(B)[:, None], -1)
        lengths = torch.tensor(past_lengths)
        positions = lengths[:, None] + torch.arange(N)
        mask = cached_attention_mask(units, lengths, P)
        name = cache_argument(body)
        cache = {}
        if P:
            kv = next(n.kv for r in rows for n in r.past)
            past = kv.new_zeros(kv.shape[0], B, kv.shape[1], P, kv.shape[3])
            for b, r in enumerate(rows):
                if r.past:
                    past[:, b, :, : past_lengths[b]] = torch.cat([n.kv for n in r.past], dim=2)
            cache = {name: DynamicCache([(past[i], past[i + 1]) for i in range(0, len(past), 2)])}
        out = body(
            input_ids=ids.to(device),
            attention_mask=self.model._for_backend(mask.to(device)),
            position_ids=positions.to(device),
            use_cache=True,
            **cache,
        )
        flat = torch.from_numpy(np.concatenate([b * N + r.ends for b, r in enumerate(rows)])).to(device)
        tags = out.last_hidden_state.reshape(B * N, -1)[flat].split([len(r.ends) for r in rows])
        kept = [b for b, r in enumerate(rows) if r.cached]
        kvs: list[torch.Tensor | None] = [None] * B
        if kept:
            at = torch.tensor(kept, device=device)
            new = torch.stack(
                [t[at, :, P:] for k, v, *_ in getattr(out, name) for t in (k, v)]
            )  # [2 x layers, kept, heads, N, dim]
            for j, b in enumerate(kept):
                kvs[b] = new[:, j, :, : len(rows[b].ids)]
        return list(tags), kvs

    def _path_scores(
        self,
        h_l2r: torch.Tensor | None,
        h_r2l: torch.Tensor | None,
        lengths: Sequence[int],
        dropped: Sequence[int],
        streams: str,
    ) -> list[PathScore]:
        """The model's own heads on the tag states (the value head alone for streams="l2r")."""
        if streams == "l2r":
            out = {"l2r": self.model.value_head(h_l2r).squeeze(-1), "r2l": None, "fused": None}
        else:
            result = self.model.heads(h_l2r, h_r2l, torch.from_numpy(offsets_of(lengths)).to(self.model.device))
            out = {k: getattr(result, k) for k in ("l2r", "r2l", "fused")}
        flat = {k: None if v is None else v.double().cpu().numpy() for k, v in out.items()}
        return path_scores(lengths, dropped, flat["l2r"], flat["r2l"], flat["fused"], streams)
