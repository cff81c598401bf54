"""The prefix scorer: incremental L2R equals scoring from scratch and the Scorer, costs O(D) tokens, flags over-long
paths; search-and-learn's PRM contract on top of it."""

import numpy as np
import pytest
import torch

from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.data.trajectory import DataError, Trajectory
from biprm.integrations.search_and_learn import SearchAndLearnPRM
from biprm.modeling import from_backbone
from biprm.scoring import Scorer
from biprm.scoring.prefix import PrefixScorer, Row
from conftest import scored

QUESTIONS = ["Tom has 3 apples and buys 5 more. How many apples?", "A box holds 12 eggs. How many eggs are in 4 boxes?"]
STEPS = [
    "3 + 5 = 8",
    "He has 8 apples.",
    "12 * 4 = 48",
    "The answer is 48.",
    "Add the two numbers.",
    "So 8 in all.",
    "Multiply 12 by 4.",
    "Check: 48 / 4 = 12.",
    "The answer is 8.",
]


@pytest.fixture(scope="module", params=["bi", "l2r", "r2l", "bi-static"])
def scorer(request) -> Scorer:
    """An untrained tiny model of each mode in fp32 (seeded), on the CPU."""
    backbone = resolve_backbone("tiny")
    tok = load_tokenizer(backbone)
    torch.manual_seed(0)
    return Scorer(from_backbone(backbone, tok, mode=request.param).eval(), tok)


def levels(depth: int = 4, seed: int = 0) -> list[list[tuple[str, list[str]]]]:
    """A branching search: per question 3 first steps, then each level keeps 2 paths and grows each by 2 steps."""
    rng = np.random.default_rng(seed)
    pick = lambda n: [STEPS[i] for i in rng.choice(len(STEPS), n, replace=False)]  # noqa: E731
    level = [(q, [s]) for q in QUESTIONS for s in pick(3)]
    out = [level]
    for _ in range(depth - 1):
        kept = [level[i] for i in rng.choice(len(level), 2 * len(QUESTIONS), replace=False)]
        level = [(q, [*p, s]) for q, p in kept for s in pick(2)]
        out.append(level)
    return out


def run(prefix: PrefixScorer, search: list, streams: str = "fused") -> list:
    return [prefix.score([q for q, _ in level], [p for _, p in level], streams) for level in search]


def test_incremental_scores_equal_scratch_and_the_scorer(scorer):
    search = levels()
    incremental, scratch = run(PrefixScorer(scorer), search), run(PrefixScorer(scorer, incremental=False), search)
    streams = [s for s in ("l2r", "r2l", "fused") if getattr(incremental[0][0], s) is not None]
    for a_level, b_level in zip(incremental, scratch):
        for a, b in zip(a_level, b_level):
            for s in streams:
                np.testing.assert_allclose(getattr(a, s), getattr(b, s), atol=1e-5, rtol=0)
    finished = scored(scorer, [Trajectory(q, p) for q, p in search[-1]])
    for i, path in enumerate(incremental[-1]):
        for s in streams:
            np.testing.assert_allclose(
                getattr(path, s), getattr(finished, s)[finished.offsets[i] : finished.offsets[i + 1]], atol=1e-5, rtol=0
            )
    assert (
        np.ptp(np.concatenate([p.fused for p in incremental[-1]])) > 1e-3
    )  # the paths' scores differ: the comparison has teeth


def test_r2l_scores_of_a_prefix_change_with_depth(bi_scorer):
    """R2L reads the newest step first, so step 1's R2L score moves when step 2 arrives; L2R's does not."""
    prefix = PrefixScorer(bi_scorer)
    one, two = (prefix.score([QUESTIONS[0]], [STEPS[:d]])[0] for d in (1, 2))
    assert one.l2r[0] == pytest.approx(two.l2r[0], abs=1e-6)
    assert abs(one.r2l[0] - two.r2l[0]) > 1e-4


