"""Third-party PRM kinds: each replica loads as a user would load the real folder, and scores as its card's code
does."""

import numpy as np
import pytest

from biprm import Scorer, Trajectory
from biprm.data.template import QWEN_SYSTEM, TEMPLATES
from biprm.data.trajectory import DataError
from biprm.modeling import from_prm
from biprm.folder import NotACheckpoint, detect, resolve
from biprm.prms import KINDS, UnknownPRM
from biprm.scoring.aggregate import sigmoid
from tests.prm_replicas import PROBLEMS, REFERENCES, build, eurus_logits, reference_lm

KIND_NAMES = sorted(REFERENCES)
HEAD_KINDS = [k for k in KIND_NAMES if not KINDS[k].implicit]  # the kinds a BiPRM can be built on


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    root = tmp_path_factory.mktemp("prms")
    return {kind: build(kind, root / kind) for kind in KIND_NAMES}


def trajectories():
    return [Trajectory(q, steps) for q, steps in PROBLEMS]


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_each_kind_scores_as_its_reference_code(replicas, kind):
    folder = replicas[kind]
    assert detect(folder) == kind
    scorer = Scorer.from_pretrained(str(folder), device="cpu", prm_reference=reference_lm(folder))
    assert scorer.mode == "l2r" and scorer.model.config.prm_kind == kind
    encs, problems = scorer.encode(trajectories())
    assert not problems
    scores = scorer.score(encs, progress=False)
    for i, (q, steps) in enumerate(PROBLEMS):
        np.testing.assert_allclose(scores.of(i, "l2r"), REFERENCES[kind](folder, q, steps), atol=1e-5)


@pytest.mark.parametrize("kind", HEAD_KINDS)
def test_made_bidirectional_it_starts_as_the_source(replicas, kind):
    """--init-from: the L2R stream is the source exactly, and the gate leans on it, so fused is the source within
    1e-3."""
    folder = replicas[kind]
    model = from_prm(str(folder), mode="bi", gate_init=8.0)
    scorer = Scorer(model, Scorer.from_pretrained(str(folder), device="cpu").tokenizer)
    scores = scorer.score(scorer.encode(trajectories())[0], progress=False)
    expected = np.concatenate([REFERENCES[kind](folder, q, s) for q, s in PROBLEMS])
    np.testing.assert_allclose(sigmoid(scores.l2r), expected, atol=1e-5)
    assert np.abs(sigmoid(scores.fused) - expected).max() < 1e-3
    assert scores.r2l is not None and not np.allclose(scores.r2l, scores.l2r)  # R2L reads the steps reversed


def test_qwen_prompt_is_the_chat_template_byte_for_byte(replicas):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(replicas["qwen-prm"])
    steps = ["a", "b"]
    messages = [
        {"role": "system", "content": QWEN_SYSTEM},
        {"role": "user", "content": "Q?"},
        {"role": "assistant", "content": "<extra_0>".join(steps) + "<extra_0>"},
    ]
    card = tok.apply_chat_template(messages, tokenize=False)
    prompt, pieces = TEMPLATES["qwen-prm"].render("Q?", steps)
    assert (
        card == prompt + "".join(pieces) + "<|im_end|>\n"
    )  # the card's text, then the turn's end, which no score reads


def test_a_causal_lm_without_a_name_needs_its_kind(replicas, tmp_path):
    import shutil

    plain = tmp_path / "some-causal-lm"
    shutil.copytree(replicas["rlhflow"], plain)
    with pytest.raises(UnknownPRM, match="LlamaForCausalLM.*--prm-kind"):
        detect(plain)
    assert detect(plain, "rlhflow") == "rlhflow"
    scorer = Scorer.from_pretrained(str(plain), device="cpu", prm_kind="rlhflow")
    assert scorer.model.config.prm_kind == "rlhflow"


def test_bad_folders_and_kinds_are_one_line_errors(replicas, tmp_path):

    with pytest.raises(UnknownPRM, match="not a qwen-prm checkpoint"):
        detect(replicas["skywork-prm"], "qwen-prm")
    with pytest.raises(UnknownPRM, match="not one of"):
        detect(replicas["skywork-prm"], "nonesuch")
    (tmp_path / "config.json").write_text('{"model_type": "bert", "architectures": ["BertModel"]}')
    with pytest.raises(NotACheckpoint, match="plain bert model"):
        Scorer.from_pretrained(str(tmp_path), device="cpu")
    with pytest.raises(UnknownPRM, match="BertModel"):
        detect(tmp_path)


