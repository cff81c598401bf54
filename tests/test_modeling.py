"""The model's contract: one backbone pass, exact prefix sharing, packing and prompt caching, index alignment, round
trip."""

import numpy as np
import pytest
import torch

from biprm.backbones import load_tokenizer
from biprm.data.encoding import Encoder
from biprm.data.template import STEP_TAG
from biprm.data.trajectory import DataError, Trajectory
from biprm.modeling import from_backbone
from biprm.packing import attention_mask, check_tags, pack, pack_cached
from biprm.scoring import Scorer
from conftest import ROOT, scored

TRAJS = [
    Trajectory(
        "Tom has 3 bags of 7 apples. He eats 2. How many are left?",
        ["3 * 7 = 21 apples.", "21 - 2 = 19.", "The answer is 19."],
        [1, 1, 1],
    ),
    Trajectory(
        "Tom has 3 bags of 7 apples. He eats 2. How many are left?",
        ["3 * 7 = 24 apples.", "24 - 2 = 22.", "The answer is 22."],
        [0, 0, 0],
    ),
    Trajectory("Ann reads 12 pages a day for 5 days. How many pages?", ["12 * 5 = 60.", "The answer is 60."], [1, 1]),
    Trajectory(
        "A box holds 4 rows of 6 eggs. How many eggs?",
        ["4 * 6 = 24 eggs.", "Now half of them break: 12.", "So 24 remain.", "The answer is 24."],
        [1, 0, 0, 0],
    ),
]

# Best-of-N shaped: several candidates per question, of different lengths
CANDIDATES = TRAJS + [
    Trajectory(
        TRAJS[0].question,
        ["7 * 3 = 21.", "He eats 2 of them, so 21 - 2 = 19 are left.", "The answer is 19."],
        [1, 1, 1],
    ),
    Trajectory(TRAJS[2].question, ["The answer is 60."], [1]),
    Trajectory(TRAJS[3].question, ["6 * 4 = 24.", "The answer is 24."], [1, 1]),
]
STREAM_KEYS = ("fused", "l2r", "r2l", "sigma")


def make(backbone, mode, **kw):
    tok = load_tokenizer(backbone)
    torch.manual_seed(0)
    return from_backbone(backbone, tok, mode=mode, **kw).eval(), tok


def assert_same_scores(a, b, atol=1e-4):
    for stream in STREAM_KEYS:
        x, y = getattr(a, stream), getattr(b, stream)
        assert (x is None) == (y is None)
        if x is not None:
            np.testing.assert_allclose(x, y, atol=atol)


def count_backbone_calls(model):
    calls = []
    handle = model.backbone.register_forward_hook(lambda *a: calls.append(1))
    return calls, handle


@pytest.mark.parametrize("mode", ["l2r", "r2l", "bi", "bi-static"])
def test_one_backbone_pass_per_training_step_and_scoring_batch(backbone, mode):
    model, tok = make(backbone, mode)
    model.train()
    enc = Encoder(tok, model.config.step_tag_id)
    batch = pack([enc.encode(t) for t in TRAJS], mode)
    calls, handle = count_backbone_calls(model)
    model(**batch).loss.backward()
    assert len(calls) == 1
    calls.clear()
    scored(Scorer(model, tok, tokens_per_batch=10**6), TRAJS)
    handle.remove()
    assert len(calls) == 1


@pytest.mark.parametrize("mode", ["l2r", "r2l", "bi", "bi-static"])
def test_prefix_sharing_and_packing_preserve_scores(backbone, mode):
    model, tok = make(backbone, mode)
    plain = scored(Scorer(model, tok, share_prefix=False, tokens_per_row=None), TRAJS)
    for share, row in [(True, None), (True, 64), (False, 4096), (True, 4096)]:
        assert_same_scores(plain, scored(Scorer(model, tok, share_prefix=share, tokens_per_row=row), TRAJS))
    # one trajectory alone scores the same as inside a batch (bucketing does not leak across items)
    alone = scored(Scorer(model, tok), TRAJS[3:])
    np.testing.assert_allclose(alone.prob(), plain.of(3), atol=1e-4)


