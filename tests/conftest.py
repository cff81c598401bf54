from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared data folder (../shared/data beside the repository); tests that need it skip without it."""
    path = Path(__file__).resolve().parents[2] / "shared" / "data"
    if not path.is_dir():
        pytest.skip(f"shared data folder not found at {path}; these tests read the real benchmark files")
    return path


@pytest.fixture(scope="module")
def bi_scorer():
    """A Scorer around an untrained tiny `bi` model (seeded): scores are arbitrary but fixed, enough to compare paths."""
    import torch

    from biprm.backbones import load_tokenizer, resolve_backbone
    from biprm.modeling import from_backbone
    from biprm.scoring import Scorer

    backbone = resolve_backbone("tiny")
    tok = load_tokenizer(backbone)
    torch.manual_seed(0)
    return Scorer(from_backbone(backbone, tok, mode="bi").eval(), tok)


def scored(scorer, trajs):
    """Scores of `trajs`, encoded through the scorer first (as every caller does)."""
    encs, _ = scorer.encode(trajs)
    return scorer.score(encs, progress=False)