def test_a_step_holding_the_tag_is_refused(replicas):
    scorer = Scorer.from_pretrained(str(replicas["qwen-prm"]), device="cpu")
    with pytest.raises(DataError, match="trajectory 0.*step"):
        scorer.encode([Trajectory("Q?", ["one <extra_0> two", "three"])])


def test_every_kind_has_a_template_and_a_reference():
    assert set(KINDS) <= set(TEMPLATES) and set(KINDS) == set(REFERENCES)


def test_init_from_trains_a_bidirectional_prm_that_scores_in_its_own_template(replicas, tmp_path):
    """biprm train --init-from: R2L and the gate train on CPU from a replica; the saved model keeps the PRM's kind."""
    from safetensors.torch import load_file

    from biprm.training import TrainConfig, train

    out = train(
        TrainConfig(
            init_from=str(replicas["qwen-prm"]),
            data="synthetic:32",
            output_dir=str(tmp_path / "bi"),
            mode="bi",
            max_steps=4,
            per_device_train_batch_size=4,
            gradient_accumulation_steps=1,
            learning_rate=1e-2,
            save_steps=100,
            logging_steps=1,
            show_progress=False,
        )
    )
    weights = load_file(str(tmp_path / "bi" / "model.safetensors"))
    assert float(weights["gate.2.bias"]) != 8.0  # the gate moved from its leaning start
    scorer = Scorer.from_pretrained(out, device="cpu")
    assert scorer.model.config.prm_kind == "qwen-prm" and scorer.mode == "bi"
    assert scorer.encoder.template.kind == "qwen-prm"
    scores = scorer.score(scorer.encode(trajectories())[0], progress=False)
    assert scores.r2l is not None and scores.sigma is not None and len(scores) == len(PROBLEMS)
    # eval names the trained model by its mode, and the PRM it came from by its kind, never one as the other
    from biprm.evaluation.models import sources_of

    keys = [s.key for s in sources_of([str(replicas["qwen-prm"]), out])]
    assert keys == [
        "qwen-prm: qwen-prm (as shipped)",
        "qwen-prm: qwen-prm: steps reversed, zero-shot",
        "qwen-prm: qwen-prm: static average, zero-shot",
        "bi: bi (fused)",
        "bi: bi: L2R stream",
        "bi: bi: R2L stream",
    ]


def test_eval_processbench_prints_a_third_party_row_beside_the_text_free_rows(replicas, tmp_path):
    import json

    from biprm.cli import main

    rows = [
        {"id": f"r{i}", "problem": q, "steps": steps, "label": (i % 3) - 1} for i, (q, steps) in enumerate(PROBLEMS * 4)
    ]
    data = tmp_path / "first_error.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    main(
        [
            "eval",
            "processbench",
            "--model",
            str(replicas["qwen-prm"]),
            "--data",
            str(data),
            "--out",
            str(tmp_path / "ev"),
        ]
    )
    table = (tmp_path / "ev" / "processbench.md").read_text()
    for row in (
        "qwen-prm (as shipped)",
        "qwen-prm: steps reversed, zero-shot",
        "qwen-prm: static average, zero-shot",
        "baseline: always -1 (no error)",
        "baseline: always step 0",
    ):
        assert f"| {row}" in table, row


def test_served_over_http_it_returns_its_reference_scores(replicas):
    pytest.importorskip("fastapi")
    from fastapi.testclient import TestClient

    from biprm.serve.app import build_app
    from biprm.serve.config import ServeConfig

    folder = replicas["skywork-prm"]
    ((q, steps),) = PROBLEMS[:1]
    scorer = Scorer.from_pretrained(str(folder), device="cpu")
    with TestClient(build_app(scorer, ServeConfig(model=str(folder)))) as client:
        body = client.post("/v1/score", json={"question": q, "steps": steps}).json()
    np.testing.assert_allclose(body["l2r"], REFERENCES["skywork-prm"](folder, q, steps), atol=1e-5)
    assert body["fused"] == body["l2r"] and body["r2l"] is None


