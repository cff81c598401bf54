"""Inputs past the window (issue 45): the overlength policies head, tail, refuse and window, and what each row says."""

from __future__ import annotations

import numpy as np
import pytest

from biprm.data.encoding import Encoder, first_runs, step_windows
from biprm.data.trajectory import DataError, Trajectory
from biprm.scoring import Scorer
from biprm.scoring.step_scores import score_rows

QUESTION = "Tom has 23 apples, throws 3 away and gives 12 to friends. How many are left?"


def _trace(n: int) -> Trajectory:
    """n steps of different lengths, a reflection passage among them."""
    steps = [
        f"Step {t}: " + ("Wait, let me re-check that: " * (t % 3)) + f"23 - 3 = 20 and 20 - 12 = {8 + t % 2}."
        for t in range(n)
    ]
    return Trajectory(QUESTION, steps)


def test_step_windows_by_hand():
    assert step_windows([3, 3, 3, 3, 3], 7) == [(0, 2), (1, 3), (2, 4), (3, 5)]
    assert first_runs([(0, 2), (1, 3), (2, 4), (3, 5)], 5) == [(0, 0), (0, 1), (1, 1), (2, 1), (3, 1)]
    # from 0: 2 + 5 + 1 = 8 fits; the next run keeps step 2 (1 token, within half the budget) but not step 1 (5)
    assert step_windows([2, 5, 1, 1, 4], 8) == [(0, 3), (2, 5)]
    assert first_runs([(0, 3), (2, 5)], 5) == [(0, 0), (0, 1), (0, 2), (1, 1), (1, 2)]
    assert step_windows([4, 4, 4], 6, overlap=0.0) == [(0, 1), (1, 2), (2, 3)] and step_windows([1, 1], 6) == [(0, 2)]


@pytest.fixture(scope="module")
def encoder(bi_scorer) -> Encoder:
    return bi_scorer.encoder


def _policy(encoder: Encoder, overlength: str, max_length: int) -> Encoder:
    return Encoder(encoder.tokenizer, encoder.step_tag_id, max_length, encoder.template, overlength)


def test_each_policy_says_what_it_kept(encoder):
    traj = _trace(12)
    whole = _policy(encoder, "head", 10**6).encode(traj)
    lengths = [len(s) for s in whole.steps]
    limit = len(whole.prompt) + sum(lengths[:5]) + 1  # five steps fit from the start
    head = _policy(encoder, "head", limit).encode(traj)
    assert head.steps == whole.steps[:5] and head.n_dropped == 7 and head.first == 0 and not head.windowed
    tail = _policy(encoder, "tail", limit).encode(traj)
    k = int(np.searchsorted(np.cumsum(lengths[::-1]), limit - len(whole.prompt), side="right"))
    assert tail.steps == whole.steps[-k:] and tail.n_dropped == 12 - k and tail.first == 12 - k
    window = _policy(encoder, "window", limit).encode(traj)
    assert window.steps == whole.steps and window.windowed and window.n_dropped == 0
    with pytest.raises(
        DataError, match=rf"^row 3: {whole.n_tokens} tokens, past max_length={limit} \(overlength policy: refuse\)$"
    ):
        _policy(encoder, "refuse", limit).encode(traj, "row 3")
    too_long = Trajectory(QUESTION, ["short.", "x " * 400, "short."])
    with pytest.raises(
        DataError, match=r"^row 4: step 1 alone needs \d+ tokens, past the \d+ that max_length=200 leaves"
    ):
        _policy(encoder, "window", 200).encode(too_long, "row 4")
    assert _policy(encoder, "refuse", 10**6).encode(traj).steps == whole.steps  # a row that fits is never touched
    with pytest.raises(ValueError, match="overlength 'drop'"):
        _policy(encoder, "drop", 100)


