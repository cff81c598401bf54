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
TRAINED = "pass a folder written by `biprm train` (its --output-dir)"


class NotACheckpoint(OSError):
    """A path that is not a biprm checkpoint; the message says what it is and what to pass instead.

    An OSError, as transformers raises for a model it cannot find, so callers that catch that catch this."""


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


def looks_local(path: str) -> bool:
    """A path the user meant on this machine: absolute, relative (./, ../, ~), or inside an existing folder.

    Only what is left ("owner/name" with no local parent) may be a Hugging Face Hub model id."""
    parent = Path(path).expanduser().parent
    return path.startswith(("/", ".", "~")) or path.count("/") > 1 or (parent != Path(".") and parent.is_dir())


def check_checkpoint(path: str, prm_kind: str | None = None) -> None:
    """Raise NotACheckpoint, in one line, unless `path` is a biprm checkpoint folder, a PRM of a kind biprm reads
    (named by `prm_kind` where its config cannot say, as for a plain causal LM), or may be a Hub model id.

    Run before anything loads, so a wrong folder is named at once instead of by a long transformers error,
    and a missing local path is never retried on the Hub."""
    folder = Path(path).expanduser()
    if prm_kind is not None and (folder / "config.json").is_file() and _known_prm(folder, prm_kind):
        return
    problem = _what_is(folder) if folder.exists() or looks_local(path) else None
    if problem:
        raise NotACheckpoint(f"{path}: {problem}")


def _what_is(folder: Path) -> str | None:
    """None for a biprm checkpoint, else what `folder` holds and what to pass instead."""
    if not folder.exists():
        return f"no such folder; {TRAINED}"
    if not folder.is_dir():
        return f"is a file, not a checkpoint folder; {TRAINED}"
    config = folder / "config.json"
    if config.is_file():
        return _what_config(config)
    from biprm.run_folder import RECORD, latest_complete

    found = latest_complete(folder)
    if (folder / RECORD).is_file() or found:
        instead = f"pass its checkpoint {found}, or " if found else ""
        return f"holds a training run with no final model yet; {instead}finish it with `biprm train ... --resume`"
    if (folder / "trainer_state.json").is_file():
        return (
            "is a Trainer checkpoint without the model (no config.json); pass the run's folder or a checkpoint-N "
            "holding config.json and weights"
        )
    return f"holds no model (no config.json); {TRAINED}"


def _what_config(config: Path) -> str | None:
    """None for a biprm config beside its weights, else what the folder is."""
    try:
        values = json.loads(config.read_text())
    except ValueError as error:
        return (
            f"config.json is not valid JSON ({error}); the save was cut short: train again or pass another checkpoint"
        )
    kind = values.get("model_type") if isinstance(values, dict) else None
    if kind != "biprm" and _known_prm(config.parent):
        return None
    if kind != "biprm":
        causal = any(str(a).endswith("ForCausalLM") for a in values.get("architectures") or ())
        causal_prm = (
            "; if it is a PRM read from its LM head (math-shepherd, rlhflow, eurus-prm), name the kind with --prm-kind"
            if causal
            else ""
        )
        return (
            f"is a plain {kind or 'unknown'} model (a backbone), not a biprm checkpoint; train a PRM on it with "
            f"`biprm train --backbone {config.parent}`, then {TRAINED}{causal_prm}"
        )
    if not any(config.parent.glob("*.safetensors")) and not any(config.parent.glob("*.bin")):
        return (
            "has a biprm config.json but no weights (*.safetensors); the save was cut short: train again or pass "
            "another checkpoint"
        )
    return None


def _known_prm(folder: Path, kind: str | None = None) -> bool:
    """A PRM of a kind biprm reads (biprm.prms), weights included. A `kind` the folder does not fit is refused in one
    line; without one, a folder of no known kind is simply not a PRM."""
    from biprm.prms import UnknownPRM, detect, weight_files

    try:
        detect(folder, kind)
    except UnknownPRM as error:
        if kind is None:
            return False
        raise NotACheckpoint(str(error)) from None
    return bool(weight_files(folder))


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
