import gzip
import json
import random

import pytest

from biprm.data.benchmarks import gsm8k_reference
from studies.replication.data import (
    DataRecipe,
    build,
    corrupt_carried,
    corrupt_claim,
    evaluation_questions,
    normalise,
    prmbench_train,
    write,
)
from biprm.data.trajectory import DataError, Trajectory

EGGS = Trajectory(
    "Tom buys 4 boxes of 6 eggs, breaks 3 and buys 5 more. The shop had 124 eggs. How many eggs does Tom have?",
    [
        "Tom buys 4 x 6 = 24 eggs.",
        "After breaking 3 he has 24 - 3 = 21 eggs.",
        "With 5 more he has 21 + 5 = 26 eggs, and the shop has 124 - 24 = 100 left.",
        "The answer is 26.",
    ],
    [1.0] * 4,
    answer="26",
    meta={"source": "gsm8k"},
)
PAY = Trajectory(
    "Ann earns $250 a day for 5 days a week. A cup of tea costs half of 7 dollars. How much does she earn in 2 weeks?",
    [
        "She earns 5 x $250 = $1,250 a week.",
        "In 2 weeks she earns $1,250 x 2 = $2,500.",
        "A cup costs 7 / 2 = 3.5 dollars, so she can buy 2500 / 3.5 = 714.29 cups.",
        "The answer is 2,500.",
    ],
    [1.0] * 4,
)


# ---- GSM8K references --------------------------------------------------------------------


def test_gsm8k_reference_drops_annotations_and_rewrites_the_final_line():
    answer = (
        "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips "
        "altogether.\n#### 72"
    )
    traj = gsm8k_reference("How many clips?", answer, "row 1")
    assert traj.steps == [
        "Natalia sold 48/2 = 24 clips in May.",
        "Natalia sold 48+24 = 72 clips altogether.",
        "The answer is 72.",
    ]
    assert traj.labels == [1.0, 1.0, 1.0]
    assert traj.answer == "72" and traj.meta["source"] == "gsm8k"


def test_gsm8k_reference_gold_answer_loses_thousands_commas_and_needs_a_final_mark():
    traj = gsm8k_reference("Q?", "She earns 5 x 250 = 1,250.\n#### 1,250", "row 2")
    assert traj.steps[-1] == "The answer is 1,250." and traj.answer == "1250"
    with pytest.raises(DataError, match="row 3: field 'answer'"):
        gsm8k_reference("Q?", "No final mark here.", "row 3")


# ---- corruptions -------------------------------------------------------------------------


def test_carried_redoes_every_later_step_and_leaves_124_alone():
    # rng 1 picks step 0 and 24 -> 34; by hand: 34 - 3 = 31, 31 + 5 = 36, 124 - 34 = 90.
    bad = corrupt_carried(EGGS, random.Random(1))
    assert bad.steps == [
        "Tom buys 4 x 6 = 34 eggs.",
        "After breaking 3 he has 34 - 3 = 31 eggs.",
        "With 5 more he has 31 + 5 = 36 eggs, and the shop has 124 - 34 = 90 left.",
        "The answer is 36.",
    ]
    assert bad.labels == [0.0, 0.0, 0.0, 0.0]
    assert bad.meta["corruption"] == {"step": 0, "from": "24", "to": "34"} and bad.meta["first_error"] == 0
    assert EGGS.steps[0] == "Tom buys 4 x 6 = 24 eggs." and EGGS.labels == [1.0] * 4  # input untouched


def test_carried_from_a_middle_step_keeps_the_steps_before_it():
    bad = corrupt_carried(EGGS, random.Random(0))  # step 1: 21 -> 14, then 14 + 5 = 19
    assert bad.steps[:1] == EGGS.steps[:1]
    assert bad.steps[1:] == [
        "After breaking 3 he has 24 - 3 = 14 eggs.",
        "With 5 more he has 14 + 5 = 19 eggs, and the shop has 124 - 24 = 100 left.",
        "The answer is 19.",
    ]
    assert bad.labels == [1.0, 0.0, 0.0, 0.0] and bad.meta["kind"] == "carried"


