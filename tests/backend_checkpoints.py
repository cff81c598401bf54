"""Run under `torchrun --standalone --nproc_per_node 2`: the backend parts of Trainer checkpoints, written by the
real libraries on CPU (gloo), into OUT/<layout>/checkpoint-2 after 2 optimizer steps of a small model.

- fsdp-full, fsdp-sharded: accelerate's own FSDP save functions (the ones the Trainer calls) on a torch FSDP2 model;
- deepspeed: DeepSpeed's ZeRO-3 engine `save_checkpoint`, if deepspeed is installed.

accelerate starts neither backend on a CPU, so `biprm train` cannot write these here; the test adds the
files the Trainer writes around them (tests/test_resume_backends.py).
"""

import sys
from pathlib import Path
from types import SimpleNamespace

import torch


def small_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 1))


def fsdp(out: Path) -> None:
    import torch.distributed as dist
    from accelerate.utils import FullyShardedDataParallelPlugin, save_fsdp_model, save_fsdp_optimizer
    from torch.distributed.fsdp import fully_shard

    model = small_model()
    for layer in model:
        fully_shard(layer)
    fully_shard(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(2):
        model(torch.randn(4, 8)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    rank = dist.get_rank()
    accelerator = SimpleNamespace(
        process_index=rank, num_processes=dist.get_world_size(), is_fsdp2=True, is_main_process=rank == 0
    )
    for layout, kind in (("fsdp-full", "FULL_STATE_DICT"), ("fsdp-sharded", "SHARDED_STATE_DICT")):
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, state_dict_type=kind)
        folder = out / layout / "checkpoint-2"
        save_fsdp_model(plugin, accelerator, model, folder)
        save_fsdp_optimizer(plugin, accelerator, optimizer, model, folder)


def deepspeed_zero3(out: Path) -> None:
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo")
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": 3},
        "zero_allow_untested_optimizer": True,
    }
    model = small_model()
    engine, *_ = deepspeed.initialize(
        model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2), config=config
    )
    for _ in range(2):
        engine.backward(engine(torch.randn(2, 8)).pow(2).mean())
        engine.step()
    engine.save_checkpoint(str(out / "deepspeed" / "checkpoint-2"))


if __name__ == "__main__":
    from accelerate import PartialState

    PartialState(cpu=True)  # the gloo group, and accelerate's logging, which its save functions use
    target = Path(sys.argv[1])
    fsdp(target)
    try:
        import deepspeed  # noqa: F401
    except ImportError:
        sys.exit(0)
    deepspeed_zero3(target)