def test_tokens_follow_the_o_d_and_o_d2_accounting(bi_scorer):
    """One path grown one step per call for D calls: L2R runs each step once (sum of step lengths), R2L every
    step again at every depth, and from scratch L2R reruns the prompt and every step each call."""
    steps, D = STEPS[:4], 4
    enc = bi_scorer.encode([Trajectory(QUESTIONS[0], steps)])[0][0]
    n, p = np.array([len(s) for s in enc.steps]), len(enc.prompt)
    quadratic = int(sum(n[:d].sum() for d in range(1, D + 1)))
    incremental, scratch = PrefixScorer(bi_scorer), PrefixScorer(bi_scorer, incremental=False)
    for d in range(1, D + 1):
        incremental.score([QUESTIONS[0]], [steps[:d]])
        scratch.score([QUESTIONS[0]], [steps[:d]], streams="l2r")
    assert incremental.tokens == {"prompt": p, "l2r": int(n.sum()), "r2l": quadratic}
    assert scratch.tokens == {"prompt": D * p, "l2r": quadratic, "r2l": 0}
    assert incremental.calls == scratch.calls == D
    incremental.score([QUESTIONS[0]], [steps])  # the finished path again (a final rerank): no new L2R token
    assert incremental.tokens["l2r"] == int(n.sum())


def test_a_path_given_twice_in_one_call_runs_once_in_each_stream(bi_scorer):
    """A call that holds one path twice (a policy that samples one step twice from one parent) reads it once per
    stream, and both copies get its scores, the same as a call that holds it once."""
    enc = bi_scorer.encode([Trajectory(QUESTIONS[0], STEPS[:2])])[0][0]
    n = sum(len(s) for s in enc.steps)
    prefix = PrefixScorer(bi_scorer, incremental=False)
    twice = prefix.score([QUESTIONS[0], QUESTIONS[1], QUESTIONS[0]], [STEPS[:2], STEPS[:1], STEPS[:2]])
    other = bi_scorer.encode([Trajectory(QUESTIONS[1], STEPS[:1])])[0][0]
    m = sum(len(s) for s in other.steps)
    assert prefix.tokens == {"prompt": len(enc.prompt) + len(other.prompt), "l2r": n + m, "r2l": n + m}
    once = PrefixScorer(bi_scorer, incremental=False).score([QUESTIONS[0], QUESTIONS[1]], [STEPS[:2], STEPS[:1]])
    for got, want in zip(twice, [once[0], once[1], once[0]]):
        np.testing.assert_allclose(got.fused, want.fused, atol=1e-6, rtol=0)
        np.testing.assert_allclose(got.r2l, want.r2l, atol=1e-6, rtol=0)


def test_only_the_paths_of_the_last_call_stay_cached(bi_scorer):
    prefix = PrefixScorer(bi_scorer)
    prefix.score([QUESTIONS[0]] * 2, [[STEPS[0]], [STEPS[1]]])
    prefix.score([QUESTIONS[0]], [[STEPS[0], STEPS[2]]])
    assert set(prefix.nodes) == {(QUESTIONS[0],), (QUESTIONS[0], STEPS[0]), (QUESTIONS[0], STEPS[0], STEPS[2])}


def test_a_cache_bound_keeps_the_scores_and_reruns_what_it_dropped(bi_scorer):
    """With no room for step nodes, each call reruns every path's steps on its cached prompt: the scores stay those of
    the unbounded scorer, and the L2R tokens become those of L2R from scratch."""
    search = levels()
    free, bounded, scratch = (
        PrefixScorer(bi_scorer),
        PrefixScorer(bi_scorer, max_cache_mb=0),
        PrefixScorer(bi_scorer, incremental=False),
    )
    for a_level, b_level in zip(run(free, search), run(bounded, search)):
        for a, b in zip(a_level, b_level):
            np.testing.assert_allclose(a.fused, b.fused, atol=1e-5, rtol=0)
    run(scratch, search)
    assert bounded.tokens["l2r"] == scratch.tokens["l2r"] > free.tokens["l2r"]
    assert bounded.tokens["prompt"] == free.tokens["prompt"] < scratch.tokens["prompt"]
    assert all(len(key) == 1 for key in bounded.nodes)
    one_step = max(n.kv.nbytes for k, n in free.nodes.items() if len(k) > 1) / 2**20
    some = PrefixScorer(bi_scorer, max_cache_mb=one_step)
    run(some, search)
    assert 0 < sum(len(k) > 1 for k in some.nodes) < sum(len(k) > 1 for k in free.nodes)
    assert all(k[:-1] in some.nodes for k in some.nodes if len(k) > 1)  # a node stays only with its parent


