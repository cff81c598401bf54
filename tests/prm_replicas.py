"""Tiny random replicas of third-party PRM checkpoints, and transcriptions of their model cards' reference code.

No real checkpoint can be downloaded here, so each replica is a folder laid out like the real one: the same
architecture names and config.json fields, the same parameter names (transformers' own classes where the real
checkpoint uses one, hand-named tensors where it ships remote code), and a tokenizer that holds the kind's special
tokens. The `reference_*` functions score with the cards' recipe, written out independently of biprm's loaders:
the body from transformers, the head applied as the card applies it, the text built as the card builds it.
"""

from __future__ import annotations

import json
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
    out: Path, body: Qwen2Model, head: dict[str, torch.Tensor], arch: str, extra: dict, pickle: bool = False
) -> None:
    """A checkpoint written by remote code: body tensors under "model.", the head's by its own names, and a config
    whose architectures and auto_map name classes transformers does not have; `pickle`: one pytorch_model.bin, as
    Skywork ships."""
    tensors = {f"model.{k}": v.contiguous() for k, v in body.state_dict().items()} | head
    if pickle:
        torch.save(tensors, out / "pytorch_model.bin")
    else:
        save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"})
    config = body.config.to_dict() | {"architectures": [arch], "model_type": "qwen2"} | extra
    (out / "config.json").write_text(json.dumps(config, indent=2))


def build(kind: str, out: Path, heads: int = 4) -> Path:
    """The replica of `kind` in `out` (created), seeded. vLLM's CPU attention takes head sizes from 32: `heads=1` gives
    one."""
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    if kind == "eurus-prm":  # the implicit PRM and, beside it, its reference LM: two causal LMs with one tokenizer
        tok = _tokenizer(QWEN_SPECIALS, None, "<|im_end|>", EURUS_CHAT)
        for folder in (out, reference_lm(out)):
            Qwen2ForCausalLM(_small(Qwen2Config, len(tok), heads, tie_word_embeddings=False)).save_pretrained(folder)
            tok.save_pretrained(folder)
    elif kind in ("qwen-prm", "skywork-prm", "token-classification"):
        tok = _tokenizer(QWEN_SPECIALS, "<|im_start|>" if kind == "skywork-prm" else None, "<|im_end|>", QWEN_CHAT)
        config = _small(Qwen2Config, len(tok), heads, tie_word_embeddings=False)
        if kind == "token-classification":
            config.num_labels = 2
            model = Qwen2ForTokenClassification(config)
            model.score.bias.data.normal_()  # TRL's head has a bias; give it one that matters
            model.save_pretrained(out)
        elif kind == "qwen-prm":
            H = config.hidden_size
            head = {
                "score.0.weight": torch.randn(H, H) / H**0.5,
                "score.0.bias": torch.randn(H) * 0.1,
                "score.2.weight": torch.randn(2, H) / H**0.5,
                "score.2.bias": torch.randn(2) * 0.1,
                "lm_head.weight": torch.randn(len(tok), H) * 0.02,
            }  # shipped, and read by no PRM path
            auto = {
                "AutoConfig": "configuration_qwen2_rm.Qwen2RMConfig",
                "AutoModel": "modeling_qwen2_rm.Qwen2ForProcessRewardModel",
            }
            _save_remote_code_layout(
                out, Qwen2Model(config), head, "Qwen2ForProcessRewardModel", {"auto_map": auto}
            )  # no num_labels: the real config has none
        else:
            H, body = config.hidden_size, Qwen2Model(config)
            head = {
                "lm_head.weight": torch.randn(len(tok), H) * 0.02,
                "v_head.summary.weight": torch.randn(1, H) / H**0.5,
                "v_head.summary.bias": torch.randn(1) * 0.1,
            }
            auto = {
                "AutoConfig": "configuration_qwen2_rm.Qwen2RMConfig",
                "AutoModel": "modeling_qwen2_rm.Qwen2ForRewardModel",
            }
            _save_remote_code_layout(out, body, head, "Qwen2ForPrmModel", {"auto_map": auto}, pickle=True)
    elif kind == "math-shepherd":
        tok = _tokenizer(["<s>", "</s>"], "<s>", "</s>", None, sentencepiece=True)
        MistralForCausalLM(_small(MistralConfig, len(tok), heads, tie_word_embeddings=False)).save_pretrained(out)
    elif kind == "rlhflow":
        tok = _tokenizer(LLAMA_SPECIALS, "<|begin_of_text|>", "<|eot_id|>", LLAMA_CHAT)
        LlamaForCausalLM(_small(LlamaConfig, len(tok), heads, tie_word_embeddings=False)).save_pretrained(out)
    else:
        raise ValueError(kind)
    tok.save_pretrained(out)
    return out


