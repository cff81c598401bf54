"""Every command's settings checked as parsed, before a recipe runs: numeric ranges, both list forms, choices in any
case."""

import dataclasses
import re
import typing

import pytest

from biprm import cli
from biprm.config import BOUNDS, check_ranges
from biprm.evaluation import cli as evaluation

UNBOUNDED = {"gate_init"}  # train --gate-init: the gate starts at sigmoid(this), and any real is a gate


def commands() -> list[tuple[tuple[str, ...], type]]:
    """Every command's words and its settings dataclass."""
    return [((name,), settings) for name, (settings, _, _) in cli.COMMANDS.items()] + [
        (("eval", name), settings) for name, (settings, _, _) in evaluation.COMMANDS.items()
    ]


def numeric(settings: type) -> list[dataclasses.Field]:
    """Fields holding a number, or a list of numbers, or none (a mapping, given as YAML, is its recipe's to check)."""
    hints = typing.get_type_hints(settings)
    kinds = lambda t: {t, typing.get_origin(t)} | {k for a in typing.get_args(t) for k in kinds(a)}  # noqa: E731
    return [
        f
        for f in dataclasses.fields(settings)
        if {int, float} & kinds(hints[f.name]) and not {bool, dict} & kinds(hints[f.name])
    ]


CASES = [(words, settings, f) for words, settings in commands() for f in numeric(settings)]


@pytest.fixture
def no_recipe(monkeypatch):
    """Every command's recipe replaced by one that fails the test: a refusal must come before it."""

    def ran(cfg):
        raise AssertionError(f"the recipe ran with {cfg}")

    for table in (cli.COMMANDS, evaluation.COMMANDS):
        for name, (settings, _, text) in list(table.items()):
            monkeypatch.setitem(table, name, (settings, ran, text))


def out_of_range(f: dataclasses.Field, value: float) -> bool:
    return not all(BOUNDS[k][1](value, f.metadata[k]) for k in BOUNDS if k in f.metadata)


@pytest.mark.parametrize("words, settings, f", CASES, ids=[f"{' '.join(w)} --{f.name}" for w, _, f in CASES])
def test_every_numeric_setting_is_range_checked_before_anything_runs(words, settings, f, no_recipe, capsys):
    assert f.name in UNBOUNDED or set(BOUNDS) & set(f.metadata), (
        f"{' '.join(words)} --{f.name} declares no range (biprm.config.arg's min/max)"
    )
    flag = f"--{f.name.replace('_', '-')}"
    parser = cli._chosen(cli.build_parser(), list(words))[1]
    required = [w for a in parser._actions if a.required for w in (a.option_strings[0], "x")]
    big = f.metadata.get("max", f.metadata.get("below", 10**9)) * 10 + 1
    for value in (0, -1, -(10**9), big):
        if not out_of_range(f, value):
            check_ranges(settings, {f.name: value})  # in range: passes
            continue
        with pytest.raises(SystemExit) as stop:
            cli.main([*words, *required, flag, str(value)])
        err = capsys.readouterr().err
        assert stop.value.code == 2 and err.count("\n") == 1, err
        assert err.startswith(f"biprm {' '.join(words)}: error: {flag}") and "must be" in err, err


def studies() -> list[tuple[str, type]]:
    """Each study's program and its settings: parsed like a command (biprm.cli.run_program)."""
    from studies.mechanism.config import MechanismConfig
    from studies.replication.config import ReplicateConfig
    from studies.rl.config import RLStudyConfig

    return [("mechanism", MechanismConfig), ("replication", ReplicateConfig), ("rl", RLStudyConfig)]


STUDY_CASES = [(study, settings, f) for study, settings in studies() for f in numeric(settings)]