def test_prefix_cache_calls_the_backbone_once_for_prompts_then_once_per_chunk(backbone):
    model, tok = make(backbone, "bi")
    encs = [Encoder(tok, model.config.step_tag_id).encode(t) for t in CANDIDATES]
    calls, handle = count_backbone_calls(model)
    scored(Scorer(model, tok, prefix_cache=True, tokens_per_batch=10**6, tokens_per_call=10**6), CANDIDATES)
    assert len(calls) == 2
    calls.clear()
    batch = pack_cached(encs, "bi", max_tokens=60)
    with torch.no_grad():
        model.score_with_prefix(**batch)
    handle.remove()
    assert len(batch["chunks"]) > 2 and len(calls) == 1 + len(batch["chunks"]) - 1


def test_pack_cached_layout(backbone):
    """Each prompt once; one continuation per row, longest first; chunks within the budget; positions after the
    prompt."""
    model, tok = make(backbone, "bi")
    encs = [Encoder(tok, model.config.step_tag_id).encode(t) for t in CANDIDATES]
    batch = pack_cached(encs, "bi", max_tokens=60)
    check_tags(batch, model.config.step_tag_id)
    assert len(batch["prefix_ids"]) == len({t.question for t in CANDIDATES})
    width = (batch["unit_ids"] >= 0).sum(1)
    assert len(width) == 2 * len(encs) and bool((width[:-1] >= width[1:]).all())
    bounds = batch["chunks"].tolist()
    assert bounds[0] == 0 and bounds[-1] == len(width)
    assert all(b - a == 1 or (b - a) * int(width[a]) <= 60 for a, b in zip(bounds[:-1], bounds[1:]))
    assert bool((batch["position_ids"][:, 0] == batch["prefix_lengths"][batch["prefix_rows"]]).all())


def test_one_sequence_rows_take_the_plain_causal_path(backbone):
    """No mask, and position ids that never restart inside a row (padding continues them), so
    transformers does not build a packed-sequence mask and SDPA runs its causal kernel."""
    from transformers.masking_utils import find_packed_sequence_indices

    model, tok = make(backbone, "bi")
    encs = [Encoder(tok, model.config.step_tag_id).encode(t) for t in CANDIDATES]
    distinct = [encs[i] for i in (0, 2, 3)]  # with sharing, a prompt followed by one stream is one plain sequence
    too_long = pack(
        encs[:1], "bi", share_prefix=True, max_tokens=8
    )  # a tree wider than a row: one plain row per stream
    assert too_long["input_ids"].shape[0] == 2
    for batch in (pack(encs, "bi", share_prefix=False), pack(distinct, "l2r", share_prefix=True), too_long):
        assert attention_mask(batch["unit_ids"], batch["stream_ids"]) is None
        assert find_packed_sequence_indices(batch["position_ids"]) is None


def test_r2l_scores_are_aligned_by_index(backbone):
    """Recompute R2L by hand: prompt + s_T..s_1 through the backbone, value head at each tag."""
    model, tok = make(backbone, "bi")
    scores = scored(Scorer(model, tok), TRAJS)
    enc = Encoder(tok, model.config.step_tag_id).encode(TRAJS[3])
    ids = enc.prompt + [i for s in enc.steps[::-1] for i in s]
    with torch.no_grad():
        h = model.backbone(input_ids=torch.tensor([ids])).last_hidden_state[0]
        tags = [k for k, i in enumerate(ids) if i == model.config.step_tag_id]  # tags of s_T .. s_1
        r2l = torch.sigmoid(model.value_head(h[tags[::-1]]).squeeze(-1)).numpy()
    np.testing.assert_allclose(scores.of(3, "r2l"), r2l, atol=1e-5)


