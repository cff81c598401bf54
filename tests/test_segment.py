"""Segmenters (biprm.data.segment) on hand-cut examples: each step's text and its span in the trace."""

from __future__ import annotations

import json

import numpy as np
import pytest

from biprm.data.readers import load_trajectories, split_steps
from biprm.data.segment import JOIN, Markers, Segmenter, first_error_on, for_model, markers, step_at
from biprm.data.trajectory import DataError
from biprm.search.steps import split_steps as search_split

# A reasoning trace in the style of R1/QwQ: thinking markers, "Wait," passages that re-check, a "But" that must not cut.
LONG = (
    "Okay, so I need to find how many apples Tom has left after giving some away. He starts with 23 apples and gives 7 "
    "to Anna and then 5 to Ben. Let me compute the total given away first: 7 + 5 = 12. So he has 23 - 12 = 11 apples "
    "left. Wait, let me re-check the subtraction. 23 - 12: 23 minus 10 is 13, minus 2 more is 11. Yes, that is right. "
    "But the question might mean something else, since it says some apples were rotten, and rotten ones are thrown "
    "away before he gives any to his friends. Hmm, re-reading the problem statement, it says 3 of the apples were "
    "rotten and were thrown away before that. Wait, that changes things. Then he had 23 - 3 = 20 apples, and 20 - 12 = "
    "8 apples left over at the end.\n\nTherefore, Tom has 8 apples left, and the answer is 8."
)


def _check_spans(text: str, cut) -> None:
    """Every step is exactly the text at its span, and the spans are in order and never overlap."""
    assert all(text[s.start : s.end] == s.text for s in cut)
    assert all(a.end <= b.start for a, b in zip(cut, cut[1:]))


def test_paragraph_and_lines_cut_where_a_person_would_with_spans():
    text = "  First line.\nSecond line.\n\n \nThird para.\n"
    paragraphs = Segmenter("paragraph").cut(text, "row 1")
    assert paragraphs.texts == ["First line.\nSecond line.", "Third para."] and paragraphs.offsets == [
        [2, 26],
        [30, 41],
    ]
    lines = Segmenter("lines").cut(text, "row 1")
    assert lines.texts == ["First line.", "Second line.", "Third para."] and lines.fallback is None
    _check_spans(text, paragraphs.steps)
    _check_spans(text, lines.steps)


def test_markers_cut_the_long_trace_as_cut_by_hand():
    """Cut before "Let me", "So", "Wait,", "Hmm", "Wait,", "Then", "Therefore"; never before "But". Then steps under 100
    characters run into the next ("Let me compute" + "So he has" + "Wait, let me re-check ... But ..."; "Wait, that
    changes things." + "Then ..."), and the short closing "Therefore" joins the step before it."""
    cut = Segmenter("markers").cut(LONG, "row 7")
    _check_spans(LONG, cut.steps)
    openings = ["Okay, so I need", "Let me compute the total", "Hmm, re-reading", "Wait, that changes things."]
    assert [s.text[: len(o)] for s, o in zip(cut.steps, openings)] == openings and len(cut.steps) == 4
    assert cut.steps[1].text.endswith("before he gives any to his friends.")
    assert cut.steps[3].text.endswith("the answer is 8.") and cut.fallback is None
    assert [len(s.text) for s in cut.steps] == [140, 348, 108, 159]


def test_markers_merge_short_steps_and_split_long_ones_at_sentences():
    rule = Markers(min_chars=15, max_chars=60)
    text = "So x = 1. Wait, no. Let me redo it: x equals one, and then y equals two. Finally z = x + y = 3."
    steps, fallback = markers(text, rule)
    assert [s.text for s in steps] == [
        "So x = 1. Wait, no.",
        "Let me redo it: x equals one, and then y equals two.",
        "Finally z = x + y = 3.",
    ]
    assert fallback is None
    long = "A" * 10 + ". " + "The value is found. " * 6  # no marker: the length rule alone, at sentence starts
    steps, fallback = markers(long, rule)
    assert all(15 <= len(s.text) <= 60 for s in steps) and "no marker" in fallback
    _check_spans(long, steps)


def test_markers_never_cut_on_but_however_alternatively_and_settings_are_honoured():
    rule = Markers(min_chars=5, max_chars=500)
    text = "We add them. But wait, the sum is odd. However, it still works. Alternatively, use a table. So it is 9."
    assert [s.text for s in markers(text, rule)[0]] == [
        "We add them. But wait, the sum is odd. However, it still works. Alternatively, use a table.",
        "So it is 9.",
    ]
    own = Markers(markers=("check",), min_chars=5, max_chars=500)
    assert [s.text for s in markers("We add. Check: 4. So done.", own)[0]] == ["We add.", "Check: 4. So done."]
    with pytest.raises(ValueError, match="min_chars < max_chars"):
        Markers(min_chars=600, max_chars=100)


