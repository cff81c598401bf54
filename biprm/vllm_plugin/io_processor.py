"""vLLM's IO processor for biprm: one request in, its stream prompts to the model, one fused answer out.

Request `data`: {"question": str, "steps": [str, ...]} or a list of them (or the same already
tokenized: {"prompt_ids": [int, ...], "step_ids": [[int, ...], ...]}, each id inside the model's
vocabulary). Answer: for each
solution, the per-step probabilities `fused`, `l2r`, `r2l`, the gate weight `sigma` (null
where the mode lacks them), the logits they come from, and `steps_scored`. A solution
longer than the engine's max_model_len keeps the steps that fit, as biprm's Scorer does
with its max_length, so `steps_scored` is then below the number of steps sent.

Text items are encoded with the template of the export's PRM kind. The model pools every token whose
id is the step tag, and only this processor knows where each step piece ends, so it keeps a
request's encodings from `pre_process` to `post_process` (by request id; offline, where vLLM gives
none, `LLM.encode` runs one request at a time) and reads each step at its piece's last token.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from numbers import Integral
from pathlib import Path

import numpy as np
from safetensors import safe_open
from transformers import AutoTokenizer
from vllm.config import VllmConfig
from vllm.inputs import TokensPrompt
from vllm.outputs import PoolingRequestOutput
from vllm.plugins.io_processors.interface import IOProcessor
from vllm.renderers import BaseRenderer

from biprm.data.encoding import Encoded
from biprm.config import MODE_TABLE
from biprm.data.trajectory import Trajectory, validate
from biprm.vllm_plugin.fusion import at_step_ends, fuse, sigmoid
from biprm.vllm_plugin.spec import spec_encoder

IN_FLIGHT = 4096  # requests whose encodings are kept until their answer; past it the oldest (one its client left) goes


def _second_gate_layer(folder: Path) -> tuple[np.ndarray, float]:
    """W2 and b2 of the gate, read from the checkpoint's weights (the model computes the first layer)."""
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), "np") as f:
            if "gate.2.weight" in f.keys():
                return f.get_tensor("gate.2.weight").astype(np.float64)[0], float(f.get_tensor("gate.2.bias")[0])
    raise ValueError(f"{folder}: no gate weights (gate.2.weight) in its safetensors files, but its mode is 'bi'")


class BiPRMIOProcessor(IOProcessor):
    def __init__(self, vllm_config: VllmConfig, renderer: BaseRenderer):
        super().__init__(vllm_config, renderer)
        model = vllm_config.model_config
        spec = model.hf_config.biprm
        self.mode, self.streams = spec["mode"], MODE_TABLE[spec["mode"]].streams
        self.encoder = spec_encoder(spec, AutoTokenizer.from_pretrained(model.tokenizer), model.max_model_len)
        self.in_flight: OrderedDict[str | None, list[Encoded]] = OrderedDict()
        self.vocab_size = model.get_vocab_size()
        self.w2, self.b2 = (
            _second_gate_layer(Path(model.model)) if MODE_TABLE[self.mode].fusion == "gate" else (None, 0.0)
        )

    def parse_data(self, data: object) -> list[Encoded]:
        """Text items are tokenized here; token items (what `biprm serve --engine vllm` sends, already encoded
        and cut to its max_length) are checked and taken as they are."""
        items = data if isinstance(data, list) else [data]
        if not items or not all(
            isinstance(x, dict) and set(x) in ({"question", "steps"}, {"prompt_ids", "step_ids"}) for x in items
        ):
            raise ValueError('\'data\' must be {"question": str, "steps": [str, ...]} or a non-empty list of them')
        return [self.encode(x, f"item {i}") for i, x in enumerate(items)]

    def encode(self, item: dict, where: str) -> Encoded:
        if "question" in item:
            return self.encoder.encode(validate(Trajectory(item["question"], list(item["steps"])), where), where)
        if not isinstance(item["step_ids"], list):
            raise ValueError(f"{where}: field 'step_ids' must be a list of lists of token ids")
        steps = [self.token_ids(s, f"{where}: field 'step_ids' [{j}]") for j, s in enumerate(item["step_ids"])]
        enc = Encoded(self.token_ids(item["prompt_ids"], f"{where}: field 'prompt_ids'"), steps, None)
        tag, unique = self.encoder.step_tag_id, self.encoder.template.unique_tag  # a text tag ("\n") may occur anywhere
        if (
            not enc.steps
            or any(not s or s[-1] != tag or (unique and s.count(tag) != 1) for s in enc.steps)
            or (unique and tag in enc.prompt)
        ):
            raise ValueError(
                f"{where}: every step must end with the step tag {tag}" + (" and hold no other" if unique else "")
            )
        if enc.n_tokens > self.encoder.max_length:
            raise ValueError(
                f"{where}: {enc.n_tokens} tokens per stream; this engine takes at most {self.encoder.max_length}"
            )
        return enc

    def token_ids(self, ids: object, where: str) -> list[int]:
        """`ids` if it is a list of integers inside the embedding table: an id outside it would crash the engine."""
        if not isinstance(ids, list):
            raise ValueError(f"{where} must be a list of token ids")
        for t in ids:
            if not isinstance(t, Integral) or isinstance(t, bool) or not 0 <= t < self.vocab_size:
                raise ValueError(
                    f"{where}: {t!r} is not a token id of this model (integers from 0 to {self.vocab_size - 1})"
                )
        return [int(t) for t in ids]

    def pre_process(self, prompt: list[Encoded], request_id: str | None = None, **kwargs) -> list[TokensPrompt]:
        self.in_flight[request_id] = prompt
        while len(self.in_flight) > IN_FLIGHT:
            self.in_flight.popitem(last=False)
        return [TokensPrompt(prompt_token_ids=e.stream(s)) for e in prompt for s in self.streams]

    def post_process(
        self, model_output: Sequence[PoolingRequestOutput], request_id: str | None = None, **kwargs
    ) -> list[dict]:
        encs = self.in_flight.pop(request_id, None)
        sent = [(e, s) for e in encs or [] for s in self.streams]
        if len(sent) != len(model_output) or any(
            list(o.prompt_token_ids) != e.stream(s) for o, (e, s) in zip(model_output, sent)
        ):
            raise ValueError(
                f"request {request_id}: its encodings are not the prompts answered (a request id sent twice at once, "
                f"or more than {IN_FLIGHT} requests in flight)"
            )
        tag = self.encoder.step_tag_id
        outs = [at_step_ends(o.outputs.data.double().cpu().numpy(), e, s, tag) for o, (e, s) in zip(model_output, sent)]
        answers = []
        for i in range(len(outs) // len(self.streams)):
            rows = dict(zip(self.streams, outs[i * len(self.streams) : (i + 1) * len(self.streams)]))
            answers.append(self.answer(rows))
        return answers

    def answer(self, rows: dict[str, np.ndarray]) -> dict:
        logits = fuse(rows, self.mode, self.w2, self.b2)
        prob = lambda k: None if logits[k] is None else sigmoid(logits[k]).tolist()  # noqa: E731
        return {
            "fused": prob("fused"),
            "l2r": prob("l2r"),
            "r2l": prob("r2l"),
            "sigma": None if logits["sigma"] is None else logits["sigma"].tolist(),
            "logits": {k: None if logits[k] is None else logits[k].tolist() for k in ("fused", "l2r", "r2l")},
            "steps_scored": len(logits["fused"]),
        }
