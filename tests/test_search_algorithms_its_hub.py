"""its_hub 1.2.0's BeamSearch and ParticleFiltering and biprm's pick the same on one scripted policy and PRM.

Both policies hand out a prefix's children in turn, and the PRM reads the text only, so
where the semantics line up (every path finishes at the same depth, weights so uneven that
resampling is certain) the two must choose the same solution."""

import asyncio

import numpy as np
import pytest

from biprm.search.algorithms import Search, beam_search, choose, particle_filter
from biprm.search.steps import STEP_TOKEN, join_steps, split_steps
from search_scripted import ScriptedPolicy, ScriptedScorer
from test_search_algorithms import LOGITS, TREE

its_hub = pytest.importorskip("its_hub", reason="its-hub==1.2.0 is in the dev extra")
from its_hub.api import AbstractLanguageModel, AbstractProcessRewardModel  # noqa: E402
from its_hub.core.algorithms.beam_search import BeamSearch  # noqa: E402
from its_hub.core.algorithms.particle_gibbs import ParticleFiltering  # noqa: E402
from its_hub.core.lms.step_generation import StepGeneration  # noqa: E402


class TreeLM(AbstractLanguageModel):
    """The scripted policy behind its_hub's language-model interface (a continued assistant turn)."""

    def __init__(self, tree):
        self.policy = ScriptedPolicy(tree)

    async def agenerate(self, messages, stop=None, **kwargs):
        def one(conversation):
            steps = split_steps(conversation[1].content, STEP_TOKEN) if len(conversation) > 1 else []
            return {"role": "assistant", "content": self.policy.next_step((conversation[0].content, *steps))}

        return [one(m) for m in messages]


class TreePRM(AbstractProcessRewardModel):
    """The scripted PRM, aggregated by its last step and given as a probability (what its_hub expects)."""

    def __init__(self, logits):
        self.scorer = ScriptedScorer(logits)

    async def ascore(self, prompt, responses):
        results = self.scorer.score([prompt] * len(responses), [split_steps(r) for r in responses])
        return [float(1 / (1 + np.exp(-r.fused[-1]))) for r in results]

    def score(self, prompt, responses):
        return asyncio.run(self.ascore(prompt, responses))


def theirs(algorithm, tree, logits, **kw):
    sg = StepGeneration(max_steps=10, step_token=STEP_TOKEN, stop_token="answer")
    result = asyncio.run(
        algorithm(sg, TreePRM(logits), **kw).ainfer(
            TreeLM(tree), "Q", budget=4 if algorithm is BeamSearch else 2, return_response_only=False
        )
    )
    return result.the_one["content"]


def ours(algorithm, tree, logits, **kw):
    s = Search(["Q"], ScriptedPolicy(tree), ScriptedScorer(logits), aggregation="last")
    kept = algorithm(s, **kw)
    return join_steps(list(kept[choose(kept)[0]].steps)).removesuffix(STEP_TOKEN)


def test_beam_search_agrees_with_its_hub():
    assert (
        theirs(BeamSearch, TREE, LOGITS, beam_width=2)
        == ours(beam_search, TREE, LOGITS, n=4, width=2)
        == "a\n\na1\n\nanswer A1x"
    )


def test_particle_filtering_agrees_with_its_hub():
    tree = {("Q",): ["a", "b"], ("Q", "a"): ["answer good", "answer bad"], ("Q", "b"): ["answer b"]}
    logits = {"a": 30.0, "b": -30.0, "answer good": 30.0, "answer bad": -30.0, "answer b": 0.0}
    mine = ours(particle_filter, tree, logits, n=2, rng=np.random.default_rng(0))
    assert theirs(ParticleFiltering, tree, logits) == mine == "a\n\nanswer good"
