"""The faust app's consumer settings that the pipeline's throughput and latency depend on."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from types import SimpleNamespace

import pytest

from core.settings import Settings
from processors import faust_transport
from processors.faust_app import broker_url, make_app
from processors.table_rows import utc_date


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
