import gzip
import json
import logging
from collections import Counter

import pytest

from biprm.data.readers import (
    EMPTY_RESPONSE,
    detect_format,
    from_bon_pool,
    from_math_shepherd,
    from_prmbench,
    from_processbench,
    load_trajectories,
    load_with_report,
    open_source,
    read_rows,
    solution_steps,
    split_steps,
)
from biprm.data.trajectory import DataError

TRL = [
    {"prompt": "What is 2 + 3 * 4?", "completions": ["3 * 4 = 12.", "2 + 12 = 14."], "labels": [True, True]},
    {"prompt": "What is 10 - 4?", "completions": ["10 - 4 = 5.", "The answer is 5."], "labels": [True, False]},
]
MS_ROW = {
    "input": "Tom has 3 apples and buys 2. How many now? Step 1: 3 + 2 = 5. ки\nStep 2: The answer is: 6 ки",
    "label": "Tom has 3 apples and buys 2. How many now? Step 1: 3 + 2 = 5. +\nStep 2: The answer is: 6 -",
    "task": "GSM8K",
}
PB_ROW = {
    "id": "x-0",
    "generator": "m",
    "problem": "Q?",
    "steps": ["a", "b", "c"],
    "final_answer_correct": False,
    "label": 1,
}
PRMB_ROW = {
    "idx": "p_0",
    "classification": "confidence",
    "original_question": "Q?",
    "modified_question": "Q'?",
    "original_process": ["a", "b", "c", "d"],
    "modified_process": ["a", "b", "x", "y"],
    "error_steps": [4, 3],
}


def write(path, rows, kind):
    """Write rows as .json, .jsonl, .jsonl.gz or .parquet and return the path as a string."""
    if kind == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        text = (
            json.dumps(rows)
            if kind.startswith("json.") or kind == "json"
            else "".join(json.dumps(r) + "\n" for r in rows)
        )
        with gzip.open(path, "wt") if kind.endswith(".gz") else open(path, "w") as f:
            f.write(text)
    return str(path)


@pytest.mark.parametrize("kind", ["json", "jsonl", "jsonl.gz", "json.gz", "parquet"])
def test_read_rows_formats(tmp_path, kind):
    path = write(tmp_path / f"d.{kind}", TRL, kind)
    rows, name = read_rows(path)
    assert rows == TRL
    assert name == path
    trajs = load_trajectories(path)
    assert [t.labels for t in trajs] == [[1.0, 1.0], [1.0, 0.0]]
    assert trajs[0].question == TRL[0]["prompt"] and trajs[1].first_error == 1


@pytest.mark.parametrize("source", ["file", "synthetic:6:2"])
def test_lists_and_arrow_open_a_source_through_one_door(tmp_path, source):
    """`load_trajectories` and the Arrow training set see the same name, format, columns and trajectories."""
    from biprm.data.synthetic import make_dataset

    source = write(tmp_path / "d.jsonl", TRL, "jsonl") if source == "file" else source
    lists, table = open_source(source), open_source(source, arrow=True)
    assert (lists.name, lists.fmt, lists.columns) == (table.name, table.fmt, table.columns)
    convert = lambda rows: [rows.convert(row, "here", i) for i, row in enumerate(rows.raw)]  # noqa: E731
    assert convert(lists) == convert(table) == load_trajectories(source)
    assert load_trajectories("synthetic:6:2") == make_dataset(6, seed=2)


def test_read_rows_json_object_and_missing_paths(tmp_path):
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"data": TRL}))
    with pytest.raises(DataError, match=r"d\.json: expected a JSON list of rows.*\['data'\]"):
        read_rows(str(path))
    for missing in [str(tmp_path / "nope.jsonl"), "data/train.json", "./rows", "a/b/c"]:
        with pytest.raises(FileNotFoundError, match="no such data file"):
            read_rows(missing)


def test_malformed_jsonl_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(TRL[0]) + "\n{not json\n")
    with pytest.raises(DataError, match=r"bad\.jsonl line 2: not valid JSON"):
        read_rows(str(path))


