"""What a model folder is, worked out once per model before any weights load.

Every command that takes a model (score, eval, serve on either engine, export, search, `train --init-from`, the
integrations) resolves it here once, then reads the answer, a `ModelFolder`: its kind, how it is read, its template
and tag, its window, its tokenizer and, for an implicit PRM, its reference LM. This is the only module that reads a
model folder's config.json or works out its kind, so every fact about a folder is decided where all of them meet:
that is what lets a kind that does not fit its tokenizer be named before a single weight is read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

from biprm.config import ZERO_SHOT_MODES
from biprm.data.template import TEMPLATES, Template
from biprm.prms import CAUSAL_HINTS, KINDS, Kind, UnknownPRM, weight_files
from biprm.vllm_plugin import ARCHITECTURE as EXPORT  # what `biprm export` writes

TRAINED = "pass a folder written by `biprm train` (its --output-dir)"


class NotACheckpoint(OSError):
    """A path that is not a model biprm reads; the message says what it is and what to pass instead.

    An OSError, as transformers raises for a model it cannot find, so callers that catch that catch this."""


@dataclass(frozen=True)
class ModelFolder:
    """A resolved model: `kind` is "biprm" (a biprm checkpoint, or a Hub id left to transformers), "export" (a vLLM
    export of one) or a key of `biprm.prms.KINDS` (a PRM trained elsewhere); `mode` is how it is read (a biprm
    checkpoint's trained mode; l2r, r2l or bi-static for a PRM trained elsewhere)."""

    path: str
    kind: str
    mode: str | None
    config: dict = field(default_factory=dict, repr=False)
    reference: str | None = None  # an implicit PRM's reference LM

    @property
    def spec(self) -> Kind | None:
        return KINDS.get(self.kind)

    @property
    def trained_elsewhere(self) -> bool:
        """A PRM biprm did not train (one trained `--init-from` such a PRM is biprm's own)."""
        return self.kind in KINDS

    @property
    def implicit(self) -> bool:
        return self.spec is not None and self.spec.implicit

    @property
    def local(self) -> bool:
        return bool(self.config)

    @property
    def trained(self) -> dict:
        """What biprm recorded of the model's training (mode, prm_kind, ...): a checkpoint's config, an export's
        "biprm" section."""
        return self.config.get("biprm", {}) if self.kind == "export" else self.config

    @property
    def template(self) -> Template:
        """The text layout the model reads: a PRM kind's own, or the one a biprm checkpoint was trained in."""
        return TEMPLATES[self.kind if self.trained_elsewhere else self.trained.get("prm_kind") or "biprm"]

    @property
    def window(self) -> int | None:
        """The positions a PRM trained elsewhere was built for (its config's max_position_embeddings)."""
        return self.config.get("max_position_embeddings") if self.trained_elsewhere else None

    @property
    def segmenter(self) -> str:
        """What cuts a one-string trace for this model: what a biprm checkpoint records, else "given"."""
        return self.config.get("segmenter", "given") if self.kind == "biprm" else "given"

    def body_config(self):
        """The body's config as transformers builds it for the folder's model_type (never its remote code)."""
        return body_config(self.path)

    def check_reference(self) -> None:
        """An implicit PRM needs the folder of a reference LM of the same vocabulary; refused in one line without."""
        if not self.implicit:
            return
        if self.reference is None:
            raise UnknownPRM(
                f"{self.path}: a {self.kind} PRM scores each step against a reference LM; pass --prm-reference FOLDER "
                "(EurusPRM's cards use Qwen2.5-Math-7B-Instruct)"
            )
        if not (Path(self.reference) / "config.json").is_file():
            raise UnknownPRM(f"--prm-reference {self.reference}: no config.json there; pass the reference LM's folder")
        sizes = [_config(Path(p), strict=False).get("vocab_size") for p in (self.path, self.reference)]
        if sizes[0] != sizes[1]:
            raise UnknownPRM(
                f"--prm-reference {self.reference}: a vocabulary of {sizes[1]} tokens, where {self.path} has "
                f"{sizes[0]}: the log-ratio needs both to read the same tokens"
            )

    def reading(self, mode: str | None) -> ModelFolder:
        """This folder read in `mode` (see `reading_mode`)."""
        return replace(self, mode=reading_mode(self, mode))

    @cached_property
    def tokenizer(self):
        """The folder's tokenizer (with a pad token), checked against the kind's read-out: a PRM kind whose tags,
        read-out tokens or chat tokens the tokenizer lacks is refused here, in one line, before any weight loads."""
        tokenizer = tokenizer_from(self.path)
        if self.trained_elsewhere:
            check_fits(self.kind, tokenizer, self.path)
        return tokenizer


def resolve(
    path: str | Path, prm_kind: str | None = None, prm_mode: str | None = None, prm_reference: str | None = None
) -> ModelFolder:
    """What `path` is, in one line's error where it is nothing biprm reads: a biprm checkpoint (in its trained mode),
    its vLLM export, a PRM trained elsewhere (of the kind detected, or named by `prm_kind`, read in `prm_mode`; an
    implicit one against `prm_reference`), or a name left to the Hub. Reads config.json once; no weights load."""
    path = str(path)
    folder = Path(path).expanduser()
    if not folder.is_dir():
        if folder.exists() or looks_local(path):
            raise NotACheckpoint(f"{path}: {_what_is(folder)}")
        return ModelFolder(path, "biprm", prm_mode)  # a Hub id: transformers fetches it
    config = _config(folder)
    if config.get("architectures") == [EXPORT]:
        kind = "export"
    else:
        try:
            kind = _kind(folder, config, prm_kind)
        except UnknownPRM as error:
            if prm_kind is not None:
                raise NotACheckpoint(str(error)) from None
            raise NotACheckpoint(f"{path}: {_what_config(folder, config)}") from None
        if kind != "biprm" and not weight_files(folder):
            raise NotACheckpoint(f"{path}: a {kind} PRM's config.json, but no weights (*.safetensors or *.bin)")
        if kind == "biprm" and not weight_files(folder):
            raise NotACheckpoint(
                f"{path}: has a biprm config.json but no weights (*.safetensors); the save was cut short: train again "
                "or pass another checkpoint"
            )
    resolved = ModelFolder(path, kind, None, config, prm_reference)
    resolved = replace(resolved, mode=reading_mode(resolved, prm_mode))
    if resolved.implicit and prm_reference is not None:
        resolved.check_reference()
    return resolved


def detect(folder: str | Path, kind: str | None = None) -> str:
    """The kind of PRM `folder` holds: "biprm", a key of KINDS, or `kind` when given (checked against the folder)."""
    return _kind(Path(folder), _config(Path(folder), strict=False), kind)


def body_config(folder: str | Path):
    """The config transformers builds for the folder's model_type, from its config.json: its remote code (auto_map)
    and the architecture names that would pick it are left out."""
    from transformers import AutoConfig

    raw = _config(Path(folder), strict=False)
    return AutoConfig.for_model(
        **{k: v for k, v in raw.items() if k not in ("architectures", "auto_map", "model_type")},
        model_type=raw["model_type"],
    )


def reading_mode(folder: ModelFolder, mode: str | None) -> str | None:
    """The mode `folder` is read in without training. A biprm checkpoint or its export keeps the one it was trained in
    (asking for another is an error). A PRM of another kind is read as shipped (l2r, the default), reversed (r2l) or
    both averaged (bi-static); a gate mode would run an untrained gate."""
    if not folder.trained_elsewhere:
        trained = folder.trained.get("mode")
        if mode not in (None, trained) and folder.local:
            what = "an export" if folder.kind == "export" else "a biprm checkpoint trained"
            raise ValueError(f"--prm-mode {mode}: {folder.path} is {what} in mode {trained}, which it keeps")
        return trained if folder.local else mode
    if mode not in (None, *ZERO_SHOT_MODES):
        train = (
            "and as an implicit PRM it has no head to train one on"
            if folder.implicit
            else f"`biprm train --init-from {folder.path} --mode {mode}` trains one"
        )
        raise ValueError(
            f"--prm-mode {mode}: a {folder.kind} PRM is read as l2r, r2l or bi-static (it has no trained gate; {train})"
        )
    return mode or "l2r"


def check_fits(kind: str, tokenizer, path: str) -> None:
    """A PRM kind read from a tokenizer that lacks what its card reads is refused, naming the kind and what is
    missing: the tokens its chat template is made of, its step tag, and the "+"/"-" its read-out compares, each one
    token, as the card's code takes them."""
    spec, template = KINDS[kind], TEMPLATES[kind]
    vocab = tokenizer.get_vocab()
    missing = [t for t in template.specials if t not in vocab]
    if missing:
        raise UnknownPRM(f"{path}: not a {kind} tokenizer: it lacks {', '.join(missing)}, which its template writes")
    if template.unique_tag:  # the card finds the tag's id alone (encode("ки")[-1]) and reads it after a step's text
        alone = tokenizer.encode(template.tag.strip(), add_special_tokens=False)
        in_text = tokenizer.encode("1" + template.tag, add_special_tokens=False)
        if not alone or in_text[-1] != alone[-1]:
            raise UnknownPRM(
                f"{path}: not a {kind} tokenizer: its step tag {template.tag!r} after a step's text is not the token "
                f"{alone[-1:]} it is alone"
            )
    if spec.plus_minus is not None:
        spec.plus_minus(tokenizer)


def recorded(path: str | Path, key: str, default=None):
    """What a folder's config.json records under `key`; `default` where it records nothing or `path` holds no
    config (a built-in name), checked no further: for facts settled before the model is resolved (what cuts a trace,
    whether a tokenizer's folder is biprm's)."""
    config = Path(path) / "config.json"
    return json.loads(config.read_text()).get(key, default) if config.is_file() else default


def tokenizer_from(folder: str):
    """A folder's tokenizer with a pad token: batching needs one, and decoder-only tokenizers often ship without."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def looks_local(path: str) -> bool:
    """A path the user meant on this machine: absolute, relative (./, ../, ~), or inside an existing folder.

    Only what is left ("owner/name" with no local parent) may be a Hugging Face Hub model id."""
    parent = Path(path).expanduser().parent
    return path.startswith(("/", ".", "~")) or path.count("/") > 1 or (parent != Path(".") and parent.is_dir())


def _config(folder: Path, strict: bool = True) -> dict:
    """config.json's fields; `strict`: a folder without one, or with a torn one, is a NotACheckpoint saying what the
    folder is (else an UnknownPRM naming the file)."""
    path = folder / "config.json"
    try:
        values = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        if not strict:
            raise UnknownPRM(f"{path}: cannot read it ({error})") from None
        if isinstance(error, ValueError):
            raise NotACheckpoint(
                f"{folder}: config.json is not valid JSON ({error}); the save was cut short: train again or pass "
                "another checkpoint"
            ) from None
        raise NotACheckpoint(f"{folder}: {_what_is(folder)}") from None
    if not isinstance(values, dict):
        raise NotACheckpoint(f"{path}: holds {type(values).__name__}, not a model config")
    return values


def _kind(folder: Path, config: dict, kind: str | None) -> str:
    arch = tuple(config.get("architectures") or ())
    seen = f"{folder / 'config.json'}: model_type {config.get('model_type')!r}, architectures {list(arch)}"
    if config.get("model_type") == "biprm":
        if kind not in (None, "biprm"):
            raise UnknownPRM(f"{seen}: a biprm checkpoint, not --prm-kind {kind}")
        return "biprm"
    if kind is not None:
        if kind not in KINDS:
            raise UnknownPRM(f"--prm-kind {kind!r}: not one of biprm, {', '.join(KINDS)}")
        spec = KINDS[kind]  # a causal-LM read-out fits any causal LM; a head of its own needs its own architecture
        if not any(a.endswith(k) for a in arch for k in spec.architectures) and not (_causal(arch) and spec.causal):
            raise UnknownPRM(f"{seen}: not a {kind} checkpoint (it expects {' or '.join(spec.architectures)})")
        return kind
    for name, spec in KINDS.items():
        if spec.causal:
            continue  # a causal LM says nothing of its read-out: named below, or by hand
        if any(a.endswith(k) for a in arch for k in spec.architectures):
            return name
    if _causal(arch):
        named = str(config.get("_name_or_path", "")).lower() + " " + str(folder).lower()
        hits = sorted({kind for hint, kind in CAUSAL_HINTS.items() if hint in named})
        if len(hits) == 1:
            return hits[0]
        raise UnknownPRM(
            f"{seen}: a causal LM, whose read-out its config does not say; pass --prm-kind math-shepherd, "
            "rlhflow or eurus-prm (or train a biprm on it: biprm train --backbone ...)"
        )
    raise UnknownPRM(f"{seen}: no PRM kind biprm knows ({', '.join(['biprm', *KINDS])}); see docs/PRMS.md to add one")


def _causal(arch: tuple[str, ...]) -> bool:
    return any(a.endswith("ForCausalLM") for a in arch)


def _what_is(folder: Path) -> str:
    """What a path that holds no model config is, and what to pass instead."""
    if not folder.exists():
        return f"no such folder; {TRAINED}"
    if not folder.is_dir():
        return f"is a file, not a checkpoint folder; {TRAINED}"
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


def _what_config(folder: Path, config: dict) -> str:
    """What a folder whose config names no kind biprm reads is, and what to do with it."""
    kind = config.get("model_type")
    causal = _causal(tuple(str(a) for a in config.get("architectures") or ()))
    causal_prm = (
        "; if it is a PRM read from its LM head (math-shepherd, rlhflow, eurus-prm), name the kind with --prm-kind"
        if causal
        else ""
    )
    return (
        f"is a plain {kind or 'unknown'} model (a backbone), not a biprm checkpoint; train a PRM on it with "
        f"`biprm train --backbone {folder}`, then {TRAINED}{causal_prm}"
    )
