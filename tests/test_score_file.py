"""`biprm score`'s file handling (`biprm.scoring.score_file`): a torn tail cut off, a resume only of the same run,
parts joined in order into an output that is never seen half-written. The command end to end: tests/test_cli.py."""

import json
import os

import pytest

from biprm.scoring.score_file import _check_run, _join, _stamp, complete_lines


def test_complete_lines_keeps_whole_json_lines_and_cuts_a_torn_tail(tmp_path):
    part = tmp_path / "part.jsonl"
    assert complete_lines(part) == 0
    part.write_text('{"a": 1}\n{"b": 2}\n{"c": ')
    assert complete_lines(part) == 2 and part.read_text() == '{"a": 1}\n{"b": 2}\n'
    part.write_text('{"a": 1}\nnot json\n{"b": 2}\n')
    assert complete_lines(part) == 1 and part.read_text() == '{"a": 1}\n'  # nothing after a bad line is trusted


def test_parts_join_in_order_and_replace_the_output_whole(tmp_path):
    parts = [tmp_path / f"part-{k:05d}-of-00002.jsonl" for k in range(2)]
    parts[0].write_text('{"row": 1}\n')
    parts[1].write_text('{"row": 2}\n{"row": 3}\n')
    out = tmp_path / "out" / "scores.jsonl"
    out.parent.mkdir()
    out.write_text("an older run's output\n")
    _join(parts, out, 2)
    assert out.read_text() == '{"row": 1}\n{"row": 2}\n{"row": 3}\n'
    assert os.listdir(out.parent) == ["scores.jsonl"]  # no temporary file left
    with pytest.raises(RuntimeError, match="expected 3 part files, found 2"):
        _join(parts, out, 3)
    assert out.read_text().count("row") == 3


def run_record(tmp_path, rows: int) -> dict:
    return {
        "model": "m",
        "model_files": [],
        "input": "in.jsonl",
        "input_file": _stamp(tmp_path / "in.jsonl"),
        "rows": rows,
        "processes": 1,
    }


def test_a_resume_must_be_the_same_run(tmp_path):
    (tmp_path / "in.jsonl").write_text("{}\n")
    scratch = tmp_path / "out.jsonl.parts"
    _check_run(scratch, run_record(tmp_path, 3), resume=False)
    assert json.loads((scratch / "run.json").read_text())["rows"] == 3
    (scratch / "part-00000-of-00001.jsonl").write_text('{"row": 1}\n')
    with pytest.raises(FileExistsError, match="add --resume"):
        _check_run(scratch, run_record(tmp_path, 3), resume=False)
    _check_run(scratch, run_record(tmp_path, 3), resume=True)
    with pytest.raises(ValueError, match="belongs to another run.*rows: 3 then, 4 now"):
        _check_run(scratch, run_record(tmp_path, 4), resume=True)
    os.utime(tmp_path / "in.jsonl", ns=(0, 0))  # the input was edited since
    with pytest.raises(ValueError, match="belongs to another run.*input_file"):
        _check_run(scratch, run_record(tmp_path, 3), resume=True)


def test_a_run_that_failed_before_its_first_chunk_leaves_nothing_in_the_way(tmp_path):
    scratch = tmp_path / "out.jsonl.parts"
    _check_run(scratch, run_record(tmp_path, 3), resume=False)
    (scratch / "part-00000-of-00001.jsonl").write_text("")
    _check_run(scratch, run_record(tmp_path, 5), resume=False)  # empty parts: no --resume needed, another run may start
    assert json.loads((scratch / "run.json").read_text())["rows"] == 5
