"""PRMs trained elsewhere: which kind a checkpoint folder holds, and its read-out written as biprm's value head.

Every kind below reads one score per step from the hidden state at the step's tag, and every read-out but a bare
sigmoid is a two-way softmax, softmax([a, b])[1] = sigmoid(b - a). So each is a scalar logit per step, which is
what biprm's value head produces: a two-class head becomes the difference of its two rows, a causal LM's "+"/"-"
read-out the difference of those two rows of its LM head, and Qwen's Linear -> ReLU -> Linear head stays whole
with its last layer so differenced. The body is the checkpoint's own, built by transformers from its config
(never its remote code). Templates and tags live in `biprm.data.template`; the model is built in `biprm.modeling`.

The implicit kind (EurusPRM) has no head: its step score is a sum of per-token log-ratios between the PRM and a
reference LM, a logit too, which `biprm.implicit` reads from the two models' vocabulary logits.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import torch

Tensors = dict[str, "torch.Tensor"]


class UnknownPRM(ValueError):
    """A folder whose config.json names no PRM kind biprm can read; the message says what it saw."""


def _rows(weight: torch.Tensor, bias: torch.Tensor | None, good: int, bad: int) -> Tensors:
    """A two-class read-out softmax([.., ..])[good] as one logit: row good minus row bad."""
    out = {"value_head.weight": _difference(weight, good, bad)}
    import torch

    out["value_head.bias"] = _difference(bias, good, bad) if bias is not None else torch.zeros(1)
    return out


def _difference(rows: torch.Tensor, good: int, bad: int) -> torch.Tensor:
    """Row good minus row bad, each upcast first: differenced in a bf16 checkpoint's own dtype, it would be rounded."""
    return (rows[good].float() - rows[bad].float())[None]


def _qwen_head(t: Tensors, ids: tuple[int, int]) -> Tensors:
    """score = Linear(h, h) -> ReLU -> Linear(h, 2); the positive class is index 1."""
    last = _rows(t["score.2.weight"], t.get("score.2.bias"), 1, 0)
    return {
        "value_head.0.weight": t["score.0.weight"].float(),
        "value_head.0.bias": t["score.0.bias"].float(),
        "value_head.2.weight": last["value_head.weight"],
        "value_head.2.bias": last["value_head.bias"],
    }


def _lm_head(t: Tensors, ids: tuple[int, int]) -> Tensors:
    """softmax over the LM logits of "+" and "-", index of "+"; a tied model's LM head is its embedding table."""
    weight = t.get("lm_head.weight", t.get("model.embed_tokens.weight"))
    return _rows(weight, None, *ids)


@dataclass(frozen=True)
class Kind:
    """One PRM family: how its config.json names it, the value head biprm builds for it, the checkpoint tensors
    that head is made of, and its defaults. Its layout is biprm.data.template.TEMPLATES[name]."""

    name: str
    architectures: tuple[str, ...]
    head: (
        str  # "linear": Linear(H, 1); "mlp": Linear(H, H) -> ReLU -> Linear(H, 1); "implicit": no head (biprm.implicit)
    )
    head_keys: tuple[str, ...]  # checkpoint tensors the head is built from (any one of a group of alternatives)
    read_head: Callable[[Tensors, tuple[int, int]], Tensors] | None
    aggregation: str = "min"
    source: str = ""
    plus_minus: Callable[[object], tuple[int, int]] | None = None  # (good, bad) token ids, for LM-head read-outs
    beta: float = 0.0  # an implicit PRM's coefficient on its log-ratio against the reference model

    @property
    def implicit(self) -> bool:
        """Scored as beta * log(pi / pi_ref) summed over the tokens read so far: two causal LMs, no value head."""
        return self.head == "implicit"

    @property
    def causal(self) -> bool:
        """Read from a causal LM's vocabulary logits, so any causal LM's folder may hold one: its name or --prm-kind
        says."""
        return self.plus_minus is not None or self.implicit


def _shepherd_ids(tokenizer) -> tuple[int, int]:
    """The card's `tokenizer.encode("+ -")[1:]`: the two ids after the BOS (648 and 387 for its Mistral tokenizer)."""
    ids = tokenizer.encode("+ -", add_special_tokens=False)
    if len(ids) != 2:
        raise UnknownPRM(f"the tokenizer encodes '+ -' to {ids}, not two tokens: not math-shepherd's tokenizer")
    return ids[0], ids[1]