def test_a_call_keeps_new_keys_and_values_only_for_rows_it_caches(bi_scorer):
    """R2L rows are rerun at every call, so their keys and values are dropped as soon as their tag states are read;
    the same row, kept, gets the same tag states and its own keys and values (every layer, its tokens only)."""
    prefix = PrefixScorer(bi_scorer)
    prefix.score([QUESTIONS[0]], [[STEPS[0]]])
    prompt = prefix.nodes[(QUESTIONS[0],)]
    ids = np.array(bi_scorer.tokenizer(STEPS[2])["input_ids"], dtype=np.int64)
    ends = np.array([len(ids) - 1])
    tags, kvs = prefix._forward([Row([prompt], ids, ends), Row([prompt], ids, ends, cached=False)])
    torch.testing.assert_close(tags[0], tags[1])
    assert kvs[1] is None
    assert kvs[0].shape == (*prompt.kv.shape[:2], len(ids), prompt.kv.shape[3])


def test_a_path_past_max_length_is_flagged_and_scored_on_the_steps_that_fit(bi_scorer):
    short = Scorer(bi_scorer.model, bi_scorer.tokenizer, max_length=60)
    path = STEPS * 2
    kept = len(short.encode([Trajectory(QUESTIONS[0], path)])[0][0].steps)
    assert 0 < kept < len(path)
    got = PrefixScorer(short).score([QUESTIONS[0]], [path])[0]
    assert got.n_dropped == len(path) - kept and len(got.fused) == kept
    whole = PrefixScorer(bi_scorer).score([QUESTIONS[0]], [path[:kept]])[0]
    assert whole.n_dropped == 0
    np.testing.assert_allclose(got.fused, whole.fused, atol=1e-5, rtol=0)
    tiny = PrefixScorer(Scorer(bi_scorer.model, bi_scorer.tokenizer, max_length=20))  # not even the first step fits
    unfit, fits = tiny.score([QUESTIONS[0] * 3, "Why?"], [path[:2], ["Yes."]])
    assert unfit.n_dropped == 2 and len(unfit.fused) == len(unfit.l2r) == len(unfit.r2l) == 0
    assert fits.n_dropped == 0 and len(fits.fused) == 1
    assert tiny.score([QUESTIONS[0] * 3], [path[:2]])[0].n_dropped == 2


def test_bad_step_text_is_an_error_naming_the_path(bi_scorer):
    with pytest.raises(DataError, match=r"path 1 \(question 'Why\?'\).*step tag"):
        PrefixScorer(bi_scorer).score([QUESTIONS[0], "Why?"], [["Fine."], ["Not <|step|> fine."]])


def test_streams_are_checked(scorer):
    prefix = PrefixScorer(scorer)
    with pytest.raises(ValueError, match="streams must be one of"):
        prefix.score(QUESTIONS[:1], [STEPS[:1]], streams="r2l")
    if scorer.mode == "r2l":
        with pytest.raises(ValueError, match="needs a model with an L2R stream"):
            prefix.score(QUESTIONS[:1], [STEPS[:1]], streams="l2r")
    else:
        got = prefix.score(QUESTIONS[:1], [STEPS[:2]], streams="l2r")[0]
        assert got.r2l is None and np.array_equal(got.fused, got.l2r) and prefix.tokens["r2l"] == 0


def test_search_and_learn_prm_gives_step_probabilities_per_question_and_output(bi_scorer):
    outputs = [["3 + 5 = 8\n\nSo it is 8.", "Add the numbers."], ["12 * 4 = 48"]]
    got = SearchAndLearnPRM(PrefixScorer(bi_scorer)).score(QUESTIONS, outputs)
    assert [[len(s) for s in per_q] for per_q in got] == [[2, 1], [1]]
    want = scored(
        bi_scorer, [Trajectory(q, o.split("\n\n")) for q, outs in zip(QUESTIONS, outputs) for o in outs]
    ).prob()
    np.testing.assert_allclose([x for per_q in got for s in per_q for x in s], want, atol=1e-6)