def test_hub_name_goes_to_load_dataset(monkeypatch):
    import datasets

    calls = []

    def fake(name, config=None, split=None, streaming=False):
        calls.append((name, config, split))
        return datasets.Dataset.from_list(TRL)

    monkeypatch.setattr(datasets, "load_dataset", fake)
    rows, name = read_rows("org/set:cfg", split="test")
    assert calls == [("org/set", "cfg", "test")] and len(rows) == 2 and name == "org/set:cfg[test]"
    assert len(load_trajectories("trl-lib/math_shepherd")) == 2 and calls[-1] == (
        "trl-lib/math_shepherd",
        None,
        "train",
    )


def test_trl_label_kinds(tmp_path):
    rows = [
        {"prompt": "Q?", "completions": ["a", "b"]},
        {"prompt": "Q?", "completions": ["a", "b"], "labels": [1, 0.25]},
    ]
    assert [t.labels for t in load_trajectories(write(tmp_path / "u.jsonl", rows, "jsonl"))] == [None, [1.0, 0.25]]


BAD = [
    ({"completions": []}, "steps", "empty step list"),
    ({"completions": ["a", "  "]}, "steps", "empty step at index 1"),
    ({"labels": [True]}, "labels", "1 labels for 2 steps"),
    ({"labels": [True, 2]}, "labels", "not a bool"),
    ({"labels": [True, 1.5]}, "labels", "not a bool"),
    ({"labels": [True, "yes"]}, "labels", "not a bool"),
    ({"labels": "11"}, "labels", "expected list"),
    ({"prompt": None}, "prompt", "missing"),
    ({"completions": "a\nb"}, "completions", "expected list"),
]


@pytest.mark.parametrize("change, field, what", BAD)
def test_bad_rows_name_file_row_and_field(tmp_path, change, field, what):
    path = write(tmp_path / "bad.jsonl", [TRL[0], {**TRL[1], **change}], "jsonl")
    with pytest.raises(DataError) as err:
        load_trajectories(path)
    msg = str(err.value)
    assert msg.startswith(f"{path} row 2: ") and f"field '{field}'" in msg and what in msg


def test_skip_invalid_skips_and_reports(tmp_path, caplog):
    rows = [
        TRL[0],
        {**TRL[1], "labels": [1]},
        TRL[1],
        {**TRL[1], "completions": ["a", ""]},
        {**TRL[0], "labels": [True, 7]},
    ]
    path = write(tmp_path / "mixed.jsonl", rows, "jsonl")
    with caplog.at_level(logging.WARNING, logger="biprm.data.readers"):
        trajs, report = load_with_report(path, skip_invalid=True)
    assert len(trajs) == 2 and sum(report.values()) == 3
    assert report == {
        "field 'labels' has N labels for N steps": 1,
        "field 'steps' has an empty step at index N": 1,
        "field 'labels': N is not a bool, N/N or a float in [...]": 1,
    }
    assert (
        "skipped 3 of 5 rows: row 2 (field 'labels' has 1 labels for 2 steps); row 4 (field 'steps' has an empty step "
        "at index 1)" in caplog.text
    )
    assert " N " not in caplog.text  # the kinds are counted, but each is shown by its own row's message
    assert len(load_trajectories(path, skip_invalid=True)) == 2


def test_format_detection(tmp_path):
    bon = {"question": "Q?", "answer": "5", "candidates": [{"text": "a\nb", "correct": True}, {"steps": ["c"]}]}
    cases = {
        "math-shepherd": (MS_ROW, 1),
        "processbench": (PB_ROW, 1),
        "prmbench": (PRMB_ROW, 2),
        "bon": (bon, 2),
        "trl": (TRL[0], 1),
    }
    for fmt, (row, n) in cases.items():
        assert detect_format(row, "row 1") == fmt
        assert len(load_trajectories(write(tmp_path / f"{fmt}.jsonl", [row], "jsonl"))) == n
    with pytest.raises(DataError, match=r"row 1: cannot tell the format from fields \['a', 'b'\]"):
        load_trajectories(write(tmp_path / "other.jsonl", [{"a": 1, "b": 2}], "jsonl"))


