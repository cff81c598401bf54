"""The Scorer (`biprm.scoring.scorer`): budgets that follow its device, settings from one dataclass, both attention
kernels, the prompt cache and length-sorted batches that keep the scores, each distinct trajectory scored once, float64
logits."""

import types

import numpy as np
import pytest
import torch
from transformers import Qwen2Config

from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.config import ScorerSettings
from biprm.data.encoding import Encoder
from biprm.data.trajectory import Trajectory
from biprm.modeling import from_backbone
from biprm.scoring import CPU_BUDGETS, Budgets, Scorer, device_budgets
from biprm.scoring.scorer import Collector, budgets_for_memory
from conftest import scored
from test_modeling import CANDIDATES, TRAJS, assert_same_scores, count_backbone_calls, make

QWEN_1_5B = Qwen2Config(
    hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2
)


def test_budgets_fill_a_share_of_free_gpu_memory():
    # per token, bf16: 2 x (6*1536 + 3*8960 + 2*28*2*128 + 512*12) = 113,152 bytes
    assert budgets_for_memory(80 * 10**9, QWEN_1_5B, torch.bfloat16) == Budgets(176128, 4 * 176128, 176128)
    assert budgets_for_memory(2 * 2**30, QWEN_1_5B, torch.bfloat16) == Budgets(
        4096, 16384, 4096
    )  # never below the CPU's
    assert budgets_for_memory(10**13, QWEN_1_5B, torch.bfloat16).one_pass == 1 << 18  # capped


def test_scorer_budgets_follow_the_device(bi_scorer, monkeypatch):
    assert bi_scorer.model.device.type == "cpu" and bi_scorer.budgets == CPU_BUDGETS
    assert bi_scorer.tokens_per_call == CPU_BUDGETS.per_call
    on_gpu = types.SimpleNamespace(
        device=torch.device("cuda", 0), dtype=torch.bfloat16, config=types.SimpleNamespace(backbone_config=QWEN_1_5B)
    )
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (80 * 10**9, 80 * 10**9))
    assert device_budgets(on_gpu) == budgets_for_memory(80 * 10**9, QWEN_1_5B, torch.bfloat16)


def test_batches_use_the_device_budget_unless_set(bi_scorer):
    encs, _ = bi_scorer.encode(CANDIDATES)
    tiny = Scorer(bi_scorer.model, bi_scorer.tokenizer, tokens_per_batch=1)
    assert len(tiny.batches(encs, cached=False)) == len(encs)  # one trajectory per batch at a budget of 1
    assert len(bi_scorer.batches(encs, cached=False)) == 1  # the CPU's 4,096 hold them all


def test_settings_reach_the_scorer(tmp_path):
    backbone = resolve_backbone("tiny")
    tok = load_tokenizer(backbone)
    model = from_backbone(backbone, tok, mode="bi")
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    settings = ScorerSettings(
        device="cpu",
        max_length=300,
        tokens_per_batch=777,
        tokens_per_call=99,
        tokens_per_row=0,
        attn_implementation="eager",
    )
    scorer = Scorer.from_settings(str(tmp_path), settings)
    assert (scorer.max_length, scorer.tokens_per_batch, scorer.tokens_per_call, scorer.tokens_per_row) == (
        300,
        777,
        99,
        None,
    )
    assert scorer.model.backbone.config._attn_implementation == "eager"
    with pytest.raises(ValueError, match="attn-implementation 'flex_attention'"):
        ScorerSettings(attn_implementation="flex_attention")


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_eager_attention_gives_the_sdpa_scores(bi_scorer, prefix_cache):
    """Eager attention adds the mask to the scores instead of taking it as booleans (`_for_backend`)."""
    model, scores = bi_scorer.model, {}
    for kernel in ("sdpa", "eager"):
        model.set_attn_implementation(kernel)
        assert model.backbone.config._attn_implementation == kernel
        scores[kernel] = scored(Scorer(model, bi_scorer.tokenizer, prefix_cache=prefix_cache), CANDIDATES)
    model.set_attn_implementation("sdpa")
    assert_same_scores(scores["sdpa"], scores["eager"], atol=1e-5)
    assert np.ptp(scores["sdpa"].fused) > 0  # not a constant that any kernel would match


def test_a_kernel_without_the_mask_is_refused():
    backbone = resolve_backbone("tiny")
    with pytest.raises(ValueError, match="only sdpa and eager"):
        from_backbone(backbone, load_tokenizer(backbone), mode="bi", attn_implementation="flex_attention")