def test_windowed_scores_read_each_step_with_its_window_of_context(bi_scorer):
    """L2R reads step t after the steps of the first window that holds it; R2L after the steps of the last one. Each
    equals scoring exactly that window's steps in one pass, and the fused score fuses the two with the gate as in one
    pass."""
    traj = _trace(10)
    whole = _policy(bi_scorer.encoder, "head", 10**6).encode(traj)
    lengths = [len(s) for s in whole.steps]
    limit = len(whole.prompt) + sum(sorted(lengths)[-3:])  # about three steps per window
    windowed = Scorer(bi_scorer.model, bi_scorer.tokenizer, max_length=limit, overlength="window", prefix_cache=False)
    encs, _ = windowed.encode([traj, _trace(2)])
    assert encs[0].windowed and not encs[1].windowed
    got = windowed.score(encs, progress=False)
    assert len(got.of(0)) == 10 and len(got.of(1)) == 2
    plain = Scorer(bi_scorer.model, bi_scorer.tokenizer, max_length=10**6, prefix_cache=False)
    short = plain.score(plain.encode([_trace(2)])[0], progress=False)
    np.testing.assert_allclose(got.of(1, "fused"), short.of(0, "fused"), atol=1e-5)
    budget = limit - len(whole.prompt)
    runs = step_windows(lengths, budget)
    for t, (j, _) in enumerate(first_runs(runs, 10)):
        alone = plain.score(plain.encode([Trajectory(QUESTION, traj.steps[runs[j][0] : t + 1])])[0], progress=False)
        assert abs(got.l2r[t] - alone.l2r[-1]) < 1e-4, t
    back = step_windows(lengths[::-1], budget)
    for u, (j, _) in enumerate(first_runs(back, 10)):
        t = 9 - u
        alone = plain.score(plain.encode([Trajectory(QUESTION, traj.steps[t : 10 - back[j][0]])])[0], progress=False)
        assert abs(got.r2l[t] - alone.r2l[0]) < 1e-4, t
    sigma = got.sigma[:10]
    np.testing.assert_allclose(got.fused[:10], sigma * got.l2r[:10] + (1 - sigma) * got.r2l[:10], atol=1e-6)
    rows = list(score_rows([traj, _trace(2)], got, encs=encs))
    assert (
        rows[0]["windowed"] and rows[0]["n_dropped"] == 0 and rows[0]["steps_scored"] == 10 and not rows[1]["windowed"]
    )


def test_a_trace_past_the_tiny_models_window_under_each_policy(bi_scorer):
    """The tiny model reads 4,096 positions; a trace of about 6,000 tokens is refused, cut or windowed, and says so."""
    traj = _trace(100)
    n_tokens = _policy(bi_scorer.encoder, "head", 10**6).encode(traj).n_tokens
    limit = bi_scorer.model.config.backbone_config.max_position_embeddings
    assert n_tokens > limit
    rows = {}
    for policy in ("head", "tail", "window"):
        scorer = Scorer(bi_scorer.model, bi_scorer.tokenizer, max_length=limit, overlength=policy, prefix_cache=False)
        encs, _ = scorer.encode([traj])
        rows[policy] = next(score_rows([traj], scorer.score(encs, progress=False), encs=encs))
    assert rows["head"]["n_dropped"] == 100 - rows["head"]["steps_scored"] > 0 and rows["head"]["first_scored"] == 0
    assert rows["tail"]["first_scored"] == rows["tail"]["n_dropped"] == 100 - rows["tail"]["steps_scored"] > 0
    assert rows["window"]["steps_scored"] == 100 and rows["window"]["windowed"] and rows["window"]["n_dropped"] == 0
    assert all(v is not None and 0 <= v <= 1 for v in rows["window"]["fused"])
    refuse = Scorer(bi_scorer.model, bi_scorer.tokenizer, max_length=limit, overlength="refuse")
    with pytest.raises(DataError, match=rf"trajectory 0: {n_tokens} tokens, past max_length={limit}"):
        refuse.encode([traj])


