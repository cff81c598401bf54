"""`biprm search` end to end on a scripted policy and PRM: records, baselines, resume, a grader that times out."""

import json
import logging
import re
from dataclasses import replace
from pathlib import Path

import pytest

from biprm.search import run as search_run
from biprm.search.config import SearchConfig
from biprm.search.run import run_search
from search_scripted import ScriptedPolicy, ScriptedScorer

QUESTIONS = [
    {"question": "one", "answer": "3"},
    {"question": "two", "answer": "5"},
    {"question": "three", "answer": "7"},
]
TREE = {
    ("one",): ["answer 3", "answer 4"],
    ("two",): ["x", "y"],
    ("two", "x"): ["answer 5"],
    ("two", "y"): ["answer 6"],
    ("three",): ["z"],
    ("three", "z"): ["answer 8"],
}
LOGITS = {
    "answer 3": 2.0,
    "answer 4": -2.0,
    "x": 1.0,
    "y": -1.0,
    "answer 5": 1.0,
    "answer 6": 1.0,
    "z": 0.0,
    "answer 8": 0.0,
}


@pytest.fixture
def config(tmp_path):
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return SearchConfig(
        out=str(tmp_path / "out"),
        data=str(data),
        algorithms=["bon", "beam", "dvts", "particles"],
        n=[2, 4],
        width=2,
        strategies=["fused", "l2r-rerank"],
        batch_questions=2,
        grade_workers=0,
    )


def records(cfg):
    return [json.loads(line) for line in open(f"{cfg.out}/questions.jsonl")]


def without_timings(record: dict) -> dict:
    """A record less its budgets, the one part two runs of the same draws do not share."""
    return json.loads(json.dumps(record), object_hook=lambda d: {k: v for k, v in d.items() if k != "budget"})


def test_every_method_and_baseline_lands_in_one_line_per_question(config):
    text = run_search(config, ScriptedPolicy(TREE), [ScriptedScorer(LOGITS)])
    rows = records(config)
    assert [r["index"] for r in rows] == [0, 1, 2]
    methods = rows[0]["methods"]
    for n in (2, 4):
        for name in (
            "pass",
            "majority",
            "random",
            "bon-max/fused",
            "bon-vote/fused",
            "noise:bon-max",
            "beam/fused",
            "noise:beam",
            "dvts/l2r-rerank",
            "noise:dvts",
            "particles/fused",
            "noise:particles",
        ):
            assert f"{name}@{n}" in methods and f"{name}@{n}" in text
    one, two, three = (r["methods"] for r in rows)
    assert (
        one["bon-max/fused@2"]["answer"] == "3" and one["bon-max/fused@2"]["correct"] is True
    )  # pool: answer 3, answer 4
    assert one["majority@4"]["correct"] is True  # 3, 4, 3, 4: a tie goes to the first answer seen
    assert two["beam/fused@4"]["solution"] == "x\n\nanswer 5" and two["beam/fused@4"]["correct"] is True
    small, full = one["majority@2"]["budget"], one["majority@4"]["budget"]  # the pool's first 2 of 4
    assert small["policy_calls"] == full["policy_calls"] == 1 and small["policy_tokens"] == sum(
        p["tokens"] for p in rows[0]["pool"][:2]
    )
    spent = rows[1][
        "budget"
    ]  # the pool (2 levels for question two), then 3 algorithms x 2 N x (2 strategies + noise), 2 levels each
    assert spent["policy_calls"] == 2 + 18 * 2 and spent["policy_tokens"] == sum(
        p["tokens"] for p in rows[1]["pool"]
    ) + sum(m["budget"]["policy_tokens"] for m in two.values() if "paths" in m)
    assert "prm_calls" not in small and one["bon-max/fused@2"]["budget"]["prm_calls"] == 1
    assert three["pass@4"]["correct"] is False and three["beam/fused@4"]["correct"] is False
    beam = two["beam/fused@4"]
    assert [p["steps"] for p in beam["paths"]] == [["x", "answer 5"]] * 2  # a tie (1.0 each) keeps the first children
    assert beam["paths"][0]["fused"] == [round(1 / (1 + 2.718281828459045**-1.0), 4)] * 2
    assert (
        beam["budget"]["policy_calls"] == 2 and beam["budget"]["policy_tokens"] == 2 * 1 + 4 * 8
    )  # x, y; then two children each
    assert all((Path(config.out) / name).stat().st_size > 0 for name in ("accuracy.png", "summary.md", "summary.json"))