def test_zero_rewards_are_not_mistaken_for_padding(backbone):
    model, tok = make(backbone, "bi-static")
    torch.nn.init.zeros_(model.value_head.weight)
    torch.nn.init.zeros_(model.value_head.bias)
    scores = scored(Scorer(model, tok), TRAJS)
    assert len(scores.fused) == sum(len(t.steps) for t in TRAJS)
    np.testing.assert_allclose(scores.fused, 0.0)  # logits


def test_modes_and_gate(backbone):
    bi, tok = make(backbone, "bi")
    H = bi.config.backbone_config.hidden_size
    assert sum(p.numel() for p in bi.gate.parameters()) == 2 * H * H + H + H + 1
    s = scored(Scorer(bi, tok), TRAJS)
    assert ((s.sigma > 0) & (s.sigma < 1)).all()
    static, _ = make(backbone, "bi-static")
    assert static.gate is None
    np.testing.assert_allclose(scored(Scorer(static, tok), TRAJS).sigma, 0.5)
    l2r, _ = make(backbone, "l2r")
    s = scored(Scorer(l2r, tok), TRAJS)
    assert s.r2l is None and s.sigma is None
    np.testing.assert_allclose(s.fused, s.l2r)


@pytest.mark.parametrize("detach", [True, False])
def test_gate_input_detach_option(backbone, detach):
    model, tok = make(backbone, "bi", detach_gate_inputs=detach)
    batch = pack([Encoder(tok, model.config.step_tag_id).encode(t) for t in TRAJS], "bi")
    model(**batch).sigma.sum().backward()
    backbone_grad = sum(p.grad.abs().sum() for p in model.backbone.parameters() if p.grad is not None)
    assert model.gate[0].weight.grad.abs().sum() > 0
    assert (backbone_grad == 0) if detach else (backbone_grad > 0)


def test_aux_loss_weight_adds_per_stream_losses(backbone):
    base, tok = make(backbone, "bi")
    aux, _ = make(backbone, "bi", aux_loss_weight=0.5)
    batch = pack([Encoder(tok, base.config.step_tag_id).encode(t) for t in TRAJS], "bi")
    out = aux(**batch)
    from biprm.losses import bce_loss

    expected = bce_loss(out.fused, batch["labels"], batch["step_offsets"]) + 0.5 * (
        bce_loss(out.l2r, batch["labels"], batch["step_offsets"])
        + bce_loss(out.r2l, batch["labels"], batch["step_offsets"])
    )
    assert out.loss.item() == pytest.approx(expected.item(), rel=1e-5)


@pytest.mark.parametrize("mode", ["l2r", "bi"])
def test_save_and_load_round_trip(backbone, mode, tmp_path):
    model, tok = make(backbone, mode)
    before = scored(Scorer(model, tok), TRAJS)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    loaded = Scorer.from_pretrained(str(tmp_path), device="cpu")
    assert loaded.model.config.mode == mode
    assert loaded.tokenizer.convert_tokens_to_ids(STEP_TAG) == model.config.step_tag_id
    after = scored(loaded, TRAJS)
    np.testing.assert_allclose(before.fused, after.fused, rtol=0, atol=1e-6)
    if mode == "bi":
        np.testing.assert_allclose(before.sigma, after.sigma, rtol=0, atol=1e-6)


def test_tags_found_by_id_in_final_input_ids(backbone):
    model, tok = make(backbone, "bi")
    batch = pack([Encoder(tok, model.config.step_tag_id).encode(t) for t in TRAJS], "bi")
    check_tags(batch, model.config.step_tag_id)
    batch["l2r_index"] = batch["l2r_index"] - 1
    with pytest.raises(AssertionError, match="not the step tag"):
        check_tags(batch, model.config.step_tag_id)


def test_step_text_containing_the_tag_is_rejected(backbone):
    model, tok = make(backbone, "l2r")
    bad = Trajectory("q?", ["first " + STEP_TAG + " second"], [1])
    with pytest.raises(DataError, match="row 7.*2 step-tag tokens for 1 steps"):
        Encoder(tok, model.config.step_tag_id).encode(bad, "data.jsonl row 7")


