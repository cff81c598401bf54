"""The vLLM search policy, in .ci/run's vLLM venv: one generate call per level, steps closed at the token cap, tokens
counted."""

import os

import pytest

for _key, _value in {
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_CPU_KVCACHE_SPACE": "1",
}.items():
    os.environ.setdefault(_key, _value)  # 2 shared cores: no pinning, a small KV cache
pytest.importorskip("vllm", reason="vLLM is not installed: see the README for `.[vllm]` (GPU) or the vllm-cpu recipe")

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from biprm.backbones import load_tokenizer, resolve_backbone  # noqa: E402
from biprm.search.policy import VLLMPolicy  # noqa: E402


@pytest.fixture(scope="module")
def policy_folder(tmp_path_factory):
    """A tiny random causal LM whose attention heads vLLM's CPU kernels take (head size 32; the built-in tiny has
    24)."""
    root = tmp_path_factory.mktemp("policy")
    tiny = resolve_backbone("tiny")
    config = AutoConfig.from_pretrained(tiny)
    config.num_attention_heads, config.num_key_value_heads, config.head_dim = 3, 1, 32
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(root)
    load_tokenizer(tiny).save_pretrained(root)
    return root


@pytest.mark.slow
def test_vllm_policy_closes_steps_at_the_cap_and_counts_tokens(policy_folder):
    policy = VLLMPolicy(str(policy_folder), max_step_tokens=6, step_token="@@never@@", temperature=0.0, dtype="float32")
    outs = policy.generate_step(
        [policy.prompt("What is 2 + 2?", []), policy.prompt("What is 3 + 3?", ["Three and three."])], 2
    )
    assert len(outs) == 4 and policy.calls == 1 and policy.tokens == sum(o.tokens for o in outs)
    assert all(o.tokens <= 6 and (o.capped or o.finished) for o in outs)
    assert any(o.capped and o.tokens == 6 for o in outs)
    assert outs[0] == outs[1]  # greedy: both samples of a prompt agree