def test_a_killed_run_resumes_at_the_first_unfinished_question(config):
    run_search(config, ScriptedPolicy(TREE), [ScriptedScorer(LOGITS)])
    full = records(config)
    path = f"{config.out}/questions.jsonl"
    lines = open(path).read().splitlines(keepends=True)
    open(path, "w").write(lines[0] + lines[1][:40])  # killed while writing the second line
    policy = ScriptedPolicy(TREE)
    run_search(config, policy, [ScriptedScorer(LOGITS)])
    again = records(config)
    assert [r["index"] for r in again] == [0, 1, 2]
    assert "one" not in {k[0] for k in policy.asked}  # the finished question is not searched again
    assert without_timings(again[2]["methods"]["beam/fused@4"]) == without_timings(full[2]["methods"]["beam/fused@4"])


class DiesAt(ScriptedPolicy):
    """Killed at its `at`-th call (0: never); keeps the prompts it was asked, call by call."""

    def __init__(self, tree, at: int):
        super().__init__(tree)
        self.at, self.prompts = at, []

    def generate_step(self, prompts, n):
        self.prompts.append(prompts)
        if len(self.prompts) == self.at:
            raise RuntimeError("killed")
        return super().generate_step(prompts, n)


# Three first steps for question one: the pool of 4 asks it 4 times, so the tree searches after it start at its second
# child, and a resumed run does the same only if the policy's draw state was saved with the pool.
TREE3 = TREE | {("one",): ["answer 3", "answer 4", "answer 5"]}


def test_a_run_killed_while_drawing_the_pool_resumes_at_its_last_level(config, tmp_path):
    whole = replace(config, out=str(tmp_path / "whole"))
    run_search(whole, ScriptedPolicy(TREE3), [ScriptedScorer(LOGITS)])
    with pytest.raises(RuntimeError, match="killed"):
        run_search(
            config, DiesAt(TREE3, at=2), [ScriptedScorer(LOGITS)]
        )  # the first batch's pool: depth 1 drawn, depth 2 not
    saved = Path(config.out) / "batch-in-flight.json"
    kept = json.loads(saved.read_text())
    pool = kept["pool"]
    assert (
        kept["indices"] == [0, 1]
        and {len(p["steps"]) for p in pool["paths"]} == {1}
        and pool["budget"]["policy_calls"] == [1, 1]
    )
    assert [["one"], 4] in pool["policy"]["asked"]
    policy = DiesAt(TREE3, at=0)
    run_search(config, policy, [ScriptedScorer(LOGITS)])
    assert policy.prompts[0] == [
        "two||x",
        "two||y",
        "two||x",
        "two||y",
    ]  # the saved pool's next level, not its first again
    assert not saved.exists()
    mine, theirs = records(config), records(whole)
    assert [without_timings(r) for r in mine] == [without_timings(r) for r in theirs]
    assert (
        mine[1]["methods"]["majority@4"]["budget"]["policy_calls"] == 2
    )  # the saved level's call and the resumed one's

    lines = open(
        f"{config.out}/questions.jsonl"
    ).readlines()  # killed after a batch was appended, before its pool was removed
    open(f"{config.out}/questions.jsonl", "w").writelines(lines[:2])
    saved.write_text(json.dumps(kept))
    policy = DiesAt(TREE3, at=0)
    run_search(config, policy, [ScriptedScorer(LOGITS)])
    assert {p.split("||")[0] for call in policy.prompts for p in call} == {"three"} and not saved.exists()
    assert [without_timings(r) for r in records(config)] == [without_timings(r) for r in theirs]

    open(f"{config.out}/questions.jsonl", "w").writelines(
        lines[:1]
    )  # killed in the append: question 0's line made it, 1's did not
    saved.write_text(json.dumps(kept))
    policy = DiesAt(TREE3, at=0)
    run_search(config, policy, [ScriptedScorer(LOGITS)])
    assert {p.split("||")[0] for call in policy.prompts for p in call} == {"two", "three"} and not saved.exists()
    assert [r["index"] for r in records(config)] == [0, 1, 2]

    saved.write_text(json.dumps(kept))  # killed after the last batch's append: nothing is left to do, and the file goes
    run_search(config, DiesAt(TREE3, at=1), [ScriptedScorer(LOGITS)])
    assert not saved.exists()


class ScorerDiesAt(ScriptedScorer):
    """Killed at its `at`-th call (0: never)."""

    def __init__(self, logits, at: int):
        super().__init__(logits)
        self.at = at

    def score(self, questions, paths, streams="fused"):
        if self.calls + 1 == self.at:
            raise RuntimeError("killed")
        return super().score(questions, paths, streams)


