"""Frozen trunk: training and scoring from cached bottom-layer features equal the full model with the same layers
frozen."""

import copy
import json

import numpy as np
import pytest
import torch
from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.config import MODE_TABLE
from biprm.data.encoding import Encoded, Encoder, add_step_tag
from biprm.data.template import STEP_TAG
from biprm.data.trajectory import Trajectory
from biprm.modeling import BiPRMConfig, BiPRMModel, split
from biprm.packing import pack
from biprm.trunk import Layout, TrunkCache, _digest, cached_scores, freeze_bottom, grouped_batches
from conftest import scored

TRAJS = [
    Trajectory(
        "Tom has 3 bags of 7 apples. He eats 2. How many are left?",
        ["3 * 7 = 21 apples.", "21 - 2 = 19.", "The answer is 19."],
        [1, 1, 1],
    ),
    Trajectory(
        "Tom has 3 bags of 7 apples. He eats 2. How many are left?",
        ["3 * 7 = 24 apples.", "24 - 2 = 22.", "The answer is 22."],
        [1, 0, 0],
    ),
    Trajectory("Ann reads 12 pages a day for 5 days. How many pages?", ["12 * 5 = 60.", "The answer is 60."], [1, 1]),
    Trajectory(
        "A box holds 4 rows of 6 eggs. How many eggs?",
        ["4 * 6 = 24 eggs.", "Half break: 12.", "So 24 remain.", "The answer is 24."],
        [1, 0, 0, 0],
    ),
]
SMALL = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2)
BODIES = {
    "llama": lambda v: LlamaConfig(vocab_size=v, **SMALL),
    "mistral": lambda v: MistralConfig(vocab_size=v, sliding_window=8, **SMALL),  # window shorter than the rows
    "qwen2": lambda v: Qwen2Config(vocab_size=v, **SMALL),
}


@pytest.fixture(scope="module")
def tokenizer():
    tok = load_tokenizer(resolve_backbone("tiny"))
    add_step_tag(tok)
    return tok


def build(tokenizer, kind: str, mode: str) -> BiPRMModel:
    step_tag_id = tokenizer.convert_tokens_to_ids(STEP_TAG)
    torch.manual_seed(0)
    config = BiPRMConfig(
        backbone_config=BODIES[kind](len(tokenizer)), mode=mode, step_tag_id=step_tag_id, detach_gate_inputs=False
    )
    config._attn_implementation = "sdpa"
    model = BiPRMModel(config)
    with torch.no_grad():  # heads away from their near-zero init, so every gradient is visibly non-zero
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model


def encodings(tokenizer):
    encoder = Encoder(tokenizer, tokenizer.convert_tokens_to_ids(STEP_TAG))
    return [encoder.encode(t) for t in TRAJS]