def test_carried_keeps_commas_and_recomputes_rounded_decimals():
    bad = corrupt_carried(PAY, random.Random(1))  # 1,250 -> 1,833; 1,833 x 2 = 3,666; 3666 / 3.5 = 1047.43
    assert bad.steps == [
        "She earns 5 x $250 = $1,833 a week.",
        "In 2 weeks she earns $1,833 x 2 = $3,666.",
        "A cup costs 7 / 2 = 3.5 dollars, so she can buy 3666 / 3.5 = 1047.43 cups.",
        "The answer is 3,666.",
    ]


def test_claim_changes_only_its_own_step():
    bad = corrupt_claim(EGGS, random.Random(0))  # step 1: 21 -> 14; step 2 still adds 21 + 5
    assert bad.steps == [EGGS.steps[0], "After breaking 3 he has 24 - 3 = 14 eggs.", *EGGS.steps[2:]]
    assert bad.labels == [1.0, 0.0, 0.0, 0.0]
    assert bad.meta["kind"] == "claim" and bad.meta["corruption"] == {"step": 1, "from": "21", "to": "14"}


@pytest.mark.parametrize("corrupt", [corrupt_carried, corrupt_claim])
def test_wrong_values_differ_stay_positive_and_keep_their_precision(corrupt):
    for seed in range(40):
        bad = corrupt(PAY, random.Random(seed))
        old, new = bad.meta["corruption"]["from"], bad.meta["corruption"]["to"]
        assert new != old and float(new.replace(",", "")) > 0
        assert ("." in new) == ("." in old)
        assert corrupt(PAY, random.Random(seed)).steps == bad.steps  # deterministic given the generator


@pytest.mark.parametrize("corrupt", [corrupt_carried, corrupt_claim])
def test_none_when_no_result_is_used_again(corrupt):
    assert corrupt(Trajectory("Q?", ["The sky is blue.", "The answer is 3."], [1.0, 1.0]), random.Random(0)) is None
    assert corrupt(Trajectory("Q?", ["2 + 2 = 4.", "The answer is 5."], [1.0, 1.0]), random.Random(0)) is None


def test_carried_needs_a_value_first_computed_in_its_step_claim_does_not():
    # 6 is already in the question, so a later 6 may not be this result: carried refuses, claim does not.
    traj = Trajectory("Ann has 6 pens and 3 + 3 more.", ["She gets 3 + 3 = 6 more.", "The answer is 6."], [1.0, 1.0])
    assert corrupt_carried(traj, random.Random(0)) is None
    assert corrupt_claim(traj, random.Random(0)).steps[1] == "The answer is 6."


# ---- the mix on a tiny data root ---------------------------------------------------------


def _jsonl_gz(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(row) + "\n" for row in rows)


def _prmbench_row(idx, question, process, modified_question=None, cls="circular"):
    return {
        "idx": idx,
        "classification": cls,
        "original_question": question,
        "modified_question": modified_question or question,
        "original_process": process,
        "modified_process": [*process[:-1], "A wrong step."],
        "error_steps": [len(process)],
    }


def _gsm8k_row(i):
    n, left = 3 * i, 3 * i - 2
    return {
        "question": f"Sam has {i} bags of 3 apples and eats 2 (case {i}). How many are left?",
        "answer": f"Sam has {i} x 3 = <<{i}*3={n}>>{n} apples.\nHe has {n} - 2 = <<{n}-2={left}>>{left} left.\n#### "
        f"{left}",
    }


