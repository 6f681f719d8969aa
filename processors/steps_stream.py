"""Steps from Kafka in whole fetches: a plain consumer-group consumer (aiokafka) that feeds the steps sink's batches.

Steps are the pipeline's volume: every action of every edge client. faust hands each message to its stream on its
own (an Event, a delivery, an ack each); draining a 40,000-step backlog, py-spy put about 60 % of the worker's main
thread there, and the worker kept 0.47x the pace of a bare consumer. Here a fetch is one list, appended to the
filling batch, and the batch rule is the same (processors.batching). Episodes, one per several steps, stay a faust
agent.

Exactly once stays the Delta sink's (processors.delta_sink): an assigned partition is read from the offset after
the last one the steps table's commits hold, so nothing here commits offsets to Kafka and a restart re-reads nothing
that is written. A partition about to move is written out first: its next owner finds its rows in the table, and
two writers never hold it at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener

from core.settings import Settings
from lake.tables import STEPS
from processors.batching import Batcher
from processors.delta_sink import DeltaSink
from processors.faust_transport import FETCH_MAX_WAIT_MS
from streams.kafka_clients import sasl_options, ssl_context
from streams.topics import topics_for

log = logging.getLogger(__name__)
# Up to ~6,000 screenshot-sized steps per partition and fetch: fewer fetch rounds, each a round trip.
MAX_PARTITION_FETCH_BYTES = 32 * 1024 * 1024
REBALANCE_TIMEOUT_MS = 120_000
LEAVE_DRAIN_S = 60.0  # a stopping worker writes out what it read for at most this long before it leaves the group


def steps_group(settings: Settings) -> str:
    """The steps consumers' group: under the faust app's id, so the worker role's ACLs (streams.broker.roles) cover
    it."""
    return f"{settings.topic_prefix}-flywheel-processors-steps"


def aiokafka_security(settings: Settings) -> dict[str, Any]:
    """aiokafka keyword arguments for settings.security_protocol (streams.kafka_clients has kafka-python's)."""
    protocol = settings.security_protocol
    return {"security_protocol": protocol, "ssl_context": ssl_context(settings), **sasl_options(settings)}


class StepsStream(ConsumerRebalanceListener):
    """Consumes the steps topic as one of the group `steps_group`, adding each fetch to `batcher`."""

    def __init__(self, settings: Settings, batcher: Batcher, on_assigned: Callable[[set[int]], None]):
        self.settings = settings
        self.topic = topics_for(settings).steps.name
        self.batcher = batcher
        self.on_assigned = on_assigned  # told the steps partitions this worker holds now, whole
        self.failed: BaseException | None = None  # raised by `run`: aiokafka only logs a listener's errors
        self.consumer = AIOKafkaConsumer(
            bootstrap_servers=settings.bootstrap.split(","),
            client_id=steps_group(settings),
            group_id=steps_group(settings),
            enable_auto_commit=False,
            auto_offset_reset="earliest",  # a partition whose oldest offsets the log's retention removed
            fetch_max_wait_ms=FETCH_MAX_WAIT_MS,
            max_partition_fetch_bytes=MAX_PARTITION_FETCH_BYTES,
            fetch_max_bytes=4 * MAX_PARTITION_FETCH_BYTES,
            # A dead worker's partitions move after the session timeout (faust's app uses the same).
            session_timeout_ms=10_000,
            heartbeat_interval_ms=1_000,
            # A rebalance waits for each member to write out what it read (a full batch and its commit): it must
            # not drop a member for that (aiokafka's default is the session timeout).
            rebalance_timeout_ms=REBALANCE_TIMEOUT_MS,
            **aiokafka_security(settings),
        )

    async def run(self) -> None:
        """Until cancelled; leaves the group on the way out, so its partitions move at once."""
        self.consumer.subscribe([self.topic], listener=self)
        await self.consumer.start()
        try:
            while self.failed is None:
                fetched = await self.consumer.getmany(timeout_ms=FETCH_MAX_WAIT_MS, max_records=self.batcher.room())
                await self.batcher.extend([record for records in fetched.values() for record in records])
            raise self.failed
        finally:
            # Leaving the group calls no revoke listener: write out what was read first, so the next owner of
            # these partitions finds it in the table and never writes beside this worker.
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(asyncio.shield(self.batcher.drain()), LEAVE_DRAIN_S)
            await self.consumer.stop()

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self.batcher.drain()  # what was read of them is in the table before they move

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self.consumer.pause(*assigned)  # nothing is fetched from the log's start while the table's offsets are read
        try:
            partitions = {tp.partition for tp in assigned}
            self.on_assigned(partitions)
            keys = {(self.topic, partition) for partition in partitions}
            # A sink of its own: the batches' sink may be mid-write in its thread.
            written = await asyncio.to_thread(DeltaSink(self.settings.tables_dir, STEPS).committed_offsets, keys)
            for tp in assigned:
                self.consumer.seek(tp, written[(tp.topic, tp.partition)] + 1)
            log.info("steps partitions %s, from Delta offsets %s", sorted(partitions), written)
        except Exception as error:  # a table it cannot read: the worker must not read on from the log's start
            self.failed = error
            return
        self.consumer.resume(*assigned)
