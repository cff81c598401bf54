"""Every PRM kind served by vLLM (vllm-cpu, fp32) as biprm's HF adapter scores it.

Each kind's tiny replica (tests/prm_replicas.py, one head of 32: vLLM's CPU attention takes no smaller) is exported
with its read-out written as the value head, including the causal-LM "+"/"-" read-outs that vLLM's own STEP pooling
gets wrong (#16545), and read as shipped, reversed and averaged (bi-static). Its logits equal
`Scorer.from_pretrained(replica)`'s within 1e-4, by token ids (`biprm serve --engine vllm`) and by text (the IO
processor's own encoding in the kind's template), over-length solutions too, and where the kind's tag is ordinary
text ("\\n") that also stands inside the question and the steps. A Qwen PRM made bidirectional by
`biprm train --init-from` (MLP head and gate) serves in `bi`; an unnamed causal LM serves given its kind; an implicit
PRM (EurusPRM), which has no read-out to export, serves on two generating engines as biprm's scorer reads it. Engines
start one at a time."""

import json
import os
import shutil
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

for _key, _value in {
    "OMP_NUM_THREADS": "1",
    "VLLM_CPU_OMP_THREADS_BIND": "nobind",
    "VLLM_CPU_KVCACHE_SPACE": "1",
}.items():
    os.environ.setdefault(_key, _value)  # 2 shared cores: no pinning, a small KV cache
pytest.importorskip("vllm", reason="vLLM is not installed: see the README for `.[vllm]` (GPU) or the vllm-cpu recipe")

from biprm.cli import main  # noqa: E402
from biprm.data.trajectory import Trajectory  # noqa: E402
from biprm.prms import KINDS as PRM_KINDS  # noqa: E402
from biprm.scoring import Scorer  # noqa: E402
from biprm.serve.export import export_for_vllm  # noqa: E402
from biprm.serve.vllm_engine import VLLMScorer  # noqa: E402
from conftest import scored  # noqa: E402
from tests.prm_replicas import PROBLEMS, REFERENCES, SOLUTIONS, build, reference_lm  # noqa: E402

KINDS = [k for k in sorted(REFERENCES) if not PRM_KINDS[k].implicit]  # those with a read-out to export
CUT_AT = 256  # tokens per stream in the over-length comparison
STREAMS = ("fused", "l2r", "r2l", "sigma")


def trajectories() -> list[Trajectory]:
    """The replicas' problems; a question and a step holding newlines (Skywork's and TRL's tag, inside RLHFlow's); a
    solution past CUT_AT."""
    lines = Trajectory("Two lines:\nwhat is 2 + 3?", ["2 + 3\n= 5.", "The answer is 5."])
    long = Trajectory("What is 1 + 2 + ... + 40?", [f"Adding {k} gives {k * (k + 1) // 2}." for k in range(1, 41)])
    return [Trajectory(q, steps) for q, steps in PROBLEMS] + [lines, long]