@pytest.fixture
def root(tmp_path):
    classified = tmp_path / "prmbench" / "classified"
    a = _prmbench_row("p0", "What is 1+1?", ["1+1=2.", "So 2."])
    one_step = _prmbench_row("p1", "What is 2+2?", ["4."])
    leaked = _prmbench_row("p2", "What is 3+3?", ["3+3=6.", "So 6."], modified_question="A test question.")
    _jsonl_gz(classified / "prm800k_train_p1_first400_4o_circular.jsonl.gz", [a, one_step, leaked])
    _jsonl_gz(
        classified / "prm800k_train_p1_first400_4o_confidence.jsonl.gz",
        [{**a, "modified_process": ["1+1=3.", "So 3."]}],
    )
    _jsonl_gz(
        classified / "prm800k_test_p1_4o_circular.jsonl.gz", [_prmbench_row("t0", "A test question.", ["x.", "y."])]
    )
    _jsonl_gz(tmp_path / "gsm8k" / "train.jsonl.gz", [_gsm8k_row(i) for i in range(2, 42)])
    (tmp_path / "gsm8k" / "test.jsonl").write_text(json.dumps(_gsm8k_row(7)) + "\n")
    return tmp_path


def test_prmbench_train_drops_repeated_originals(root):
    trajs, repeats = prmbench_train(str(root))
    assert repeats == 1  # p0's clean process, in both class files
    assert [(t.meta["idx"], t.meta["kind"]) for t in trajs] == [
        ("p0", "original"),
        ("p0", "modified"),
        ("p1", "original"),
        ("p1", "modified"),
        ("p2", "original"),
        ("p2", "modified"),
        ("p0", "modified"),
    ]
    assert {t.meta["group"] for t in trajs} == {"prmbench:p0", "prmbench:p1", "prmbench:p2"}


def test_evaluation_questions_reads_only_sets_on_hand(root):
    evals = evaluation_questions(str(root))
    assert set(evals) == {"prmbench_test", "gsm8k_test"}
    assert evals["prmbench_test"] == {"a test question."}
    assert evals["gsm8k_test"] == {normalise(_gsm8k_row(7)["question"])}


def test_build_filters_dedups_and_splits_by_question(root):
    train, valid, report = build(str(root), DataRecipe(valid_fraction=0.3))
    assert report.prmbench_rows_read == 8 and report.prmbench_duplicates == 1
    assert report.gsm8k_questions == 40 and report.gsm8k_corruptions_missing == 0
    assert report.single_step_dropped == 2  # p1, clean and modified
    assert report.eval_dedup_by_set == {"prmbench_test": 2, "gsm8k_test": 2}  # all of p2; question 7 and its copy
    assert report.eval_dedup_removed == 4
    rows = train + valid
    assert len(rows) == 7 + 2 * 40 - 2 - 4 == report.train_rows + report.valid_rows
    assert all(len(t.steps) >= 2 for t in rows)
    assert not {t.meta["group"] for t in rows} & {"prmbench:p2", normalise(_gsm8k_row(7)["question"])}
    train_groups, valid_groups = {t.meta["group"] for t in train}, {t.meta["group"] for t in valid}
    assert train_groups and valid_groups and not train_groups & valid_groups
    assert (report.train_questions, report.valid_questions) == (len(train_groups), len(valid_groups))
    again = build(str(root), DataRecipe(valid_fraction=0.3))
    assert [t.steps for t in again[0]] == [t.steps for t in train]


def test_caps_and_write(root, tmp_path):
    train, valid, report = build(str(root), DataRecipe(prmbench_rows=3, gsm8k_questions=10, valid_fraction=0.0))
    assert report.prmbench_rows == 3 and report.gsm8k_questions == 10 and valid == []
    write(str(tmp_path / "out"), train, valid, report)
    lines = (tmp_path / "out" / "train.jsonl").read_text().splitlines()
    assert len(lines) == len(train) and set(json.loads(lines[0])) == {"prompt", "completions", "labels"}
    assert json.loads((tmp_path / "out" / "report.json").read_text())["train_rows"] == len(train)


# ---- the real files ----------------------------------------------------------------------


def test_real_data_counts(data_dir):
    train, valid, report = build(str(data_dir), DataRecipe(gsm8k_questions=300))
    assert report.prmbench_rows_read == 6380 and report.prmbench_duplicates == 1722
    assert report.gsm8k_questions_read == 7473 and report.gsm8k_corruptions_missing == 0
    assert len(report.eval_questions) == 9 and report.eval_questions["gsm8k_test"] == 1319
    groups = [{t.meta["group"] for t in split} for split in (train, valid)]
    assert not groups[0] & groups[1]