def test_tokens_cut_every_n_tokens_of_the_models_tokenizer():
    class Words:  # a stand-in tokenizer: one token per word, with offsets
        def __call__(self, text, add_special_tokens, return_offsets_mapping):
            import re

            return {"offset_mapping": [m.span() for m in re.finditer(r"\S+", text)]}

    cut = Segmenter("tokens:2", Words()).cut("a b c d e", "row 2")
    assert cut.texts == ["a b", "c d", "e"] and cut.offsets == [[0, 3], [4, 7], [8, 9]]
    with pytest.raises(ValueError, match="tokenizer"):
        Segmenter("tokens:2").cut("a b", "row 2")
    with pytest.raises(ValueError, match="N > 0"):
        Segmenter("tokens:0")


def test_given_steps_keep_their_spans_in_the_joined_text_and_are_recut_by_any_other():
    steps = ["Add 2 and 3.", "So the sum is 5."]
    cut = Segmenter("given").cut(steps, "row 3")
    assert cut.texts == steps and [JOIN.join(steps)[a:b] for a, b in cut.offsets] == steps
    assert Segmenter("lines").cut(steps, "row 3").texts == steps


def test_bad_input_is_one_line_naming_the_row():
    with pytest.raises(DataError, match=r"^row 4: the trace is empty$"):
        Segmenter("paragraph").cut("  \n ", "row 4")
    with pytest.raises(DataError, match=r"^row 5: segmenter 'given' keeps .* one string"):
        Segmenter("given").cut("one text", "row 5")
    with pytest.raises(DataError, match="^row 6: field 'steps' is empty"):
        Segmenter("given").cut([], "row 6")
    with pytest.raises(DataError, match="zero steps"):
        Segmenter("ки").cut("ки ки", "row 8")
    with pytest.raises(ValueError, match="unknown segmenter 'sentences'"):
        Segmenter("sentences")
    assert "\n" not in str(pytest.raises(DataError, Segmenter("given").cut, "x", "row 9").value)


def test_the_old_split_rules_and_the_search_splitter_cut_as_before():
    text = "First line.\nSecond line.\n\nThird para."
    assert split_steps(text, "newline") == ["First line.", "Second line.", "Third para."]
    assert split_steps(text) == ["First line.\nSecond line.", "Third para."] and split_steps("a ки\n\nb ки") == [
        "a",
        "b",
    ]
    assert split_steps("a\nb") == ["a", "b"] and split_steps(text, "markers") == [text]
    assert search_split("Step one.\n\nStep two.\n\n \n\n", "\n\n") == ["Step one.", "Step two."]
    assert search_split("a<s>b", "<s>") == ["a", "b"]
    with pytest.raises(ValueError, match="must not be empty"):
        search_split("a", "")


def test_a_trace_row_is_cut_and_its_offsets_travel_in_meta(tmp_path):
    rows = tmp_path / "traces.jsonl"
    rows.write_text(
        "\n".join(
            json.dumps(r)
            for r in (
                {"question": "How many apples?", "solution": LONG, "id": "a"},
                {"problem": "2 + 2?", "response": "2 + 2 = 4.\n\nThe answer is 4."},
            )
        )
    )
    first, second = load_trajectories(str(rows), split_rule=Segmenter("markers"))
    assert first.meta["id"] == "a" and first.meta["segmenter"] == "markers"
    assert [LONG[a:b] for a, b in first.meta["offsets"]] == first.steps
    assert second.steps == ["2 + 2 = 4.\n\nThe answer is 4."] and second.question == "2 + 2?"  # under 100 characters
    assert "no marker" in second.meta["segmenter_fallback"]
    fallback = load_trajectories(str(rows), split_rule=for_model(None, "given"))[1]
    assert fallback.steps == ["2 + 2 = 4.", "The answer is 4."] and "given steps" in fallback.meta["segmenter_fallback"]
    rows.write_text(json.dumps({"question": "q", "solution": "   "}))
    with pytest.raises(DataError, match=r"row 1: field 'solution': the trace is empty"):
        load_trajectories(str(rows))
    assert for_model("markers", "given").name == "markers" and for_model(None, "lines").name == "lines"


