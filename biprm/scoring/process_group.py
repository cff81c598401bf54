"""The one process group of `accelerate launch` / `torchrun`, shared by `biprm score` and `biprm eval`."""

from __future__ import annotations

from datetime import timedelta

WAIT = timedelta(days=7)  # how long a process waits on the others: a done process may wait for hours


def process_state():
    """accelerate's PartialState: gloo between processes where there is no GPU. A process that is done
    waits for the slowest one, or for the next job, possibly for hours, so the group's timeout is a week."""
    import torch
    from accelerate import PartialState

    return PartialState(cpu=not torch.cuda.is_available(), timeout=WAIT)


def close_processes() -> None:
    """End a command that ran on several processes: wait for every process, then close the group (and forget the
    state that holds it, so a later command in the same Python process starts afresh). A process that exits with the
    group open can abort in gloo's teardown ("terminate called without an active exception"), and torchrun then
    reports a run that finished as failed. Alone, nothing to do."""
    import torch.distributed as dist
    from accelerate import PartialState

    if dist.is_available() and dist.is_initialized():
        process_state().wait_for_everyone()
        dist.destroy_process_group()
        PartialState._reset_state()
