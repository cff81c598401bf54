"""What a benchmark says while it runs: first what it measures and where it writes, then each stage as it ends, with
its time, the time so far and an estimate of the time left (the stages so far, extrapolated), so a long run never
sits silent."""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager


def announce(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def clock(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.1f} min"


class Stages:
    """`with stages.stage(name):` around each of a run's `total` stages, in order."""

    def __init__(self, total: int) -> None:
        self.total, self.done, self.start = total, 0, time.perf_counter()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        began = time.perf_counter()
        announce(f"[{self.done + 1}/{self.total}] {name} ...")
        yield
        self.done += 1
        now = time.perf_counter()
        left = (now - self.start) / self.done * (self.total - self.done)
        announce(
            f"[{self.done}/{self.total}] {name}: {clock(now - began)}; {clock(now - self.start)} so far"
            + (f", about {clock(left)} left" if self.done < self.total else "")
        )
