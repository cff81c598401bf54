"""The mechanism runner's workers (`--workers N`, studies/mechanism/study.py `side_by_side`): runs trained side by
side on one device give the logits they give one after another."""

import json

import numpy as np
import pytest
import torch

from biprm.scoring.step_scores import load_scores


def toy(tmp_path, data_dir, name: str, workers: int):
    from studies.mechanism.config import MechanismConfig, design

    return MechanismConfig(
        **design(2)
        | dict(
            out=str(tmp_path / name / "out"),
            work_dir=str(tmp_path / name / "work"),
            data_root=str(data_dir),
            backbone="tiny",
            top_layers=1,
            train_questions=12,
            valid_questions=8,
            test_questions=8,
            seeds={"l2r": 1, "bi": 2},
            processbench_rows=8,
            bon_questions=4,
            batch_size=8,
            epochs=1.0,
            save_every=1,
            bf16="no",
            pilot=False,
            workers=workers,
        )
    )


@pytest.mark.slow
def test_two_workers_give_the_logits_of_one(data_dir, tmp_path):
    from studies.mechanism.rows import load_sets
    from studies.mechanism.study import Run, prepare, side_by_side, train_and_score

    runs = [Run("l2r", 1106), Run("bi", 1106), Run("bi", 1107)]
    one, two = toy(tmp_path, data_dir, "one", 1), toy(tmp_path, data_dir, "two", 2)
    sets = load_sets(one)[0]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # one thread per run either way: one after another, or two workers of 2 // 2
        encs, caches = prepare(one, False, sets)
        for run in runs:
            train_and_score(one, run, sets, encs, caches, False)
        torch.set_num_threads(2)
        side_by_side(two, runs, False, sets)
    finally:
        torch.set_num_threads(threads)
    for run in runs:
        a, b = (load_scores(f"{cfg.out}/runs/{run.name}.npz") for cfg in (one, two))
        assert a.keys() == b.keys()
        for split in a:
            for stream in ("fused", "l2r", "r2l", "sigma"):
                x, y = getattr(a[split], stream), getattr(b[split], stream)
                assert (x is None and y is None) or np.array_equal(x, y), (run.name, split, stream)
    a, b = (json.loads((tmp_path / k / "out" / "runs" / "bi-seed1107.json").read_text()) for k in ("one", "two"))
    assert a["train"]["losses"] == b["train"]["losses"]
