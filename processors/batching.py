"""Batches of stream events for the Delta sinks, acknowledged only after they are written.

faust's `take_events` records the wrong event for some values (seen here: the last offset of a
partition twice, another offset never), so the sinks batch `stream.noack().events()` themselves.
Acking after the write matters: faust commits acked offsets to Kafka, and an offset committed
before its rows are in Delta would be lost by a crash in between.

The stream keeps reading while a batch is written: the next batch fills behind the write in flight
and ages from its own first event. When reading stopped for each write, a step that arrived during
one waited that write, then the batch age, then its own write (on an object store, where a commit is
several round trips, that was the p99). Writes stay one at a time and in order (the episode assembler
and each commit's offsets need it); the stream waits only when a full batch is already queued.

A busy stream's batch is due sooner: one of `early_size` events is due at `early_age_s` (the p99 at 1,000 steps/s
was the whole age plus a commit, over 1 s). A quiet stream's batches still wait the whole age, so the tables' files
stay few; a backlog still fills whole batches, so a drain keeps their throughput.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from faust.types import EventT


def ack_each(events: list[EventT]) -> None:
    """faust events: acked once written, so faust commits their offsets."""
    for event in events:
        event.ack()


def batch_due(size: int, age_s: float, max_size: int, max_age_s: float, early_size: int, early_age_s: float) -> bool:
    """Full, as old as the age, or busy enough to go early (early_size 0: never)."""
    return size >= max_size or (size > 0 and (age_s >= max_age_s or (0 < early_size <= size and age_s >= early_age_s)))


@dataclass
class Batcher:
    flush: Callable[[list[EventT]], Awaitable[None]]
    on_failure: Callable[[BaseException], None]  # the batch stays un-acked; the worker must restart
    max_size: int = 500
    max_age_s: float = 1.0
    early_size: int = 0  # 0: never early
    early_age_s: float = 0.0
    acknowledge: Callable[[list], None] = ack_each  # once written (plain records: their offsets are in the commit)
    events: list[EventT] = field(default_factory=list)  # the batch filling, not yet being written
    first_at: float = 0.0
    writing: asyncio.Task | None = None  # the batch being written, at most one
    failed: BaseException | None = None

    def should_flush(self) -> bool:
        return batch_due(len(self.events), time.monotonic() - self.first_at, self.max_size, self.max_age_s,
                         self.early_size, self.early_age_s)  # fmt: skip

    def busy(self) -> bool:
        return self.writing is not None and not self.writing.done()

    async def add(self, event: EventT) -> None:
        await self.extend([event])

    async def extend(self, events: list) -> None:
        """Add events (a whole fetch at most `room()` long); wait only while a full batch is queued behind a write."""
        self.raise_if_failed()
        if events and not self.events:
            self.first_at = time.monotonic()
        self.events += events
        while len(self.events) >= self.max_size and self.busy():
            await asyncio.shield(self.writing)  # backpressure: one full batch behind the write is enough
        self.raise_if_failed()
        self.start_write_if_due()

    def room(self) -> int:
        """Events the filling batch still takes before it is full."""
        return max(0, self.max_size - len(self.events))

    async def flush_if_due(self) -> None:
        """Called by a timer, so a quiet stream still flushes its last events."""
        self.start_write_if_due()

    async def drain(self) -> None:
        """Until every event added so far is written (or a write failed)."""
        while self.busy() or (self.events and not self.failed):
            if not self.busy():
                self.start_write()
            await asyncio.shield(self.writing)

    def start_write_if_due(self) -> None:
        if self.should_flush() and not self.busy() and not self.failed:
            self.start_write()

    def start_write(self) -> None:
        events, self.events = self.events, []
        self.writing = asyncio.ensure_future(self.write(events))

    async def write(self, events: list[EventT]) -> None:
        try:
            await self.flush(events)
        except Exception as error:
            self.events[:0] = events  # never acked, never dropped
            self.failed = error
            self.on_failure(error)
            return
        self.acknowledge(events)
        self.writing = None
        self.start_write_if_due()  # the batch that filled meanwhile may be due already

    def raise_if_failed(self) -> None:
        if self.failed is not None:
            raise self.failed
