"""The code blocks of a page under docs/, as the doc tests run them: verbatim. A block that cannot run in a test (a GPU,
a server, hours) carries `<!-- not run: REASON -->` on the line before it; ```text blocks show output and are not
code."""

import contextlib
import io
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted(ROOT.glob("studies/*/README.md"))]
SHELL = ("bash", "sh", "")
FENCE = re.compile(r"(?:<!-- not run: (?P<why>[^>]+?) -->\n)?```(?P<lang>\w*)\n(?P<code>.*?)```", re.S)
CODE = ("python", "bash")


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    not_run: str | None


def fenced(text: str) -> list[Block]:
    """Every fenced block of a page's `text`, in any language."""
    return [Block(m["lang"], m["code"], m["why"]) for m in FENCE.finditer(text)]


def blocks(page: str) -> list[Block]:
    """Every fenced block of docs/`page` but output; an unknown language fails, so no block is left out unseen."""
    found = fenced((DOCS / page).read_text())
    assert {b.lang for b in found} <= {*CODE, "text"}, f"{page}: a block in a language the doc tests do not run"
    return [b for b in found if b.lang in CODE]


def runnable(page: str) -> list[Block]:
    return [b for b in blocks(page) if b.not_run is None]


def skipped(page: str):
    """A test that skips each block of docs/`page` marked not run, giving the mark's reason."""

    @pytest.mark.parametrize("block", [b for b in blocks(page) if b.not_run], ids=lambda b: b.code.split("\n")[0][:40])
    def test(block: Block) -> None:
        pytest.skip(block.not_run)

    return test


def commands(code: str) -> Iterator[tuple[str, list[str]]]:
    """(program, argv) of every command a shell block runs with biprm, `python -m biprm.cli`, `python -m studies.X` or
    `python -m benchmarks`: lines joined across a trailing backslash, comments cut, `a && b | c` split, $VAR read as 1.
    A line that is not shell (unclosed quotes) raises ValueError."""
    for line in code.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(re.sub(r"\$\w+", "1", line), posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
        for i, word in enumerate(words):
            module = words[i + 1] if word == "-m" and i + 1 < len(words) else ""
            if word == "biprm" or module == "biprm.cli" or re.fullmatch(r"studies\.\w+|benchmarks", module):
                rest = words[i + (1 if word == "biprm" else 2) :]
                end = next((j for j, w in enumerate(rest) if set(w) <= set("();<>|&")), len(rest))
                yield "biprm" if module in ("", "biprm.cli") else module, rest[:end]


def parser_of(program: str):
    """The argparse parser `program` reads its flags with; None for a module that has no settings dataclass."""
    import importlib
    import typing

    from biprm.cli import build_parser, program_parser

    if program == "biprm":
        return build_parser()
    try:
        main = importlib.import_module(f"{program}.__main__").main
    except ModuleNotFoundError as missing:
        if missing.name != f"{program}.__main__":
            raise
        return None
    return program_parser(typing.get_type_hints(main)["cfg"], main, f"python -m {program}")


def stale(text: str, where: str, parsers: dict) -> list[str]:
    """What the shell blocks of a page's `text` name that does not exist: a sub-command, a flag, or a command line
    that does not parse (one skipped where it reads a --config file or elides with ...). `parsers` caches
    `parser_of`."""
    from biprm.cli import _chosen

    found = []
    for block in (b for b in fenced(text) if b.lang in SHELL):
        try:
            found_here = list(commands(block.code))
        except ValueError as error:
            found.append(f"{where}: a shell block that does not read as shell ({error}): {block.code[:60]!r}")
            continue
        for program, argv in found_here:
            parser = parsers.setdefault(program, parser_of(program))
            if parser is None or argv[:1] in (["--help"], ["--version"], ["-h"]):
                continue
            name, chosen = _chosen(parser, argv)
            words = [w for w in argv if not w.startswith("-")]
            if program == "biprm" and (not name or chosen._subparsers is not None):
                found.append(f"{where}: `{program} {' '.join(argv[:3])}`: no such sub-command")
                continue
            flags = [w.split("=")[0].strip("[]") for w in argv if w.startswith("--")]
            unknown = [
                f"{where}: `{program} {name}".rstrip() + f"`: no flag {f}"
                for f in flags
                if f not in chosen._option_string_actions
            ]
            found += unknown
            if unknown or "--config" in argv or any("..." in w or "…" in w for w in argv) or not words:
                continue
            try:
                with contextlib.redirect_stderr(io.StringIO()):  # argparse's own line; the problem says it
                    parser.parse_args([w.strip("[]") for w in argv])  # a synopsis writes optional flags in brackets
            except SystemExit:
                found.append(f"{where}: `{program} {' '.join(argv)}` does not parse")
    return found
