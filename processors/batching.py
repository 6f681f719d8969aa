"""Batches of stream events for the Delta sinks, acknowledged only after they are written.

faust's `take_events` records the wrong event for some values (seen here: the last offset of a
partition twice, another offset never), so the sinks batch `stream.noack().events()` themselves.
Acking after the write matters: faust commits acked offsets to Kafka, and an offset committed
before its rows are in Delta would be lost by a crash in between.
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
    events: list[EventT] = field(default_factory=list)
    first_at: float = 0.0
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def should_flush(self) -> bool:
        return len(self.events) >= self.max_size or (
            bool(self.events) and time.monotonic() - self.first_at >= self.max_age_s
        )

    async def add(self, event: EventT) -> None:
        if not self.events:
            self.first_at = time.monotonic()
        self.events.append(event)
        if self.should_flush():
            await self.flush_now()

    async def flush_if_due(self) -> None:
        """Called by a timer, so a quiet stream still flushes its last events."""
        if self.should_flush():
            await self.flush_now()

    async def flush_now(self) -> None:
        async with self.lock:
            events, self.events = self.events, []
            if not events:
                return
            try:
                await self.flush(events)
            except Exception as error:
                self.events[:0] = events  # never acked, never dropped
                self.on_failure(error)
                raise
            for event in events:
                event.ack()
