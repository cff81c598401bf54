"""Two optimizer steps (accumulating 2 micro-batches each) of a LoRA BiPRM under DeepSpeed ZeRO-2 in bf16 on the CPU
(gloo, one process) with the shipped configs/ds_zero2.json, then `biprm train`'s merged save with the heads' fp32
masters. Prints the engine's gradient accumulation dtype and how the saved heads relate to the masters and to the
module's bf16 copies; run by tests/test_distributed.py."""

import json
import sys
from pathlib import Path

import deepspeed
import torch
from safetensors.torch import load_file

from biprm.backbones import load_tokenizer, resolve_backbone
from biprm.data.encoding import Encoder
from biprm.data.trajectory import Trajectory
from biprm.lora import lora_head_masters, save_merged, with_lora
from biprm.modeling import from_backbone
from biprm.packing import pack

out = Path(sys.argv[1])
deepspeed.init_distributed(dist_backend="gloo")  # the process group torchrun describes
config = json.loads((Path(__file__).parents[1] / "configs" / "ds_zero2.json").read_text())
config.update(
    bf16={"enabled": True},
    train_micro_batch_size_per_gpu=2,
    gradient_accumulation_steps=2,
    gradient_clipping=1.0,
    train_batch_size=4,
    zero_allow_untested_optimizer=True,
)
config["zero_optimization"]["reduce_bucket_size"] = 1000
path = resolve_backbone("tiny")
tokenizer = load_tokenizer(path)
model = with_lora(from_backbone(path, tokenizer, mode="bi"), r=2, alpha=4)
engine, *_ = deepspeed.initialize(
    model=model, optimizer=torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3), config=config
)
encoder = Encoder(tokenizer, model.get_base_model().config.step_tag_id)
trajs = [
    Trajectory("What is 2 + 3?", ["2 + 3 = 5.", "The answer is 5."], [1, 1]),
    Trajectory("What is 4 * 2?", ["4 * 2 = 6.", "The answer is 6."], [0, 0]),
]
batch = pack([encoder.encode(t) for t in trajs], "bi")
for _ in range(4):
    engine.backward(engine(**batch).loss)
    engine.step()
masters = lora_head_masters(engine.module)
copies = {
    n.replace(".modules_to_save.default", ""): p.detach().float().clone()
    for n, p in engine.module.get_base_model().named_parameters()
    if ".modules_to_save.default." in n
}
save_merged(engine.module, tokenizer, out, masters)
saved = load_file(str(out / "model.safetensors"))
print(
    json.dumps(
        {
            "optimizer_steps": engine.global_steps,
            "grad_accum_dtype": str(engine.get_data_types()[1]),
            "heads": sorted(masters),
            "saved_dtypes": sorted({str(saved[n].dtype) for n in masters}),
            "saved_are_the_masters": all(torch.equal(saved[n], masters[n]) for n in masters),
            "masters_round_to_the_copies": all(torch.equal(masters[n].bfloat16().float(), copies[n]) for n in masters),
            "masters_finer_than_bf16": any(not torch.equal(m, m.bfloat16().float()) for m in masters.values()),
        }
    )
)