@pytest.mark.parametrize("mode", ["l2r", "r2l", "bi-static", "bi"])
def test_past_dense_max_a_batch_runs_plain_rows_without_a_mask_and_the_same_scores(bi_scorer, mode):
    """The switch to one causal row per stream (no L x L mask) gives the tree layout's scores within fp32 tolerance."""
    import torch

    from biprm.backbones import load_tokenizer, resolve_backbone
    from biprm.modeling import from_backbone
    from biprm.packing import attention_mask, pack

    torch.manual_seed(1)
    tok = load_tokenizer(resolve_backbone("tiny"))
    model = from_backbone(resolve_backbone("tiny"), tok, mode=mode).eval()
    encs = [bi_scorer.encoder.encode(t) for t in (_trace(30), _trace(3), _trace(12))]
    assert 1024 < max(e.n_tokens for e in encs) < 2048
    dense = pack(encs, mode, share_prefix=True, max_tokens=512, dense_max=None)
    linear = pack(encs, mode, share_prefix=True, max_tokens=512)
    assert attention_mask(dense["unit_ids"], dense["stream_ids"]) is not None
    assert attention_mask(linear["unit_ids"], linear["stream_ids"]) is None
    with torch.inference_mode():
        a, b = model(**dense), model(**linear)
    for key in ("fused", "l2r", "r2l", "sigma"):
        if getattr(a, key) is not None:
            torch.testing.assert_close(getattr(b, key), getattr(a, key), atol=1e-4, rtol=1e-4)


def test_a_pool_of_long_candidates_skips_the_prompt_cache_and_its_square_masks(bi_scorer, monkeypatch):
    """Best-of-N candidates past DENSE_MAX tokens run the one-pass layout (plain causal rows) even where the question
    has enough candidates for the prompt cache, whose per-row masks grow with the square of the row's length."""
    import biprm.scoring.scorer as scorer_module
    from biprm.packing import pack_cached

    used = []
    monkeypatch.setattr(scorer_module, "pack_cached", lambda *a, **k: used.append(len(a[0])) or pack_cached(*a, **k))
    pool = lambda n: [Trajectory(QUESTION, _trace(n).steps + [f"The answer is {i}."]) for i in range(4)]  # noqa: E731
    long_encs, _ = bi_scorer.encode(pool(30))
    assert min(e.n_tokens for e in long_encs) > 1024
    assert len(bi_scorer.score(long_encs, progress=False)) == 4 and not used
    short_encs, _ = bi_scorer.encode(pool(3))
    bi_scorer.score(short_encs, progress=False)
    assert used  # four short candidates of one question: the prompt cache


@pytest.mark.slow
def test_bench_long_preset_runs_and_reports_its_targets(tmp_path, capsys):
    """`python -m benchmarks --preset long` on tiny sizes: every configuration probed, the targets read from one run."""
    from benchmarks.config import BenchConfig
    from benchmarks.long import main

    result = main(
        BenchConfig(preset="long", shape="tiny", out=str(tmp_path), threads=1),
        sizes=dict(lengths=[512, 4096], layers=None, tree_max=512, train_length=1024),
    )
    assert {(r["config"], r["length"]) for r in result["results"]} == {
        ("l2r", 512),
        ("bi:plain", 512),
        ("bi:tree", 512),
        ("l2r", 4096),
        ("bi:plain", 4096),
    }
    said = capsys.readouterr().err.splitlines()  # what it measures, then each probe with the time left
    assert said[0].startswith("python -m benchmarks --preset long: 5 traces of 512, 4096 tokens on the tiny shape")
    assert said[-1].startswith("[6/6] tiny training step at 1024 tokens: ") and "about" in said[-3]
    assert [t["target"] for t in result["targets"]][0] == "time per token, bi:plain / l2r"
    assert (tmp_path / "bench-tiny-long.md").read_text().startswith("# biprm bench: one long trace")