def _rlhflow_ids(tokenizer) -> tuple[int, int]:
    """The reference's `tokenizer.encode("+")[-1]` and `tokenizer.encode("-")[-1]`."""
    return tokenizer.encode("+", add_special_tokens=False)[-1], tokenizer.encode("-", add_special_tokens=False)[-1]


KINDS = {
    "qwen-prm": Kind(
        "qwen-prm",
        ("Qwen2ForProcessRewardModel",),
        "mlp",
        ("score.0.weight", "score.0.bias", "score.2.weight", "score.2.bias"),
        _qwen_head,
        aggregation="min",
        source="Qwen/Qwen2.5-Math-PRM-7B card (softmax at <extra_0>, index 1)",
    ),
    "skywork-prm": Kind(
        "skywork-prm",
        ("Qwen2ForPrmModel",),
        "linear",
        ("v_head.summary.weight", "v_head.summary.bias"),
        lambda t, ids: {
            "value_head.weight": t["v_head.summary.weight"].float(),
            "value_head.bias": t["v_head.summary.bias"].float(),
        },
        aggregation="min",
        source="SkyworkAI/skywork-o1-prm-inference (sigmoid of v_head at each step's newline)",
    ),
    "math-shepherd": Kind(
        "math-shepherd",
        ("MistralForCausalLM",),
        "linear",
        ("lm_head.weight|model.embed_tokens.weight",),
        _lm_head,
        aggregation="min",
        source="peiyi9979/math-shepherd-mistral-7b-prm card (softmax over '+'/'-' at ки, index of '+')",
        plus_minus=_shepherd_ids,
    ),
    "rlhflow": Kind(
        "rlhflow",
        ("LlamaForCausalLM",),
        "linear",
        ("lm_head.weight|model.embed_tokens.weight",),
        _lm_head,
        aggregation="mean",
        source="RLHFlow/RLHF-Reward-Modeling math-rm (softmax over '+'/'-' before the assistant's answer)",
        plus_minus=_rlhflow_ids,
    ),
    "eurus-prm": Kind(
        "eurus-prm",
        ("Qwen2ForCausalLM",),
        "implicit",
        (),
        None,
        aggregation="min",
        beta=0.001,
        source="PRIME-RL/EurusPRM-Stage1 and -Stage2 cards (beta * log-ratio to the reference, summed up to each step)",
    ),
    "token-classification": Kind(
        "token-classification",
        ("ForTokenClassification",),
        "linear",
        ("score.weight", "score.bias"),
        lambda t, ids: _rows(t["score.weight"], t.get("score.bias"), 1, 0),
        aggregation="min",
        source="TRL PRMTrainer (2 labels, class 1 = correct, at each separator)",
    ),
}
CAUSAL_HINTS = {
    "math-shepherd": "math-shepherd",
    "rlhflow": "rlhflow",
    "eurusprm": "eurus-prm",
    "eurus-prm": "eurus-prm",
}  # name -> kind


def weight_files(folder: str | Path) -> list[Path]:
    """A checkpoint's weight files: safetensors where there are any, else PyTorch pickles (Skywork ships only those)."""
    folder = Path(folder)
    return sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))


def head_tensors(folder: str | Path, kind: Kind) -> Tensors:
    """The checkpoint tensors `kind`'s head is made of, read by name from its weight files (sharded or not); a pickle
    is read with weights_only, memory-mapped, so nothing in it runs and the body is not read into memory."""
    import torch
    from safetensors import safe_open

    files = weight_files(folder)
    if not files:
        raise UnknownPRM(f"{folder}: no weights (*.safetensors or pytorch_model*.bin)")
    wanted = {k for group in kind.head_keys for k in group.split("|")}
    found: Tensors = {}
    for file in files:
        if file.suffix == ".safetensors":
            with safe_open(str(file), framework="pt") as f:
                found |= {key: f.get_tensor(key) for key in f.keys() if key in wanted}
        else:
            found |= {
                k: v
                for k, v in torch.load(file, map_location="cpu", weights_only=True, mmap=True).items()
                if k in wanted
            }
    missing = [g for g in kind.head_keys if not any(k in found for k in g.split("|"))]
    if missing:
        raise UnknownPRM(
            f"{folder}: a {kind.name} checkpoint needs the tensors {missing}, which its safetensors files lack"
        )
    return found


def read_out(folder: str | Path, kind: Kind, tokenizer) -> Tensors:
    """`folder`'s read-out as biprm's value-head tensors, by state-dict name: what `from_prm` loads and what the
    vLLM export writes beside the body."""
    ids = kind.plus_minus(tokenizer) if kind.plus_minus else (0, 0)
    return kind.read_head(head_tensors(folder, kind), ids)