def trainable_grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.parametrize("kind", list(BODIES))
@pytest.mark.parametrize("mode", ["bi", "l2r", "r2l", "bi-static"])
def test_cached_training_and_scoring_equal_the_full_model_with_the_same_layers_frozen(tokenizer, tmp_path, kind, mode):
    top_layers = 2
    full = build(tokenizer, kind, mode)
    cached = copy.deepcopy(full)
    for m in (full, cached):
        freeze_bottom(m, top_layers)
    encs = encodings(tokenizer)

    batch = pack(encs, mode, share_prefix=False, pad_id=tokenizer.pad_token_id)
    out_full = full(**batch)
    out_full.loss.backward()

    cache = TrunkCache(tmp_path, cached, top_layers, encs).build(tokens_per_batch=64, progress=False)
    idx = np.arange(len(encs))
    out_cached = cached.forward_features(**cache.batch(idx, MODE_TABLE[mode].streams, [e.labels for e in encs]))
    out_cached.loss.backward()

    torch.testing.assert_close(out_cached.loss, out_full.loss, rtol=1e-5, atol=1e-6)
    for key in ("fused", "l2r", "r2l", "sigma"):
        a, b = getattr(out_cached, key), getattr(out_full, key)
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    grads_full, grads_cached = trainable_grads(full), trainable_grads(cached)
    assert grads_full.keys() == grads_cached.keys()
    assert not any(
        n.startswith(("backbone.embed_tokens", "backbone.layers.0.", "backbone.layers.1.")) for n in grads_full
    )
    assert any(n.startswith("backbone.layers.3.") for n in grads_full)
    for name, g in grads_full.items():
        assert g.abs().sum() > 0, name
        torch.testing.assert_close(grads_cached[name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_batches_of_any_subset_and_order_match(tokenizer, tmp_path):
    model = build(tokenizer, "llama", "bi").eval()
    encs = encodings(tokenizer)
    cache = TrunkCache(tmp_path, model, 1, encs).build(progress=False)
    with torch.no_grad():
        whole = model.forward_features(**cache.batch(np.arange(4), ("l2r", "r2l"))).fused
        some = model.forward_features(**cache.batch(np.array([3, 1]), ("l2r", "r2l"))).fused
    steps = np.cumsum([0] + [len(e.steps) for e in encs])
    expected = torch.cat([whole[steps[3] : steps[4]], whole[steps[1] : steps[2]]])
    torch.testing.assert_close(some, expected, rtol=1e-5, atol=1e-6)


def test_cache_is_keyed_by_weights_cut_and_data(tokenizer, tmp_path):
    model = build(tokenizer, "llama", "bi")
    encs = encodings(tokenizer)
    base = TrunkCache(tmp_path, model, 2, encs).dir
    assert TrunkCache(tmp_path, copy.deepcopy(model), 2, encs).dir == base  # same content, same folder
    assert TrunkCache(tmp_path, model, 1, encs).dir != base
    assert TrunkCache(tmp_path, model, 2, encs[:3]).dir != base
    assert TrunkCache(tmp_path, model, 2, encs, dtype=torch.bfloat16).dir != base
    # a top-layer weight is not part of the key: training the top never invalidates the cache
    with torch.no_grad():
        model.backbone.layers[3].mlp.down_proj.weight.add_(1.0)
    assert TrunkCache(tmp_path, model, 2, encs).dir == base
    with torch.no_grad():
        model.backbone.layers[0].mlp.down_proj.weight.add_(1.0)
    changed = TrunkCache(tmp_path, model, 2, encs).dir
    assert changed != base
    model.config.backbone_config.rms_norm_eps *= 10  # in no weight, yet every feature changes
    assert TrunkCache(tmp_path, model, 2, encs).dir != changed


def test_the_layout_part_of_the_key_is_the_one_built_caches_have():
    """The feature rows and their digest, pinned: a change in how the layout is laid out would orphan every built
    cache, and a resumed study would compute its trunk again (the value is the one biprm computed before this test)."""
    encs = [
        Encoded([1, 2, 3], [[4, 9], [5, 6, 9]], [1.0, 0.0]),
        Encoded([1, 2], [[7, 9]], [1.0]),
        Encoded([8], [[4, 4, 9], [9], [5, 9]], [1.0, 1.0, 0.0]),
    ]
    layout = Layout.of(encs)
    # shortest first; each: prompt, L2R continuation, R2L continuation
    assert layout.tokens.tolist() == [
        1,
        2,
        7,
        9,
        7,
        9,
        1,
        2,
        3,
        4,
        9,
        5,
        6,
        9,
        5,
        6,
        9,
        4,
        9,
        8,
        4,
        4,
        9,
        9,
        5,
        9,
        5,
        9,
        9,
        4,
        4,
        9,
    ]
    digest = _digest(layout.tokens, layout.starts, layout.prompt_lengths, layout.step_lengths, layout.step_offsets)
    assert digest == "70ba59b1eb73058ec12bf82d916b770cdabf9dc5979402a6321af826cf687234"


def test_a_killed_build_resumes_where_it_stopped(tokenizer, tmp_path):
    model = build(tokenizer, "llama", "bi")
    encs = encodings(tokenizer)
    cache = TrunkCache(tmp_path, model, 2, encs).build(tokens_per_batch=64, progress=False)
    reference = np.array(cache.features)
    layout = cache.layout
    # as if killed after the first two trajectories (in file order) were written
    (cache.dir / "done").unlink()
    (cache.dir / "progress.json").write_text(json.dumps({"done": 2}))
    features = np.memmap(cache.dir / "features.bin", dtype=np.float32, mode="r+", shape=reference.shape)
    kept = int(layout.starts[layout.order[2]])
    features[:kept] = 7.0  # a resumed build must not recompute these
    features[kept:] = 0.0
    features.flush()
    resumed = TrunkCache(tmp_path, model, 2, encs).build(tokens_per_batch=64, progress=False)
    assert (np.asarray(resumed.features[:kept]) == 7.0).all()
    np.testing.assert_array_equal(resumed.features[kept:], reference[kept:])


def test_bf16_cache_stores_half_precision_features_close_to_fp32(tokenizer, tmp_path):
    model = build(tokenizer, "llama", "bi").eval()
    encs = encodings(tokenizer)
    fp32 = TrunkCache(tmp_path, model, 2, encs).build(progress=False)
    bf16 = TrunkCache(tmp_path, model, 2, encs, dtype=torch.bfloat16).build(progress=False)
    assert bf16.features.dtype == np.uint16
    a = fp32.batch(np.arange(4), ("l2r",))["features"]
    b = bf16.batch(np.arange(4), ("l2r",))["features"]
    assert b.dtype == torch.bfloat16
    torch.testing.assert_close(b.float(), a, rtol=0.05, atol=0.05)


def test_other_architectures_and_bad_cuts_are_refused(tokenizer):
    config = BiPRMConfig(
        backbone_config=GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=2, n_head=4), mode="bi", step_tag_id=1
    )
    with pytest.raises(ValueError, match="Llama-family.*'gpt2'"):
        split(BiPRMModel(config), 1)
    model = build(tokenizer, "llama", "bi")
    for bad in (0, 5):
        with pytest.raises(ValueError, match=r"must be in \[1, 4\]"):
            split(model, bad)


@pytest.mark.parametrize("mode", ["bi", "l2r", "r2l", "bi-static"])
def test_cached_scores_equal_the_scorer(tokenizer, tmp_path, mode):
    from biprm.scoring import Scorer

    model = build(tokenizer, "qwen2", mode).eval()
    encs = encodings(tokenizer)
    cache = TrunkCache(tmp_path, model, 2, encs).build(progress=False)
    got = cached_scores(model, cache, tokens_per_batch=128)
    want = scored(Scorer(model, tokenizer), TRAJS)
    np.testing.assert_array_equal(got.offsets, want.offsets)
    for key in ("fused", "l2r", "r2l", "sigma"):
        a, b = getattr(got, key), getattr(want, key)
        assert (a is None) == (b is None)
        if a is not None:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_cached_scores_send_their_batches_to_the_models_device(tokenizer, tmp_path, monkeypatch):
    """A model on a GPU gets its batches there; "meta" stands in for the GPU."""
    model = build(tokenizer, "qwen2", "bi").eval()
    cache = TrunkCache(tmp_path, model, 2, encodings(tokenizer)).build(progress=False)
    on_meta = cache.batch(np.arange(2), model.streams, device="meta")
    assert all(v.device.type == "meta" for v in on_meta.values() if isinstance(v, torch.Tensor))
    asked, batch = [], TrunkCache.batch
    monkeypatch.setattr(
        TrunkCache,
        "batch",
        lambda self, idx, streams, labels=None, device="cpu": asked.append(device) or batch(self, idx, streams),
    )
    monkeypatch.setattr(BiPRMModel, "device", property(lambda self: torch.device("meta")))
    cached_scores(model, cache, tokens_per_batch=128)  # runs on the CPU batches the stand-in hands back
    assert asked and set(asked) == {torch.device("meta")}


def test_batches_are_seeded_cover_every_row_once_per_epoch_and_group_lengths():
    lengths = np.arange(100)
    a, b = grouped_batches(lengths, 8, 1.0, seed=3), grouped_batches(lengths, 8, 1.0, seed=3)
    assert all((x == y).all() for x, y in zip(a, b))
    assert sorted(np.concatenate(a).tolist()) == list(range(100))
    assert len(a) == 13
    assert len(grouped_batches(lengths, 8, 2.0, seed=3)) == 26
    spread_within = np.mean([np.ptp(lengths[x]) for x in a if len(x) == 8])
    assert spread_within < 40  # a random batch of 8 from 0..99 spans about 78


def test_a_second_build_of_the_same_cache_waits_for_the_first_and_takes_its_features(tokenizer, tmp_path, monkeypatch):
    import fcntl
    import threading
    import time

    model, encs = build(tokenizer, "llama", "bi"), encodings(tokenizer)
    folder = TrunkCache(tmp_path, model, 2, encs).dir
    folder.mkdir(parents=True)
    first = open(folder / "lock", "w")
    fcntl.flock(first, fcntl.LOCK_EX)  # a first build in flight, in another process
    computed = []
    monkeypatch.setattr(TrunkCache, "_build", lambda self, *args: computed.append(self.dir))
    second = threading.Thread(target=TrunkCache(tmp_path, model, 2, encs).build, kwargs={"progress": False})
    second.start()
    time.sleep(0.3)
    assert second.is_alive()  # waiting, not writing
    (folder / "done").write_text("ok\n")  # the first build finishes
    fcntl.flock(first, fcntl.LOCK_UN)
    first.close()
    second.join(10)
    assert not second.is_alive() and computed == []
