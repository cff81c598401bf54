"""`python -m benchmarks --preset search` on the tiny shape and a small tree: token counts follow the O(D) / O(D^2)
accounting."""

import json

import numpy as np
import pytest

from benchmarks.config import PRESETS, BenchConfig
from benchmarks.search import main, search_tree

SMALL = dict(questions=2, depth=3, width=2, paths=4, group=2)


def test_search_tree_keeps_width_paths_and_grows_each(data_dir):
    levels = search_tree(str(data_dir), SMALL)[0]
    assert [len(level) for level in levels] == [8, 8, 8]
    for parent, child in zip(levels, levels[1:]):
        prefixes = {(q, tuple(p[:-1])) for q, p in child}
        assert len(prefixes) == 4 and prefixes <= {
            (q, tuple(p)) for q, p in parent
        }  # 2 kept per question, each grown 2 ways


def test_search_preset_smoke_on_tiny_shape(data_dir, tmp_path, monkeypatch):
    monkeypatch.setitem(PRESETS, "search", SMALL)
    main(BenchConfig(preset="search", shape="tiny", data_root=str(data_dir), out=str(tmp_path), threads=1))
    result = json.loads((tmp_path / "bench-tiny-search.json").read_text())
    assert (tmp_path / "bench-tiny-search.md").read_text().startswith("# biprm bench: scoring a beam search")
    tokens = {k: np.array(v) for k, v in result["tokens"].items()}  # [depth, (prompt, l2r, r2l)]
    inc, scratch, fused = tokens["l2r:incremental"], tokens["l2r:scratch"], tokens["bi:fused"]
    assert inc[0, 0] > 0 and (inc[1:, 0] == 0).all()  # the prompts run once...
    assert (scratch[:, 0] == inc[0, 0]).all()  # ...from scratch, once per call
    assert (fused[:, 2] == scratch[:, 1]).all()  # R2L reruns every step of every path, as L2R from scratch does
    assert (fused[:, 1] == inc[:, 1]).all() and (inc[1:, 1] < scratch[1:, 1]).all()
    assert result["max_abs_diff_incremental_vs_scratch"] < 1e-5
    assert [t["target"] for t in result["targets"]][0] == "L2R tokens: scratch / incremental"


def test_a_search_bench_cut_short_keeps_its_groups_and_goes_on_from_them(data_dir, tmp_path, monkeypatch):
    """Cut after its first question group (of two), the run has written that group's rows and a partial report; run
    again, it measures the second group alone and counts every token as a run never cut would."""
    import benchmarks.search as search

    monkeypatch.setitem(PRESETS, "search", SMALL | {"questions": 4})
    cfg = BenchConfig(preset="search", shape="tiny", data_root=str(data_dir), out=str(tmp_path / "cut"), threads=1)
    saved = search.save

    def save_then_stop(*args, **kwargs):
        saved(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(search, "save", save_then_stop)
    with pytest.raises(
        KeyboardInterrupt, match="bench-tiny-search.rows.jsonl, and reported beside it: the same command goes on"
    ):
        main(cfg)
    partial = json.loads((tmp_path / "cut" / "bench-tiny-search.json").read_text())
    assert (partial["groups_done"], partial["groups"]) == (1, 2)
    assert "**Partial:** 1 of 2 question groups" in (tmp_path / "cut" / "bench-tiny-search.md").read_text()
    header, *rows = [
        json.loads(r) for r in (tmp_path / "cut" / "bench-tiny-search.rows.jsonl").read_text().splitlines()
    ]
    assert header["config"]["questions"] == 4 and [(r["group"], r["config"]) for r in rows] == [
        (0, name) for name in search.CONFIGS
    ]
    monkeypatch.setattr(search, "save", saved)
    with pytest.raises(ValueError, match="holds the rows of another run \\(seed: 0 then, 1 now\\)"):
        main(
            BenchConfig(
                preset="search", shape="tiny", data_root=str(data_dir), out=str(tmp_path / "cut"), threads=1, seed=1
            )
        )
    measure, measured = search.measure, []
    monkeypatch.setattr(
        search, "measure", lambda prefix, levels, streams: measured.append(levels) or measure(prefix, levels, streams)
    )
    resumed = main(cfg)
    assert resumed["groups_done"] == 2 and resumed["sessions"] == 2
    assert (
        measured == [search_tree(str(data_dir), SMALL | {"questions": 4})[1]] * 3
    )  # group 1 alone, by each configuration
    assert not (tmp_path / "cut" / "bench-tiny-search.rows.jsonl").exists()
    whole = main(
        BenchConfig(preset="search", shape="tiny", data_root=str(data_dir), out=str(tmp_path / "whole"), threads=1)
    )
    assert resumed["tokens"] == whole["tokens"]