def test_a_search_scores_paths_incrementally_as_the_reference_does(replicas):
    """The search's PathScorer grows L2R on its KV cache depth by depth; every depth gives the card's scores."""
    from biprm.scoring.prefix import PrefixScorer

    folder = replicas["qwen-prm"]
    prefix, scratch = (PrefixScorer.from_pretrained(str(folder), incremental=i, device="cpu") for i in (True, False))
    for depth in (1, 2, 3):
        paths = [steps[:depth] for _, steps in PROBLEMS]
        got = prefix.score([q for q, _ in PROBLEMS], paths, streams="l2r")
        scratch.score([q for q, _ in PROBLEMS], paths, streams="l2r")
        for (q, _), path, score in zip(PROBLEMS, paths, got):
            np.testing.assert_allclose(sigmoid(score.fused), REFERENCES["qwen-prm"](folder, q, path), atol=1e-5)
    assert prefix.tokens["l2r"] < scratch.tokens["l2r"]  # the earlier steps came from the cache


def test_search_library_adapters_take_any_kind(replicas):
    """search-and-learn's PRM.score and its_hub's AbstractProcessRewardModel over a math-shepherd replica: the card's
    scores."""
    from biprm.integrations.search_and_learn import SearchAndLearnPRM
    from biprm.scoring.prefix import PrefixScorer

    folder = replicas["math-shepherd"]
    prm = SearchAndLearnPRM(PrefixScorer.from_pretrained(str(folder), device="cpu"))
    got = prm.score([q for q, _ in PROBLEMS], [["\n\n".join(steps)] for _, steps in PROBLEMS])
    for (q, steps), per_question in zip(PROBLEMS, got):
        np.testing.assert_allclose(per_question[0], REFERENCES["math-shepherd"](folder, q, steps), atol=1e-5)
    pytest.importorskip("its_hub")
    from biprm.integrations.its_hub import BiPRMProcessRewardModel

    hub = BiPRMProcessRewardModel(PrefixScorer.from_pretrained(str(folder), device="cpu"), aggregation="min")
    q, steps = PROBLEMS[0]
    assert hub.score(q, "\n\n".join(steps)) == pytest.approx(
        min(REFERENCES["math-shepherd"](folder, q, steps)), abs=1e-5
    )


def test_a_third_party_window_caps_max_length_and_says_so(replicas, caplog):
    """The replicas declare 4,096 positions, as Qwen2.5-Math-PRM does: a longer --max-length reads at most that."""
    with caplog.at_level("WARNING"):
        scorer = Scorer.from_pretrained(str(replicas["qwen-prm"]), device="cpu", max_length=10_000)
    assert scorer.max_length == 4096 and "window of 4096" in caplog.text


