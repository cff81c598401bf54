"""Two optimizer steps of a BiPRM under DeepSpeed ZeRO-3 in bf16 on the CPU (gloo, one process), built the way
`biprm train` builds it there: with transformers' DeepSpeed config active, so the body loads partitioned under
zero.Init in the engine's dtype. Prints the losses, the heads' output dtype, the dtype the engine accumulates gradients
in, and how their fp32 masters (what a save writes) relate to the module's bf16 copies; run by
tests/test_distributed.py."""

import json
from pathlib import Path

import deepspeed
import torch
from transformers.integrations import HfDeepSpeedConfig

from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.data.encoding import Encoder
from biprm.data.trajectory import Trajectory
from biprm.modeling import from_backbone, head_masters
from biprm.packing import pack

deepspeed.init_distributed(dist_backend="gloo")  # the process group torchrun describes (tests/test_distributed.py)
config = json.loads((Path(__file__).parents[1] / "configs" / "ds_zero3.json").read_text())
config.update(
    bf16={"enabled": True},
    train_micro_batch_size_per_gpu=2,
    gradient_accumulation_steps=1,
    gradient_clipping=1.0,
    train_batch_size=2,
    zero_allow_untested_optimizer=True,
)
for key in ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold"):
    config["zero_optimization"][key] = 1000
active = HfDeepSpeedConfig(config)  # what TrainingArguments(deepspeed=...) sets before the Trainer builds the model
path = resolve_backbone("tiny")
tokenizer = load_tokenizer(path)
model = from_backbone(path, tokenizer, mode="bi")
engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), config=config)
encoder = Encoder(tokenizer, model.config.step_tag_id)
trajs = [
    Trajectory("What is 2 + 3?", ["2 + 3 = 5.", "The answer is 5."], [1, 1]),
    Trajectory("What is 4 * 2?", ["4 * 2 = 6.", "The answer is 6."], [0, 0]),
]
batch = pack([encoder.encode(t) for t in trajs], "bi")
losses = []
for _ in range(2):
    out = engine(**batch)
    engine.backward(out.loss)
    engine.step()
    losses.append(float(out.loss))
masters = head_masters(engine.module)
heads = [p for n, p in engine.module.named_parameters() if n in masters]
with deepspeed.zero.GatheredParameters(heads):  # the module's bf16 copies, whole
    copies = {n: p.detach().float().clone() for n, p in engine.module.named_parameters() if n in masters}
print(
    json.dumps(
        {
            "losses": losses,
            "fused_dtype": str(out.fused.dtype),
            "heads": sorted(masters),
            "grad_accum_dtype": str(engine.get_data_types()[1]),
            "master_dtypes": sorted({str(m.dtype) for m in masters.values()}),
            "masters_round_to_the_copies": all(torch.equal(masters[n].bfloat16().float(), copies[n]) for n in masters),
            "masters_finer_than_bf16": any(not torch.equal(m, m.bfloat16().float()) for m in masters.values()),
        }
    )
)
