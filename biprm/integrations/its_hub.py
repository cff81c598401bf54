"""its_hub's process reward model interface over a biprm PathScorer, so its searches run on a BiPRM unchanged.

its_hub's beam search and particle filtering call `ascore(prompt, responses)` once per
level with every live path of one question, as full texts (steps joined by the step
token), and want one probability per path (particle filtering takes its logit). Here each
response is cut with the search's own step token (`split_steps`, as the policy wrote it),
scored per step by the PathScorer (a `PrefixScorer` recognises the prefixes it scored at
the last level and runs only their new steps), and the step scores are aggregated as
biprm does everywhere (`StepScores.solution_scores`: min by default, also prod, mean,
last, max). its_hub runs one search per question; `ascore` calls of searches running
concurrently (`asyncio.gather` over questions) are gathered by biprm's serving `Batcher`
for a few milliseconds into one PathScorer call, so the model sees all questions at once.
`BiPRMOutcomeRewardModel` puts the same scores behind its_hub's outcome-model interface,
which its BestOfN takes.

Give the searches the question as a plain string. its_hub 1.2.0's BeamSearch and
ParticleFiltering hand the PRM `ChatMessages.to_prompt()`, which flattens a message list
into one "role: content" text, so a system message would be read as part of the question;
set a system prompt on the language model instead.
"""

from __future__ import annotations

import asyncio

import numpy as np
from its_hub.api import AbstractOutcomeRewardModel, AbstractProcessRewardModel, ChatMessage, ChatMessages

from biprm.scoring.step_scores import StepScores
from biprm.scoring.paths import PathScorer, check_streams, fused_scores
from biprm.search.steps import STEP_TOKEN, response_steps
from biprm.serve.batcher import Batcher

BATCH_WAIT_MS = (
    10.0  # how long a level's first ascore waits for the other questions' (their policy calls end close together)
)
LOW, HIGH = (
    np.finfo(np.float64).tiny,
    1.0 - np.finfo(np.float64).epsneg,
)  # open (0, 1): a caller may take a log or a logit


class BiPRMProcessRewardModel(AbstractProcessRewardModel):
    def __init__(
        self,
        scorer: PathScorer,
        step_token: str = STEP_TOKEN,
        aggregation: str = "min",
        streams: str = "fused",
        max_wait_ms: float = BATCH_WAIT_MS,
    ):
        """`step_token`: the one the search's StepGeneration cuts steps at; `aggregation`: step scores -> one per
        path."""
        check_streams(streams)
        self.scorer, self.step_token, self.aggregation, self.streams, self.max_wait_ms = (
            scorer,
            step_token,
            aggregation,
            streams,
            max_wait_ms,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batcher: Batcher | None = None

    def score(
        self, prompt_or_messages: str | list[ChatMessage] | ChatMessages, responses: str | list[str]
    ) -> float | list[float]:
        """One probability per response, scored now (not gathered with other calls)."""
        probs = self._now(self._items(prompt_or_messages, responses))
        return probs[0] if isinstance(responses, str) else probs

    async def ascore(
        self, prompt_or_messages: str | list[ChatMessage] | ChatMessages, responses: str | list[str]
    ) -> float | list[float]:
        """As `score`, gathered with the calls of concurrent searches into one PathScorer call on a worker thread."""
        probs = await self._gathered(self._items(prompt_or_messages, responses))
        return probs[0] if isinstance(responses, str) else probs

    def _now(self, items: list[tuple[str, list[str]]]) -> list[float]:
        return self._probs(self._score(items))

    async def _gathered(self, items: list[tuple[str, list[str]]]) -> list[float]:
        return self._probs(await self._batcher_of_this_loop().submit(items, len(items)))

    def _items(self, prompt_or_messages, responses: str | list[str]) -> list[tuple[str, list[str]]]:
        """(question, steps) per response; the question is the prompt, or the last user message of a conversation."""
        messages = ChatMessages.from_prompt_or_messages(prompt_or_messages).to_chat_messages()
        user = [m if isinstance(m, ChatMessage) else ChatMessage.from_dict(m) for m in messages]
        question = next((m.extract_text_content() for m in reversed(user) if m.role == "user"), None)
        if not question:
            raise ValueError("its_hub prompt: no user message holds the question")
        texts = [responses] if isinstance(responses, str) else responses
        return [(question, response_steps(r, self.step_token, f"its_hub response {i}")) for i, r in enumerate(texts)]

    def _score(self, items: list[tuple[str, list[str]]]) -> StepScores:
        """The Batcher's scoring function: all gathered paths in one PathScorer call, as flat step logits."""
        return fused_scores(self.scorer.score([q for q, _ in items], [s for _, s in items], self.streams))

    def _probs(self, scores: StepScores) -> list[float]:
        """Aggregated probabilities; a path none of whose steps fit the PRM's max_length (flagged by the scorer) gets
        the lowest."""
        fit = np.flatnonzero(np.diff(scores.offsets) > 0)
        probs = np.full(len(scores), LOW)
        if len(fit):
            probs[fit] = scores.select(fit).solution_scores(self.aggregation)
        return np.clip(probs, LOW, HIGH).tolist()

    def _batcher_of_this_loop(self) -> Batcher:
        """A Batcher lives on one event loop; its_hub's sync `infer` runs a fresh loop per question."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            self._loop, self._batcher = (
                loop,
                Batcher(self._score, self.max_wait_ms, max_batch_tokens=1 << 62, max_queue=1 << 62),
            )
            self._batcher.start()
        return self._batcher


class BiPRMOutcomeRewardModel(AbstractOutcomeRewardModel):
    """its_hub's outcome-model interface, which its BestOfN takes: each conversation's final assistant message is a
    finished response, scored as `BiPRMProcessRewardModel` scores a path (same splitting, aggregation and batching)."""

    def __init__(self, prm: BiPRMProcessRewardModel):
        self.prm = prm

    def score(self, messages: list[ChatMessage] | list[list[ChatMessage]], **kwargs) -> float | list[float]:
        single, items = self._items(messages)
        probs = self.prm._now(items)
        return probs[0] if single else probs

    async def ascore(
        self, messages: list[ChatMessage] | list[list[ChatMessage]], orchestrator=None, **kwargs
    ) -> float | list[float]:
        single, items = self._items(messages)
        probs = await self.prm._gathered(items)
        return probs[0] if single else probs

    def _items(self, messages) -> tuple[bool, list[tuple[str, list[str]]]]:
        single = not isinstance(messages[0], list)
        items = []
        for i, conversation in enumerate([messages] if single else messages):
            *prompt, answer = [m if isinstance(m, ChatMessage) else ChatMessage.from_dict(m) for m in conversation]
            if answer.role != "assistant":
                raise ValueError(
                    f"its_hub conversation {i}: the last message is the {answer.role}'s, not a response to score"
                )
            items += self.prm._items(prompt, answer.extract_text_content())
        return single, items