def test_a_run_killed_while_a_prm_scores_the_pool_resumes_at_its_next_call(config, tmp_path, monkeypatch):
    config.algorithms, config.n, config.strategies = ["bon", "beam"], [4], ["fused"]
    monkeypatch.setattr(search_run, "POOL_CHUNK", 3)
    whole = replace(config, out=str(tmp_path / "whole"))
    run_search(whole, ScriptedPolicy(TREE3), [ScriptedScorer(LOGITS)])
    with pytest.raises(RuntimeError, match="killed"):
        run_search(
            config, ScriptedPolicy(TREE3), [ScorerDiesAt(LOGITS, at=3)]
        )  # first batch: 8 paths, calls of 3, 3, 2
    kept = json.loads((Path(config.out) / "batch-in-flight.json").read_text())
    (scored,) = kept["scores"].values()
    assert len(scored["paths"]) == 6 and scored["budget"]["prm_calls"] == [2, 1]
    policy, scorer = DiesAt(TREE3, at=0), ScriptedScorer(LOGITS)
    run_search(config, policy, [scorer])
    assert policy.prompts[0] == ["one", "two"]  # beam search's first level: the first pool is not drawn again
    assert [len(paths) for _, paths in scorer.seen[:2]] == [
        2,
        4,
    ]  # the first pool's last call, then beam search's first level
    mine, theirs = records(config), records(whole)
    assert [without_timings(r) for r in mine] == [without_timings(r) for r in theirs]
    calls = lambda rows: [r["methods"]["bon-max/fused@4"]["budget"]["prm_calls"] for r in rows]  # noqa: E731
    assert calls(mine) == calls(theirs) == [2, 2, 2]  # question two: one call saved, one run after the resume


def test_resume_refuses_changed_settings(config):
    run_search(config, ScriptedPolicy(TREE), [ScriptedScorer(LOGITS)])
    config.width = 1
    with pytest.raises(ValueError, match="--width was 2, now 1"):
        run_search(config, ScriptedPolicy(TREE), [ScriptedScorer(LOGITS)])


def test_an_out_of_another_search_is_replaced_only_with_overwrite_and_a_stranger_file_never(config, caplog):
    """Before, a changed setting could not be replaced at all (no --overwrite), and files no search writes were written
    beside without a word."""
    run_search(config, ScriptedPolicy(TREE), [ScriptedScorer(LOGITS)])
    held = sorted(p.name for p in Path(config.out).iterdir())
    config.width = 1
    with pytest.raises(
        ValueError, match=re.escape(f"holds {', '.join(held)}, written by another biprm search (--width")
    ):
        run_search(config, ScriptedPolicy(TREE), [ScriptedScorer(LOGITS)])
    config.overwrite = True
    with caplog.at_level(logging.WARNING):
        run_search(config, ScriptedPolicy(TREE), [ScriptedScorer(LOGITS)])
    assert f"--overwrite: deleting {', '.join(held)} in {config.out}" in caplog.text
    assert json.loads((Path(config.out) / "settings.json").read_text())["width"] == 1
    (Path(config.out) / "model.safetensors").touch()
    with pytest.raises(FileExistsError, match="holds model.safetensors, which biprm search never writes"):
        run_search(config, ScriptedPolicy(TREE), [ScriptedScorer(LOGITS)])
    assert (Path(config.out) / "model.safetensors").is_file()


def test_the_hf_policys_batch_size_is_a_setting_a_resume_shares(config):
    """It changes what --policy hf draws; with another policy it changes nothing, so it is not compared."""
    from biprm.search.run import check_settings

    out = Path(config.out)
    out.mkdir(parents=True)
    config.policy = "hf"
    check_settings(out, config)
    config.policy_batch_size = 8
    with pytest.raises(ValueError, match="--policy-batch-size was 32, now 8"):
        check_settings(out, config)
    other = replace(config, out=str(out.parent / "other"), policy="vllm")
    Path(other.out).mkdir()
    check_settings(Path(other.out), other)
    other.policy_batch_size = 64
    check_settings(Path(other.out), other)


def test_a_grader_that_times_out_gives_unknown_not_wrong(config, monkeypatch):
    monkeypatch.setattr(
        search_run, "grade_many", lambda pairs, workers, timeout: [None] * len(pairs)
    )  # what grade_many returns on timeouts
    config.algorithms, config.n = ["beam"], [2]
    text = run_search(config, ScriptedPolicy(TREE), [ScriptedScorer(LOGITS)])
    row = records(config)[0]
    assert row["methods"]["beam/fused@2"]["correct"] is None and row["methods"]["pass@2"]["correct"] is None
    assert "| beam/fused@2 | - |" in text and all(p["correct"] is None for p in row["pool"])