def test_truncation_drops_whole_trailing_steps_in_both_streams(backbone):
    model, tok = make(backbone, "bi")
    full = Encoder(tok, model.config.step_tag_id).encode(TRAJS[3])
    limit = full.n_tokens - len(full.steps[-1])  # room for all but the last step
    cut = Encoder(tok, model.config.step_tag_id, max_length=limit).encode(TRAJS[3])
    assert cut.n_dropped == 1 and cut.steps == full.steps[:-1] and cut.labels == [1, 0, 0]
    batch = pack([cut], "bi")
    check_tags(batch, model.config.step_tag_id)
    assert len(batch["l2r_index"]) == len(batch["r2l_index"]) == 3


def test_heads_run_in_fp32_under_a_bf16_backbone_and_autocast(backbone, tmp_path):
    """A bf16 logit near 10 moves in steps of 0.06 and ties Best-of-N candidates; the heads keep fp32."""
    from biprm.modeling import BiPRMModel

    model, tok = make(backbone, "bi")
    model.save_pretrained(tmp_path)
    loaded = BiPRMModel.from_pretrained(tmp_path, dtype=torch.bfloat16)
    dtypes = {name: p.dtype for name, p in loaded.named_parameters()}
    assert all(d == torch.float32 for n, d in dtypes.items() if n.startswith(("value_head.", "gate.")))
    assert all(
        d == torch.bfloat16 for n, d in dtypes.items() if n.startswith("backbone.")
    )  # gate_proj too: only our gate is kept
    h = torch.randn(5, model.config.backbone_config.hidden_size, dtype=torch.bfloat16)
    offsets = torch.tensor([0, 5])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = loaded.heads(h, h.flip(0), offsets)
    assert out.fused.dtype == out.l2r.dtype == out.sigma.dtype == torch.float32
    expected = h.float() @ loaded.value_head.weight.T + loaded.value_head.bias
    torch.testing.assert_close(out.l2r, expected.squeeze(-1), rtol=1e-6, atol=1e-6)


def test_heads_compute_in_fp32_when_an_engine_casts_every_weight_to_bf16(backbone, tmp_path):
    """DeepSpeed's bf16 mode and FSDP's mixed precision cast the heads' weights too; logits, sigma and the
    fusion must stay fp32, equal to the fp32 model's within the bf16 body's noise, and save in fp32."""
    import copy

    from safetensors import safe_open

    model, tok = make(backbone, "bi")
    cast = copy.deepcopy(model).bfloat16()
    encoder = Encoder(tok, model.config.step_tag_id)
    batch = pack([encoder.encode(t) for t in TRAJS], "bi")
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        got = cast(**batch)
    want = model(**batch)
    for key in ("fused", "l2r", "r2l", "sigma"):
        assert getattr(got, key).dtype == torch.float32
        torch.testing.assert_close(getattr(got, key), getattr(want, key).detach(), atol=0.05, rtol=0.05)
    cast.save_pretrained(tmp_path)
    with safe_open(str(next(tmp_path.glob("*.safetensors"))), "pt") as f:
        dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys()}
    assert {dtypes[k] for k in dtypes if k.startswith(("value_head.", "gate."))} == {"F32"}
    assert dtypes["backbone.norm.weight"] == "BF16"


def test_step_tag_row_starts_at_the_mean_when_the_table_is_padded_past_the_tokenizer(backbone, tmp_path):
    """Qwen2.5's table has rows past its tokenizer, so the tag lands on an existing, never-trained row
    without a resize; that row must still start at the mean of the known tokens' rows."""
    from transformers import AutoModel

    tok = load_tokenizer(backbone)
    body = AutoModel.from_pretrained(backbone)
    known = len(tok)
    body.resize_token_embeddings(known + 16, mean_resizing=False)
    with torch.no_grad():
        body.get_input_embeddings().weight[known:] = 7.0  # padding rows far from the mean
    body.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    model = from_backbone(str(tmp_path), tok, mode="bi")
    table = model.backbone.get_input_embeddings().weight
    assert table.shape[0] == known + 16 and model.config.step_tag_id == known
    torch.testing.assert_close(table[known], table[:known].mean(0))
    assert bool((table[known + 1 :] == 7.0).all())  # rows no token uses are left alone


