"""biprm's own calls into transformers raise no FutureWarning: the next deprecation is caught here, not by users."""

import warnings

import pytest
from transformers import TrainingArguments

from biprm import BiPRMTrainer
from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.data.encoding import Encoder
from biprm.modeling import from_backbone
from biprm.scoring import Scorer
from conftest import scored
from test_modeling import CANDIDATES


@pytest.fixture
def futures_are_errors():
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        yield


def test_scoring_in_every_layout_warns_of_nothing_deprecated(futures_are_errors):
    backbone = resolve_backbone("tiny")
    tok = load_tokenizer(backbone)
    model = from_backbone(backbone, tok, mode="bi").eval()
    for prefix_cache in (False, True):
        scored(Scorer(model, tok, prefix_cache=prefix_cache), CANDIDATES)


def test_a_training_step_warns_of_nothing_deprecated(futures_are_errors, tmp_path):
    from biprm.data.arrow import encoded_dataset
    from biprm.data.writer import write_trajectories

    backbone = resolve_backbone("tiny")
    tok = load_tokenizer(backbone)
    model = from_backbone(backbone, tok, mode="bi")
    data = encoded_dataset(
        str(write_trajectories(tmp_path / "train.jsonl", CANDIDATES)), Encoder(tok, model.config.step_tag_id)
    )
    args = TrainingArguments(
        str(tmp_path / "run"),
        max_steps=1,
        per_device_train_batch_size=4,
        use_cpu=True,
        report_to=[],
        save_strategy="no",
        disable_tqdm=True,
    )
    assert BiPRMTrainer(model, args, train_dataset=data, processing_class=tok).train().global_step == 1