def test_a_named_kind_reaches_every_command_for_a_folder_whose_config_cannot_say(replicas, tmp_path):
    """A causal LM's folder named like any other: --prm-kind gets it past the up-front check of score, serve and
    eval."""
    import json
    import shutil

    from biprm.cli import main

    plain = tmp_path / "my-prm"
    shutil.copytree(replicas["math-shepherd"], plain)
    with pytest.raises(NotACheckpoint, match="plain mistral model"):
        resolve(str(plain))
    resolve(str(plain), "math-shepherd")
    with pytest.raises(NotACheckpoint, match="not a qwen-prm checkpoint"):
        resolve(str(plain), "qwen-prm")
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"question": q, "steps": s}) + "\n" for q, s in PROBLEMS))
    main(
        [
            "score",
            "--model",
            str(plain),
            "--prm-kind",
            "math-shepherd",
            "--input",
            str(rows),
            "--output",
            str(tmp_path / "out.jsonl"),
        ]
    )
    got = [json.loads(line)["l2r"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    for (q, steps), scores in zip(PROBLEMS, got):
        np.testing.assert_allclose(scores, REFERENCES["math-shepherd"](plain, q, steps), atol=1e-5)
    data = tmp_path / "first_error.jsonl"
    data.write_text(
        "".join(
            json.dumps({"id": f"r{i}", "problem": q, "steps": s, "label": -1}) + "\n"
            for i, (q, s) in enumerate(PROBLEMS)
        )
    )
    main(
        [
            "eval",
            "processbench",
            "--model",
            str(plain),
            "--prm-kind",
            "math-shepherd",
            "--data",
            str(data),
            "--out",
            str(tmp_path / "ev"),
        ]
    )
    assert "| math-shepherd (as shipped)" in (tmp_path / "ev" / "processbench.md").read_text()


def _score_cli(folder, rows, out, *flags) -> list[dict]:
    import json

    from biprm.cli import main

    main(["score", "--model", str(folder), "--input", str(rows), "--output", str(out), *flags])
    return [json.loads(line) for line in out.read_text().splitlines()]


def test_score_reads_a_third_party_prm_reversed_and_averaged_when_asked(replicas, tmp_path):
    """`--prm-mode r2l` reads the steps reversed after the question; bi-static keeps both streams (its L2R stream is the
    PRM as shipped, its R2L stream what r2l reads) and fuses their logits half and half. The reversed stream reorders
    the L2R pieces, each keeping its joiner (docs/PRMS.md), so it is near, not equal to, the card's code run on the
    reversed steps."""
    import json

    folder = replicas["math-shepherd"]
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"question": q, "steps": s}) + "\n" for q, s in PROBLEMS))
    shipped = _score_cli(folder, rows, tmp_path / "l2r.jsonl")
    reversed_ = _score_cli(folder, rows, tmp_path / "r2l.jsonl", "--prm-mode", "r2l")
    both = _score_cli(folder, rows, tmp_path / "bi.jsonl", "--prm-mode", "bi-static")
    for (q, steps), a, r, b in zip(PROBLEMS, shipped, reversed_, both):
        assert a["r2l"] is None and r["l2r"] is None
        card = REFERENCES["math-shepherd"](folder, q, steps[::-1])[::-1]
        np.testing.assert_allclose(r["r2l"], card, atol=5e-3)
        assert not np.allclose(r["r2l"], a["l2r"], atol=1e-4)
        np.testing.assert_allclose(b["l2r"], a["l2r"], atol=1e-5)
        np.testing.assert_allclose(b["r2l"], r["r2l"], atol=1e-5)
        logit = lambda p: np.log(np.asarray(p) / (1 - np.asarray(p)))  # noqa: E731
        np.testing.assert_allclose(logit(b["fused"]), (logit(b["l2r"]) + logit(b["r2l"])) / 2, atol=1e-3)


def test_a_resumed_score_keeps_the_reading_it_started_with(replicas, tmp_path, monkeypatch, capsys):
    """Parts scored reversed never join rows read as shipped: --resume with another --prm-mode is refused."""
    import json

    from biprm.cli import main

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"question": q, "steps": s}) + "\n" for q, s in PROBLEMS))
    real, calls = Scorer.score, []

    def dies_on_second_chunk(self, encs, progress=True):
        calls.append(len(encs))
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(self, encs, progress)

    monkeypatch.setattr(Scorer, "score", dies_on_second_chunk)
    argv = ["score", "--model", str(replicas["math-shepherd"]), "--input", str(rows), "--output", str(tmp_path / "o")]
    with pytest.raises(SystemExit):
        main([*argv, "--chunk", "1", "--prm-mode", "r2l"])
    monkeypatch.setattr(Scorer, "score", real)
    with pytest.raises(SystemExit):
        main([*argv, "--chunk", "1", "--resume"])
    err = capsys.readouterr().err
    assert "belongs to another run" in err and "prm_mode" in err, err
    main([*argv, "--chunk", "1", "--resume", "--prm-mode", "r2l"])
    assert all(json.loads(line)["l2r"] is None for line in (tmp_path / "o").read_text().splitlines())


def test_prm_mode_is_refused_where_it_cannot_apply(replicas, bi_scorer, tmp_path, capsys):
    """A biprm checkpoint keeps its trained mode, a gate mode would be untrained, and eval already reports all three
    readings: each is one line, before a model loads."""
    from biprm.cli import main

    bi_checkpoint = str(tmp_path / "bi")
    bi_scorer.model.save_pretrained(bi_checkpoint)
    bi_scorer.tokenizer.save_pretrained(bi_checkpoint)
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"question": "1+1?", "steps": ["2"]}\n')
    with pytest.raises(SystemExit) as stop:
        main(
            [
                "score",
                "--model",
                bi_checkpoint,
                "--input",
                str(rows),
                "--output",
                str(tmp_path / "o"),
                "--prm-mode",
                "r2l",
            ]
        )
    assert stop.value.code == 2
    assert "is a biprm checkpoint trained in mode bi, which it keeps" in capsys.readouterr().err
    with pytest.raises(ValueError, match="has no trained gate; `biprm train --init-from"):
        resolve(replicas["qwen-prm"], prm_mode="bi")
    for argv in (
        ["score", "--model", str(replicas["qwen-prm"]), "--input", str(rows), "--output", "o", "--prm-mode", "bi"],
        ["eval", "processbench", "--model", str(replicas["qwen-prm"]), "--prm-mode", "l2r"],
    ):
        with pytest.raises(SystemExit) as stop:
            main(argv)
        assert stop.value.code == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and ("invalid choice: 'bi'" in err or "all three readings" in err), err


