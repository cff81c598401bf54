"""its_hub's searches run unchanged on a BiPRM: beam search, particle filtering and best-of-N on a scripted policy;
a served PRM scores as the local one."""

import asyncio

import numpy as np
import pytest

pytest.importorskip("its_hub")
from its_hub.api import AbstractLanguageModel  # noqa: E402
from its_hub.core.algorithms.beam_search import BeamSearch  # noqa: E402
from its_hub.core.algorithms.bon import BestOfN  # noqa: E402
from its_hub.core.algorithms.particle_gibbs import ParticleFiltering  # noqa: E402
from its_hub.core.lms.step_generation import StepGeneration  # noqa: E402

from biprm.data.trajectory import Trajectory  # noqa: E402
from biprm.integrations.its_hub import BiPRMOutcomeRewardModel, BiPRMProcessRewardModel  # noqa: E402
from biprm.scoring import Scorer  # noqa: E402
from biprm.scoring.prefix import PrefixScorer  # noqa: E402
from conftest import scored, serving  # noqa: E402

QUESTIONS = ["Tom has 3 apples and buys 5 more. How many apples?", "A box holds 12 eggs. How many eggs are in 4 boxes?"]
STEPS = [
    "Add the numbers.",
    "3 + 5 = 8",
    "12 * 4 = 48",
    "Check the sum.",
    "Multiply them.",
    "So it is 48.",
    "So it is 8.",
]


class ScriptedLM(AbstractLanguageModel):
    """A policy that writes a seeded step per call and ends every path at its third step ("The answer is")."""

    def __init__(self, seed: int = 0):
        self.rng = np.random.default_rng(seed)

    def _one(self, messages) -> dict:
        done = messages[-1].content.count("\n\n") if messages[-1].role == "assistant" else 0
        text = "The answer is 8." if done == 2 else STEPS[self.rng.integers(len(STEPS))]
        return {"role": "assistant", "content": text}

    async def agenerate(self, messages, stop=None, **kwargs):
        return [self._one(m) for m in messages] if isinstance(messages[0], list) else self._one(messages)

    async def agenerate_single(self, messages, stop=None, **kwargs):
        """A whole solution at once, for best-of-N."""
        return {
            "role": "assistant",
            "content": "\n\n".join([*(STEPS[i] for i in self.rng.integers(len(STEPS), size=2)), "The answer is 8."]),
        }


class Recording(PrefixScorer):
    """Remembers the questions of each call."""

    def score(self, questions, paths, streams="fused"):
        self.seen = getattr(self, "seen", []) + [sorted(set(questions))]
        return super().score(questions, paths, streams)


def step_generation() -> StepGeneration:
    return StepGeneration(max_steps=5, step_token="\n\n", stop_token="The answer is")


def expected(bi_scorer, question: str, responses: list[str]) -> np.ndarray:
    """The min over steps of the Scorer's fused probabilities, each response cut at the step token."""
    return scored(bi_scorer, [Trajectory(question, r.split("\n\n")) for r in responses]).solution_scores("min")


def test_score_is_the_aggregated_step_probability(bi_scorer):
    prm = BiPRMProcessRewardModel(PrefixScorer(bi_scorer))
    responses = ["3 + 5 = 8\n\nSo it is 8.", "Add the numbers.\n\n3 + 5 = 8\n\nThe answer is 8."]
    got = prm.score(QUESTIONS[0], responses)
    np.testing.assert_allclose(got, expected(bi_scorer, QUESTIONS[0], responses), atol=1e-6)
    assert prm.score(QUESTIONS[0], responses[0]) == pytest.approx(got[0], abs=1e-6)  # a single response -> a float
    with pytest.raises(ValueError, match="response 0: no step text"):
        prm.score(QUESTIONS[0], ["\n\n"])
    short = BiPRMProcessRewardModel(PrefixScorer(Scorer(bi_scorer.model, bi_scorer.tokenizer, max_length=40)))
    unfit, fits = short.score(QUESTIONS[0], ["Add the numbers. " * 10, "So it is 8."])
    assert (
        unfit == np.finfo(np.float64).tiny and 0 < fits < 1
    )  # a path the PRM cannot read ranks last, and particle weights stay finite


