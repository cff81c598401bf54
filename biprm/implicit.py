"""Implicit PRMs (EurusPRM, PRIME): a step's score is a log-ratio between two causal LMs, read in either stream.

An implicit PRM is an outcome reward model whose reward is r(y) = beta * log(pi(y) / pi_ref(y)), with pi the PRM and
pi_ref a reference LM. Its value after t tokens,

    q_t = beta * sum_{i <= t} [log pi(y_i | y_<i) - log pi_ref(y_i | y_<i)],

is a logit: sigmoid(q_t) is the chance the answer turns out right, so it is what biprm's value heads give per step,
and every aggregation, metric and table reads it unchanged. A step's score is q where the card reads it (`stream_row`);
the R2L stream is the card's text of the same steps in reverse order, read the same way, zero-shot.
There is no head, so nothing here trains: a gate cannot be learned, and only l2r, r2l and bi-static are read.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn as nn
from transformers import AutoModelForCausalLM, PreTrainedModel, PreTrainedTokenizerBase

from biprm.config import MODE_TABLE
from biprm.data.encoding import Encoded, stream_order
from biprm.modeling import BiPRMConfig, BiPRMOutput, check_attention, special_ids
from biprm.folder import ModelFolder, body_config
from biprm.prms import UnknownPRM

LOGIT_CHUNK = (
    512  # positions whose vocabulary logits exist at once: memory is chunk x vocabulary, not length x vocabulary
)


@dataclass(frozen=True)
class Reading:
    """What reading an implicit PRM takes besides its two LMs: its coefficient, and the ids `stream_row` writes."""

    kind: str
    beta: float
    tag_id: int  # the step tag's last token, the model's step_tag_id
    tag_length: int  # the tag's tokens at the end of each step
    close_id: int  # the token that closes the answer (`Template.close`)


def reading(folder: ModelFolder, tokenizer: PreTrainedTokenizerBase) -> Reading:
    """Everything an implicit PRM needs checked before either LM loads, in one line each (its mode was checked when
    the folder was resolved): a reference LM of the same vocabulary, a tokenizer with the kind's tag and end token."""
    folder.check_reference()
    path, kind, template = folder.path, folder.kind, folder.template
    tag, close = (tokenizer.encode(text, add_special_tokens=False) for text in (template.tag, template.close))
    if len(close) != 1:
        raise UnknownPRM(
            f"{path}: its tokenizer encodes {template.close!r}, which closes a {kind} answer, to {close}, not one token"
        )
    return Reading(kind, folder.spec.beta, tag[-1], len(tag), close[0])


def stream_row(enc: Encoded, stream: str, read: Reading) -> tuple[list[int], np.ndarray]:
    """One stream as the card's chat text: the prompt, then the steps in the stream's order joined by the tag
    ("\\n\\n"), the last step's own tokens (`Encoded.closing`) closed by the end token (<|im_end|>, `Template.close`);
    and, in forward step order, the index j of each step's q among the row's log-ratios (j is that of token j + 1).
    These are the cards' positions, `len(ids) - 2` of each prefix's chat text: a prefix's steps, the last of them
    closing the answer, then the end token and, but for the last step, the tag (tokenised on its own, `tag_length`
    tokens). So with a one-token tag (Qwen's "\\n\\n") q of a step the stream goes on after runs one token past that
    step's own tokens (where the tag merges with the step's end, as ".\\n\\n" does in Qwen's vocabulary, that is the
    next step's second token), and q of the stream's last step through the end token."""
    pieces = stream_order(enc.steps, stream)
    closing = stream_order(enc.closing or [p[: -read.tag_length] for p in enc.steps], stream)
    before = np.cumsum([0, *map(len, pieces[:-1])])
    reads = len(enc.prompt) - 1 + before + [len(c) for c in closing] + read.tag_length  # the end token, then the tag
    reads[-1] -= read.tag_length  # the last step is followed by the end token only
    row = enc.prompt + [t for p in pieces[:-1] for t in p] + closing[-1] + [read.close_id]
    return row, stream_order(reads, stream)