def reference_lm(folder: Path) -> Path | None:
    """Where a replica's reference LM is (an implicit PRM's), or None for kinds that need none."""
    return folder.with_name(folder.name + "-reference") if folder.name.startswith("eurus") else None


# --- the cards' reference code, transcribed -------------------------------------------------------------


def _qwen_body(folder: Path) -> Qwen2Model:
    return Qwen2Model.from_pretrained(
        folder,
        config=Qwen2Config(
            **{
                k: v
                for k, v in json.loads((folder / "config.json").read_text()).items()
                if k not in ("architectures", "auto_map", "model_type")
            }
        ),
    ).eval()


def _tensors(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    if (folder / "pytorch_model.bin").is_file():
        return torch.load(folder / "pytorch_model.bin", weights_only=True)
    return load_file(str(folder / "model.safetensors"))


@torch.no_grad()
def reference_qwen_prm(folder: Path, question: str, steps: list[str]) -> list[float]:
    """Qwen2.5-Math-PRM card: chat template, steps joined by <extra_0> (one after the last), softmax at each tag, index
    1."""
    tok = AutoTokenizer.from_pretrained(folder)
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
    """Skywork's prepare_input: bos + problem + "\\n", then each step's ids and the "\\n" id, flagged;
    sigmoid(v_head)."""
    tok = AutoTokenizer.from_pretrained(folder)
    newline = tok.encode("\n")[-1]
    ids, flags = tok.encode(tok.bos_token + question + "\n"), []
    flags = [0] * len(ids)
    for step in steps:
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
    tok = AutoTokenizer.from_pretrained(folder)
    plus_minus = tok.encode("+ -")[1:]
    tag = tok.encode("ки")[-1]
    output = "\n".join(s + " ки" for s in steps)
    ids = torch.tensor([tok.encode(f"{question} {output}")])
    logits = MistralForCausalLM.from_pretrained(folder).eval()(ids).logits
    return logits[0, :, plus_minus].softmax(-1)[ids[0] == tag, 0].tolist()


@torch.no_grad()
def reference_rlhflow(folder: Path, question: str, steps: list[str]) -> list[float]:
    """RLHFlow's prm_evaluate: per step, the conversation so far (first user turn question + " " + step 1, each step a
    user turn answered "+"), chat-templated; softmax over the "+"/"-" logits at position -3, index of "+"."""
    tok = AutoTokenizer.from_pretrained(folder)
    plus, minus = tok.encode("+", add_special_tokens=False)[-1], tok.encode("-", add_special_tokens=False)[-1]
    model = LlamaForCausalLM.from_pretrained(folder).eval()
    conversation, out = [], []
    for k, step in enumerate(steps):
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
    tok = AutoTokenizer.from_pretrained(folder)
    sep = tok.encode("\n", add_special_tokens=False)
    ids = ([tok.bos_token_id] if tok.bos_token_id is not None else []) + tok.encode(question, add_special_tokens=False)
    ends = []
    for step in steps:
        ids += tok.encode(step, add_special_tokens=False) + sep
        ends.append(len(ids) - 1)
    logits = Qwen2ForTokenClassification.from_pretrained(folder).eval()(torch.tensor([ids])).logits
    return logits[0, ends].softmax(-1)[:, 1].tolist()


@torch.no_grad()
def eurus_logits(folder: Path, question: str, steps: list[str]) -> list[float]:
    """EurusPRM cards: the conversation [user: question, assistant: steps joined by "\\n\\n"], chat-templated; each
    prefix's end found as len(ids) - 2 of its stripped chat text (with "\\n\\n" added but for none or all steps);
    beta (0.001) times the per-token log-ratio of the PRM to the reference, masked before the first end, summed
    cumulatively and taken at the other ends: q per step, a logit."""
    tok = AutoTokenizer.from_pretrained(folder)

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
        logits = Qwen2ForCausalLM.from_pretrained(path).eval()(ids).logits[:, :-1]
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