def test_the_segmenter_a_model_was_trained_with_is_recorded_and_cuts_traces_when_scoring(tmp_path, capsys):
    from biprm.cli import main
    from biprm.config import TrainConfig
    from biprm.training import train

    model = train(
        TrainConfig(
            backbone="tiny",
            data="synthetic:4",
            mode="bi",
            max_steps=1,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=1,
            output_dir=str(tmp_path / "m"),
            save_steps=10**9,
            show_progress=False,
            segmenter="markers",
        )
    )
    assert json.loads((tmp_path / "m" / "config.json").read_text())["segmenter"] == "markers"
    rows, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    rows.write_text(json.dumps({"question": "How many apples?", "solution": LONG}))
    main(["score", "--model", model, "--input", str(rows), "--output", str(out)])
    line = json.loads(out.read_text())
    assert line["meta"]["segmenter"] == "markers" and len(line["fused"]) == len(line["meta"]["offsets"]) == 4
    again = ["--output", str(out), "--overwrite"]  # the first run's output is replaced, as asked
    main(["score", "--model", model, "--input", str(rows), *again, "--segmenter", "paragraph"])
    assert json.loads(out.read_text())["meta"]["offsets"] == [
        [0, LONG.index("\n\n")],
        [LONG.index("\n\n") + 2, len(LONG)],
    ]
    with pytest.raises(SystemExit):
        main(["score", "--model", model, "--input", str(rows), "--output", str(out), "--segmenter", "sentences"])
    assert "unknown segmenter 'sentences'" in capsys.readouterr().err


def test_a_position_lands_on_the_step_that_holds_it_and_a_first_error_maps_across_cuts():
    given = [[0, 10], [12, 30], [32, 50]]  # three steps joined by two-character gaps
    assert [step_at(given, c) for c in (0, 9, 10, 11, 12, 49, 50)] == [0, 0, 1, 1, 1, 2, -1]
    cut = [[0, 5], [6, 20], [21, 40], [41, 50]]  # a finer cut of the same text
    # cut step 1 starts at 6 (in given step 0), cut step 2 at 21 (given 1), cut step 3 at 41 (given 2); -1 stays -1
    assert [first_error_on(k, cut, given) for k in (-1, 0, 1, 2, 3)] == [-1, 0, 0, 1, 2]


def test_a_labelled_trace_row_is_labelled_under_every_cut(tmp_path):
    text = "3 + 4 = 7.\nSo 7 * 2 = 15.\n\nThe answer is 15."  # the slip starts at character 14 ("7 * 2 = 15")
    rows = tmp_path / "t.jsonl"
    rows.write_text(json.dumps({"question": "q", "solution": text, "first_error_char": text.index("7 * 2")}))
    (lines,) = load_trajectories(str(rows), split_rule=Segmenter("lines"))
    (paragraphs,) = load_trajectories(str(rows), split_rule=Segmenter("paragraph"))
    assert lines.labels == [1.0, 0.0, 0.0] and paragraphs.labels == [0.0, 0.0] and "first_error_char" not in lines.meta
    rows.write_text(json.dumps({"question": "q", "solution": text, "first_error_char": -1}))
    assert load_trajectories(str(rows), split_rule=Segmenter("lines"))[0].labels == [1.0] * 3
    rows.write_text(json.dumps({"question": "q", "solution": text, "first_error_char": 999}))
    with pytest.raises(
        DataError, match="row 1: field 'first_error_char' is 999, past the last step of field 'solution'"
    ):
        load_trajectories(str(rows), split_rule=Segmenter("lines"))
    rows.write_text(json.dumps({"solution": text}))  # the message names the field and the names it also goes by
    with pytest.raises(DataError, match=r"row 1: field 'question' is missing \(or 'problem' or 'prompt'\)"):
        load_trajectories(str(rows), fmt="trace", split_rule=Segmenter("lines"))
    rows.write_text(json.dumps({"question": "q", "solution": text, "first_error_char": -5}))  # not read as "none"
    with pytest.raises(DataError, match="row 1: field 'first_error_char' is -5; give a character position, or -1"):
        load_trajectories(str(rows), split_rule=Segmenter("lines"))


