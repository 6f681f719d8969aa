"""Reading the compacted model-versions topic: the newest signed manifest of each channel."""

from __future__ import annotations

import time

from kafka import TopicPartition

from core.settings import Settings
from schemas import EventDecodeError, ModelVersionEvent, decode_event
from streams.kafka_clients import make_consumer
from streams.topics import topics_for


def latest_by_channel(settings: Settings, timeout_s: float = 60.0) -> dict[str, ModelVersionEvent]:
    """The newest ModelVersionEvent of each channel, read from the start of the compacted topic."""
    consumer = make_consumer(settings, "canary-reader", consumer_timeout_ms=1000)
    try:
        partition = TopicPartition(topics_for(settings).model_versions.name, 0)
        consumer.assign([partition])
        end = consumer.end_offsets([partition])[partition]
        consumer.seek_to_beginning(partition)
        latest: dict[str, ModelVersionEvent] = {}
        deadline = time.monotonic() + timeout_s
        while consumer.position(partition) < end:
            if time.monotonic() > deadline:
                raise TimeoutError(f"model versions not read to offset {end} within {timeout_s} s")
            for records in consumer.poll(timeout_ms=1000).values():
                for record in records:
                    try:
                        event = decode_event(record.value, expect=ModelVersionEvent)
                    except EventDecodeError:
                        continue
                    latest[event.channel] = event
        return latest
    finally:
        consumer.close()
