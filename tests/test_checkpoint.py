"""A checkpoint folder (`biprm.checkpoint`): every wrong folder named in one line before anything loads, the text layout
recorded and checked, files readable by others, and a model card that says how to load the model."""

import json
import logging
import os
import re
import types

import pytest

from biprm.folder import NotACheckpoint, looks_local, resolve
from biprm.checkpoint import (
    LAYOUT,
    check_layout,
    share,
    stamp,
    write_model_card,
)


def folder(tmp_path, name, config=None, files=()):
    path = tmp_path / name
    path.mkdir()
    if config is not None:
        (path / "config.json").write_text(config if isinstance(config, str) else json.dumps(config))
    for f in files:
        (path / f).write_bytes(b"")
    return path


@pytest.mark.parametrize(
    "name, config, files, says",
    [
        (
            "backbone",
            {"model_type": "llama"},
            ["model.safetensors"],
            "is a plain llama model (a backbone), not a biprm checkpoint",
        ),
        ("no-weights", {"model_type": "biprm"}, [], "has a biprm config.json but no weights"),
        ("torn", '{"model_type": "bi', ["model.safetensors"], "config.json is not valid JSON"),
        ("trainer", None, ["trainer_state.json"], "is a Trainer checkpoint without the model"),
        ("empty", None, [], "holds no model (no config.json)"),
    ],
)
def test_a_folder_that_is_not_a_checkpoint_is_named_with_what_it_holds(tmp_path, name, config, files, says):
    path = folder(tmp_path, name, config, files)
    with pytest.raises(NotACheckpoint, match=f"^{re.escape(f'{path}: {says}')}") as error:
        resolve(str(path))
    assert "\n" not in str(error.value) and isinstance(
        error.value, OSError
    )  # one line; caught where transformers' errors are


def test_a_causal_lm_that_may_be_a_prm_is_told_about_prm_kind(tmp_path):
    """A renamed math-shepherd or RLHFlow folder is a plain causal LM to look at: the message says how to name it."""
    path = folder(
        tmp_path, "my-prm", {"model_type": "mistral", "architectures": ["MistralForCausalLM"]}, ["x.safetensors"]
    )
    with pytest.raises(NotACheckpoint) as error:
        resolve(str(path))
    assert str(error.value).startswith(f"{path}: is a plain mistral model (a backbone)") and str(error.value).endswith(
        "if it is a PRM read from its LM head (math-shepherd, rlhflow, eurus-prm), name the kind with --prm-kind"
    )
    with pytest.raises(NotACheckpoint) as error:  # a backbone with no LM head is not told
        resolve(str(folder(tmp_path, "enc", {"model_type": "bert"}, ["x.safetensors"])))
    assert "--prm-kind" not in str(error.value)


def test_a_checkpoint_passes_and_only_a_non_local_name_may_be_a_hub_id(tmp_path):
    resolve(str(folder(tmp_path, "ok", {"model_type": "biprm"}, ["model.safetensors"])))
    resolve("someone/some-prm")  # not here: left to the Hub
    assert (
        not looks_local("someone/some-prm") and looks_local("./someone/some-prm") and looks_local(str(tmp_path / "x"))
    )
    with pytest.raises(NotACheckpoint, match="no such folder"):
        resolve(str(tmp_path / "missing"))
    (tmp_path / "file").write_text("")
    with pytest.raises(NotACheckpoint, match="is a file, not a checkpoint folder"):
        resolve(str(tmp_path / "file"))


def test_the_layout_is_stamped_and_another_one_is_warned_about(caplog):
    config = types.SimpleNamespace()
    stamp(config)
    assert config.text_layout == LAYOUT and config.biprm_version
    with caplog.at_level(logging.WARNING, logger="biprm.checkpoint"):
        check_layout(config, "ours")
        assert not caplog.records
        check_layout(
            types.SimpleNamespace(text_layout={"prompt": "Q: {question}", "step": "{step}"}, biprm_version="0.0.1"),
            "theirs",
        )
    assert "theirs was trained with the text layout" in caplog.text and "biprm 0.0.1" in caplog.text


def test_share_makes_owner_only_files_readable_as_the_umask_allows(tmp_path):
    weights = folder(tmp_path, "ckpt", files=["model.safetensors"]) / "model.safetensors"
    weights.chmod(0o600)  # as safetensors writes them
    mask = os.umask(0o022)
    try:
        share(tmp_path / "ckpt")
    finally:
        os.umask(mask)
    assert weights.stat().st_mode & 0o777 == 0o644


def test_the_model_card_names_the_run_and_how_to_load_it(tmp_path):
    cfg = {"backbone": "tiny", "mode": "bi", "objective": "bce", "data": "synthetic:8"}
    write_model_card(tmp_path, cfg, [{"loss": 0.7, "step": 1}, {"loss": 0.5, "step": 2}, {"eval_loss": 0.6, "step": 2}])
    card = (tmp_path / "README.md").read_text()
    assert "# bi process reward model" in card and "for 2 optimizer steps from `tiny`" in card
    assert "Last logged training loss: 0.5000." in card and "Last validation loss: 0.6000." in card
    assert 'Scorer.from_pretrained("path/to/this/folder")' in card and json.dumps(cfg, indent=2) in card