def test_new_rows_are_gathered_under_zero3_and_refused_when_they_cannot_be(monkeypatch):
    """Under ZeRO-3 a parameter is an empty shard until gathered: writing into it would silently do nothing."""
    import sys
    import types
    from contextlib import contextmanager

    from biprm.modeling import init_new_rows

    full = torch.randn(6, 3)
    table = torch.nn.Parameter(torch.empty(0))
    table.ds_id = 0

    @contextmanager
    def gathered(params, modifier_rank=None):  # a stand-in for deepspeed.zero.GatheredParameters
        assert modifier_rank == 0
        params[0].data = full.clone()
        yield
        full.copy_(params[0].data)
        params[0].data = torch.empty(0)

    fake = types.ModuleType("deepspeed")
    fake.zero = types.SimpleNamespace(GatheredParameters=gathered)
    monkeypatch.setitem(sys.modules, "deepspeed", fake)
    known_mean = full[:4].mean(0)
    init_new_rows(table, known=4, total=5)
    torch.testing.assert_close(full[4], known_mean)
    assert table.numel() == 0  # partitioned again
    with pytest.raises(RuntimeError, match="partitioned"):
        init_new_rows(torch.nn.Parameter(torch.empty(0)), known=4, total=5)


def test_a_bf16_model_built_on_a_backbone_keeps_its_heads_in_fp32():
    from biprm.backbones import load_tokenizer, resolve_backbone
    from biprm.modeling import from_backbone

    path = resolve_backbone("tiny")
    model = from_backbone(path, load_tokenizer(path), mode="bi", dtype=torch.bfloat16)
    assert model.backbone.get_input_embeddings().weight.dtype == torch.bfloat16
    assert {p.dtype for n, p in model.named_parameters() if n.startswith(("value_head.", "gate."))} == {torch.float32}


def test_deepspeed_fills_its_auto_zero3_buckets_from_the_config(backbone):
    """The paper's recipe (configs/ds_zero3.json) leaves ZeRO-3's buckets on "auto", which transformers sizes from
    `config.hidden_size`; a config that nests its backbone's made DeepSpeed refuse to start on the first GPU."""
    import json

    pytest.importorskip("deepspeed")
    from transformers import TrainingArguments
    from transformers.integrations.deepspeed import HfTrainerDeepSpeedConfig

    model = from_backbone(backbone, load_tokenizer(backbone), mode="bi")
    ds = HfTrainerDeepSpeedConfig(json.loads((ROOT / "configs" / "ds_zero3.json").read_text()))
    args = TrainingArguments(
        output_dir="unused", per_device_train_batch_size=2, gradient_accumulation_steps=4, report_to=[]
    )
    ds.trainer_config_process(args)
    ds.trainer_config_finalize(args, model, num_training_steps=10)
    H = model.config.backbone_config.hidden_size
    assert model.config.hidden_size == H
    assert ds.config["zero_optimization"]["reduce_bucket_size"] == H * H
    assert ds.config["zero_optimization"]["stage3_param_persistence_threshold"] == 10 * H
    assert "hidden_size" not in model.config.to_dict()  # read from the backbone, never saved twice


def test_a_config_json_holding_the_width_loads_and_a_wrong_one_is_refused():
    from transformers import LlamaConfig

    from biprm.modeling import BiPRMConfig

    body = LlamaConfig(hidden_size=64, num_attention_heads=4).to_dict()
    assert BiPRMConfig.from_dict({"backbone_config": body, "hidden_size": 64}).hidden_size == 64
    with pytest.raises(ValueError, match="hidden_size 32 differs from the backbone's 64"):
        BiPRMConfig.from_dict({"backbone_config": body, "hidden_size": 32})
