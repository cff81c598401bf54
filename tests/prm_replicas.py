"""Tiny random replicas of third-party PRM checkpoints, and transcriptions of their model cards' reference code.

No real checkpoint can be downloaded here, so each replica is a folder laid out like the real one: the same
architecture names and config.json fields, the same parameter names (transformers' own classes where the real
checkpoint uses one, hand-named tensors where it ships remote code), and a tokenizer that holds the kind's special
tokens. The `reference_*` functions score with the cards' recipe, written out independently of biprm's loaders:
the body from transformers, the head applied as the card applies it, the text built as the card builds it.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import (
    AutoTokenizer,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForTokenClassification,
    Qwen2Model,
)

QWEN_VOCAB = 151936  # Qwen2.5-Math-1.5B's embedding rows: its tokens, padded
QWEN_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<extra_0>"]
LLAMA_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
QWEN_CHAT = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
# Qwen2.5-Math-Instruct's template (EurusPRM's base): a conversation without a system turn gets the default one
EURUS_CHAT = (
    "{% if messages[0]['role'] != 'system' %}<|im_start|>system\nPlease reason step by step, and put your final "
    "answer within \\boxed{}.<|im_end|>\n{% endif %}" + QWEN_CHAT
)
LLAMA_CHAT = (
    "{{ bos_token }}<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
    "Today Date: 26 Jul 2024\n\n<|eot_id|>{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>"
    "\n\n{{ m['content'] | trim }}<|eot_id|>{% endfor %}"
)

PROBLEMS = [
    (
        "Tom has 3 apples and buys 4 more. How many apples does he have?",
        ["Tom starts with 3 apples.", "He buys 4 more, so 3 + 4 = 7.", "The answer is 7."],
    ),
    (
        "A box holds 12 eggs. How many eggs are in 5 boxes?",
        ["Each box holds 12 eggs.", "5 * 12 = 60, so there are 60 eggs.", "The answer is 60."],
    ),
    ("What is 2 + 3 * 4?", ["3 * 4 = 12.", "2 + 12 = 14.", "The answer is 14."]),
]


# Solutions as real ones read: steps ending in ".", "}" or "$" (which Qwen's BPE merges with a following blank line),
# a first step starting with a space, several steps, LaTeX
SOLUTIONS = [
    (
        "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many "
        "clips did Natalia sell altogether in April and May?",
        [
            " Natalia sold $48 / 2 = 24$ clips in May.",
            "Altogether she sold $48 + 24 = 72$ clips in April and May.",
            "The answer is $\\boxed{72}$",
        ],
    ),
    (
        "Compute $\\frac{3}{4} + \\frac{1}{8}$.",
        [
            "Write both fractions over 8: $\\frac{3}{4} = \\frac{6}{8}$.",
            "Then $\\frac{6}{8} + \\frac{1}{8} = \\frac{7}{8}$.",
            "So the sum is \\boxed{\\frac{7}{8}}",
        ],
    ),
    (
        "Find $x$ if $2x + 3 = 11$.",
        [
            " Subtract 3 from both sides: $2x = 8$.",
            "Divide both sides by 2: $x = 4$.",
            "Check: $2 \\cdot 4 + 3 = 11$, which holds.",
            "Hence $x = 4$, that is, $\\boxed{4}$.",
            "The answer is $4$",
        ],
    ),
]


def _corpus() -> list[str]:
    lines = []
    for q, steps in PROBLEMS * 20:
        lines += [q, " ки\n".join(steps) + " ки", "\n\n".join(steps), "+ - + -", " ки ки"]
    return lines


def _tokenizer(
    specials: list[str], bos: str | None, eos: str, chat: str | None, sentencepiece: bool = False
) -> PreTrainedTokenizerFast:
    """A byte-level BPE over the test problems' words, with the kind's special tokens: any text encodes.
    `sentencepiece`: Mistral's kind instead (words carry "▁", a text starts with one, the BOS comes first)."""
    bpe = Tokenizer(models.BPE(byte_fallback=sentencepiece))
    if sentencepiece:
        bpe.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split("\n", "isolated"), pre_tokenizers.Metaspace(prepend_scheme="first")]
        )
        bpe.decoder = decoders.Metaspace(prepend_scheme="first")
    else:
        bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_corpus(), trainer)
    if sentencepiece:
        bpe.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", special_tokens=[(bos, bpe.token_to_id(bos))]
        )
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token=bos, eos_token=eos, pad_token=eos)
    if chat:
        tok.chat_template = chat
    return tok


