"""The edge spool: order, bounds, restart, a broker that is away for a minute, and a client killed before its cursor
write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kafka import TopicPartition
from kafka.errors import KafkaTimeoutError

from core.processes import sigterm_requests_stop, wait_until
from edge_client.spool import Spool, SpoolFull, SpoolingPublisher
from lake.tables import STEPS
from schemas import StepEvent, decode_event
from streams.kafka_clients import make_consumer
from streams.topics import topics_for
from tests.test_faults import Pipeline

ROOT = Path(__file__).resolve().parents[1]


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


class CutOffProducer:
    """A producer whose broker went away after it took the records: flush and close time out, as kafka-python's do
    (record_accumulator.await_flush_completion) when its only route to the cluster is cut."""

    def send(self, topic, key, value):
        return None

    def flush(self, timeout=None):
        raise KafkaTimeoutError("Timeout waiting for future")

    close = flush


def test_closing_while_cut_off_keeps_the_events_spooled_for_the_next_run(tmp_path):
    publisher = SpoolingPublisher(Spool(tmp_path, max_bytes=1 << 20), CutOffProducer, send_timeout_s=0.2)
    for i in range(3):
        publisher.publish("t", b"k", f"v{i}".encode())
    assert publisher.close(timeout_s=1.0) == 3  # it used to raise KafkaTimeoutError from the producer's close
    assert [r.value for r in Spool(tmp_path, max_bytes=1 << 20).pending(10)] == [b"v0", b"v1", b"v2"]


@pytest.mark.kafka
@pytest.mark.browser
def test_edge_client_keeps_acting_while_the_broker_is_down_and_delivers_everything_once(stack, tmp_path):
    """A real edge client (MiniWoB + experts) runs through a broker outage of over a minute."""
    settings = stack.settings
    summary_path = tmp_path / "summary.json"
    client = stack.start(
        "edge-offline",
        ["edge", "--client-id", "offline-c0", "--tasks", "click-test", "--episodes", "100000",
         "--stop-after-s", "90", "--summary", str(summary_path)],
    )  # fmt: skip
    time.sleep(12)  # browser up, some steps delivered
    stack.stop_broker()  # brought back by the stack should the test fail before it does
    time.sleep(62)  # the broker is away for over a minute; the client keeps acting
    assert client.running(), client.tail()
    stack.start_broker()
    assert client.wait(timeout=240) == 0, client.tail()
    summary = json.loads(summary_path.read_text())
    assert summary["unsent"] == 0 and summary["episodes"] > 100

    consumer = make_consumer(settings, "offline-check", consumer_timeout_ms=3000)
    partitions = [TopicPartition(topics_for(settings).steps.name, p) for p in range(settings.topic_partitions)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    logs: dict[int, list[StepEvent]] = {}
    for record in consumer:
        logs.setdefault(record.partition, []).append(decode_event(record.value, expect=StepEvent))
    consumer.close()
    steps = [step for log in logs.values() for step in log]
    assert len(steps) == summary["steps_published"]  # nothing lost
    assert len({s.event_id for s in steps}) == len(steps)  # nothing duplicated
    for log in logs.values():  # each partition holds its events in the order the client acted
        assert [s.produced_at for s in log] == sorted(s.produced_at for s in log)


def test_spool_repairs_a_stale_cursor_and_a_torn_record(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.append("t", b"k", b"kept")
    spool.close()
    (tmp_path / "cursor").write_text("5000")  # killed after truncating the log, before resetting the cursor
    with open(tmp_path / "spool.log", "ab") as log_file:
        log_file.write(b"\x00\x00\x00\x01\x00\x00")  # killed half-way through an append
    reopened = Spool(tmp_path, max_bytes=1 << 20)
    reopened.append("t", b"k", b"next")
    assert [r.value for r in reopened.pending(10)] == [b"kept", b"next"]


@pytest.mark.kafka
def test_an_edge_client_killed_between_ack_and_cursor_write_sends_again_and_every_step_lands_once(stack, tmp_path):
    """SIGKILLed after Kafka acknowledged its first batch, before the spool's cursor moved: restarted, the client
    sends that batch again, so the log holds it twice; the tables hold every step once."""
    pipeline = Pipeline(stack, tmp_path)
    worker = pipeline.start_worker()
    spool_dir, ids_file = tmp_path / "spool", tmp_path / "ids"

    def client(*args: str) -> subprocess.CompletedProcess:
        command = [sys.executable, "-m", "tests.spool_client", str(spool_dir), str(ids_file), *args]
        env = {**os.environ, **stack.env}
        return subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)

    killed = client("300", "--die-after-ack")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    cursor = spool_dir / "cursor"
    assert not cursor.exists() or cursor.read_text() == "0", "the kill should land before the cursor write"
    restarted = client("90")
    assert restarted.returncode == 0, restarted.stderr
    spooled = ids_file.read_text().split()
    assert len(spooled) == 390
    assert sum(pipeline.ends(topics_for(stack.settings).steps.name).values()) > len(spooled), "a batch sent twice"

    wait_until(pipeline.caught_up([worker]), 120, what="every step and its copy consumed")
    landed = pipeline.column(STEPS, "event_id")
    assert len(landed) == len(set(landed)) and set(landed) == set(spooled)


def test_sigterm_asks_the_holder_to_stop_instead_of_ending_the_process():
    before = signal.getsignal(signal.SIGTERM)
    with sigterm_requests_stop() as stop_requested:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop_requested.wait(5)  # and this process is still here to see it
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.kafka
def test_an_edge_client_asked_to_stop_ends_its_episode_and_drains_its_spool(stack, tmp_path):
    """SIGTERM mid-run (a restart, a deploy): the client finishes the episode it is in, sends what it spooled and
    exits cleanly, so no episode is left without its final step (the assembler would never close it)."""
    summary_path, ledger_path = tmp_path / "summary.json", tmp_path / "ledger"
    client = stack.start(
        "edge-stopped",
        ["edge", "--client-id", "stopped-c0", "--tasks", "click-checkboxes,enter-text", "--episodes", "100000",
         "--summary", str(summary_path), "--ledger-path", str(ledger_path)],
    )  # fmt: skip
    wait_until(lambda: ledger_path.exists() and len(ledger_path.read_text().splitlines()) > 20, 120,
               what="the client acting")  # fmt: skip
    assert client.stop(timeout=60, leader_only=True) == 0, client.tail()
    summary = json.loads(summary_path.read_text())
    assert summary["unsent"] == 0 and summary["episodes"] > 0

    consumer = make_consumer(stack.settings, "stopped-check", consumer_timeout_ms=3000)
    partitions = [
        TopicPartition(topics_for(stack.settings).steps.name, p) for p in range(stack.settings.topic_partitions)
    ]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    episodes: dict[str, list[StepEvent]] = {}
    for record in consumer:
        step = decode_event(record.value, expect=StepEvent)
        if step.client_id == "stopped-c0":
            episodes.setdefault(step.episode_id, []).append(step)
    consumer.close()
    assert sum(len(steps) for steps in episodes.values()) == len(ledger_path.read_text().splitlines())
    assert len(episodes) == summary["episodes"]
    for steps in episodes.values():  # every episode ends with its final step, and only there
        assert [s.done for s in sorted(steps, key=lambda s: s.step)] == [False] * (len(steps) - 1) + [True]