@pytest.fixture(scope="module")
def replicas(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("vllm-prms")
    return {kind: build(kind, root / kind, heads=1) for kind in KINDS}


@pytest.fixture(scope="module")
def real_replicas(tmp_path_factory) -> dict[str, Path]:
    """Each kind on its real vocabulary, in bf16 shards as shipped (tests/real_vocab.py), with one head of 32."""
    root = tmp_path_factory.mktemp("vllm-real")
    return {kind: build(kind, root / kind, heads=1, real=True) for kind in KINDS}


@contextmanager
def engine(path: Path, **kwargs):
    scorer = VLLMScorer.from_pretrained(str(path), max_length=4096, enforce_eager=True, max_num_seqs=32, **kwargs)
    try:
        yield scorer
    finally:
        scorer.close()


def assert_same(got, want, atol: float = 1e-4) -> float:
    """The largest difference over the streams, after checking both score the same steps."""
    assert got.offsets.tolist() == want.offsets.tolist()
    worst = 0.0
    for key in STREAMS:
        assert (getattr(got, key) is None) == (getattr(want, key) is None), key
        if getattr(want, key) is not None:
            np.testing.assert_allclose(getattr(got, key), getattr(want, key), rtol=0, atol=atol, err_msg=key)
            worst = max(worst, float(np.abs(getattr(got, key) - getattr(want, key)).max()))
    return worst


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_serves_the_hf_adapters_scores(replicas, tmp_path, kind):
    folder, trajs = replicas[kind], trajectories()
    export = export_for_vllm(str(folder), str(tmp_path / "export"), mode="bi-static")
    spec = json.loads((export / "config.json").read_text())["biprm"]
    assert (spec["prm_kind"], spec["mode"], spec["value_head"]) == (
        kind,
        "bi-static",
        "mlp" if kind == "qwen-prm" else "linear",
    )
    hf = Scorer.from_pretrained(str(folder), device="cpu", max_length=CUT_AT, prm_mode="bi-static")
    want = scored(hf, trajs)
    assert np.diff(want.offsets)[-1] < 40  # the long solution lost its tail
    with engine(export) as vllm:
        vllm.encoder.max_length = CUT_AT
        worst = assert_same(scored(vllm, trajs), want)
        by_text = vllm.llm.encode(
            {"data": [{"question": t.question, "steps": t.steps} for t in trajs[:-1]]}, pooling_task="plugin"
        )[0].outputs
    for i, answer in enumerate(by_text):  # probabilities
        for key in STREAMS:
            np.testing.assert_allclose(answer[key], want.of(i, key), atol=1e-4, err_msg=f"{key} of item {i} by text")
    for i, (q, steps) in enumerate(PROBLEMS):  # and the card's reference code, as shipped
        np.testing.assert_allclose(by_text[i]["l2r"], REFERENCES[kind](folder, q, steps), atol=1e-4)
    print(f"{kind}: max |vLLM - HF| = {worst:.2e}")


@pytest.mark.slow
def test_a_prm_made_bidirectional_serves_in_bi(replicas, tmp_path):
    """biprm train --init-from on the Qwen PRM: its output (MLP head, a trained gate) exports as a biprm checkpoint."""
    from biprm.training import TrainConfig, train

    out = train(
        TrainConfig(
            init_from=str(replicas["qwen-prm"]),
            data="synthetic:16",
            output_dir=str(tmp_path / "bi"),
            mode="bi",
            max_steps=2,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=1,
            learning_rate=1e-2,
            save_steps=100,
            show_progress=False,
        )
    )
    export = export_for_vllm(str(out), str(tmp_path / "export"))
    spec = json.loads((export / "config.json").read_text())["biprm"]
    assert (spec["prm_kind"], spec["mode"], spec["value_head"]) == ("qwen-prm", "bi", "mlp")
    want = scored(Scorer.from_pretrained(str(out), device="cpu", max_length=CUT_AT), trajectories())
    with engine(export) as vllm:
        vllm.encoder.max_length = CUT_AT
        worst = assert_same(scored(vllm, trajectories()), want)
    print(f"qwen-prm made bidirectional (bi): max |vLLM - HF| = {worst:.2e}")


@pytest.mark.slow
def test_an_unnamed_causal_lm_serves_as_shipped_with_its_kind(replicas, tmp_path, capsys):
    """`biprm export --prm-kind` of a folder whose name says nothing records the kind in l2r; a gate it lacks is refused
    in one line; the engine of `biprm serve --engine vllm` (VLLMScorer), given the kind, scores as the HF adapter
    does."""
    plain = tmp_path / "some-causal-lm"
    shutil.copytree(replicas["rlhflow"], plain)
    main(["export", "--model", str(plain), "--out", str(tmp_path / "export"), "--prm-kind", "rlhflow"])
    spec = json.loads((tmp_path / "export" / "config.json").read_text())["biprm"]
    assert (spec["prm_kind"], spec["mode"], spec["skip_prefixes"]) == ("rlhflow", "l2r", ["lm_head."])
    with pytest.raises(SystemExit):
        main(["export", "--model", str(plain), "--out", str(tmp_path / "bi"), "--prm-kind", "rlhflow", "--mode", "bi"])
    assert (
        capsys.readouterr()
        .err.strip()
        .startswith("biprm export: error: argument --prm-mode/--mode/--prm_mode: invalid choice: 'bi'")
    )
    want = scored(Scorer.from_pretrained(str(plain), device="cpu", prm_kind="rlhflow"), trajectories())
    with engine(plain, prm_kind="rlhflow") as vllm:
        worst = assert_same(scored(vllm, trajectories()), want)
    assert want.r2l is None
    print(f"rlhflow (l2r, --prm-kind): max |vLLM - HF| = {worst:.2e}")


@pytest.mark.slow
def test_an_implicit_prm_serves_on_two_engines_as_biprm_reads_it(tmp_path, capsys):
    """EurusPRM's replica and its reference LM: `biprm export` refuses it in one line (no value head); `biprm serve
    --engine vllm` runs a generating engine on each, and q from their prompt log-probs equals biprm's scorer's within
    1e-6 (fp32; q is about 1e-3), in l2r and bi-static, over-length solutions too, and through the HTTP app."""
    from fastapi.testclient import TestClient

    from biprm.serve.app import build_app
    from biprm.serve.config import ServeConfig

    folder = build("eurus-prm", tmp_path / "eurus-prm", heads=1)
    reference, trajs = str(reference_lm(folder)), trajectories()
    capsys.readouterr()  # the replica's saving
    with pytest.raises(SystemExit):
        main(["export", "--model", str(folder), "--out", str(tmp_path / "export")])
    assert capsys.readouterr().err.strip() == (
        f"biprm export: error: {folder}: an implicit PRM (eurus-prm) has no value head to export "
        "(its score is a log-ratio to a reference LM); serve it with `biprm serve --model "
        f"{folder} --engine vllm --prm-reference REFERENCE_LM`"
    )
    for mode in ("l2r", "bi-static"):
        hf = Scorer.from_pretrained(
            str(folder), device="cpu", max_length=CUT_AT, prm_reference=reference, prm_mode=mode
        )
        want = scored(hf, trajs)
        assert np.diff(want.offsets)[-1] < 40  # the long solution lost its tail
        with engine(folder, prm_reference=reference, prm_mode=mode) as vllm:
            assert vllm.mode == mode and len(vllm.processes()) == 2
            vllm.encoder.max_length = CUT_AT
            got = scored(vllm, trajs)
            with TestClient(
                build_app(vllm, ServeConfig(model=str(folder), max_length=CUT_AT, prm_reference=reference))
            ) as client:
                body = client.post(
                    "/v1/score", json=[{"question": t.question, "steps": t.steps} for t in trajs[:2]]
                ).json()
        worst = assert_same(got, want, atol=1e-6)
        for i, item in enumerate(body):
            np.testing.assert_allclose(item["fused"], want.of(i, "fused"), rtol=0, atol=1e-6)
        print(f"eurus-prm ({mode}): max |vLLM - HF| = {worst:.2e}, |q| up to {np.abs(want.fused).max():.1e}")


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_on_its_real_vocabulary_serves_the_cards_scores(real_replicas, kind):
    """The engine of `biprm serve --engine vllm` over a real-vocabulary bf16 replica: the card's scores on solutions as
    real ones read (steps ending in ".", "}" or "$", a first step starting with a space, LaTeX)."""
    folder = real_replicas[kind]
    with engine(folder) as vllm:
        got = scored(vllm, [Trajectory(q, steps) for q, steps in SOLUTIONS])
    for i, (q, steps) in enumerate(SOLUTIONS):
        np.testing.assert_allclose(got.of(i, "l2r"), REFERENCES[kind](folder, q, steps), atol=1e-4, err_msg=kind)