def _small(config_class, vocab: int, heads: int, **kw):
    return config_class(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=max(heads // 2, 1),
        max_position_embeddings=4096,
        **kw,
    )


def _save_remote_code_layout(
    out: Path,
    body: Qwen2Model,
    head: dict[str, torch.Tensor],
    arch: str,
    extra: dict,
    pickle: bool = False,
    real: bool = False,
) -> None:
    """A checkpoint written by remote code: body tensors under "model.", the head's by its own names, and a config
    whose architectures and auto_map name classes transformers does not have; `pickle`: one pytorch_model.bin, as
    Skywork ships. `real`: bf16, and safetensors in two shards with an index, as Qwen ships."""
    tensors = {f"model.{k}": v.contiguous() for k, v in body.state_dict().items()} | head
    if real:
        tensors = {k: v.to(torch.bfloat16) for k, v in tensors.items()}
    if pickle:
        torch.save(tensors, out / "pytorch_model.bin")
    elif real:
        names = sorted(tensors)
        shards = {f"model-0000{i + 1}-of-00002.safetensors": names[i::2] for i in range(2)}
        for file, keys in shards.items():
            save_file({k: tensors[k] for k in keys}, str(out / file), metadata={"format": "pt"})
        index = {"metadata": {}, "weight_map": {k: file for file, keys in shards.items() for k in keys}}
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    else:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = body.config.to_dict() | {"architectures": [arch], "model_type": "qwen2"} | extra
    (out / "config.json").write_text(json.dumps(config, indent=2))
    if real:
        _as_shipped(out)


def build(kind: str, out: Path, heads: int = 4, real: bool = False) -> Path:
    """The replica of `kind` in `out` (created), seeded. vLLM's CPU attention takes head sizes from 32: `heads=1` gives
    one. `real`: the kind's real vocabulary (tests/real_vocab.py), its real chat template, bf16 weights sharded as the
    real checkpoint ships them, the real config fields and a remote-code file that raises if imported."""
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    tok = _real_tokenizer(kind) if real else None
    if kind == "eurus-prm":  # the implicit PRM and, beside it, its reference LM: two causal LMs with one tokenizer
        tok = tok or _tokenizer(QWEN_SPECIALS, None, "<|im_end|>", EURUS_CHAT)
        for folder in (out, reference_lm(out)):
            model = Qwen2ForCausalLM(_small(Qwen2Config, _rows(tok, real), heads, tie_word_embeddings=False))
            _save(model, folder, real)
            tok.save_pretrained(folder)
    elif kind in ("qwen-prm", "skywork-prm", "token-classification"):
        bos = "<|im_start|>" if kind == "skywork-prm" else None
        tok = tok or _tokenizer(QWEN_SPECIALS, bos, "<|im_end|>", QWEN_CHAT)
        config = _small(Qwen2Config, _rows(tok, real), heads, tie_word_embeddings=False)
        if kind == "token-classification":
            config.num_labels = 2
            model = Qwen2ForTokenClassification(config)
            model.score.bias.data.normal_()  # TRL's head has a bias; give it one that matters
            _save(model, out, real)
        elif kind == "qwen-prm":
            H = config.hidden_size
            head = {
                "score.0.weight": torch.randn(H, H) / H**0.5,
                "score.0.bias": torch.randn(H) * 0.1,
                "score.2.weight": torch.randn(2, H) / H**0.5,
                "score.2.bias": torch.randn(2) * 0.1,
                "lm_head.weight": torch.randn(config.vocab_size, H) * 0.02,
            }  # shipped, and read by no PRM path
            auto = {
                "AutoConfig": "configuration_qwen2_rm.Qwen2RMConfig",
                "AutoModel": "modeling_qwen2_rm.Qwen2ForProcessRewardModel",
            }
            _save_remote_code_layout(
                out, Qwen2Model(config), head, "Qwen2ForProcessRewardModel", {"auto_map": auto}, real=real
            )  # no num_labels: the real config has none
        else:
            H, body = config.hidden_size, Qwen2Model(config)
            head = {
                "lm_head.weight": torch.randn(config.vocab_size, H) * 0.02,
                "v_head.summary.weight": torch.randn(1, H) / H**0.5,
                "v_head.summary.bias": torch.randn(1) * 0.1,
            }
            auto = {
                "AutoConfig": "configuration_qwen2_rm.Qwen2RMConfig",
                "AutoModel": "modeling_qwen2_rm.Qwen2ForRewardModel",
            }
            _save_remote_code_layout(out, body, head, "Qwen2ForPrmModel", {"auto_map": auto}, pickle=True, real=real)
    elif kind == "math-shepherd":
        tok = tok or _tokenizer(["<s>", "</s>"], "<s>", "</s>", None, sentencepiece=True)
        _save(MistralForCausalLM(_small(MistralConfig, _rows(tok, real), heads, tie_word_embeddings=False)), out, real)
    elif kind == "rlhflow":
        tok = tok or _tokenizer(LLAMA_SPECIALS, "<|begin_of_text|>", "<|eot_id|>", LLAMA_CHAT)
        _save(LlamaForCausalLM(_small(LlamaConfig, _rows(tok, real), heads, tie_word_embeddings=False)), out, real)
    else:
        raise ValueError(kind)
    tok.save_pretrained(out)
    return out


REAL_VOCABS = {  # kind: its tokenizer in tests/real_vocab.py
    "qwen-prm": "qwen2.5-math-prm",
    "skywork-prm": "qwen2.5",
    "token-classification": "qwen2.5",
    "eurus-prm": "qwen2.5",
    "math-shepherd": "mistral-v1",
    "rlhflow": "llama3.1",
}
REMOTE_CODE = 'raise RuntimeError("the remote code of a test replica was imported: biprm must never run it")\n'


def _real_tokenizer(kind: str):
    from tests.real_vocab import real_tokenizer

    tok = real_tokenizer(REAL_VOCABS[kind])
    if kind == "skywork-prm":  # Skywork's prepare_input writes tokenizer.bos_token first (not confirmed which)
        tok.bos_token = "<|im_start|>"
    return tok


def _rows(tok, real: bool) -> int:
    """Embedding rows: the tokenizer's size, or for a real Qwen vocabulary its padded size as shipped."""
    return max(len(tok), QWEN_VOCAB) if real and "<|im_start|>" in tok.get_vocab() else len(tok)


def _save(model, out: Path, real: bool) -> None:
    """save_pretrained; `real`: in bf16, sharded, with the real config's torch_dtype."""
    if not real:
        model.save_pretrained(out)
        return
    model.to(torch.bfloat16).save_pretrained(out, max_shard_size="4MB")
    _as_shipped(out)


def _as_shipped(out: Path) -> None:
    """config.json as the real checkpoints write it (torch_dtype bfloat16), and a remote-code file for each auto_map
    entry that raises if anything imports it."""
    path = out / "config.json"
    config = json.loads(path.read_text())
    config.pop("dtype", None)
    config["torch_dtype"] = "bfloat16"
    path.write_text(json.dumps(config, indent=2))
    for ref in config.get("auto_map", {}).values():
        (out / f"{ref.split('.')[0]}.py").write_text(REMOTE_CODE)


def reference_lm(folder: Path) -> Path | None:
    """Where a replica's reference LM is (an implicit PRM's), or None for kinds that need none."""
    return folder.with_name(folder.name + "-reference") if folder.name.startswith("eurus") else None


# --- the cards' reference code, transcribed -------------------------------------------------------------


# Each reference runs in fp32 on the shipped weights, upcast: the card's math, as exact as it can be had. Loaded
# folders are kept (by path and file times), so a test calling a reference per problem loads each once.


def _stamp(folder: Path) -> tuple:
    return (str(folder), *sorted((p.name, p.stat().st_mtime_ns) for p in Path(folder).iterdir() if p.is_file()))


@lru_cache(maxsize=16)
def _cached(stamp: tuple, what: str):
    folder = Path(stamp[0])
    if what == "tokenizer":
        return AutoTokenizer.from_pretrained(folder)
    if what == "tensors":
        return _read_tensors(folder)
    if what == "qwen-body":
        config = Qwen2Config(
            **{
                k: v
                for k, v in json.loads((folder / "config.json").read_text()).items()
                if k not in ("architectures", "auto_map", "model_type", "torch_dtype", "dtype")
            }
        )
        return Qwen2Model.from_pretrained(folder, config=config, dtype=torch.float32).eval()
    classes = {"mistral": MistralForCausalLM, "llama": LlamaForCausalLM, "qwen2": Qwen2ForCausalLM}
    cls = Qwen2ForTokenClassification if what == "token-classification" else classes[what]
    return cls.from_pretrained(folder, dtype=torch.float32).eval()


def _load(folder: Path, what: str):
    return _cached(_stamp(folder), what)


def _qwen_body(folder: Path) -> Qwen2Model:
    return _load(folder, "qwen-body")


def _read_tensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the folder's weight files (one pickle, one safetensors file or its shards), upcast to fp32."""
    from safetensors.torch import load_file

    if (folder / "pytorch_model.bin").is_file():
        found = torch.load(folder / "pytorch_model.bin", weights_only=True)
    else:
        found = {k: v for f in sorted(folder.glob("*.safetensors")) for k, v in load_file(str(f)).items()}
    return {k: v.float() for k, v in found.items()}


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    return _load(folder, "tensors")


@torch.no_grad()
def reference_qwen_prm(folder: Path, question: str, steps: list[str]) -> list[float]:
    """Qwen2.5-Math-PRM card: chat template, steps joined by <extra_0> (one after the last), softmax at each tag, index
    1."""
    tok = _load(folder, "tokenizer")
    messages = [
        {"role": "system", "content": "Please reason step by step, and put your final answer within \\boxed{}."},
        {"role": "user", "content": question},
        {"role": "assistant", "content": "<extra_0>".join(steps) + "<extra_0>"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    ids = torch.tensor([tok.encode(text)])
    hidden = _qwen_body(folder)(input_ids=ids).last_hidden_state
    t = _tensors(folder)
    logits = torch.relu(hidden @ t["score.0.weight"].T + t["score.0.bias"]) @ t["score.2.weight"].T + t["score.2.bias"]
    probs = logits.softmax(-1)[0, ids[0] == tok.convert_tokens_to_ids("<extra_0>"), 1]
    return probs.tolist()


@torch.no_grad()
def reference_skywork_prm(folder: Path, question: str, steps: list[str]) -> list[float]:
    """Skywork's prepare_input: bos + problem + "\\n", then the response ("\\n".join(steps)) cut on "\\n", each
    non-empty part's ids and the "\\n" id, flagged; sigmoid(v_head) at the flags: one score per line."""
    tok = _load(folder, "tokenizer")
    newline = tok.encode("\n")[-1]
    ids = tok.encode(tok.bos_token + question + "\n")
    flags = [0] * len(ids)
    for step in "\n".join(steps).split("\n"):
        if step != "":
            ids += tok.encode(step) + [newline]
            flags += [0] * len(tok.encode(step)) + [1]
    ids = torch.tensor([ids])
    hidden = _qwen_body(folder)(input_ids=ids).last_hidden_state
    t = _tensors(folder)
    value = (hidden @ t["v_head.summary.weight"].T + t["v_head.summary.bias"]).squeeze(-1)
    return torch.sigmoid(value[0, torch.tensor(flags) == 1]).tolist()


@torch.no_grad()
def reference_math_shepherd(folder: Path, question: str, steps: list[str]) -> list[float]:
    """math-shepherd card: f"{question} {output}", output = steps each followed by " ки", joined by "\\n";
    logits[..., [+, -]].softmax(-1)[..., 0] at the ки positions, with [+, -] = tokenizer.encode("+ -")[1:]."""
    tok = _load(folder, "tokenizer")
    plus_minus = tok.encode("+ -")[1:]
    tag = tok.encode("ки")[-1]
    output = "\n".join(s + " ки" for s in steps)
    ids = torch.tensor([tok.encode(f"{question} {output}")])
    logits = _load(folder, "mistral")(ids).logits
    return logits[0, :, plus_minus].softmax(-1)[ids[0] == tag, 0].tolist()


@torch.no_grad()
def reference_rlhflow(folder: Path, question: str, steps: list[str]) -> list[float]:
    """RLHFlow's math-rm/prm_evaluate.py (RLHFlow/RLHF-Reward-Modeling): every step stripped; per step, the
    conversation so far (first user turn question + " " + step 1, each step a user turn answered "+"), through the
    model's own chat template; softmax over the "+"/"-" logits at position -3, index of "+"."""
    tok = _load(folder, "tokenizer")
    plus, minus = tok.encode("+", add_special_tokens=False)[-1], tok.encode("-", add_special_tokens=False)[-1]
    model = _load(folder, "llama")
    conversation, out = [], []
    for k, step in enumerate(s.strip() for s in steps):
        conversation += [
            {"role": "user", "content": question + " " + step if k == 0 else step},
            {"role": "assistant", "content": "+"},
        ]
        ids = tok.apply_chat_template(conversation, return_tensors="pt", return_dict=True)["input_ids"]
        logits = model(ids).logits[0, -3, [plus, minus]]
        out.append(logits.softmax(-1)[0].item())
    return out


@torch.no_grad()
def reference_token_classification(folder: Path, question: str, steps: list[str]) -> list[float]:
    """TRL's PRMTrainer tokenize_row: [bos] + prompt ids + (step ids + separator ids) per step; softmax class 1 at each
    separator's last token."""
    tok = _load(folder, "tokenizer")
    sep = tok.encode("\n", add_special_tokens=False)
    ids = ([tok.bos_token_id] if tok.bos_token_id is not None else []) + tok.encode(question, add_special_tokens=False)
    ends = []
    for step in steps:
        ids += tok.encode(step, add_special_tokens=False) + sep
        ends.append(len(ids) - 1)
    logits = _load(folder, "token-classification")(torch.tensor([ids])).logits
    return logits[0, ends].softmax(-1)[:, 1].tolist()


@torch.no_grad()
def eurus_logits(folder: Path, question: str, steps: list[str]) -> list[float]:
    """EurusPRM cards: the conversation [user: question, assistant: steps joined by "\\n\\n"], chat-templated; each
    prefix's end found as len(ids) - 2 of its stripped chat text (with "\\n\\n" added but for none or all steps);
    beta (0.001) times the per-token log-ratio of the PRM to the reference, masked before the first end, summed
    cumulatively and taken at the other ends: q per step, a logit."""
    tok = _load(folder, "tokenizer")

    def chat(answer: str) -> str:
        return tok.apply_chat_template(
            [{"role": "user", "content": question}, {"role": "assistant", "content": answer}], tokenize=False
        )

    ids = torch.tensor([tok.encode(chat("\n\n".join(steps)), add_special_tokens=False)])
    ends = []
    for k in range(len(steps) + 1):
        text = chat("\n\n".join(steps[:k])).strip() + ("\n\n" if 0 < k < len(steps) else "")
        ends.append(len(tok.encode(text, add_special_tokens=False)) - 2)

    def logps(path: Path) -> torch.Tensor:
        logits = _load(path, "qwen2")(ids).logits[:, :-1]
        return logits.log_softmax(-1).gather(2, ids[:, 1:, None])[..., 0]

    mask = torch.zeros_like(ids)
    mask[0, ends[0] :] = 1
    q = (0.001 * (logps(folder) - logps(reference_lm(folder))) * mask[:, 1:]).cumsum(-1)
    return q[0, ends[1:]].tolist()


def reference_eurus_prm(folder: Path, question: str, steps: list[str]) -> list[float]:
    return torch.sigmoid(torch.tensor(eurus_logits(folder, question, steps), dtype=torch.float64)).tolist()


REFERENCES = {
    "qwen-prm": reference_qwen_prm,
    "skywork-prm": reference_skywork_prm,
    "math-shepherd": reference_math_shepherd,
    "rlhflow": reference_rlhflow,
    "token-classification": reference_token_classification,
    "eurus-prm": reference_eurus_prm,
}