def test_math_shepherd_row():
    traj = from_math_shepherd(MS_ROW, "f row 1")
    assert traj.question == "Tom has 3 apples and buys 2. How many now?"
    assert traj.steps == ["Step 1: 3 + 2 = 5.", "Step 2: The answer is: 6"] and traj.labels == [1.0, 0.0]
    with pytest.raises(DataError, match=r"f row 1: field 'label' has \d+ characters"):
        from_math_shepherd({**MS_ROW, "label": MS_ROW["label"] + " +"}, "f row 1")
    with pytest.raises(DataError, match=r"f row 1: field 'label' has '\?' at the tag of step 2"):
        from_math_shepherd({**MS_ROW, "label": MS_ROW["label"][:-1] + "?"}, "f row 1")
    with pytest.raises(DataError, match=r"f row 1: field 'input' has no step tag"):
        from_math_shepherd({**MS_ROW, "input": "no tags"}, "f row 1")


def test_processbench_row():
    traj = from_processbench(PB_ROW, "f row 1")
    assert traj.labels == [1.0, 0.0, 0.0] and traj.meta == {
        "id": "x-0",
        "generator": "m",
        "final_answer_correct": False,
        "first_error": 1,
    }
    assert from_processbench({**PB_ROW, "label": -1}, "w").labels == [1.0, 1.0, 1.0]
    for label in (3, -2, True, "1"):
        with pytest.raises(DataError, match=r"f row 1: field 'label'"):
            from_processbench({**PB_ROW, "label": label}, "f row 1")


def test_prmbench_row():
    original, modified = from_prmbench(PRMB_ROW, "f row 1")
    assert original.labels == [1.0] * 4 and original.question == "Q?" and original.meta["variant"] == "original"
    assert (
        modified.labels == [1.0, 1.0, 0.0, 0.0] and modified.question == "Q'?"
    )  # first listed error is step 3 (1-based)
    assert modified.meta == {"idx": "p_0", "classification": "confidence", "variant": "modified", "error_steps": [4, 3]}
    assert from_prmbench({**PRMB_ROW, "error_steps": []}, "w")[1].labels == [1.0] * 4
    assert from_prmbench({**PRMB_ROW, "error_steps": [2, 9]}, "w")[1].labels == [1.0, 0.0, 0.0, 0.0]
    with pytest.raises(DataError, match=r"f row 1: field 'error_steps' \[5\] points past the 4 steps"):
        from_prmbench({**PRMB_ROW, "error_steps": [5]}, "f row 1")
    with pytest.raises(DataError, match=r"f row 1: field 'error_steps' must hold 1-based"):
        from_prmbench({**PRMB_ROW, "error_steps": [0]}, "f row 1")
    with pytest.raises(DataError, match=r"f row 1 \(original_process\): field 'steps' has an empty step"):
        from_prmbench({**PRMB_ROW, "original_process": ["a", ""]}, "f row 1")


def test_bon_pool_layouts():
    pqm = {
        "question": "Q?",
        "responses": [{"text": "Step one.\n\nStep two.", "model_name": "m"}, {"text": "x\ny ки z ки"}],
    }
    trajs = from_bon_pool(pqm, "f row 4", qid=3)
    assert [t.steps for t in trajs] == [["Step one.", "Step two."], ["x\ny", "z"]]
    assert [t.meta for t in trajs] == [{"qid": 3, "cand": 0, "policy": "m"}, {"qid": 3, "cand": 1}]
    assert trajs[0].correct is None and trajs[0].answer is None
    ours = {
        "question": "Q?",
        "answer": 7,
        "candidates": [{"steps": ["a", "b"], "correct": False}, {"text": "a\nb\nc", "correct": True}],
    }
    trajs = from_bon_pool(ours, "f row 1", split_rule="newline")
    assert [(t.steps, t.correct, t.answer) for t in trajs] == [(["a", "b"], False, "7"), (["a", "b", "c"], True, "7")]
    with pytest.raises(DataError, match=r"f row 1 candidates\[0\]: field 'correct' is str"):
        from_bon_pool({**ours, "candidates": [{"text": "a", "correct": "yes"}]}, "f row 1")
    with pytest.raises(DataError, match=r"f row 1 candidates\[0\]: field 'steps' is an empty step list"):
        from_bon_pool({**ours, "candidates": [{"text": "\n\n"}]}, "f row 1")
    plain = from_bon_pool({"question": "Q?", "responses": ["a\n\nb", "c"]}, "f row 2")  # what generators write
    assert [t.steps for t in plain] == [["a", "b"], ["c"]] and plain[1].meta == {"qid": 0, "cand": 1}
    mine = from_bon_pool({"id": "q1", "source": "gsm8k", **ours}, "f row 1", qid=5)  # the row's own fields ride along
    assert [t.meta for t in mine] == [{"id": "q1", "source": "gsm8k", "qid": 5, "cand": j} for j in (0, 1)]
    with pytest.raises(DataError, match=r"f row 2 responses\[0\]: expected a string or an object"):
        from_bon_pool({"question": "Q?", "responses": [3]}, "f row 2")


