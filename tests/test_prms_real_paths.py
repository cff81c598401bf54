"""Every path a PRM trained elsewhere takes, on the real-vocabulary bf16 replicas (tests/test_prms_real.py): served
over HTTP, searched depth by depth on the L2R KV cache, exported for vLLM, and made bidirectional by
`biprm train --init-from`; each gives the card transcription's scores (fp32 math on the shipped weights) within 1e-5."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from biprm import Scorer, Trajectory
from biprm.prms import KINDS
from tests.prm_replicas import REFERENCES, SOLUTIONS, reference_lm
from tests.test_prms_real import KIND_NAMES, real  # noqa: F401  the session's replicas

HEAD_KINDS = [k for k in KIND_NAMES if not KINDS[k].implicit]


def sigmoid(x) -> np.ndarray:
    return 1 / (1 + np.exp(-np.asarray(x, dtype=np.float64)))


def _reference(folder) -> str | None:
    found = reference_lm(folder)
    return str(found) if found else None


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_served_over_http_each_kind_answers_its_cards_scores(real, kind):  # noqa: F811
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from biprm.serve.app import build_app
    from biprm.serve.config import ServeConfig

    folder = real[kind]
    scorer = Scorer.from_pretrained(str(folder), device="cpu", prm_reference=_reference(folder))
    config = ServeConfig(model=str(folder), prm_reference=_reference(folder))
    with TestClient(build_app(scorer, config)) as client:
        for q, steps in SOLUTIONS:
            body = client.post("/v1/score", json={"question": q, "steps": steps}).json()
            np.testing.assert_allclose(body["l2r"], REFERENCES[kind](folder, q, steps), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_a_search_scores_each_depth_as_the_card_scores_the_prefix(real, kind):  # noqa: F811
    """The search's PathScorer grows L2R on its KV cache (or, for an implicit PRM, reads each prefix whole); every
    depth gives the card's scores of the prefix."""
    from biprm.scoring.prefix import PrefixScorer

    folder = real[kind]
    prefix = PrefixScorer.from_pretrained(str(folder), device="cpu", prm_reference=_reference(folder))
    for depth in (1, 2, 3):
        questions, paths = [q for q, _ in SOLUTIONS], [steps[:depth] for _, steps in SOLUTIONS]
        for q, path, score in zip(questions, paths, prefix.score(questions, paths, streams="l2r")):
            np.testing.assert_allclose(sigmoid(score.fused), REFERENCES[kind](folder, q, path), atol=1e-5, rtol=0)


@pytest.mark.parametrize("kind", HEAD_KINDS)
def test_the_export_writes_the_cards_read_out(real, kind, tmp_path):  # noqa: F811
    """`biprm export`'s value head, applied to the body's hidden states as vLLM's plugin applies it, is the card's
    read-out: checked here on the HF side; tests/test_vllm_prms.py serves the same exports in vLLM."""
    from biprm.serve.export import HEAD_FILE, export_for_vllm

    folder = real[kind]
    export = export_for_vllm(str(folder), str(tmp_path / "export"), link=True)
    spec = json.loads((export / "config.json").read_text())["biprm"]
    assert (spec["prm_kind"], spec["mode"]) == (kind, "l2r")
    (written,) = export.glob(f"{HEAD_FILE}.*")  # in the weights' own format: Skywork's is a pickle
    loaded = load_file(str(written)) if written.suffix == ".safetensors" else torch.load(written, weights_only=True)
    head = {k.removeprefix("value_head."): v for k, v in loaded.items()}
    scorer = Scorer.from_pretrained(str(folder), device="cpu")
    own = {k.removeprefix("value_head."): v for k, v in scorer.model.state_dict().items() if "value_head" in k}
    assert head.keys() == own.keys() and all(head[k].dtype == own[k].dtype for k in own)
    for k in own:  # the head is written in fp32, differenced after the upcast: nothing rounded to bf16
        np.testing.assert_array_equal(head[k].numpy(), own[k].numpy())


@pytest.mark.parametrize("kind", ["qwen-prm", "math-shepherd", "rlhflow"])
def test_init_from_starts_as_the_card_and_saves_what_it_read(real, kind, tmp_path):  # noqa: F811
    """`biprm train --init-from` at learning rate 0: the saved bidirectional model's L2R stream is still the card's,
    after the save and a reload (the read-out stored in fp32 beside the bf16 body)."""
    from biprm.training import TrainConfig, train

    folder = real[kind]
    out = train(
        TrainConfig(
            init_from=str(folder),
            data="synthetic:8",
            output_dir=str(tmp_path / "bi"),
            mode="bi",
            max_steps=1,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=1,
            learning_rate=0.0,
            save_steps=100,
            show_progress=False,
        )
    )
    scorer = Scorer.from_pretrained(out, device="cpu")
    assert (scorer.model.config.prm_kind, scorer.mode) == (kind, "bi")
    scores = scorer.score(scorer.encode([Trajectory(q, s) for q, s in SOLUTIONS])[0], progress=False)
    for i, (q, steps) in enumerate(SOLUTIONS):
        np.testing.assert_allclose(scores.of(i, "l2r"), REFERENCES[kind](folder, q, steps), atol=1e-5, rtol=0)