def test_path_past_the_prm_max_length_is_flagged_in_the_output(config):
    config.algorithms, config.n = ["beam"], [2]
    run_search(config, ScriptedPolicy(TREE), [ScriptedScorer(LOGITS, max_steps=1)])
    paths = records(config)[1]["methods"]["beam/fused@2"]["paths"]
    assert paths[0]["n_dropped"] == 1 and len(paths[0]["fused"]) == 1 and len(paths[0]["steps"]) == 2


@pytest.mark.slow
def test_a_transformers_policy_runs_the_whole_command(config):
    from biprm.search.noise import NoiseScorer
    from biprm.search.policy import HFPolicy

    config.algorithms, config.n, config.strategies, config.max_depth, config.max_step_tokens = (
        ["beam"],
        [2],
        ["fused"],
        2,
        6,
    )
    policy = HFPolicy.from_pretrained("tiny", max_step_tokens=6)
    text = run_search(config, policy, [NoiseScorer()])
    rows = records(config)
    assert len(rows) == 3 and "beam/fused@2" in text
    paths = rows[0]["methods"]["beam/fused@2"]["paths"]
    assert all(len(p["steps"]) <= 2 and p["finished"] for p in paths)
    assert sum(r["methods"]["beam/fused@2"]["budget"]["policy_tokens"] for r in rows) > 0


@pytest.mark.slow
def test_a_prefix_scorer_drives_every_strategy(config, bi_scorer):
    from biprm.scoring import prefix

    config.algorithms, config.n, config.strategies = ["bon", "beam", "particles"], [2], ["fused", "l2r-rerank", "l2r"]
    run_search(config, ScriptedPolicy(TREE), [prefix.PrefixScorer(bi_scorer)])
    methods = records(config)[1]["methods"]
    beam = methods["beam/fused@2"]
    assert all(len(p["fused"]) == len(p["steps"]) and p["n_dropped"] == 0 for p in beam["paths"])
    assert beam["budget"]["prm_tokens_l2r"] > 0 and beam["budget"]["prm_tokens_r2l"] > 0
    assert methods["beam/l2r@2"]["budget"].get("prm_tokens_r2l", 0) == 0  # L2R only: R2L never runs


def test_the_table_marks_a_search_that_does_not_beat_its_noise_twin_or_majority_vote():
    from biprm.search.report import method_rows, table

    def record(i):
        right = i % 2 == 0
        cost = {"budget": {"policy_tokens": 10.0}}
        return {
            "methods": {
                "beam/fused@4": {"correct": True, **cost},
                "noise:beam@4": {"correct": right, **cost},
                "beam/l2r@4": {"correct": right, **cost},
                "majority@4": {"correct": None if i == 0 else right, **cost},
            }
        }

    rows = {r["method"]: r for r in method_rows([record(i) for i in range(40)])}
    assert list(rows) == ["majority@4", "beam/fused@4", "beam/l2r@4", "noise:beam@4"]
    assert not rows["beam/fused@4"]["vs_noise"]["within_noise"] and rows["beam/l2r@4"]["vs_noise"]["within_noise"]
    assert rows["majority@4"]["unknown"] == 1 and rows["majority@4"]["questions"] == 39
    text = table(list(rows.values()))
    assert (
        "| beam/fused@4 | 100.0 [100.0, 100.0] | +50.0 [" in text
        and "| beam/l2r@4 | 50.0 [" in text
        and "+0.0 [" in text
    )
    assert text.count("(noise)") == 1
    assert "vs_majority" not in rows["majority@4"]  # questions 1-39: majority right on the 19 even ones, as is beam/l2r
    assert round(100 * rows["beam/fused@4"]["vs_majority"]["mean"], 1) == round(100 * 20 / 39, 1) == 51.3
    assert rows["beam/l2r@4"]["vs_majority"]["mean"] == 0 and rows["noise:beam@4"]["vs_majority"]["questions"] == 39
    assert text.count("(tie)") == 2


# Two PRMs that disagree: "l2r" is LOGITS, "bi" prefers the other child everywhere.
FLIPPED = {step: -v for step, v in LOGITS.items()}


def run_alone(config, tmp_path, prm: str, logits: dict) -> list[dict]:
    """The same experiment with one PRM, in its own folder."""
    alone = SearchConfig(**{**vars(config), "out": str(tmp_path / f"alone-{prm}"), "prm": [prm]})
    run_search(alone, ScriptedPolicy(TREE), [ScriptedScorer(logits)])
    return records(alone)


