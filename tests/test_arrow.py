"""The Arrow training set: the same encodings as the in-memory path, built once and then read from the cache,
bad rows named (file, row, field) or skipped and counted, truncated rows named."""

import json
import logging
from pathlib import Path

import datasets
import pytest

import biprm.data.arrow as encoded
from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.data.arrow import encoded_dataset, to_encoded
from biprm.data.encoding import Encoder, add_step_tag
from biprm.data.readers import load_trajectories
from biprm.data.trajectory import DataError


@pytest.fixture(scope="module")
def encoder():
    tok = load_tokenizer(resolve_backbone("tiny"))
    return Encoder(tok, add_step_tag(tok), max_length=2048)


@pytest.fixture(autouse=True)
def own_cache(tmp_path, monkeypatch):
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


def trl_file(path, n=12, bad_row=None):
    rows = [
        {
            "prompt": f"What is {k} + {k}?",
            "completions": [f"{k} + {k} = {2 * k}.", f"The answer is {2 * k}."],
            "labels": [True, k % 3 != 0],
        }
        for k in range(n)
    ]
    if bad_row is not None:
        del rows[bad_row - 1]["labels"]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return path


def test_encodings_equal_the_in_memory_path(tmp_path, encoder):
    path = trl_file(tmp_path / "d.jsonl")
    data = encoded_dataset(str(path), encoder)
    want = [encoder.encode(t) for t in load_trajectories(str(path), labelled=True)]
    got = [to_encoded(r) for r in data]
    assert [(g.prompt, g.steps, g.labels) for g in got] == [(w.prompt, w.steps, w.labels) for w in want]
    assert list(data["n_tokens"]) == [w.n_tokens for w in want] and list(data["row"]) == list(range(1, 13))
    synthetic = encoded_dataset("synthetic:5:3", encoder)
    assert [to_encoded(r).steps for r in synthetic] == [
        encoder.encode(t).steps for t in load_trajectories("synthetic:5:3")
    ]


def test_a_second_run_reads_the_cache(tmp_path, encoder, monkeypatch):
    path = trl_file(tmp_path / "d.jsonl")
    calls = []
    real = encoded._encode_rows
    monkeypatch.setattr(encoded, "_encode_rows", lambda *a, **k: calls.append(1) or real(*a, **k))
    first = encoded_dataset(str(path), encoder)
    n = len(calls)
    second = encoded_dataset(str(path), encoder)
    assert n > 0 and len(calls) == n and list(second["steps"]) == list(first["steps"])
    encoded_dataset(str(path), Encoder(encoder.tokenizer, encoder.step_tag_id, max_length=64))
    assert len(calls) > n  # another max_length is another encoding


def test_a_bad_row_is_named_or_skipped_and_counted(tmp_path, encoder, caplog):
    path = trl_file(tmp_path / "d.jsonl", bad_row=5)
    with pytest.raises(DataError, match=r"d.jsonl row 5: field 'labels' is missing"):
        encoded_dataset(str(path), encoder)
    with caplog.at_level(logging.WARNING):
        data = encoded_dataset(str(path), encoder, skip_invalid=True)
    assert len(data) == 11 and 5 not in list(data["row"]) and "error" not in data.column_names
    assert "skipped 1 of 12 rows: row 5 (field 'labels' is missing; training needs step labels)" in caplog.text


def test_truncated_rows_are_named_and_broken_json_names_its_line(tmp_path, encoder, caplog):
    path = trl_file(tmp_path / "d.jsonl", n=3)
    short = Encoder(
        encoder.tokenizer,
        encoder.step_tag_id,
        max_length=len(encoder.encode(load_trajectories(str(path))[0]).prompt) + 12,
    )
    with caplog.at_level(logging.WARNING):
        data = encoded_dataset(str(path), short)
    assert (
        all(n > 0 for n in data["n_dropped"])
        and "3 rows exceed max_length" in caplog.text
        and "rows 1, 2, 3" in caplog.text
    )
    broken = tmp_path / "broken.jsonl"
    broken.write_text(path.read_text() + '{"prompt": "x", \n')
    with pytest.raises(DataError, match=r"broken.jsonl line 4: not valid JSON"):
        encoded_dataset(str(broken), encoder)


