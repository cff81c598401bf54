"""StepScores (`biprm.scoring.step_scores`): selecting trajectories, and the npz files of the score cache and of a
study's runs."""

import numpy as np
import pytest

from biprm.scoring.aggregate import logit
from biprm.scoring.step_scores import StepScores, load_scores, save_scores, step_positions

VALUES = np.array([0.9, 0.2, 0.8, 0.5, 0.6, 0.7])  # trajectory 0: [0.9, 0.2, 0.8]; 1: [0.5]; 2: [0.6, 0.7]
OFFSETS = np.array([0, 3, 4, 6])


def test_step_scores_select_and_positions():
    scores = StepScores.from_probs(OFFSETS, VALUES, sigma=VALUES * 0)
    np.testing.assert_array_equal(step_positions(OFFSETS, [2, 0]), [4, 5, 0, 1, 2])
    sub = scores.select([2, 0])
    np.testing.assert_array_equal(sub.offsets, [0, 2, 5])
    np.testing.assert_allclose(sub.prob(), [0.6, 0.7, 0.9, 0.2, 0.8])
    np.testing.assert_allclose(sub.of(1), [0.9, 0.2, 0.8])
    np.testing.assert_allclose(sub.solution_scores("min"), [0.6, 0.2])
    assert sub.l2r is None and len(sub.sigma) == 5


def assert_same(a: StepScores, b: StepScores) -> None:
    for field in ("offsets", "fused", "l2r", "r2l", "sigma"):
        x, y = getattr(a, field), getattr(b, field)
        assert (x is None) == (y is None), field
        if x is not None:
            assert x.dtype == y.dtype and np.array_equal(x, y), field


@pytest.mark.parametrize("compress", [False, True])
def test_named_scores_round_trip_and_keep_missing_streams_missing(tmp_path, compress):
    bi = StepScores(OFFSETS, logit(VALUES), logit(VALUES[::-1].copy()), logit(VALUES), np.full(6, 0.25))
    l2r = StepScores(OFFSETS[:3], logit(VALUES[:4]), logit(VALUES[:4]))
    path = save_scores(tmp_path / "deep" / "run.npz", {"valid": bi, "processbench": l2r}, compress=compress)
    loaded = load_scores(path)
    assert set(loaded) == {"valid", "processbench"}
    assert_same(loaded["valid"], bi)
    assert_same(loaded["processbench"], l2r)
    assert loaded["processbench"].r2l is None and loaded["processbench"].sigma is None
    assert [p.name for p in path.parent.iterdir()] == ["run.npz"]  # no temporary file left behind


def test_files_written_before_the_move_read_back(tmp_path):
    """The two layouts already on disk: the score cache's bare field names, and a study's `set/field` names."""
    scores = StepScores(OFFSETS, logit(VALUES), r2l=logit(VALUES))
    np.savez(tmp_path / "cache.npz", offsets=scores.offsets, fused=scores.fused, r2l=scores.r2l)
    np.savez_compressed(
        tmp_path / "run.npz", **{"valid/offsets": scores.offsets, "valid/fused": scores.fused, "valid/r2l": scores.r2l}
    )
    assert list(load_scores(tmp_path / "cache.npz")) == [""]
    assert_same(load_scores(tmp_path / "cache.npz")[""], scores)
    assert_same(load_scores(tmp_path / "run.npz")["valid"], scores)
    save_scores(tmp_path / "again.npz", {"": scores})
    with np.load(tmp_path / "again.npz") as z:
        assert sorted(z.files) == ["fused", "offsets", "r2l"]  # what the score cache has always written