def test_two_prms_score_one_pool_and_each_picks_as_it_would_alone(config, tmp_path):
    config.algorithms, config.prm = ["bon", "beam"], ["runs/l2r", "runs/bi"]
    policy = ScriptedPolicy(TREE)
    text = run_search(config, policy, [ScriptedScorer(LOGITS), ScriptedScorer(FLIPPED)])
    both = records(config)
    alone = {
        "l2r": run_alone(config, tmp_path, "runs/l2r", LOGITS),
        "bi": run_alone(config, tmp_path, "runs/bi", FLIPPED),
    }
    untimed = lambda b: {k: v for k, v in b.items() if not k.endswith("_s")}  # noqa: E731
    for q, record in enumerate(both):
        assert [p["steps"] for p in record["pool"]] == [p["steps"] for p in alone["l2r"][q]["pool"]]
        for prm, solo in alone.items():
            assert record["pool"][0]["prms"][prm]["fused"] == solo[q]["pool"][0]["fused"]
            for n in (2, 4):
                for method in ("bon-max/fused", "bon-vote/fused"):
                    mine, theirs = record["methods"][f"{method}@{n} [{prm}]"], solo[q]["methods"][f"{method}@{n}"]
                    assert mine["pick"] == theirs["pick"] and untimed(mine["budget"]) == untimed(
                        theirs["budget"]
                    )  # its own PRM cost only
                assert f"beam/fused@{n} [{prm}]" in record["methods"] and f"beam/l2r-rerank@{n} [{prm}]" in text
    one = both[0]["methods"]  # pool of question one: answer 3, answer 4
    assert one["bon-max/fused@2 [l2r]"]["answer"] == "3" and one["bon-max/fused@2 [bi]"]["answer"] == "4"
    assert [m for m in one if m.startswith("noise:")] == [
        "noise:bon-max@2",
        "noise:bon-max@4",
        "noise:beam@2",
        "noise:beam@4",
    ]
    pool_tokens = sum(p["tokens"] for r in both for p in r["pool"])
    searches = sum(m["budget"]["policy_tokens"] for r in both for m in r["methods"].values() if "paths" in m)
    assert (
        sum(r["budget"]["policy_tokens"] for r in both) == pool_tokens + searches == policy.tokens
    )  # the pool generated once
    assert (Path(config.out) / "accuracy.png").stat().st_size > 0


def test_method_names_carry_the_prm_only_when_there_are_several():
    from biprm.search.report import family, method_name, noise_twin, parts

    assert (
        method_name("bon-max/fused", 4, "bi") == "bon-max/fused@4 [bi]"
        and method_name("bon-max/fused", 4) == "bon-max/fused@4"
    )
    assert parts("beam/l2r-rerank@16 [ckpt@5]") == ("beam/l2r-rerank", 16, "ckpt@5") and parts("majority@8") == (
        "majority",
        8,
        None,
    )
    assert family("beam/fused@4 [bi]") == "beam/fused [bi]" and noise_twin("beam/fused@4 [bi]") == "noise:beam@4"
    assert noise_twin("bon-vote/fused@4 [bi]") is None and noise_twin("noise:beam@4") is None


def test_prm_names_are_folder_names_and_duplicates_are_refused(tmp_path):
    assert SearchConfig(out="o", prm=["runs/l2r", "runs/bi/", "noise"]).prm_names == ["l2r", "bi", "noise"]
    with pytest.raises(ValueError, match="--prm runs/a/bi and runs/b/bi: both are named 'bi'"):
        SearchConfig(out="o", prm=["runs/a/bi", "runs/b/bi"])
    with pytest.raises(ValueError, match=r"--prm runs/x\]: its folder's name 'x\]' cannot name its rows"):
        SearchConfig(out="o", prm=["runs/x]"])


def test_the_two_prms_paired_difference_on_hand_computed_values():
    from biprm.search.report import difference_table, prm_differences

    def record(i):  # l2r right on questions 0-11, bi on 0-23; question 39: l2r unknown
        cost = {"budget": {}}
        return {
            "methods": {
                "bon-max/fused@4 [l2r]": {"correct": None if i == 39 else i < 12, **cost},
                "bon-max/fused@4 [bi]": {"correct": i < 24, **cost},
                "beam/fused@4 [bi]": {"correct": True, **cost},
                "majority@4": {"correct": False, **cost},
            }
        }

    rows = prm_differences([record(i) for i in range(40)])
    assert [(r["method"], r["difference"], r["questions"]) for r in rows] == [("bon-max/fused@4", "bi - l2r", 39)]
    assert (
        rows[0]["mean"] == pytest.approx(12 / 39)
        and 0 < rows[0]["low"] < 12 / 39 < rows[0]["high"]
        and not rows[0]["within_noise"]
    )
    assert (
        difference_table(rows).splitlines()[2]
        == f"| bon-max/fused@4 | +30.8 [{100 * rows[0]['low']:+.1f}, {100 * rows[0]['high']:+.1f}] | 39 |"
    )
    alone = [{"methods": {"bon-max/fused@4": {"correct": True, "budget": {}}}}]
    assert prm_differences(alone) == []


