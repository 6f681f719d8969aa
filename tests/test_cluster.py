"""A real 3-node cluster (replication 3, min.insync.replicas 2, producers at acks=all): a real edge client, a
producer thread and the faust worker ride through a SIGKILLed leader of the steps partitions, and through a node
restarted mid-stream; every step is in the log and in Delta exactly once (lost 0, duplicated 0).

The code is the single-node broker's: only `kafka_nodes` differs (the `kafka_cluster` fixture).
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from kafka import TopicPartition

from core.processes import wait_until
from core.settings import Settings
from flywheel.run.stack import LocalStack
from lake.tables import STEPS
from schemas import StepEvent, decode_event
from streams import topic_admin
from streams.broker import local_broker
from streams.broker.properties import server_properties
from streams.kafka_clients import make_consumer
from streams.topics import topics_for
from tests.test_faults import Pipeline, Producer, episodes

EDGE_ID = "cluster-c0"
EDGE_S = 75  # the edge client acts this long once its browser is up: before, during and after the faults
THREAD_STEPS, THREAD_RATE = 1500, 15.0  # 500 three-step episodes over 100 s from the producer thread


def test_one_node_or_three_is_only_configuration(tmp_path: Path) -> None:
    one = Settings(home=tmp_path, kafka_port=30000, bootstrap_servers="")
    three = one.model_copy(update={"kafka_nodes": 3})
    assert one.local_bootstrap == "127.0.0.1:30000"
    assert three.local_bootstrap == "127.0.0.1:30000,127.0.0.1:30002,127.0.0.1:30004"

    single = server_properties(one, 1)
    assert single["controller.quorum.voters"] == "1@127.0.0.1:30001"
    assert single["log.dirs"] == str(one.kafka_dir / "data")  # the layout a single broker always had
    assert (single["default.replication.factor"], single["min.insync.replicas"]) == (1, 1)

    node2 = server_properties(three, 2)
    assert node2["node.id"] == 2
    assert node2["controller.quorum.voters"] == "1@127.0.0.1:30001,2@127.0.0.1:30003,3@127.0.0.1:30005"
    assert node2["listeners"] == "PLAINTEXT://127.0.0.1:30002,CONTROLLER://127.0.0.1:30003"
    assert node2["log.dirs"] == str(three.kafka_dir / "cluster-3" / "node-2" / "data")
    replication = ("default.replication.factor", "offsets.topic.replication.factor", "min.insync.replicas",
                   "transaction.state.log.replication.factor", "transaction.state.log.min.isr")  # fmt: skip
    assert [node2[key] for key in replication] == [3, 3, 2, 3, 2]


@pytest.mark.kafka
def test_three_nodes_run_and_replicate_every_topic(kafka_cluster: LocalStack) -> None:
    settings = kafka_cluster.settings
    state = local_broker.status(settings)
    pids = {node["node"]: node["pid"] for node in state["nodes"]}
    assert sorted(pids) == [1, 2, 3] and all(pids.values()) and len(set(pids.values())) == 3
    assert local_broker.up(settings) == pids  # all running: no JVM more
    for spec in topics_for(settings).all():
        for partition in topic_admin.partitions(settings, spec.name).values():
            assert len(partition.replicas) == 3 and set(partition.isr) == set(partition.replicas), spec.name


def _steps_topic(settings: Settings) -> str:
    return topics_for(settings).steps.name


def kill_the_steps_leader(stack: LocalStack) -> None:
    """SIGKILL the node leading the most steps partitions; wait until they have new leaders (it is fenced)."""
    leaders = Counter(p.leader for p in topic_admin.partitions(stack.settings, _steps_topic(stack.settings)).values())
    node = leaders.most_common(1)[0][0]
    stack.stop_node(node, signal.SIGKILL)

    def led_elsewhere() -> bool:
        states = topic_admin.partitions(stack.settings, _steps_topic(stack.settings)).values()
        return all(p.leader not in (node, -1) and node not in p.isr for p in states)

    wait_until(led_elsewhere, 60, what=f"new leaders for the steps partitions node {node} led")


def restart_a_node(stack: LocalStack) -> None:
    """Stop the leader of steps partition 0 (SIGTERM), let the stream run on two nodes, start it, wait until it is
    back in the ISR of every steps partition."""
    node = topic_admin.partitions(stack.settings, _steps_topic(stack.settings))[0].leader
    stack.stop_node(node, signal.SIGTERM)
    time.sleep(5)
    stack.start_node(node)

    def back_in_sync() -> bool:
        return all(node in p.isr for p in topic_admin.partitions(stack.settings, _steps_topic(stack.settings)).values())

    wait_until(back_in_sync, 90, what=f"node {node} back in every ISR")


@pytest.mark.kafka
@pytest.mark.browser
def test_edge_client_and_worker_ride_through_with_nothing_lost_or_duplicated(
    cluster_stack: LocalStack, tmp_path: Path
) -> None:
    """A clean restart of the steps leader, then a crash of the new one, under one stream (one test, not one per
    fault: the stream and its checks are the expensive part)."""
    pipeline = Pipeline(cluster_stack, tmp_path)
    settings = cluster_stack.settings
    worker = cluster_stack.start_worker()  # faust's own timeouts: the worker is what rides through, untuned
    summary_path = tmp_path / "edge.json"
    edge = cluster_stack.start(
        "edge",
        ["edge", "--client-id", EDGE_ID, "--policy", "expert", "--tasks", "click-test", "--episodes", "100000",
         "--stop-after-s", str(EDGE_S), "--summary", str(summary_path)],
    )  # fmt: skip
    producer = Producer(settings, episodes("p", THREAD_STEPS // 3), rate=THREAD_RATE)
    producer.start()

    def both_landing() -> bool:
        assert worker.running() and edge.running(), f"{worker.tail()}\n{edge.tail()}"
        return {EDGE_ID, "p"} <= set(pipeline.column(STEPS, "client_id"))

    wait_until(both_landing, 120, what="steps of the edge client and the producer thread in Delta")
    for fault in (restart_a_node, kill_the_steps_leader):
        started = time.monotonic()
        fault(cluster_stack)
        print(f"{fault.__name__}: {time.monotonic() - started:.1f} s until the cluster was whole again or failed over")
    assert producer.sent < THREAD_STEPS and edge.running(), "both should go on sending after the faults"

    acked = producer.result(180)
    assert len(acked) == THREAD_STEPS, "an idempotent acks=all producer rides through, every send acknowledged"
    assert edge.wait(timeout=240) == 0, edge.tail()
    summary = json.loads(summary_path.read_text())
    assert summary["unsent"] == 0 and summary["episodes"] > 10

    log = read_steps_log(settings)
    steps = [step for partition in log.values() for step in partition]
    ids = [step.event_id for step in steps]
    assert len(ids) == len(set(ids)), "a step was written to the log twice"
    from_edge = [step for step in steps if step.client_id == EDGE_ID]
    assert len(from_edge) == summary["steps_published"], "the log lacks steps the edge client published"
    assert {step.event_id for step in acked} <= set(ids) and len(steps) == len(from_edge) + len(acked)
    for partition in log.values():  # and in the order the client acted, failover or not
        produced = [step.produced_at for step in partition if step.client_id == EDGE_ID]
        assert produced == sorted(produced)

    finished = len({step.episode_id for step in steps if step.done})
    wait_until(pipeline.landed([worker], len(steps), finished), 180, what="every step and episode in Delta")
    pipeline.assert_steps_and_episodes_once(steps)
    assert worker.running(), "the worker rode through: it was never restarted"


def read_steps_log(settings: Settings) -> dict[int, list[StepEvent]]:
    """Every step in the steps topic, per partition in log order: read up to the end offsets, so none is missed."""
    consumer = make_consumer(settings, "cluster-check")
    try:
        partitions = [TopicPartition(_steps_topic(settings), p) for p in range(settings.topic_partitions)]
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        log: dict[int, list[StepEvent]] = {tp.partition: [] for tp in partitions}
        deadline = time.monotonic() + 60
        while any(consumer.position(tp) < ends[tp] for tp in partitions) and time.monotonic() < deadline:
            for tp, records in consumer.poll(timeout_ms=1000).items():
                log[tp.partition] += [decode_event(r.value, expect=StepEvent) for r in records]
        return log
    finally:
        consumer.close()
