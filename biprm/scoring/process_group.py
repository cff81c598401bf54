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
