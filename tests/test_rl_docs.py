"""Every Python snippet of docs/RL.md runs: ProcessGRPOTrainer on a tiny policy and a tiny BiPRM checkpoint,
and the OpenRLHF reward function against a running `biprm serve`."""
import functools
import re
from pathlib import Path

import pytest
import torch

from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.data.trajectory import Trajectory
from conftest import scored, serving

DOC = Path(__file__).resolve().parents[1] / "docs" / "RL.md"


def snippets() -> list[str]:
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)


def test_the_doc_has_the_snippets_these_tests_run():
    assert [("ProcessGRPOTrainer" in s, "def reward_func" in s) for s in snippets()] == [(True, False), (False, True)]


def test_the_trl_snippet_trains(tmp_path, bi_scorer, monkeypatch):
    trl = pytest.importorskip("trl")
    from test_integrations_process import tiny_policy

    monkeypatch.setattr(trl, "GRPOConfig", functools.partial(trl.GRPOConfig, use_cpu=True))  # the doc's config asks for bf16 on a GPU

    tok = load_tokenizer(resolve_backbone("tiny"))
    for folder, model, tokenizer in (("policy", tiny_policy(tok), tok), ("rm", bi_scorer.model, bi_scorer.tokenizer)):
        model.save_pretrained(tmp_path / folder)
        tokenizer.save_pretrained(tmp_path / folder)  # the PRM's own, which knows its step tag
    monkeypatch.chdir(tmp_path)
    namespace = {"POLICY": str(tmp_path / "policy"), "RM": str(tmp_path / "rm")}
    exec(snippets()[0], namespace)
    assert namespace["trainer"].state.global_step == 2 and (tmp_path / "runs" / "process-grpo").is_dir()


def test_the_openrlhf_reward_function_reduces_step_rewards(bi_scorer):
    pytest.importorskip("fastapi")
    from biprm.serve.app import build_app
    from biprm.serve.config import ServeConfig

    prompts = ["What is 3 + 4?"] * 2
    responses = ["3 + 4 = 7.\nThe answer is 7.", "3 + 4 = 8.\nSo 8.\nThe answer is 8."]
    with serving(build_app(bi_scorer, ServeConfig(model="tiny", segmenter="newline"))) as url:
        namespace = {"URL": url}
        exec(snippets()[1], namespace)
        out = namespace["reward_func"]([p + r for p, r in zip(prompts, responses)], prompts, ["7", "7"])
    want = scored(bi_scorer, [Trajectory(p, r.split("\n")) for p, r in zip(prompts, responses)])
    assert out["rewards"].tolist() == pytest.approx([want.of(i).mean() for i in range(2)], abs=1e-6)
    assert out["extra_logs"]["weak_steps"].tolist() == [float((want.of(i) < 0.5).sum()) for i in range(2)]
    assert torch.equal(out["scores"], out["rewards"])