def test_streaming_encodes_as_it_goes_and_trains(tmp_path, encoder, caplog):
    from biprm.data.arrow import streamed_dataset
    from biprm.training import TrainConfig, train

    path = trl_file(tmp_path / "d.jsonl", bad_row=2)
    with caplog.at_level(logging.WARNING):
        rows = list(streamed_dataset(str(path), encoder, skip_invalid=True))
    want = [encoder.encode(t) for t in load_trajectories(str(path)) if t.labels is not None]
    assert [r["steps"] for r in rows] == [
        w.steps for w in want
    ] and "d.jsonl row 2: field 'labels' is missing" in caplog.text
    with pytest.raises(ValueError, match="give --max-steps"):
        TrainConfig(data=str(path), streaming=True)
    out = train(
        TrainConfig(
            backbone="tiny",
            data=str(path),
            streaming=True,
            skip_invalid=True,
            max_steps=2,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=1,
            output_dir=str(tmp_path / "run"),
            save_steps=10,
            show_progress=False,
        )
    )
    assert max(e.get("step", 0) for e in json.loads((tmp_path / "run" / "train_log.json").read_text())) == 2 and out


LAYOUTS = {  # one small file per layout the non-streaming path reads, with rows of mixed lengths
    "trl": [
        {
            "prompt": f"What is {k} + 1?",
            "completions": [f"Step {j}." for j in range(k % 4 + 1)],
            "labels": [True] * (k % 4) + [k % 2 == 0],
        }
        for k in range(9)
    ],
    "math-shepherd": [
        {
            "input": f"What is {k}? Step 1: {k} + 0 = {k}. ки\nStep 2: So {k}. ки\nStep 3: Done. ки",
            "label": f"What is {k}? Step 1: {k} + 0 = {k}. +\nStep 2: So {k}. {'+' if k % 2 else '-'}\nStep 3: Done. -",
        }
        for k in range(5)
    ],
    "processbench": [
        {"id": str(k), "problem": f"What is {k}?", "steps": ["a", "b", "c"][: k % 3 + 1], "label": -1 if k % 2 else 0}
        for k in range(5)
    ],
    "prmbench": [
        {
            "original_question": "What is 2?",
            "modified_question": "What is 2?",
            "original_process": ["1 + 1 = 2.", "So 2."],
            "modified_process": ["1 + 1 = 3.", "So 3.", "Done."],
            "error_steps": [k + 1],
        }
        for k in range(3)
    ],
}


def _loss(rows: list[dict], mode: str) -> float:
    """The loss of one batch holding every row, on a seeded tiny model: a mean over trajectories, so row order does not
    matter."""
    import torch

    from biprm.modeling import from_backbone
    from biprm.training import collate

    tok = load_tokenizer(resolve_backbone("tiny"))
    torch.manual_seed(0)
    model = from_backbone(resolve_backbone("tiny"), tok, mode=mode).eval()
    with torch.no_grad():
        return model(
            **collate(rows, mode=mode, share_prefix=True, max_tokens=None, pad_id=tok.pad_token_id)
        ).loss.item()


@pytest.mark.parametrize("layout", [*LAYOUTS, "synthetic:6"])
def test_streaming_reads_every_layout_to_the_same_rows_and_loss(tmp_path, encoder, layout):
    from biprm.data.arrow import streamed_dataset

    source = layout
    if layout in LAYOUTS:
        source = str(tmp_path / f"{layout}.jsonl")
        Path(source).write_text("\n".join(json.dumps(r) for r in LAYOUTS[layout]) + "\n")
    streamed, stored = list(streamed_dataset(source, encoder)), list(encoded_dataset(source, encoder))
    key = lambda r: (r["row"], r["steps"], r["labels"])  # noqa: E731
    assert sorted(streamed, key=key) == sorted(stored, key=key) and len(stored) > 1
    assert _loss(streamed[::-1], "bi") == pytest.approx(_loss(stored, "bi"), rel=1e-5)


@pytest.mark.parametrize(
    "flags", [[], ["--mode", "l2r", "--batch-size", "1"], ["--no-share-prefix", "--data", "synthetic:20"]]
)
def test_streaming_trains_from_the_command_line(tmp_path, data_dir, flags):
    from biprm.cli import main

    sample = data_dir / "math_shepherd_sample" / "samples_math-shepherd.jsonl"
    out = tmp_path / "stream"
    main(
        [
            "train",
            "--backbone",
            "tiny",
            "--data",
            str(sample),
            "--streaming",
            "--max-steps",
            "3",
            "--output-dir",
            str(out),
            "--no-show-progress",
            *flags,
        ]
    )
    assert max(e.get("step", 0) for e in json.loads((out / "train_log.json").read_text())) == 3
