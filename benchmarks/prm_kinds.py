"""Does reading a third-party PRM cost anything? Scoring throughput of a Qwen2.5-Math-PRM-shaped folder against
biprm's own L2R scorer on the same body, side by side in one run.

Both models share one random Qwen2 body of SmolLM2-135M's size (576 wide, 30 layers). The first is laid out as a
Qwen2.5-Math-PRM checkpoint (body under "model.", the score MLP head, its chat template and <extra_0> tag) and is
read through biprm.prms; the second is a biprm `l2r` checkpoint (linear value head, biprm's template). Each scores
the same synthetic GSM8K-style solutions, in alternating rounds. The chat template makes the PRM's rows longer,
and a longer row costs more per token (attention), so the biprm model also scores the PRM's own token rows (its
tag id swapped in): that pair differs only in the adapter (template, head, read-out), which is what is measured.

    python benchmarks/prm_kinds.py [--solutions 256] [--rounds 3] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file
from transformers import Qwen2Config, Qwen2Model

from biprm import Scorer
from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.data.encoding import Encoded, add_step_tag
from biprm.data.synthetic import make_dataset
from biprm.modeling import BiPRMConfig, BiPRMModel

OUT = Path(__file__).resolve().parent


def body_config(vocab: int) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        max_position_embeddings=4096,
        tie_word_embeddings=True,
    )


def build(root: Path) -> tuple[Path, Path]:
    """(a Qwen2.5-Math-PRM-shaped folder, a biprm l2r checkpoint) on one body."""
    tokenizer = load_tokenizer(resolve_backbone("tiny"))
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>", "<extra_0>"]})
    add_step_tag(tokenizer)
    torch.manual_seed(0)
    body = Qwen2Model(body_config(len(tokenizer))).eval()
    H = body.config.hidden_size
    qwen, ours = root / "qwen-prm", root / "biprm-l2r"
    qwen.mkdir()
    head = {
        "score.0.weight": torch.randn(H, H) / H**0.5,
        "score.0.bias": torch.zeros(H),
        "score.2.weight": torch.randn(2, H) / H**0.5,
        "score.2.bias": torch.zeros(2),
    }
    save_file(
        {f"model.{k}": v.contiguous() for k, v in body.state_dict().items()} | head, str(qwen / "model.safetensors")
    )
    (qwen / "config.json").write_text(
        json.dumps(body.config.to_dict() | {"architectures": ["Qwen2ForProcessRewardModel"]})
    )
    tokenizer.save_pretrained(qwen)
    config = BiPRMConfig(
        backbone_config=body.config, mode="l2r", step_tag_id=tokenizer.convert_tokens_to_ids("<|step|>")
    )
    BiPRMModel(config, backbone=body).save_pretrained(ours)
    tokenizer.save_pretrained(ours)
    return qwen, ours


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--solutions", type=int, default=256, help="solutions scored per round")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds per model; the median is reported")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1 on a shared 2-core machine)")
    parser.add_argument(
        "--out", type=Path, default=OUT, help="folder for prm-kinds.md and .json (default: the committed ones)"
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(args.threads)
    trajs = make_dataset(args.solutions, seed=0)
    with tempfile.TemporaryDirectory() as tmp:
        folders = dict(zip(("qwen-prm", "biprm l2r"), build(Path(tmp))))
        scorers = {name: Scorer.from_pretrained(str(f), device="cpu") for name, f in folders.items()}
        encodings = {name: s.encode(trajs)[0] for name, s in scorers.items()}
        own_tag = scorers["biprm l2r"].model.config.step_tag_id
        encodings["biprm l2r, PRM's rows"] = [
            Encoded(e.prompt, [s[:-1] + [own_tag] for s in e.steps], None) for e in encodings["qwen-prm"]
        ]
        scorers["biprm l2r, PRM's rows"] = scorers["biprm l2r"]
        tokens = {name: sum(e.n_tokens for e in encs) for name, encs in encodings.items()}
        times: dict[str, list[float]] = {name: [] for name in scorers}
        for _ in range(args.rounds):
            for name, scorer in scorers.items():
                start = time.perf_counter()
                scorer.score(encodings[name], progress=False)
                times[name].append(time.perf_counter() - start)
    rows = {
        name: {
            "tokens": tokens[name],
            "seconds": statistics.median(t),
            "tokens_per_s": tokens[name] / statistics.median(t),
            "rounds_s": t,
        }
        for name, t in times.items()
    }
    ratio = rows["qwen-prm"]["tokens_per_s"] / rows["biprm l2r, PRM's rows"]["tokens_per_s"]
    result = {
        "solutions": args.solutions,
        "rounds": args.rounds,
        "threads": args.threads,
        "rows": rows,
        "throughput_ratio_qwen_prm_over_biprm_l2r_same_rows": ratio,
        "torch": torch.__version__,
    }
    (args.out / "prm-kinds.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# A third-party PRM kind against biprm's own L2R scorer, one body",
        "",
        f"`python benchmarks/prm_kinds.py --solutions {args.solutions} --rounds {args.rounds} --threads "
        f"{args.threads}` on a 2-core CPU shared with other work (median of alternating rounds).",
        "",
        "| model | stream tokens | median s | tokens/s |",
        "| --- | ---: | ---: | ---: |",
    ]
    lines += [f"| {name} | {r['tokens']} | {r['seconds']:.2f} | {r['tokens_per_s']:.0f} |" for name, r in rows.items()]
    lines += [
        "",
        f"Throughput ratio, qwen-prm / biprm l2r on the same token rows: **{ratio:.3f}** (the adapter's cost). "
        "Against biprm l2r on its own, shorter rows, the PRM is slower per token: its chat template makes every row "
        "longer, and attention grows with the row.",
        "",
    ]
    (args.out / "prm-kinds.md").write_text("\n".join(lines))
    print("\n".join(lines), file=sys.stderr)


if __name__ == "__main__":
    main()