def test_an_old_single_prm_setting_resumes_and_a_changed_list_is_refused(config):
    config.algorithms, config.n, config.limit = ["bon"], [2], 2
    run_search(config, ScriptedPolicy(TREE), [ScriptedScorer(LOGITS)])
    saved = Path(config.out) / "settings.json"
    settings = json.loads(saved.read_text())
    saved.write_text(json.dumps({**settings, "prm": "noise"}))  # as written before --prm took several values
    config.limit = None
    with pytest.raises(ValueError, match="--limit was 2, now None"):  # the old file is still read and compared
        run_search(config, ScriptedPolicy(TREE), [ScriptedScorer(LOGITS)])
    config.limit = 2
    run_search(config, ScriptedPolicy(TREE), [ScriptedScorer(LOGITS)])
    assert json.loads(saved.read_text())["prm"] == ["noise"]
    config.prm = ["noise", "runs/bi"]
    with pytest.raises(ValueError, match=r"--prm was \['noise'\], now \['noise', 'runs/bi'\]"):
        run_search(config, ScriptedPolicy(TREE), [ScriptedScorer(LOGITS), ScriptedScorer(FLIPPED)])


@pytest.mark.slow
def test_two_checkpoints_from_the_command_line_each_pay_their_own_prm_tokens(config, tmp_path):
    import torch

    from biprm.backbones import load_tokenizer, resolve_backbone
    from biprm.modeling import from_backbone

    backbone = resolve_backbone("tiny")
    for mode in ("l2r", "bi"):
        tok = load_tokenizer(backbone)
        torch.manual_seed(0)
        from_backbone(backbone, tok, mode=mode).save_pretrained(tmp_path / mode)
        tok.save_pretrained(tmp_path / mode)
    config.algorithms, config.n, config.strategies, config.prm = (
        ["bon", "beam"],
        [2],
        ["fused"],
        [str(tmp_path / "l2r"), str(tmp_path / "bi")],
    )
    run_search(config, ScriptedPolicy(TREE))  # the scorers come from --prm's folders
    record = records(config)[1]
    assert (
        set(record["pool"][0]["prms"]["bi"]) == {"l2r", "r2l", "fused", "score", "n_dropped"}
        and "r2l" not in record["pool"][0]["prms"]["l2r"]
    )
    for method in ("bon-max/fused@2", "beam/fused@2"):
        l2r, bi = record["methods"][f"{method} [l2r]"]["budget"], record["methods"][f"{method} [bi]"]["budget"]
        assert l2r["prm_tokens_l2r"] > 0 and l2r.get("prm_tokens_r2l", 0) == 0 and bi["prm_tokens_r2l"] > 0


def test_the_command_line_takes_several_prms_and_refuses_a_shared_name_in_one_line(tmp_path, capsys, monkeypatch):
    from biprm import cli
    from biprm.search import run

    seen = []
    monkeypatch.setattr(run, "run_search", lambda cfg: seen.append(cfg.prm) or "")
    cli.main(["search", "--out", str(tmp_path), "--prm", "runs/l2r", "runs/bi"])
    assert seen == [["runs/l2r", "runs/bi"]]
    with pytest.raises(SystemExit):
        cli.main(["search", "--out", str(tmp_path), "--prm", "runs/a/bi", "runs/b/bi"])
    assert capsys.readouterr().err == (
        "biprm search: error: --prm runs/a/bi and runs/b/bi: both are named 'bi' in the results; "
        "give one checkpoint folder another name\n"
    )


def test_every_line_of_a_crowded_cost_plot_has_its_own_colour_and_marker():
    from biprm.analysis.plots import line_styles

    names = [f"m{i}" for i in range(45)] + ["noise:beam@4"]
    styles = line_styles(names)
    assert len({(s["color"], s["marker"]) for s in styles}) == len(names)
    assert [s["ls"] for s in styles[-2:]] == ["-", "--"]
    assert len({s["color"] for s in line_styles(["a", "b", "c"])}) == 3


def test_a_pool_larger_than_a_chunk_is_scored_in_chunks_and_picks_as_in_one_call(config, tmp_path, monkeypatch):
    config.algorithms, config.n = ["bon"], [2, 4]
    whole = run_alone(config, tmp_path, "runs/whole", LOGITS)
    monkeypatch.setattr(search_run, "POOL_CHUNK", 3)
    scorer = ScriptedScorer(LOGITS)
    config.out, config.prm = str(tmp_path / "chunked"), ["runs/chunked"]
    run_search(config, ScriptedPolicy(TREE), [scorer])
    assert [len(paths) for _, paths in scorer.seen] == [
        3,
        3,
        2,
        3,
        1,
    ]  # batch 1: two questions x 4 samples; batch 2: one x 4
    for mine, theirs in zip(records(config), whole):
        assert [p["fused"] for p in mine["pool"]] == [p["fused"] for p in theirs["pool"]]
        assert {m: r.get("pick") for m, r in mine["methods"].items()} == {
            m: r.get("pick") for m, r in theirs["methods"].items()
        }


