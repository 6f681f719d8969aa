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
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from faust.types import EventT


@dataclass
class Batcher:
    flush: Callable[[list[EventT]], Awaitable[None]]
    on_failure: Callable[[BaseException], None]  # the batch stays un-acked; the worker must restart
    max_size: int = 500
    max_age_s: float = 1.0
    events: list[EventT] = field(default_factory=list)  # the batch filling, not yet being written
    first_at: float = 0.0
    writing: asyncio.Task | None = None  # the batch being written, at most one
    failed: BaseException | None = None

    def should_flush(self) -> bool:
        return len(self.events) >= self.max_size or (
            bool(self.events) and time.monotonic() - self.first_at >= self.max_age_s
        )

    def busy(self) -> bool:
        return self.writing is not None and not self.writing.done()

    async def add(self, event: EventT) -> None:
        self.raise_if_failed()
        if not self.events:
            self.first_at = time.monotonic()
        self.events.append(event)
        while len(self.events) >= self.max_size and self.busy():
            await asyncio.shield(self.writing)  # backpressure: one full batch behind the write is enough
        self.raise_if_failed()
        self.start_write_if_due()

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
        for event in events:
            event.ack()
        self.writing = None
        self.start_write_if_due()  # the batch that filled meanwhile may be due already

    def raise_if_failed(self) -> None:
        if self.failed is not None:
            raise self.failed