def test_score_eval_and_serve_resolve_one_segmenter(tmp_path):
    from biprm.cli import build_parser
    from biprm.scoring.score_file import trace_segmenter

    assert (
        trace_segmenter([], "lines").name == "lines" and trace_segmenter([], None).name == "auto"
    )  # no model: the readers' rule
    for name, segmenter in (("a", "markers"), ("b", "lines")):
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"segmenter": segmenter}))
    models = [str(tmp_path / "a"), str(tmp_path / "b")]
    assert (
        trace_segmenter(models[:1], None).name == "markers" and trace_segmenter(models, "paragraph").name == "paragraph"
    )
    with pytest.raises(
        ValueError, match=r"trained with different segmenters \(lines, markers\): name one with --segmenter"
    ):
        trace_segmenter(models, None)
    parser = build_parser()  # the old flags of eval bon and serve name the same setting
    assert parser.parse_args(["eval", "bon", "--split-rule", "lines"]).segmenter == "lines"
    assert parser.parse_args(["serve", "--model", "m", "--split", "newline"]).segmenter == "newline"
    from biprm.evaluation.config import BonConfig, ProcessBenchConfig
    from biprm.serve.config import ServeConfig

    for settings, model in (
        (BonConfig, "m"),
        (ServeConfig, "m"),
        (ProcessBenchConfig, ["m"]),
    ):  # a misspelt name is refused with the other settings, before a model loads
        with pytest.raises(ValueError, match="unknown segmenter 'sentences'"):
            settings(model=model, segmenter="sentences")


def test_training_cuts_trace_rows_by_its_segmenter(tmp_path):
    from biprm.config import TrainConfig
    from biprm.training import train

    rows = tmp_path / "traces.jsonl"
    rows.write_text(
        "\n".join(
            json.dumps({"question": "How many apples?", "solution": LONG, "first_error_char": at})
            for at in (-1, LONG.index("23 - 12"), LONG.index("Therefore"))
        )
    )
    settings = dict(
        backbone="tiny",
        data=str(rows),
        mode="bi",
        max_steps=1,
        per_device_train_batch_size=3,
        gradient_accumulation_steps=1,
        save_steps=10**9,
        show_progress=False,
        max_length=1024,
    )
    train(TrainConfig(**settings, output_dir=str(tmp_path / "m"), segmenter="paragraph"))
    assert json.loads((tmp_path / "m" / "config.json").read_text())["segmenter"] == "paragraph"
    # the encoded rows' cache is keyed by the segmenter too: the paragraph run's rows are not reused under 'given'
    with pytest.raises(
        DataError, match=r"traces.jsonl row 1: field 'solution': segmenter 'given' keeps a row's own steps"
    ):
        train(TrainConfig(**settings, output_dir=str(tmp_path / "g")))


def test_scores_of_a_recut_land_on_the_given_steps_as_the_lowest_cut_step_starting_in_each():
    """Hand-computed: given steps [0,10) [12,20) [22,30); cut steps start at 0, 5, 22 (none in the second given step)
    and a fourth cut step was not scored. The first given step takes min(-1, 2) = -1, the second cannot be flagged,
    the third takes 3; a row whose only scored cut step ends inside its first given step holds that one step."""
    from biprm.analysis.boundaries import first_errors_on_given, onto_given
    from biprm.metrics.first_error import predict_first_error
    from biprm.scoring.step_scores import StepScores

    given = [[[0, 10], [12, 20], [22, 30]], [[0, 10], [12, 20]], [[0, 10], [12, 20]], [[0, 10], [12, 20]]]
    cuts = [[[0, 4], [5, 20], [22, 30], [31, 40]], [[0, 8], [9, 20]], [[0, 15], [16, 20]], [[0, 20]]]
    fused, l2r = np.array([-1.0, 2.0, 3.0, 0.5, 1.5, 2.5]), np.array([4.0, -2.0, 1.0, 0.0, 0.0, 0.0])
    scores = StepScores(np.array([0, 3, 4, 5, 6]), fused, l2r=l2r)
    mapped = onto_given(scores, cuts, given)
    # row 3: its scored cut step runs into the second given step, whose own cut step was not scored: one step held;
    # row 4: one cut step spans both given steps and was scored: both held, the second never flagged
    assert mapped.offsets.tolist() == [0, 3, 4, 5, 7]
    assert mapped.fused.tolist() == [-1.0, np.inf, 3.0, 0.5, 1.5, 2.5, np.inf]
    assert mapped.l2r.tolist() == [-2.0, np.inf, 1.0, 0.0, 0.0, 0.0, np.inf] and mapped.r2l is None
    for threshold in (0.1, 0.3, 0.6, 0.8, 0.99):  # the first flagged given step, whatever the threshold
        on_given = predict_first_error(mapped.prob(), mapped.offsets, threshold)
        mapped_back = first_errors_on_given(scores.prob(), scores.offsets, threshold, cuts, given)
        assert on_given.tolist() == mapped_back.tolist()