def _garbage_prm(tmp_path) -> str:
    """A folder holding a config.json that names no model biprm reads."""
    (tmp_path / "garbage").mkdir()
    (tmp_path / "garbage" / "config.json").write_text('{"model_type": "bert", "architectures": ["BertModel"]}')
    return str(tmp_path / "garbage")


@pytest.mark.parametrize(
    "args, says",
    [
        (["--n", "0"], "--n 0: must be at least 1"),
        (["--n", "-4"], "--n -4: must be at least 1"),
        (["--width", "0"], "--width 0: must be at least 1"),
        (["--n", "3", "--width", "2"], "--n 3: beam search and DVTS need N to be a multiple of --width 2"),
        (["--data", "{tmp}/empty.jsonl"], "--data {tmp}/empty.jsonl: holds no question"),
        (
            ["--data", "{tmp}/no-question.jsonl"],
            "{tmp}/no-question.jsonl row 2: needs 'question' (or 'problem') and 'answer'",
        ),
        (["--data", "{tmp}/missing.jsonl"], "{tmp}/missing.jsonl: no such data file"),
        (["--prm", "noise", "{tmp}/no-such-prm"], "--prm {tmp}/no-such-prm: no such folder"),
        (["--prm", "{garbage}"], "--prm {garbage}: is a plain bert model (a backbone), not a biprm checkpoint"),
        (
            ["--policy", "server", "--policy-url", "localhost:8000"],
            "--policy-url 'localhost:8000': expected http://HOST:PORT",
        ),
    ],
)
def test_a_bad_search_input_is_one_line_before_anything_loads_and_leaves_out_as_it_was(
    args, says, tmp_path, capsys, monkeypatch
):
    from biprm import cli

    def never(*_):
        raise AssertionError("loaded a policy or a PRM before the inputs were checked")

    monkeypatch.setattr(search_run, "build_policy", never)
    monkeypatch.setattr(search_run, "build_scorer", never)
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "no-question.jsonl").write_text('{"question": "one", "answer": "3"}\n{"answer": "5"}\n')
    (tmp_path / "q.jsonl").write_text('{"question": "one", "answer": "3"}\n')
    out = tmp_path / "out"  # a finished run's folder, whose corrected rerun must still be taken
    out.mkdir()
    (out / "settings.json").write_text('{"n": [4]}')
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    names = {"tmp": str(tmp_path), "garbage": _garbage_prm(tmp_path)}
    with pytest.raises(SystemExit) as stop:
        cli.main(["search", "--out", str(out), "--data", str(tmp_path / "q.jsonl"), *[a.format(**names) for a in args]])
    err = capsys.readouterr().err
    assert (
        stop.value.code == 2 and err.count("\n") == 1 and err.startswith(f"biprm search: error: {says.format(**names)}")
    ), err
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before


def test_a_pool_drawn_whole_is_cut_by_the_chosen_segmenter_before_it_is_scored(tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "one", "answer": "3"}) + "\n")
    tree = {("one",): ["a = 1\nb = 2", "c = 9"], ("one", "a = 1\nb = 2"): ["answer 3"], ("one", "c = 9"): ["answer 4"]}
    logits = {"a = 1\nb = 2": -3.0, "a = 1": 1.0, "b = 2": 1.0, "c = 9": 0.0, "answer 3": 1.0, "answer 4": 0.5}
    base = SearchConfig(
        out="x",
        data=str(data),
        algorithms=["bon"],
        n=[2],
        strategies=["fused"],
        aggregation="min",
        pool_draw="whole",
        grade_workers=0,
    )
    runs = {}
    for segmenter in (None, "lines"):
        cfg = replace(base, out=str(tmp_path / str(segmenter)), segmenter=segmenter)
        scorer = ScriptedScorer(logits)
        run_search(cfg, ScriptedPolicy(tree), [scorer])
        runs[segmenter] = records(cfg)[0], scorer.seen
    (step_token, seen_token), (lines, seen_lines) = runs[None], runs["lines"]
    assert [p["steps"] for p in step_token["pool"]] == [["a = 1\nb = 2", "answer 3"], ["c = 9", "answer 4"]]  # as drawn
    assert [p["steps"] for p in lines["pool"]] == [
        ["a = 1", "b = 2", "answer 3"],
        ["c = 9", "answer 4"],
    ]  # cut by lines
    assert [tuple(p) for _, paths in seen_lines for p in paths] == [
        ("a = 1", "b = 2", "answer 3"),
        ("c = 9", "answer 4"),
    ]
    assert [tuple(p) for _, paths in seen_token for p in paths] == [("a = 1\nb = 2", "answer 3"), ("c = 9", "answer 4")]
    assert (
        [p["tokens"] for p in lines["pool"]] == [p["tokens"] for p in step_token["pool"]] == [19, 13]
    )  # the draw's cost, kept
    # min over steps: the step token's cut reads the first solution's
    # lines as one bad step (-3), the lines cut as two good ones
    assert (
        step_token["methods"]["bon-max/fused@2"]["answer"] == "4"
        and lines["methods"]["bon-max/fused@2"]["answer"] == "3"
    )