def test_split_steps_and_solution_steps():
    text = "First line.\nSecond line.\n\n  Third para.\n"
    assert split_steps(text, "newline") == ["First line.", "Second line.", "Third para."]
    assert split_steps(text, "double-newline") == ["First line.\nSecond line.", "Third para."]
    assert split_steps(text) == ["First line.\nSecond line.", "Third para."]
    assert split_steps("a\nb") == ["a", "b"] and split_steps("a ки\n\nb ки") == ["a", "b"]
    with pytest.raises(ValueError, match="unknown split rule"):
        split_steps("a", "sentences")
    assert solution_steps("She buys 3 * 4 = <<3*4=12>>12 eggs.\nA: 12") == [
        "She buys 3 * 4 = 12 eggs.",
        "The answer is 12.",
    ]
    assert solution_steps("x = 3\n#### 1,250\nThe answer is: 1,250") == ["x = 3", "The answer is 1,250."]
    assert solution_steps("1. ok\n2. Thus 64. #### 64 ") == ["1. ok", "2. Thus 64.", "The answer is 64."]
    assert solution_steps("Plan A: 5") == ["Plan A: 5"] and solution_steps("") == [EMPTY_RESPONSE]


# ---- the real files -------------------------------------------------------------------


def test_real_processbench(data_dir):
    trajs = load_trajectories(str(data_dir / "processbench" / "gsm8k.json"))
    assert len(trajs) == 400 and sum(t.first_error == -1 for t in trajs) == 193
    assert all(t.first_error == t.meta["first_error"] for t in trajs)


def test_real_math_shepherd(data_dir):
    trajs = load_trajectories(str(data_dir / "math_shepherd_sample" / "samples_math-shepherd.jsonl"))
    assert len(trajs) == 7 and all(
        t.steps[0].startswith("Step 1:") and not t.question.endswith("Step 1:") for t in trajs
    )
    assert trajs[0].labels == [1.0, 1.0, 1.0, 1.0, 0.0] and trajs[4].first_error == 1
    assert all("ки" not in s for t in trajs for s in t.steps)


def test_real_prmbench(data_dir):
    folder = data_dir / "prmbench" / "classified"
    trajs, report = load_with_report(str(folder / "prm800k_test_p1_4o_confidence.jsonl.gz"))
    assert len(trajs) == 180 and report == {}
    assert Counter(t.meta["variant"] for t in trajs) == {"original": 90, "modified": 90}
    assert all(t.labels is not None and t.first_error == -1 for t in trajs[::2])
    with pytest.raises(
        DataError, match=r"deception\.jsonl\.gz row 73 \(modified_process\): field 'steps' has an empty step"
    ):
        load_trajectories(str(folder / "prm800k_test_p1_4o_deception.jsonl.gz"))
    trajs, report = load_with_report(str(folder / "prm800k_test_p1_4o_deception.jsonl.gz"), skip_invalid=True)
    assert len(trajs) == 2 * 87 and report == {"(modified_process): field 'steps' has an empty step at index N": 1}
    multi = load_trajectories(str(folder / "prm_test_p12_multi_solutions.jsonl.gz"))
    assert len(multi) == 330 and all(t.first_error == -1 and t.answer for t in multi)


def test_written_trajectories_read_back_unchanged(tmp_path):
    from biprm.data.readers import load_trajectories
    from biprm.data.synthetic import make_dataset
    from biprm.data.writer import write_trajectories

    trajs = make_dataset(30, seed=4)
    trajs[0].labels = [1.0, 0.5] + [0.0] * (len(trajs[0].steps) - 2)  # a soft label stays a float
    path = write_trajectories(tmp_path / "train.jsonl", trajs)
    back = load_trajectories(str(path), labelled=True)
    assert [(t.question, t.steps, t.labels) for t in back] == [(t.question, t.steps, t.labels) for t in trajs]