def eurus(replicas, mode="l2r", **kwargs) -> Scorer:
    folder = replicas["eurus-prm"]
    return Scorer.from_pretrained(
        str(folder), device="cpu", prm_reference=str(reference_lm(folder)), prm_mode=mode, **kwargs
    )


def test_an_implicit_prm_reads_the_cards_log_ratios_in_both_streams(replicas):
    """EurusPRM's q per step (a logit of about 1e-3 here, where one token's share is about 1e-4) equals the card's code
    within 1e-8, with its read positions (one token past a step's "\\n\\n", the end token after the last step); the
    reversed stream is the card's code on the reversed steps; bi-static is their mean. A one-step path ends at once."""
    folder = replicas["eurus-prm"]
    problems = PROBLEMS + [(PROBLEMS[0][0], PROBLEMS[0][1][:1])]
    scorer = eurus(replicas, "bi-static")
    scores = scorer.score(scorer.encode([Trajectory(q, s) for q, s in problems])[0], progress=False)
    for i, (q, steps) in enumerate(problems):
        at = slice(scores.offsets[i], scores.offsets[i + 1])
        np.testing.assert_allclose(scores.l2r[at], eurus_logits(folder, q, steps), rtol=0, atol=1e-8)
        np.testing.assert_allclose(scores.r2l[at], eurus_logits(folder, q, steps[::-1])[::-1], rtol=0, atol=1e-8)
    np.testing.assert_allclose(scores.fused, (scores.l2r + scores.r2l) / 2)
    assert np.abs(scores.l2r).max() > 1e-4 and not np.allclose(scores.l2r, scores.r2l, atol=1e-6)