@pytest.mark.parametrize("mode", ["l2r", "r2l", "bi", "bi-static"])
def test_prefix_cache_matches_plain_scoring(backbone, mode):
    """Prompts encoded once into a KV cache, continuations in length-sorted chunks: same scores in fp32."""
    model, tok = make(backbone, mode)
    plain = scored(Scorer(model, tok, share_prefix=False, tokens_per_row=None), CANDIDATES)
    for kw in [{}, {"tokens_per_call": 40}, {"tokens_per_call": 1, "tokens_per_batch": 60}]:
        assert_same_scores(plain, scored(Scorer(model, tok, prefix_cache=True, **kw), CANDIDATES))


def test_prompt_cache_is_picked_for_pools_with_many_candidates_per_question(backbone):
    model, tok = make(backbone, "bi")
    pool = [TRAJS[0], TRAJS[1], CANDIDATES[4], Trajectory(TRAJS[0].question, ["21 - 2 = 19.", "The answer is 19."])]
    calls, handle = count_backbone_calls(model)
    for trajs, expected in [(pool, 2), (CANDIDATES, 1)]:  # 4 candidates of one question; 7 of 3
        calls.clear()
        scored(Scorer(model, tok, tokens_per_batch=10**6, tokens_per_call=10**6), trajs)
        assert len(calls) == expected
    handle.remove()


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_length_bucketing_does_not_change_scores(backbone, prefix_cache):
    """All trajectories in one length-sorted batch, or each (question, with the cache) alone: the same scores."""
    model, tok = make(backbone, "bi")
    bucketed = Scorer(model, tok, prefix_cache=prefix_cache, tokens_per_batch=10**6)
    alone = Scorer(model, tok, prefix_cache=prefix_cache, tokens_per_batch=1)
    encs = [bucketed.encoder.encode(t) for t in CANDIDATES]
    n_alone = (
        len({t.question for t in CANDIDATES}) if prefix_cache else len(CANDIDATES)
    )  # a question's prompt is never split
    assert len(bucketed.batches(encs, prefix_cache)) == 1 and len(alone.batches(encs, prefix_cache)) == n_alone
    assert_same_scores(scored(bucketed, CANDIDATES), scored(alone, CANDIDATES), atol=1e-5)


def test_identical_candidates_are_scored_once(backbone):
    model, tok = make(backbone, "bi")
    pool = [CANDIDATES[1], CANDIDATES[0], CANDIDATES[1], CANDIDATES[4], CANDIDATES[0]]
    scorer = Scorer(model, tok)
    seen = []
    encode = scorer.encoder.encode
    scorer.encoder.encode = lambda t, where: seen.append(where) or encode(t, where)
    scores = scored(scorer, pool)
    assert seen == ["trajectory 0", "trajectory 1", "trajectory 3"]
    one_each = scored(Scorer(model, tok), [CANDIDATES[1], CANDIDATES[0], CANDIDATES[4]])
    assert_same_scores(scores, one_each.select(np.array([0, 1, 0, 2, 1])), atol=1e-6)
    assert len(scored(scorer, [])) == 0


def test_scorer_warns_when_trailing_steps_are_not_scored(backbone, caplog):
    model, tok = make(backbone, "bi")
    full = Encoder(tok, model.config.step_tag_id).encode(TRAJS[3])
    scorer = Scorer(model, tok, max_length=full.n_tokens - len(full.steps[-1]))
    with caplog.at_level("WARNING", logger="biprm.scoring.scorer"):
        scores = scored(scorer, TRAJS[2:])
    assert np.diff(scores.offsets).tolist() == [2, 3]
    assert "1 of 2 trajectories exceed max_length" in caplog.text


def test_step_probabilities_keep_float64_resolution():
    collect = Collector(np.array([0, 1, 2]), "l2r")
    logits = torch.tensor([12.0, 12.0001], dtype=torch.float32)
    collect(np.array([0, 1]), type("Out", (), {"fused": logits, "l2r": logits, "r2l": None, "sigma": None})())
    fused = collect.scores().fused
    assert fused.dtype == np.float64 and fused[1] > fused[0]  # float32 sigmoids would both round to 0.99999386


def test_the_wings_public_names_resolve_and_its_numpy_half_loads_no_torch():
    """`from biprm import Scorer, StepScores` and `from biprm.scoring import ...` keep working; the metrics, which
    need only `aggregate`, never pay for torch (a fresh interpreter each)."""
    import subprocess
    import sys

    public = (
        "from biprm import Scorer, StepScores\nfrom biprm.scoring import Scorer as S, StepScores as T, Budgets, "
        "CPU_BUDGETS, device_budgets, load_scores, save_scores\n"
    )
    code = public + "print(Scorer is S, StepScores is T, Budgets.__module__, save_scores.__module__)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["True", "True", "biprm.scoring.scorer", "biprm.scoring.step_scores"], done.stderr[
        -2000:
    ]
    code = (
        "import sys\nimport biprm.scoring.step_scores, biprm.metrics.first_error, "
        "biprm.metrics.prmbench\nprint('torch' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.split() == ["False"], done.stderr[-2000:]
