"""The edge spool: order, bounds, restart, and a broker that is away for a minute."""

from __future__ import annotations

import time
import uuid

import pytest
from kafka import TopicPartition

from edge_client.spool import Spool, SpoolFull, SpoolingPublisher
from flywheel.kafka_clients import make_consumer, make_producer
from streams import broker
from streams.topics import topics_for


def test_spool_keeps_order_and_survives_a_restart(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    for i in range(5):
        spool.append("t", b"k", f"v{i}".encode())
    first_two = spool.pending(2)
    spool.advance(first_two[-1].end, 2)
    spool.close()
    reopened = Spool(tmp_path, max_bytes=1 << 20)  # a client restarted after a crash
    assert reopened.pending_records == 3
    assert [r.value for r in reopened.pending(10)] == [b"v2", b"v3", b"v4"]
    rest = reopened.pending(10)
    reopened.advance(rest[-1].end, 3)
    assert reopened.pending_records == 0 and reopened.size() == 0  # drained: the file starts afresh


def test_full_spool_refuses_clearly_and_keeps_what_it_has(tmp_path):
    spool = Spool(tmp_path, max_bytes=100)
    spool.append("t", b"k", b"x" * 50)
    with pytest.raises(SpoolFull, match="bound is 100"):
        spool.append("t", b"k", b"y" * 50)
    assert [r.value for r in spool.pending(10)] == [b"x" * 50]


@pytest.mark.kafka
def test_events_published_while_the_broker_is_down_arrive_in_order_once(kafka_settings):
    settings = kafka_settings.model_copy(update={"topic_prefix": f"spool-{uuid.uuid4().hex[:8]}"})
    broker.ensure_topics(settings)
    topic = topics_for(settings).steps.name
    spool_dir = settings.home / "spool" / settings.topic_prefix
    publisher = SpoolingPublisher(Spool(spool_dir, 1 << 24), lambda: make_producer(settings, "spool-test"))
    sent = []

    def act_for(seconds: float) -> None:  # the client keeps acting whatever Kafka does
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            value = f"event-{len(sent)}".encode()
            publisher.publish(topic, b"episode-1", value)  # one key: one partition, order must hold
            sent.append(value)
            time.sleep(0.05)

    act_for(3)
    broker.down(settings)
    try:
        act_for(62)  # the broker is away for over a minute
        assert publisher.depth() > 0 and not publisher.online
    finally:
        broker.up(settings)
    act_for(3)
    assert publisher.close(timeout_s=120) == 0

    consumer = make_consumer(settings, "spool-check", consumer_timeout_ms=3000)
    partitions = [TopicPartition(topic, p) for p in range(settings.topic_partitions)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    received = [record.value for record in consumer]
    consumer.close()
    assert received == sent  # all of them, once each, in order
