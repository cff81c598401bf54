"""docs/RL.md's code blocks, run verbatim: ProcessGRPOTrainer on a tiny policy and a tiny BiPRM checkpoint, and the
OpenRLHF reward function against a running `biprm serve`; the environment variables the doc names point them there."""

import pytest
import torch

from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.data.trajectory import Trajectory
from conftest import scored, serving
from docblocks import blocks, runnable, skipped

PAGE = "RL.md"


def test_every_block_runs_here_but_the_verl_command():
    assert [(b.lang, b.not_run) for b in blocks(PAGE)] == [
        ("python", None),
        ("bash", "needs GPUs, a rollout engine and verl's own venv; the rest of the command is elided (...)"),
        ("python", None),
    ]
    assert [("ProcessGRPOTrainer" in b.code, "def reward_func" in b.code) for b in runnable(PAGE)] == [
        (True, False),
        (False, True),
    ]


test_a_block_marked_not_run_is_skipped_with_its_reason = skipped(PAGE)


def test_the_trl_snippet_trains(tmp_path, bi_scorer, monkeypatch):
    pytest.importorskip("trl")
    from test_integrations_process import tiny_policy

    tok = load_tokenizer(resolve_backbone("tiny"))
    tok.chat_template = (
        "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"  # the doc's prompts are chats; SmolLM2 has one
    )
    for folder, model, tokenizer in (("policy", tiny_policy(tok), tok), ("rm", bi_scorer.model, bi_scorer.tokenizer)):
        model.save_pretrained(tmp_path / folder)
        tokenizer.save_pretrained(tmp_path / folder)  # the PRM's own, which knows its step tag
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BIPRM_POLICY", str(tmp_path / "policy"))
    monkeypatch.setenv("BIPRM_RM", str(tmp_path / "rm"))
    namespace = {"__name__": "__main__"}  # as `python file.py` runs it
    exec(runnable(PAGE)[0].code, namespace)
    assert namespace["trainer"].state.global_step == 2 and (tmp_path / "runs" / "process-grpo").is_dir()


def test_the_openrlhf_reward_function_reduces_step_rewards(bi_scorer, monkeypatch):
    pytest.importorskip("fastapi")
    from biprm.serve.app import build_app
    from biprm.serve.config import ServeConfig

    prompts = ["What is 3 + 4?"] * 2
    responses = ["3 + 4 = 7.\nThe answer is 7.", "3 + 4 = 8.\nSo 8.\nThe answer is 8."]
    with serving(build_app(bi_scorer, ServeConfig(model="tiny", segmenter="newline"))) as url:
        monkeypatch.setenv("BIPRM_URL", url)
        namespace = {}
        exec(runnable(PAGE)[1].code, namespace)
        out = namespace["reward_func"]([p + r for p, r in zip(prompts, responses)], prompts, ["7", "7"])
    want = scored(bi_scorer, [Trajectory(p, r.split("\n")) for p, r in zip(prompts, responses)])
    assert out["rewards"].tolist() == pytest.approx([want.of(i).mean() for i in range(2)], abs=1e-6)
    assert out["extra_logs"]["weak_steps"].tolist() == [float((want.of(i) < 0.5).sum()) for i in range(2)]
    assert torch.equal(out["scores"], out["rewards"])