def test_beam_search_of_concurrent_questions_shares_each_level_in_one_call(bi_scorer):
    scorer = Recording(bi_scorer)
    search = BeamSearch(step_generation(), BiPRMProcessRewardModel(scorer), beam_width=2)

    async def both():
        return await asyncio.gather(
            *(search.ainfer(ScriptedLM(), q, budget=4, return_response_only=False) for q in QUESTIONS)
        )

    results = asyncio.run(both())
    assert scorer.seen == [sorted(QUESTIONS)] * 3  # three levels, each one PathScorer call with both questions
    for q, result in zip(QUESTIONS, results):
        responses = [r["content"] for r in result.responses]
        assert all(r.endswith("The answer is 8.") and r.count("\n\n") == 2 for r in responses)
        np.testing.assert_allclose(result.scores, expected(bi_scorer, q, responses), atol=1e-6)
        assert result.selected_index == int(np.argmax(result.scores))
    assert scorer.tokens["l2r"] < scorer.tokens["r2l"]  # each level ran only the new steps of L2R


def test_particle_filtering_runs_on_log_weights_of_the_scores(bi_scorer):
    prm = BiPRMProcessRewardModel(PrefixScorer(bi_scorer), aggregation="last")
    result = ParticleFiltering(step_generation(), prm).infer(
        ScriptedLM(1), QUESTIONS[0], budget=4, return_response_only=False
    )
    responses = [r["content"] for r in result.responses]
    probs = scored(bi_scorer, [Trajectory(QUESTIONS[0], r.split("\n\n")) for r in responses]).solution_scores("last")
    np.testing.assert_allclose(result.log_weights_lst, np.log(probs / (1 - probs)), atol=1e-5)
    assert result.selected_index == int(np.argmax(result.log_weights_lst))


def test_best_of_n_picks_the_best_scored_solution(bi_scorer):
    orm = BiPRMOutcomeRewardModel(BiPRMProcessRewardModel(PrefixScorer(bi_scorer)))
    result = BestOfN(orm).infer(ScriptedLM(2), QUESTIONS[1], budget=4, return_response_only=False)
    responses = [r["content"] for r in result.responses]
    assert len(set(responses)) > 1
    np.testing.assert_allclose(result.scores, expected(bi_scorer, QUESTIONS[1], responses), atol=1e-6)
    assert result.selected_index == int(np.argmax(result.scores))
    with pytest.raises(ValueError, match="conversation 0: the last message is the user's"):
        orm.score([{"role": "user", "content": QUESTIONS[1]}])


def test_served_scorer_gives_the_local_scores(bi_scorer):
    pytest.importorskip("fastapi")
    from biprm.scoring.served import ServedScorer
    from biprm.serve.app import build_app
    from biprm.serve.config import ServeConfig

    with serving(build_app(bi_scorer, ServeConfig(model="tiny"))) as url:
        served = ServedScorer(url)
        paths = [[STEPS[0]], [STEPS[0], STEPS[1]]]
        got, want = served.score(QUESTIONS[:1] * 2, paths), PrefixScorer(bi_scorer).score(QUESTIONS[:1] * 2, paths)
        for a, b in zip(got, want):
            for s in ("l2r", "r2l", "fused"):
                np.testing.assert_allclose(getattr(a, s), getattr(b, s), atol=1e-5)
        assert served.score(QUESTIONS[:1], paths[:1], streams="l2r")[0].r2l is None and served.calls == 2
        with pytest.raises(RuntimeError, match=r"/v1/score: HTTP 400: item 0: field 'question'"):
            served.score([""], paths[:1])
