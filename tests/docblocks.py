"""The code blocks of a page under docs/, as the doc tests run them: verbatim. A block that cannot run in a test (a GPU,
a server, hours) carries `<!-- not run: REASON -->` on the line before it; ```text blocks show output and are not
code."""

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
FENCE = re.compile(r"(?:<!-- not run: (?P<why>[^>]+?) -->\n)?```(?P<lang>\w*)\n(?P<code>.*?)```", re.S)
CODE = ("python", "bash")


@dataclass(frozen=True)
class Block:
    lang: str
    code: str
    not_run: str | None


def blocks(page: str) -> list[Block]:
    """Every fenced block of docs/`page` but output; an unknown language fails, so no block is left out unseen."""
    found = [Block(m["lang"], m["code"], m["why"]) for m in FENCE.finditer((DOCS / page).read_text())]
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