@pytest.mark.parametrize("study, settings, f", STUDY_CASES, ids=[f"{s} --{f.name}" for s, _, f in STUDY_CASES])
def test_every_numeric_setting_of_a_study_is_range_checked_too(study, settings, f, capsys):
    def ran(cfg):
        raise AssertionError(f"the recipe ran with {cfg}")

    assert set(BOUNDS) & set(f.metadata), f"studies.{study} --{f.name} declares no range (biprm.config.arg's min/max)"
    prog, flag = f"python -m studies.{study}", f"--{f.name.replace('_', '-')}"
    for value in (0, -1, f.metadata.get("max", f.metadata.get("below", 10**9)) * 10 + 1):
        if out_of_range(f, value):
            with pytest.raises(SystemExit) as stop:
                cli.run_program(settings, ran, prog, [flag, str(value)])
            err = capsys.readouterr().err
            assert stop.value.code == 2 and err.startswith(f"{prog}: error: {flag}") and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "argv, says",
    [
        (
            ["score", "--model", "m", "--input", "i", "--chunk", "0"],
            "biprm score: error: --chunk 0: must be at least 1\n",
        ),
        (
            ["serve", "--model", "m", "--port", "99999"],
            "biprm serve: error: --port 99999: must be at least 1 and at most 65535\n",
        ),
        (["eval", "bon", "--limit", "-3"], "biprm eval bon: error: --limit -3: must be at least 1\n"),
        (["train", "--lr", "-1"], "biprm train: error: --learning-rate (--lr) -1.0: must be above 0\n"),
        (
            ["train", "--batch-size", "0"],
            "biprm train: error: --per-device-train-batch-size (--batch-size, --batch_size) 0: must be at least 1\n",
        ),
        (
            ["demo", "--mix", "0.5", "0.5", "0.5"],
            "biprm demo: error: --mix 0.5 0.5 0.5: give three shares (correct, calculation error, "
            "claim error) that sum to 1, not 1.5\n",
        ),
        (
            ["demo", "--events", "3", "2"],
            "biprm demo: error: --events 3 2: give two numbers, the least events per problem, then the most\n",
        ),
    ],
)
def test_the_issues_numbers_are_refused_in_one_line_naming_the_flag(argv, says, no_recipe, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2 and capsys.readouterr().err == says


@pytest.fixture
def parsed(monkeypatch):
    """The settings each command would run with, by command: the recipes record instead of running."""
    seen = {}
    for table in (cli.COMMANDS, evaluation.COMMANDS):
        for name, (settings, _, text) in list(table.items()):
            monkeypatch.setitem(table, name, (settings, lambda cfg, name=name: seen.__setitem__(name, cfg), text))
    return seen


@pytest.mark.parametrize(
    "argv, field, expected",
    [
        (["search", "--out", "o", "--n", "4", "8"], "n", [4, 8]),
        (["search", "--out", "o", "--n", "4,8"], "n", [4, 8]),
        (["search", "--out", "o", "--n=4,8", "-v"], "n", [4, 8]),
        (
            ["search", "--out", "o", "--prm", "noise,noise2", "--algorithms", "bon", "beam,dvts"],
            "algorithms",
            ["bon", "beam", "dvts"],
        ),
        (["demo", "--modes", "l2r,bi"], "modes", "l2r,bi"),
        (["demo", "--modes", "l2r", "bi"], "modes", "l2r,bi"),
        (["demo", "--mix", "0.5,0.25,0.25", "--events", "1", "4"], "mix", [0.5, 0.25, 0.25]),
        (["train", "--lora-targets", "q_proj", "v_proj", "--max-steps", "-1"], "lora_targets", "q_proj,v_proj"),
        (["train", "--mode", "BI"], "mode", "bi"),
        (
            ["search", "--out", "o", "--algorithms", "BEAM", "Bon", "--policy", "Synthetic", "--data", "synthetic"],
            "algorithms",
            ["beam", "bon"],
        ),
    ],
)
def test_every_list_flag_takes_both_forms_and_every_choice_any_case(argv, field, expected, parsed):
    cli.main(argv)
    assert getattr(parsed[argv[0]], field) == expected


@pytest.mark.parametrize(
    "argv, says",
    [
        (
            ["train", "--mode", "bx"],
            "biprm train: error: argument --mode: invalid choice: 'bx' (choose from 'l2r', 'r2l', 'bi-static', 'bi') "
            "(see biprm train --help)\n",
        ),
        (
            ["search", "--out", "o", "--n", "4;8"],
            "biprm search: error: argument --n: invalid int value: '4;8' (see biprm search --help)\n",
        ),
        (["search"], "biprm search: error: the following arguments are required: --out (see biprm search --help)\n"),
        (
            ["eval", "bon", "--nss", "4"],
            "biprm eval bon: error: unrecognized argument --nss; did you mean --ns? (see biprm eval bon --help)\n",
        ),
        (
            ["score", "--modle", "runs/bi", "--input", "x.jsonl"],
            "biprm score: error: unrecognized argument --modle; did you mean --model? (see biprm score --help)\n",
        ),
        (
            ["score", "--mod", "runs/bi", "--input", "x.jsonl"],
            "biprm score: error: unrecognized argument --mod; did you mean --model? (see biprm score --help)\n",
        ),
        (["demo", "--zzz"], "biprm demo: error: unrecognized argument --zzz (see biprm demo --help)\n"),
        (
            ["eval", "bonn", "--model", "x"],
            "biprm eval: error: argument eval_command: invalid choice: 'bonn' (choose from 'bon', 'processbench', "
            "'ablations', 'all'); did you mean bon? (see biprm eval --help)\n",
        ),
    ],
)
def test_a_bad_flag_is_one_line_without_the_usage(argv, says, parsed, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    assert stop.value.code == 2 and capsys.readouterr().err == says and not parsed


def test_required_flags_say_so_in_the_help():
    helps = {
        p.prog: " ".join(p.format_help().split())
        for p in cli._subparsers(cli.build_parser())
        if "settings" in p._defaults
    }
    assert (
        "(one line per question, appended; rerun to resume), summary.md, accuracy.png (required)"
        in helps["biprm search"]
    )
    assert (
        "checkpoint folder written by `biprm train`, or a PRM trained elsewhere (docs/PRMS.md) (required)"
        in helps["biprm score"]
    )
    assert all(
        text.count("(required)") == sum(a.required for a in p._actions)
        for p in cli._subparsers(cli.build_parser())
        if "settings" in p._defaults
        for text in [" ".join(p.format_help().split())]
    )


@pytest.mark.parametrize(
    "text, field, expected", [("n: 4,8\n", "n", [4, 8]), ("modes: [l2r, bi]\n", "modes", "l2r,bi")]
)
def test_a_settings_file_takes_both_list_forms_too(text, field, expected, parsed, tmp_path):
    (tmp_path / "run.yaml").write_text(text)
    command = "search" if field == "n" else "demo"
    cli.main([command, "--config", str(tmp_path / "run.yaml"), *(["--out", "o"] if command == "search" else [])])
    assert getattr(parsed[command], field) == expected


def sections(text: str) -> dict[str, str]:
    """A --help page's sections, title -> body, in order."""
    return {title: body for title, body in re.findall(r"\n\n(\w+):\n(.*?)(?=\n\n\w+:\n|\Z)", text, re.S)}


def test_train_help_reads_in_sections():
    found = sections(cli._chosen(cli.build_parser(), ["train"])[1].format_help())
    assert list(found) == ["model", "data", "output", "optimisation", "compute", "options"]
    assert "--lr" in found["optimisation"] and "--resume" in found["output"] and "--data " in found["data"]
    assert (
        "--no-share-prefix" in found["compute"] and "--share-prefix" in found["compute"]
    )  # a flag and its negation stay together


def test_every_command_help_reads_in_sections_as_train_does():
    """Required flags first, then model, data, output, the command's own, compute; only --help, --config and -v left
    under options; usage in the docs' spelling (--max-length, never --max_length)."""
    commands = [p for p in cli._subparsers(cli.build_parser()) if "settings" in p._defaults]
    assert len(commands) == 11
    for parser in commands:
        text = parser.format_help()
        found = sections(text)
        titles = [t for t in ("required", "model", "data", "output") if t in found]
        last = ["compute", "options"] if "compute" in found else ["options"]
        assert list(found)[: len(titles)] == titles and list(found)[-len(last) :] == last, parser.prog
        assert re.findall(r"--[\w-]+", found["options"]) == ["--help", "--config", "--verbose"], parser.prog
        assert all("(required)" in " ".join(found.get("required", "").split()) for a in parser._actions if a.required)
        usage = text[: text.index("\n\n")]
        assert not re.search(r"--\w+_\w", usage), usage
        required = [a.option_strings[0] for a in parser._actions if a.required]
        assert re.findall(r"--[\w-]+", usage)[: len(required)] == required, usage


def test_underscore_spelling_still_parses_and_is_shown_once():
    parsed = cli.build_parser().parse_args(["score", "--model", "m", "--input", "i", "--max_length", "64"])
    assert parsed.max_length == 64
    text = cli._chosen(cli.build_parser(), ["score"])[1].format_help()
    assert "--max-length MAX_LENGTH\n" in text and "--max_length" not in text


def test_eval_bon_takes_its_pool_as_data_as_the_other_eval_commands_do(parsed):
    cli.main(["eval", "bon", "--data", "pools.jsonl"])
    assert parsed["bon"].pool == "pools.jsonl"
