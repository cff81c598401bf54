"""Dynamic batching: concurrent requests -> one `Scorer.score` call.

Requests wait in a bounded queue. One worker takes the oldest, then gathers whatever
else arrives within `max_wait_ms` or until `max_batch_tokens` tokens are gathered, and
scores them all in one call on a single worker thread (so model calls never overlap
and the event loop stays free to accept and refuse). The Scorer's own batching,
deduplication and prompt cache then apply across requests. Each request gets its own
slice of the result back.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from biprm.data.encoding import Encoded
from biprm.scoring.step_scores import StepScores


class Overloaded(RuntimeError):
    """The queue is full: the caller should answer 503 and the client retry later."""


@dataclass
class Job:
    encs: list[Encoded]
    tokens: int
    future: asyncio.Future
    queued_at: float = field(default_factory=time.perf_counter)


@dataclass
class Stats:
    """Counters for /metrics; latencies and batch sizes keep a window of the latest values."""

    requests: int = 0
    rejected: int = 0
    failed: int = 0
    batches: int = 0
    solutions: int = 0
    batch_sizes: deque = field(default_factory=lambda: deque(maxlen=1000))
    latencies: deque = field(default_factory=lambda: deque(maxlen=1000))


class Batcher:
    def __init__(
        self,
        score: Callable[[list[Encoded]], StepScores],
        max_wait_ms: float = 5.0,
        max_batch_tokens: int = 16384,
        max_queue: int = 1024,
    ):
        self.score = score
        self.max_wait, self.max_batch_tokens, self.max_queue = max_wait_ms / 1000, max_batch_tokens, max_queue
        self.queue: asyncio.Queue[Job] = asyncio.Queue()
        self.queued = 0  # solutions waiting, not yet taken into a batch
        self.busy = False  # a batch is being scored
        self.stats = Stats()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="biprm-score")
        self._task: asyncio.Task | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Finish every queued request and the batch in flight, then stop the worker."""
        while self.queued or self.busy:
            await asyncio.sleep(self.max_wait or 0.001)
        if self._task is not None:
            self._task.cancel()
        self._pool.shutdown(wait=True)

    async def submit(self, encs: list[Encoded], tokens: int) -> StepScores:
        """Scores of `encs` (`tokens` in all, both streams), in order; raises Overloaded at once when the queue has no
        room."""
        if self.queued + len(encs) > self.max_queue:
            self.stats.rejected += 1
            raise Overloaded(f"{self.queued} solutions are queued (limit {self.max_queue}); retry later")
        self.stats.requests += 1
        job = Job(encs, tokens, asyncio.get_running_loop().create_future())
        self.queued += len(encs)
        self.queue.put_nowait(job)
        return await job.future

    async def _gather(self) -> list[Job]:
        jobs = [await self.queue.get()]
        tokens = jobs[0].tokens
        deadline = time.perf_counter() + self.max_wait
        while tokens < self.max_batch_tokens:
            left = deadline - time.perf_counter()
            if left <= 0 and self.queue.empty():
                break
            try:
                job = self.queue.get_nowait() if left <= 0 else await asyncio.wait_for(self.queue.get(), left)
            except (asyncio.TimeoutError, asyncio.QueueEmpty):
                break
            jobs.append(job)
            tokens += job.tokens
        return jobs

    def _score(self, encs: list[Encoded]) -> StepScores:
        """`score`, with a StopIteration turned into an error: asyncio cannot hand one back from the executor, and the
        batch's requests (and every later one) would wait forever."""
        try:
            return self.score(encs)
        except StopIteration as error:
            raise RuntimeError(f"the scorer raised StopIteration {error!r}") from error

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            jobs = await self._gather()
            encs = [t for job in jobs for t in job.encs]
            self.busy, self.queued = True, self.queued - len(encs)
            try:
                scores = await loop.run_in_executor(self._pool, self._score, encs)
                ends = np.cumsum([len(job.encs) for job in jobs])
                parts = [scores.select(np.arange(end - len(job.encs), end)) for job, end in zip(jobs, ends)]
            except BaseException as error:  # every request of the batch learns why; the worker goes on
                self.stats.failed += len(jobs)
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(
                            error if isinstance(error, Exception) else RuntimeError(f"scoring stopped: {error!r}")
                        )
                if not isinstance(error, Exception):
                    raise
                continue
            finally:
                self.busy = False
            self.stats.batches += 1
            self.stats.solutions += len(encs)
            self.stats.batch_sizes.append(len(encs))
            now = time.perf_counter()
            for job, part in zip(jobs, parts):
                self.stats.latencies.append(now - job.queued_at)
                if not job.future.done():  # a client that went away has cancelled its future
                    job.future.set_result(part)