def test_an_implicit_prm_is_refused_where_it_cannot_go(replicas, tmp_path):
    """No reference, a reference of another vocabulary, a learned gate, --init-from and windows: one line each."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    folder = replicas["eurus-prm"]
    with pytest.raises(UnknownPRM, match="pass --prm-reference FOLDER"):
        Scorer.from_pretrained(str(folder), device="cpu")
    with pytest.raises(UnknownPRM, match="no config.json there"):
        Scorer.from_pretrained(str(folder), device="cpu", prm_reference=str(tmp_path))
    other = tmp_path / "other"
    Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=50,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    ).save_pretrained(other)
    with pytest.raises(UnknownPRM, match="vocabulary of 50 tokens"):
        Scorer.from_pretrained(str(folder), device="cpu", prm_reference=str(other))
    with pytest.raises(ValueError, match="as an implicit PRM it has no head to train one on"):
        eurus(replicas, "bi")
    with pytest.raises(UnknownPRM, match="has no value head"):
        from_prm(str(folder))
    with pytest.raises(ValueError, match="--overlength window"):
        eurus(replicas, overlength="window")


def test_an_implicit_prm_reaches_score_eval_and_search(replicas, tmp_path):
    """--prm-reference through the CLI: score's rows are the card's, eval prints its three rows, a search ranks by
    it."""
    import json

    from biprm.cli import main
    from biprm.scoring.prefix import PrefixScorer

    folder, ref = replicas["eurus-prm"], str(reference_lm(replicas["eurus-prm"]))
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"question": q, "steps": s}) + "\n" for q, s in PROBLEMS))
    main(
        [
            "score",
            "--model",
            str(folder),
            "--prm-reference",
            ref,
            "--input",
            str(rows),
            "--output",
            str(tmp_path / "out.jsonl"),
        ]
    )
    got = [json.loads(line)["l2r"] for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    for (q, steps), scores in zip(PROBLEMS, got):
        np.testing.assert_allclose(scores, REFERENCES["eurus-prm"](folder, q, steps), atol=1e-5)
    data = tmp_path / "first_error.jsonl"
    data.write_text(
        "".join(
            json.dumps({"id": f"r{i}", "problem": q, "steps": s, "label": (i % 3) - 1}) + "\n"
            for i, (q, s) in enumerate(PROBLEMS * 2)
        )
    )
    main(
        [
            "eval",
            "processbench",
            "--model",
            str(folder),
            "--prm-reference",
            ref,
            "--data",
            str(data),
            "--out",
            str(tmp_path / "ev"),
        ]
    )
    table = (tmp_path / "ev" / "processbench.md").read_text()
    for row in ("eurus-prm (as shipped)", "eurus-prm: steps reversed, zero-shot", "baseline: always step 0"):
        assert f"| {row}" in table, row
    prefix = PrefixScorer.from_pretrained(str(folder), device="cpu", prm_reference=ref)
    for depth in (1, 2):
        paths = [steps[:depth] for _, steps in PROBLEMS]
        for (q, _), path, score in zip(PROBLEMS, paths, prefix.score([q for q, _ in PROBLEMS], paths, streams="l2r")):
            np.testing.assert_allclose(score.fused, eurus_logits(folder, q, path), atol=1e-8)


def test_a_search_takes_a_renamed_causal_lm_prm_with_its_kind(replicas, tmp_path):
    """A math-shepherd folder whose name says nothing: search refuses it before anything loads, saying to name its
    kind; with --prm-kind it drives a search beside a biprm checkpoint, which keeps its own kind."""
    import shutil

    from biprm.search.config import SearchConfig
    from biprm.search.run import kind_of, run_search

    plain = tmp_path / "my-prm"
    shutil.copytree(replicas["math-shepherd"], plain)
    task = dict(data="synthetic:2", policy="synthetic", algorithms=["bon"], n=[2], show_progress=False)
    with pytest.raises(NotACheckpoint, match="--prm .*name the kind with --prm-kind"):
        run_search(SearchConfig(out=str(tmp_path / "refused"), prm=[str(plain)], **task))
    assert not (tmp_path / "refused").exists()
    cfg = SearchConfig(out=str(tmp_path / "out"), prm=[str(plain)], prm_kind="math-shepherd", **task)
    summary = run_search(cfg)
    assert "bon" in summary and (tmp_path / "out" / "questions.jsonl").exists()
    bi = tmp_path / "bi"
    (bi).mkdir()
    (bi / "config.json").write_text('{"model_type": "biprm"}')
    assert kind_of(cfg, str(bi)) is None and kind_of(cfg, str(plain)) == "math-shepherd"


def test_a_search_with_an_implicit_prm_and_no_reference_stops_before_anything_loads(replicas, tmp_path):
    import json

    from biprm.search.config import SearchConfig
    from biprm.search.run import run_search

    data = tmp_path / "questions.jsonl"
    data.write_text(json.dumps({"question": "What is 2 + 3?", "answer": "5"}) + "\n")
    cfg = SearchConfig(
        out=str(tmp_path / "out"), data=str(data), prm=[str(replicas["eurus-prm"])], algorithms=["bon"], n=[2]
    )
    with pytest.raises(NotACheckpoint, match="--prm .*pass --prm-reference FOLDER"):
        run_search(cfg)
    assert not (tmp_path / "out").exists()


def test_eval_keeps_an_implicit_prms_scores_apart_by_reference(replicas, tmp_path):
    """Scores read against one reference LM are never served for another from eval's score cache (before: its key
    named the PRM's folder only, so a second --prm-reference got the first one's scores)."""
    import shutil

    import torch
    from transformers import Qwen2ForCausalLM

    from biprm.config import ScorerSettings
    from biprm.evaluation.cache import ScoreCache

    folder, reference = replicas["eurus-prm"], reference_lm(replicas["eurus-prm"])
    other = tmp_path / "other-reference"
    shutil.copytree(reference, other)
    torch.manual_seed(1)
    lm = Qwen2ForCausalLM.from_pretrained(other)
    for p in lm.parameters():
        p.data.normal_(0, 0.02)
    lm.save_pretrained(other)
    got = [
        ScoreCache(tmp_path / "cache", ScorerSettings(device="cpu", prm_reference=str(r)))
        .scores(str(folder), trajectories())
        .l2r
        for r in (reference, other)
    ]
    assert not np.allclose(got[0], got[1]) and len(list((tmp_path / "cache").rglob("scores-*.npz"))) == 2