def test_every_answer_says_how_it_was_read_and_the_table_counts_the_fallback(config):
    run_search(config, ScriptedPolicy(TREE), [ScriptedScorer(LOGITS)])
    rows = records(config)
    assert {p["read"] for r in rows for p in r["pool"]} == {"fallback"}  # "answer 3": a last number, no marker
    assert (
        rows[0]["methods"]["bon-max/fused@2"]["read"] == "fallback"
        and rows[0]["methods"]["pass@2"]["read"] == "fallback"
    )
    assert all(p["read"] == "fallback" for p in rows[1]["methods"]["beam/fused@4"]["paths"])
    summary = json.loads((Path(config.out) / "summary.json").read_text())
    right = {r["method"]: r for r in summary["rows"]}
    assert (
        right["pass@4"]["right_by_fallback"] == 2 and right["beam/fused@4"]["right_by_fallback"] == 2
    )  # questions one and two


def test_the_table_names_the_pool_ceiling_and_counts_rows_right_by_the_fallback_only():
    from biprm.search.report import method_rows, table

    def record(i):
        cost = {"budget": {}}
        return {
            "methods": {
                "pass@4": {
                    "correct": True,
                    "read": "marked" if i else "fallback",
                    **cost,
                },  # a marked right sample counts as marked
                "beam/fused@4": {"correct": i < 3, "read": "fallback" if i < 2 else "marked", **cost},
                "random@4": {"correct": True, "solution": "so 7" if i else "The answer is 7.", **cost},
            }
        }  # written before

    rows = {
        r["method"]: r for r in method_rows([record(i) for i in range(4)])
    }  # answers said how they were read: read again
    assert rows["pass@4"]["right_by_fallback"] == 1 and rows["beam/fused@4"]["right_by_fallback"] == 2
    assert rows["random@4"]["right_by_fallback"] == 3
    lines = {line.split(" | ")[0]: line for line in table(list(rows.values())).splitlines()}
    assert lines["| pass@4 (pool ceiling)"].endswith("| 75.0 (1) |") and lines["| beam/fused@4"].endswith(
        "| 25.0 (2) |"
    )
    assert lines["| random@4"].endswith("| 25.0 (3) |")


def test_read_answer_says_marked_or_fallback():
    from biprm.evaluation.grading import read_answer

    assert read_answer("3 + 4 = 7\n\nThe answer is 7.") == ("7", "marked")
    assert read_answer("so it is \\boxed{7}") == ("7", "marked")
    assert read_answer("she has 3 + 4 = 7 apples") == (
        "7",
        "fallback",
    )  # GSM8K's last number: also what a cut-off path gives
    assert read_answer("no number at all") == (None, None)


@pytest.mark.parametrize("grade_cut", [False, True])
def test_a_path_cut_at_max_depth_has_no_answer_unless_asked(grade_cut, tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "q", "answer": "7"}) + "\n")
    cfg = SearchConfig(
        out=str(tmp_path / "out"),
        data=str(data),
        algorithms=["bon", "beam"],
        n=[2],
        width=2,
        max_depth=1,
        grade_cut_paths=grade_cut,
        grade_workers=0,
    )
    run_search(
        cfg,
        ScriptedPolicy({("q",): ["3 + 4 = 7"], ("q", "3 + 4 = 7"): ["answer 7"]}),
        [ScriptedScorer({"3 + 4 = 7": 0.0})],
    )
    record = records(cfg)[0]
    assert all(p["cut"] and p["finished"] for p in record["pool"])  # the policy never ended them: --max-depth 1 did
    expected = ("7", "fallback", True) if grade_cut else (None, "cut", False)
    for method in ("majority@2", "beam/fused@2"):
        m = record["methods"][method]
        assert (m["answer"], m["read"], m["correct"]) == expected
