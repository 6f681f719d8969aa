"""The local Kafka broker: it answers, has the flywheel's topics, round-trips a record, and stops cleanly."""

from __future__ import annotations

import socket
import uuid
from pathlib import Path

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition

from core.settings import Settings
from streams import topic_admin
from streams.broker import local_broker
from streams.topics import topics_for

pytestmark = pytest.mark.kafka


def test_broker_answers_and_up_is_idempotent(kafka_settings: Settings) -> None:
    state = local_broker.status(kafka_settings)
    assert state["running"] and state["pid"]
    assert state["bootstrap"] == kafka_settings.local_bootstrap
    assert local_broker.up(kafka_settings) == {1: state["pid"]}  # already running: no second JVM


def test_topics_exist_with_their_partitions(kafka_settings: Settings) -> None:
    specs = topics_for(kafka_settings).all()
    with KafkaAdminClient(bootstrap_servers=kafka_settings.bootstrap) as admin:
        described = {topic["name"]: topic for topic in admin.describe_topics([spec.name for spec in specs])}
    assert {name: len(topic["partitions"]) for name, topic in described.items()} == {
        spec.name: spec.partitions for spec in specs
    }
    assert topic_admin.ensure_topics(kafka_settings) == []  # idempotent: nothing left to create


def test_produced_record_is_consumed_back(kafka_settings: Settings) -> None:
    topic = topics_for(kafka_settings).steps.name
    value = uuid.uuid4().bytes * (1536 * 1024 // 16)  # 1.5 MiB: above Kafka's 1 MiB default, within our 2 MiB
    producer = KafkaProducer(bootstrap_servers=kafka_settings.bootstrap, acks="all", max_request_size=2 * 1024 * 1024)
    try:
        sent = producer.send(topic, key=b"episode-1", value=value, headers=[("kind", b"test")]).get(timeout=30)
    finally:
        producer.close()

    # Assign + seek instead of a consumer group: no rebalance to wait for, and only our record is read.
    consumer = KafkaConsumer(
        bootstrap_servers=kafka_settings.bootstrap,
        enable_auto_commit=False,
        fetch_max_bytes=4 * 1024 * 1024,
        max_partition_fetch_bytes=4 * 1024 * 1024,
    )
    try:
        partition = TopicPartition(topic, sent.partition)
        consumer.assign([partition])
        consumer.seek(partition, sent.offset)
        records = consumer.poll(timeout_ms=15_000, max_records=1).get(partition, [])
    finally:
        consumer.close()
    assert records, "the produced record was not consumed back"
    assert (records[0].key, records[0].value, records[0].headers) == (b"episode-1", value, [("kind", b"test")])


def test_down_leaves_no_process_and_restart_keeps_topics(kafka_settings: Settings) -> None:
    probe = f"{kafka_settings.topic_prefix}.restart-probe"  # a topic ensure_topics would not create again
    with KafkaAdminClient(bootstrap_servers=kafka_settings.bootstrap) as admin:
        admin.create_topics({probe: {"num_partitions": 1}}, wait_for_metadata=True)
    pid = local_broker.status(kafka_settings)["pid"]
    local_broker.down(kafka_settings)
    assert not Path(f"/proc/{pid}").exists()  # gone and reaped, not a zombie
    assert _broker_pids(kafka_settings) == []
    assert local_broker.status(kafka_settings) == {
        "running": False,
        "pid": None,
        "bootstrap": kafka_settings.bootstrap,
        "topics": None,
        "nodes": [{"node": 1, "address": kafka_settings.local_bootstrap, "pid": None}],
    }
    local_broker.down(kafka_settings)  # safe when not running

    # Restarted on the same data: storage is not formatted again and the cluster metadata survives.
    assert local_broker.up(kafka_settings)[1] != pid
    assert probe in local_broker.status(kafka_settings)["topics"]


def test_busy_port_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        settings = Settings(home=tmp_path, kafka_port=taken.getsockname()[1], bootstrap_servers="")
        with pytest.raises(local_broker.BrokerError, match="already in use"):
            local_broker.up(settings)


def _broker_pids(settings: Settings) -> list[int]:
    """Pids of live processes running this settings' broker (found by its server.properties path)."""
    props = str(settings.kafka_dir / "server.properties").encode()
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if props in (proc / "cmdline").read_bytes():
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


def test_the_brokers_own_files_are_where_the_jars_module_points():
    """The JVM's logging config and the ops files ship beside the code; a moved module must not lose them."""
    from streams.broker.jars import LOG4J2_CONFIG, OPS_DIR

    assert OPS_DIR.is_dir() and LOG4J2_CONFIG.is_file()
