"""The Scorer's budgets follow its device, its settings come from one dataclass, and both attention kernels agree."""
import types

import numpy as np
import pytest
import torch
from transformers import Qwen2Config

from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.config import ScorerSettings
from biprm.modeling import from_backbone
from biprm.scoring import CPU_BUDGETS, Budgets, Scorer, budgets_for_memory, device_budgets
from conftest import scored
from test_model import CANDIDATES, assert_same_scores

QWEN_1_5B = Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12, num_key_value_heads=2)


def test_budgets_fill_a_share_of_free_gpu_memory():
    # per token, bf16: 2 x (6*1536 + 3*8960 + 2*28*2*128 + 512*12) = 113,152 bytes
    assert budgets_for_memory(80 * 10**9, QWEN_1_5B, torch.bfloat16) == Budgets(176128, 4 * 176128, 176128)
    assert budgets_for_memory(2 * 2**30, QWEN_1_5B, torch.bfloat16) == Budgets(4096, 16384, 4096)  # never below the CPU's
    assert budgets_for_memory(10**13, QWEN_1_5B, torch.bfloat16).one_pass == 1 << 18  # capped


def test_scorer_budgets_follow_the_device(bi_scorer, monkeypatch):
    assert bi_scorer.model.device.type == "cpu" and bi_scorer.budgets == CPU_BUDGETS
    assert bi_scorer.tokens_per_call == CPU_BUDGETS.per_call
    on_gpu = types.SimpleNamespace(device=torch.device("cuda", 0), dtype=torch.bfloat16, config=types.SimpleNamespace(backbone_config=QWEN_1_5B))
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
    settings = ScorerSettings(device="cpu", max_length=300, tokens_per_batch=777, tokens_per_call=99, tokens_per_row=0, attn_implementation="eager")
    scorer = Scorer.from_settings(str(tmp_path), settings)
    assert (scorer.max_length, scorer.tokens_per_batch, scorer.tokens_per_call, scorer.tokens_per_row) == (300, 777, 99, None)
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
