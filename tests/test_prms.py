"""Third-party PRM kinds: each replica loads as a user would load the real folder, and scores as its card's code does."""
import numpy as np
import pytest
import torch

from biprm import Scorer, Trajectory
from biprm.data.template import QWEN_SYSTEM, TEMPLATES
from biprm.data.trajectory import DataError
from biprm.modeling import BiPRMModel, from_prm
from biprm.prms import KINDS, UnknownPRM, detect
from biprm.scoring.aggregate import sigmoid
from tests.prm_replicas import PROBLEMS, REFERENCES, build

KIND_NAMES = sorted(REFERENCES)


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    root = tmp_path_factory.mktemp("prms")
    return {kind: build(kind, root / kind) for kind in KIND_NAMES}


def trajectories():
    return [Trajectory(q, steps) for q, steps in PROBLEMS]


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_each_kind_scores_as_its_reference_code(replicas, kind):
    folder = replicas[kind]
    assert detect(folder) == kind
    scorer = Scorer.from_pretrained(str(folder), device="cpu")
    assert scorer.mode == "l2r" and scorer.model.config.prm_kind == kind
    encs, problems = scorer.encode(trajectories())
    assert not problems
    scores = scorer.score(encs, progress=False)
    for i, (q, steps) in enumerate(PROBLEMS):
        np.testing.assert_allclose(scores.of(i, "l2r"), REFERENCES[kind](folder, q, steps), atol=1e-5)


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_made_bidirectional_it_starts_as_the_source(replicas, kind):
    """--init-from: the L2R stream is the source exactly, and the gate leans on it, so fused is the source within 1e-3."""
    folder = replicas[kind]
    model = from_prm(str(folder), mode="bi", gate_init=8.0)
    scorer = Scorer(model, Scorer.from_pretrained(str(folder), device="cpu").tokenizer)
    scores = scorer.score(scorer.encode(trajectories())[0], progress=False)
    expected = np.concatenate([REFERENCES[kind](folder, q, s) for q, s in PROBLEMS])
    np.testing.assert_allclose(sigmoid(scores.l2r), expected, atol=1e-5)
    assert np.abs(sigmoid(scores.fused) - expected).max() < 1e-3
    assert scores.r2l is not None and not np.allclose(scores.r2l, scores.l2r)  # R2L reads the steps reversed


def test_qwen_prompt_is_the_chat_template_byte_for_byte(replicas):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(replicas["qwen-prm"])
    steps = ["a", "b"]
    messages = [{"role": "system", "content": QWEN_SYSTEM}, {"role": "user", "content": "Q?"},
                {"role": "assistant", "content": "<extra_0>".join(steps) + "<extra_0>"}]
    card = tok.apply_chat_template(messages, tokenize=False)
    prompt, pieces = TEMPLATES["qwen-prm"].render("Q?", steps)
    assert card == prompt + "".join(pieces) + "<|im_end|>\n"  # the card's text, then the turn's end, which no score reads


def test_a_causal_lm_without_a_name_needs_its_kind(replicas, tmp_path):
    import shutil

    plain = tmp_path / "some-causal-lm"
    shutil.copytree(replicas["rlhflow"], plain)
    with pytest.raises(UnknownPRM, match="LlamaForCausalLM.*--prm-kind"):
        detect(plain)
    assert detect(plain, "rlhflow") == "rlhflow"
    scorer = Scorer.from_pretrained(str(plain), device="cpu", prm_kind="rlhflow")
    assert scorer.model.config.prm_kind == "rlhflow"


def test_bad_folders_and_kinds_are_one_line_errors(replicas, tmp_path):
    from biprm.checkpoint import NotACheckpoint

    with pytest.raises(UnknownPRM, match="not a qwen-prm checkpoint"):
        detect(replicas["skywork-prm"], "qwen-prm")
    with pytest.raises(UnknownPRM, match="not one of"):
        detect(replicas["skywork-prm"], "nonesuch")
    (tmp_path / "config.json").write_text('{"model_type": "bert", "architectures": ["BertModel"]}')
    with pytest.raises(NotACheckpoint, match="plain bert model"):
        Scorer.from_pretrained(str(tmp_path), device="cpu")
    with pytest.raises(UnknownPRM, match="BertModel"):
        detect(tmp_path)


def test_a_step_holding_the_tag_is_refused(replicas):
    scorer = Scorer.from_pretrained(str(replicas["qwen-prm"]), device="cpu")
    with pytest.raises(DataError, match="trajectory 0.*step"):
        scorer.encode([Trajectory("Q?", ["one <extra_0> two", "three"])])


def test_every_kind_has_a_template_and_a_reference():
    assert set(KINDS) <= set(TEMPLATES) and set(KINDS) == set(REFERENCES)
