"""What `biprm search` can be told: data, policy, PRM, algorithms, budgets and where results go."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args
from urllib.parse import urlsplit

from biprm.scoring.aggregate import AGGREGATIONS
from biprm.config import arg, check_ranges, check_segmenter, default_data_root
from biprm.data.readers import synthetic_spec

ALGORITHMS = ("bon", "beam", "dvts", "particles")
Strategy = Literal["fused", "l2r-rerank", "l2r"]
STRATEGIES: tuple[str, ...] = get_args(Strategy)


@dataclass
class SearchConfig:
    """Defaults follow its_hub: step token "\\n\\n", "last" aggregation, temperature 0.8."""

    out: str = arg(
        help="output folder: questions.jsonl (one line per question, appended; rerun to resume), summary.md, "
        "accuracy.png",
        group="output",
    )
    data: str = arg(
        "gsm8k",
        "questions: gsm8k (test), math500, a JSONL/JSON file with question (or problem) and answer, or "
        "synthetic[:N[:SEED]]: N questions of the synthetic task (default 2000, seed 0)",
        group="data",
    )
    data_root: str = arg(
        help="benchmark data folder (default: $BIPRM_DATA, else ../shared/data)",
        factory=default_data_root,
        metavar="DIR",
        group="data",
    )
    limit: int | None = arg(None, "questions to run, evenly spread over the set (default: all)", min=1, group="data")
    policy: Literal["server", "vllm", "hf", "synthetic"] = arg(
        "hf",
        "who writes the steps: an OpenAI-compatible server (--policy-url), "
        "vLLM in this process (vLLM venv), transformers generate (small CPU "
        "runs), or synthetic: a scripted policy with known error rates "
        "(--data synthetic only)",
        group="policy",
    )
    policy_model: str = arg(
        "tiny",
        "policy model: a folder or a biprm backbone name (hf, vllm); the served model's name (server); "
        "synthetic: the tokenizer that counts its tokens",
        group="policy",
    )
    policy_batch_size: int = arg(
        32, "--policy hf: sequences per generate call (a GPU takes hundreds)", min=1, group="compute"
    )
    policy_url: str = arg(
        "http://localhost:8000", "base URL of the OpenAI-compatible server (--policy server)", group="policy"
    )
    policy_tokenizer: str | None = arg(
        None,
        "tokenizer whose chat template renders the prompts for --policy server (default: --policy-model)",
        group="policy",
    )
    prm: list[str] = arg(
        help="PRMs, all scoring one shared pool and each driving its own searches: biprm checkpoint folders (any "
        "mode), PRMs trained elsewhere (docs/PRMS.md) and/or noise (text-free scores); with several, a PRM's rows "
        "end in [its folder's name]",
        factory=lambda: ["noise"],
        group="model",
    )
    algorithms: list[str] = arg(
        help="search algorithms, each run at every N and strategy",
        factory=lambda: ["beam"],
        choices=ALGORITHMS,
        group="search",
    )
    n: list[int] = arg(
        help="generation budgets N: paths per question (particles; beams x expansions)",
        factory=lambda: [4],
        min=1,
        group="search",
    )
    width: int = arg(
        2, "beam search: beams kept; DVTS: children per subtree and level (N must be a multiple)", min=1, group="search"
    )
    strategies: list[str] = arg(
        help="PRM use: fused at every expansion; l2r-rerank: L2R while expanding, one fused rerank of the "
        "finished paths; l2r: L2R only",
        factory=lambda: ["fused"],
        choices=STRATEGIES,
        group="search",
    )
    aggregation: str = arg(
        "last",
        "step scores -> path score (last: the newest step's, as search-and-learn scores a path)",
        choices=AGGREGATIONS,
        group="search",
    )
    max_depth: int = arg(12, "steps per path at most; a path reaching it is finished", min=1, group="policy")
    max_step_tokens: int = arg(
        256,
        "tokens per step at most: a step without the step token is closed there and marked capped",
        min=1,
        group="policy",
    )
    step_token: str = arg(
        "\\n\\n", "the string that ends a step (backslash escapes read: '\\n\\n' is two newlines)", group="policy"
    )
    calc_rate: float = arg(
        0.2,
        "--policy synthetic: chance per step of a calc slip (a wrong result later steps build on: the answer ends "
        "wrong)",
        min=0,
        max=1,
        group="search",
    )
    claim_rate: float = arg(
        0.2,
        "--policy synthetic: chance per step (where another step follows, not right after a claim) of a bare wrong "
        "claim that the next step contradicts (the answer stays right)",
        min=0,
        max=1,
        group="search",
    )
    temperature: float = arg(0.8, "policy sampling temperature", min=0, group="policy")
    top_p: float = arg(1.0, "policy nucleus sampling", above=0, max=1, group="policy")
    seed: int = arg(
        0,
        "seed of the policy (hf, vllm), particle resampling, random pick, the noise scorer and the bootstrap",
        min=0,
        group="search",
    )
    batch_questions: int = arg(
        8,
        "questions searched together (one policy and one PRM call per level for all); a killed run "
        "resumes the batch in flight from its checkpoint",
        min=1,
        group="compute",
    )
    pool_draw: Literal["steps", "whole"] = arg(
        "steps",
        "how best-of-N's pool is drawn: steps, a level per call up to the step "
        "token (as the tree searches draw); whole, each solution in one call, cut "
        "into steps afterwards (the same model; a server's batch stays full "
        "between levels)",
        group="search",
    )
    segmenter: str | None = arg(
        None,
        "--pool-draw whole: what cuts each drawn solution into steps before it is scored: paragraph, "
        "lines, markers, tokens:N (the policy's tokens) or a split rule (default: the step token, "
        "as a step-by-step draw cuts)",
        group="data",
    )
    policy_timeout: float = arg(
        600.0,
        "seconds to wait for one policy server call (a whole draw of a large batch takes longest)",
        above=0,
        group="compute",
    )
    retries: int = arg(4, "policy server retries with exponential backoff before giving up", min=0, group="compute")
    grade_workers: int = arg(2, "grading processes", min=0, group="compute")
    grade_cut_paths: bool = arg(
        False,
        "grade a path cut at --max-depth (the policy never ended it) by the last number in its text, "
        "GSM8K's fallback, instead of as no answer",
        group="search",
    )
    grade_timeout: float = arg(
        5.0, "seconds per grade; a grade that takes longer is 'unknown', not wrong", above=0, group="compute"
    )
    prm_max_length: int | None = arg(
        None,
        "PRM tokens per stream (default: the checkpoint's); steps past it are flagged, not scored",
        min=1,
        group="search",
    )
    prm_reference: str | None = arg(
        None, "for an implicit PRM among --prm (eurus-prm): the folder of its reference LM", group="model"
    )
    prm_kind: str | None = arg(
        None,
        "for a --prm folder whose config cannot say its kind (a plain causal LM: math-shepherd, rlhflow, eurus-prm): "
        "its kind, for every --prm folder biprm did not train (docs/PRMS.md)",
        group="model",
    )
    show_progress: bool = arg(
        True, "a progress bar over questions, saying what runs now (policy depth, PRM call)", group="output"
    )
    overwrite: bool = arg(
        False,
        "delete the results another search left in --out (other settings) and start afresh; a rerun of the same "
        "search resumes without it",
        group="output",
    )
    prm_cache_mb: float = arg(
        4096,
        "PRM keys and values kept between calls (incremental L2R), per PRM; past it, paths rerun from their "
        "prompt: same scores, more tokens",
        min=0,
        group="compute",
    )

    def __post_init__(self) -> None:
        check_ranges(type(self), vars(self))  # Python callers too: --width 0 would divide by zero below
        self.step_token = self.step_token.replace("\\n", "\n").replace("\\t", "\t")
        url = urlsplit(self.policy_url)
        if self.policy == "server" and (url.scheme not in ("http", "https") or not url.netloc):
            raise ValueError(
                f"--policy-url {self.policy_url!r}: expected http://HOST:PORT or https://HOST (the server's base URL)"
            )
        if self.policy == "synthetic" and synthetic_spec(self.data) is None:
            raise ValueError(
                "--policy synthetic writes the synthetic task's solutions: it needs --data synthetic[:N[:SEED]], not "
                f"{self.data!r}"
            )
        if self.policy == "synthetic" and self.pool_draw == "whole":
            raise ValueError("--pool-draw whole: the synthetic policy writes one step per call; use --pool-draw steps")
        if self.segmenter is not None:
            check_segmenter(self.segmenter)
            if self.pool_draw != "whole" or self.segmenter == "given":
                raise ValueError(
                    f"--segmenter {self.segmenter}: cuts a solution drawn whole (--pool-draw whole) into steps; "
                    "a step-by-step draw is cut by --step-token"
                )
        bad = [n for n in self.n if n % self.width and any(a in ("beam", "dvts") for a in self.algorithms)]
        if bad:
            raise ValueError(f"--n {bad[0]}: beam search and DVTS need N to be a multiple of --width {self.width}")
        if not self.prm:
            raise ValueError("--prm: name at least one PRM (a checkpoint folder, or noise)")
        names = self.prm_names
        for i, name in enumerate(names):
            if name in names[:i]:
                raise ValueError(
                    f"--prm {self.prm[names.index(name)]} and {self.prm[i]}: both are named {name!r} in the results; "
                    "give one checkpoint folder another name"
                )
            if not name or "]" in name:
                raise ValueError(
                    f"--prm {self.prm[i]}: its folder's name {name!r} cannot name its rows (empty, or holds ']')"
                )

    @property
    def prm_names(self) -> list[str]:
        """Each PRM's name in the results: its checkpoint folder's name ("runs/bi" -> "bi"), or "noise"."""
        return [Path(os.path.abspath(p)).name if p != "noise" else p for p in self.prm]