class ImplicitPRM(nn.Module):
    """The PRM and its reference, each a causal LM built by transformers from its folder's config (no remote code),
    with `BiPRMModel`'s config fields and output, so `Scorer` and everything above it read it as any PRM."""

    def __init__(self, policy: PreTrainedModel, reference: PreTrainedModel, config: BiPRMConfig, read: Reading):
        super().__init__()
        self.policy, self.reference, self.config, self.read = policy, reference, config, read

    @property
    def streams(self) -> tuple[str, ...]:
        return MODE_TABLE[self.config.mode].streams

    @property
    def device(self) -> torch.device:
        return self.policy.device

    @property
    def dtype(self) -> torch.dtype:
        return self.policy.dtype

    def forward(self, encs: list[Encoded]) -> BiPRMOutput:
        """Per-step logits of each stream, forward step order, flat over `encs`; every stream is a plain causal row."""
        built = [stream_row(e, s, self.read) for s in self.streams for e in encs]
        width = max(len(row) for row, _ in built)
        ids = torch.full((len(built), width), self.config.pad_token_id or 0, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, (row, _) in enumerate(built):
            ids[r, : len(row)], mask[r, : len(row)] = torch.tensor(row), 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        ratio = next_token_logps(self.policy, ids, mask) - next_token_logps(self.reference, ids, mask)
        return read_steps(self.read.beta * ratio, built, [len(e.prompt) for e in encs], self.config.mode)


def read_steps(
    ratio: torch.Tensor, built: list[tuple[list[int], np.ndarray]], prompt_lengths: list[int], mode: str
) -> BiPRMOutput:
    """The per-step logits of `stream_row`'s rows (`built`, stream by stream, each over the same trajectories) from
    their beta-scaled per-token log-ratios [rows, width - 1] (right-padded): q summed from the prompt's last token, as
    the cards' mask does, and read where `stream_row` says; bi-static fuses the streams' q half and half."""
    streams = MODE_TABLE[mode].streams
    starts = torch.tensor([p - 2 for p in prompt_lengths] * len(streams), device=ratio.device)
    counted = torch.arange(ratio.shape[1], device=ratio.device)[None] >= starts[:, None]
    q = torch.cumsum(ratio * counted, dim=1)
    rows = torch.from_numpy(np.repeat(np.arange(len(built)), [len(reads) for _, reads in built])).to(ratio.device)
    at = torch.from_numpy(np.concatenate([reads for _, reads in built])).to(ratio.device)
    out = dict(zip(streams, q[rows, at].split(len(at) // len(streams))))
    l2r, r2l = out.get("l2r"), out.get("r2l")
    sigma = torch.full_like(l2r, 0.5) if MODE_TABLE[mode].fusion == "static" else None
    fused = l2r if r2l is None else r2l if l2r is None else sigma * l2r + (1 - sigma) * r2l
    return BiPRMOutput(fused=fused, l2r=l2r, r2l=r2l, sigma=sigma)


def next_token_logps(lm: PreTrainedModel, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[R, L - 1]: log p(token j + 1 | tokens up to j), in fp32. The LM head runs a chunk of positions at a time, so no
    [R, L, vocabulary] tensor is ever made."""
    hidden = lm.get_decoder()(input_ids=ids, attention_mask=mask).last_hidden_state[:, :-1]
    flat, targets = hidden.reshape(-1, hidden.shape[-1]), ids[:, 1:].reshape(-1)
    head, out = lm.get_output_embeddings(), torch.empty(len(flat), device=ids.device)
    for a in range(0, len(flat), LOGIT_CHUNK):
        logits = head(flat[a : a + LOGIT_CHUNK]).float()
        out[a : a + LOGIT_CHUNK] = logits.gather(1, targets[a : a + LOGIT_CHUNK, None])[:, 0] - logits.logsumexp(-1)
    return out.view(hidden.shape[:2])


def causal_lm(path: str | Path, dtype: torch.dtype, attn_implementation: str) -> PreTrainedModel:
    """A causal LM from its folder, built by transformers from the config's model_type (auto_map and remote code
    ignored)."""
    config = body_config(path)
    model = AutoModelForCausalLM._model_mapping[type(config)].from_pretrained(path, config=config, dtype=dtype)
    model.set_attn_implementation(attn_implementation)  # given a config, from_pretrained leaves its kernel unset
    return model.eval()


def from_implicit(
    folder: ModelFolder,
    tokenizer: PreTrainedTokenizerBase,
    dtype: torch.dtype = torch.float32,
    attn_implementation: str = "sdpa",
) -> ImplicitPRM:
    """The implicit PRM of `folder` against its reference LM, read in its mode (l2r: as its card reads it)."""
    read = reading(folder, tokenizer)
    check_attention(attn_implementation)
    policy, ref = (causal_lm(p, dtype, attn_implementation) for p in (folder.path, folder.reference))
    config = BiPRMConfig(
        backbone_config=copy.deepcopy(policy.config),
        mode=folder.mode,
        step_tag_id=read.tag_id,
        prm_kind=folder.kind,
        value_head="implicit",
        **special_ids(tokenizer),
    )  # a copy of the LM's config: BiPRMConfig would reset its kernel
    return ImplicitPRM(policy, ref, config, read)
