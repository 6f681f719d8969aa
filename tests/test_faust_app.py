"""The faust app's consumer settings that the pipeline's throughput and latency depend on."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from types import SimpleNamespace

import aiokafka
import pytest

from core.settings import Settings
from processors import faust_transport
from processors.faust_app import broker_url, make_app
from processors.table_rows import utc_date
from streams.kafka_clients import make_admin, make_producer


def test_the_worker_consumer_waits_briefly_on_fetches_and_fetches_large_batches(tmp_path):
    async def created_consumer():
        app = make_app(Settings(data_dir=tmp_path, bootstrap_servers="127.0.0.1:1,127.0.0.1:2"))
        consumer = app.consumer._thread._create_worker_consumer(app.transport)
        try:
            hosts = [(host, port) for host, port, _family in consumer._client.hosts]
            return consumer._fetch_max_wait_ms, consumer._max_partition_fetch_bytes, hosts
        finally:
            await consumer.stop()

    fetch_wait_ms, partition_fetch_bytes, hosts = asyncio.run(created_consumer())
    assert fetch_wait_ms == faust_transport.FETCH_MAX_WAIT_MS < 1500  # faust's own fixed wait
    assert partition_fetch_bytes >= 32 * 1024 * 1024
    assert sorted(hosts) == [("127.0.0.1", 1), ("127.0.0.1", 2)]  # every bootstrap server reached the consumer


def test_broker_urls_carry_every_server_with_the_scheme():
    assert broker_url(" h1:9092, h2:9093,") == "kafka://h1:9092;kafka://h2:9093"
    assert broker_url("h1:9092", faust_transport.SCHEME) == f"{faust_transport.SCHEME}://h1:9092"


def test_the_partition_date_is_the_utc_day_on_both_sides_of_midnight():
    for stamp in (0.0, 86399.999, 86400.0, 1_764_460_799.5, 1_764_460_800.0):
        assert utc_date(stamp) == datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%d")


def test_a_delivery_runs_to_the_end_unless_the_flow_is_interrupted_first():
    async def scenario(interrupt_first: bool, fail: bool = False):
        delivered = []

        async def callback(message):
            await asyncio.sleep(0.01)
            if fail:
                raise ValueError("bad message")
            delivered.append(message)

        consumer = SimpleNamespace(callback=callback)
        interrupted = asyncio.get_running_loop().create_future()
        if interrupt_first:
            interrupted.set_result(None)  # a rebalance suspended the flow
        await faust_transport.Consumer._deliver(consumer, "m", interrupted)
        await asyncio.sleep(0.02)  # a cancelled delivery must not finish later either
        return delivered

    assert asyncio.run(scenario(interrupt_first=False)) == ["m"]
    assert asyncio.run(scenario(interrupt_first=True)) == []
    with pytest.raises(ValueError, match="bad message"):
        asyncio.run(scenario(interrupt_first=False, fail=True))


def test_a_rewind_reaches_the_partitions_nothing_was_committed_for(kafka_settings):
    """aiokafka's own seek_to_committed leaves such a partition's position past the records faust dropped in a
    rebalance (the chaos run lost an episode so); the worker's rewind reads them again from the beginning."""
    topic = f"{kafka_settings.topic_prefix}.rewind-{uuid.uuid4().hex[:8]}"
    with make_admin(kafka_settings, "rewind-test") as admin:
        admin.create_topics({topic: {"num_partitions": 1}}, wait_for_metadata=True)
    producer = make_producer(kafka_settings, "rewind-test")
    for value in (b"a", b"b", b"c"):
        producer.send(topic, value)
    producer.flush()
    producer.close()

    async def first_offset_read_again(rewind) -> int | None:
        consumer = aiokafka.AIOKafkaConsumer(
            bootstrap_servers=kafka_settings.bootstrap, group_id=topic, enable_auto_commit=False,
            auto_offset_reset="earliest",
        )  # fmt: skip
        await consumer.start()
        try:
            tp = aiokafka.TopicPartition(topic, 0)
            consumer.assign([tp])
            read = []
            while len(read) < 3:  # the whole partition fetched, nothing committed
                read += (await consumer.getmany(tp, timeout_ms=2000)).get(tp, [])
            await rewind(consumer)
            again = (await consumer.getmany(tp, timeout_ms=500)).get(tp, [])
            return again[0].offset if again else None
        finally:
            await consumer.stop()

    assert asyncio.run(first_offset_read_again(aiokafka.AIOKafkaConsumer.seek_to_committed)) is None
    assert asyncio.run(first_offset_read_again(faust_transport.rewind_to_committed)) == 0
