"""A finished checkpoint folder: weights plus what a reader needs to trust and use them.

The config records the biprm version and the prompt and step layout the model was
trained with (`Scorer.from_pretrained` warns when they differ from this biprm's), a
model card says what trained it and how to load it, and every file is readable by the
group and others (safetensors writes weights owner-only, which breaks shared caches).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from biprm.data.template import TEMPLATES

log = logging.getLogger(__name__)


def layout(kind: str = "biprm") -> dict[str, str]:
    """A PRM kind's text layout, as a checkpoint records it."""
    prompt, steps = TEMPLATES[kind].render("{question}", ["{step}", "{step}"])
    return {"prompt": prompt, "step": steps[0]} | ({"later step": steps[1]} if steps[1] != steps[0] else {})


LAYOUT = layout()


def stamp(config) -> None:
    """Record the version and the text layout on a model config before it is saved."""
    from biprm import __version__

    config.biprm_version = __version__
    config.text_layout = layout(getattr(config, "prm_kind", "biprm"))


def check_layout(config, path: str) -> None:
    """Warn when a checkpoint was trained with another text layout than the one this biprm encodes with."""
    trained, now = getattr(config, "text_layout", None), layout(getattr(config, "prm_kind", "biprm"))
    if trained is not None and trained != now:
        log.warning(
            "%s was trained with the text layout %s (biprm %s), but this biprm encodes %s: its scores may be off",
            path,
            trained,
            getattr(config, "biprm_version", "?"),
            now,
        )


def share(folder: str | Path) -> None:
    """Make every file of `folder` readable as the umask allows (group/others), not owner-only."""
    mask = os.umask(0)
    os.umask(mask)
    for p in Path(folder).rglob("*"):
        if p.is_file():
            p.chmod(0o666 & ~mask)


def write_model_card(folder: str | Path, train_config: dict, log_history: list[dict]) -> None:
    losses = [e["loss"] for e in log_history if "loss" in e]
    evals = [e["eval_loss"] for e in log_history if "eval_loss" in e]
    steps = max((e.get("step", 0) for e in log_history), default=0)
    lines = [
        "---",
        "library_name: biprm",
        f"base_model: {train_config['backbone']}",
        "tags:",
        "- process-reward-model",
        "- biprm",
        "---",
        "",
        f"# {train_config['mode']} process reward model",
        "",
        f"A `{train_config['mode']}` PRM ({train_config['objective']} objective) trained with biprm on "
        f"`{train_config['data']}` for {steps} optimizer steps from `{train_config['backbone']}`.",
        f"Last logged training loss: {losses[-1]:.4f}." if losses else "",
        f"Last validation loss: {evals[-1]:.4f}." if evals else "",
        "",
        "## Use",
        "",
        "```python",
        "from biprm import Scorer, Trajectory",
        "",
        'scorer = Scorer.from_pretrained("path/to/this/folder")',
        'encodings, _ = scorer.encode([Trajectory("What is 2 + 3 * 4?", ["3 * 4 = 12.", "2 + 12 = 14.", "The answer is '
        '14."])])',
        "scores = scorer.score(encodings)",
        'scores.of(0, "fused"), scores.solution_scores("min")',
        "```",
        "",
        "`biprm serve --model path/to/this/folder` serves it over HTTP. With transformers alone, `import "
        "biprm.modeling` first (it registers the architecture), then `AutoModel.from_pretrained(path)`.",
        "",
        "## Text layout",
        "",
        "```",
        LAYOUT["prompt"],
        LAYOUT["step"],
        "```",
        "",
        "## Training configuration",
        "",
        "```json",
        json.dumps(train_config, indent=2),
        "```",
        "",
    ]
    Path(folder, "README.md").write_text("\n".join(lines))
