"""The edge spool: order, bounds, restart, a broker that is away for a minute, a client killed before its cursor
write, one process per spool, and what a dead client left sent by its next start or by `flywheel spool replay`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import pytest
from kafka import TopicPartition
from kafka.errors import KafkaTimeoutError

from core.processes import sigterm_requests_stop, wait_until
from edge_client.spool import Spool, SpoolFull, SpoolingPublisher, SpoolInUse, spool_dir
from flywheel.chaos.ledger import read_client_ledgers
from lake.tables import STEPS
from processors.replay import assign_from_beginning, read_until
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
        ["edge", "--client-id", "offline-c0", "--policy", "expert", "--tasks", "click-test", "--episodes", "100000",
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


def client_env(stack, home: Path) -> dict[str, str]:
    """A client process's environment: the test's run on the session broker, FLYWHEEL_HOME `home`."""
    return {**os.environ, **stack.env, "FLYWHEEL_HOME": str(home)}


def run_spool_client(stack, home: Path, *args: str) -> subprocess.CompletedProcess:
    """tests.spool_client CLIENT_ID IDS_FILE STEPS [flags] to its end (killed if it outlives the timeout)."""
    command = [sys.executable, "-m", "tests.spool_client", *args]
    return subprocess.run(command, env=client_env(stack, home), cwd=ROOT, capture_output=True, text=True, timeout=120)


@contextmanager
def cut_off_client(stack, home: Path, client_id: str, ids_file: Path, steps: int, delivered: int):
    """tests.spool_client running, cut off from Kafka after `delivered` of its `steps`, holding the rest spooled
    until it is killed; yields the process once Kafka acknowledged those (its cursor moved past them) and SIGKILLs
    it, if still alive, when the block ends."""
    log = open(home.parent / f"{client_id}.log", "ab")  # noqa: SIM115 (closed below)
    command = [sys.executable, "-m", "tests.spool_client", client_id, str(ids_file), str(steps),
               "--cut-after", str(delivered)]  # fmt: skip
    proc = subprocess.Popen(command, env=client_env(stack, home), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    directory = spool_dir(home, client_id)
    try:
        if delivered:  # acknowledged records move the cursor (the rest are never written: it cannot reach 0 again)
            wait_until(lambda: int(read_or(directory / "cursor", "0")) > 0, 60, what="the first batch acknowledged")
        else:  # nothing moves the cursor: it holds its spool from the start, and has spooled all once it lists them
            wait_until(lambda: len(read_or(ids_file, "").split()) == steps, 60, what="the steps spooled")
            assert read_or(directory / "lock", "") == str(proc.pid)
        assert proc.poll() is None, (home.parent / f"{client_id}.log").read_text()[-3000:]
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)
        log.close()


def read_or(path: Path, default: str) -> str:
    """A small file's stripped text, `default` while it does not exist or is still empty."""
    try:
        return path.read_text().strip() or default
    except FileNotFoundError:
        return default


def replay_command(stack, home: Path, client_id: str) -> subprocess.CompletedProcess:
    """`flywheel spool replay` from an operator's shell: its own FLYWHEEL_HOME, the dead client's given by --home."""
    command = [sys.executable, "-m", "flywheel.cli", "spool", "replay", "--client-id", client_id, "--home", str(home)]
    env = {**os.environ, **stack.env}
    return subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)


def logged_event_ids(settings) -> Counter:
    """How many times each event_id is in the run's steps topic now."""
    consumer = make_consumer(settings, "spool-check")
    try:
        horizon = assign_from_beginning(consumer, [topics_for(settings).steps.name])
        return Counter(
            decode_event(record.value, expect=StepEvent).event_id
            for batch in read_until(consumer, horizon)
            for record in batch
        )
    finally:
        consumer.close()


def test_a_spool_is_held_by_one_process_at_a_time(tmp_path):
    spool = Spool(tmp_path, max_bytes=1 << 20)
    spool.append("t", b"k", b"owed")
    with pytest.raises(SpoolInUse, match=f"in use by process {os.getpid()}"):
        Spool(tmp_path, max_bytes=1 << 20)  # a second run of the same client while the first lives
    spool.close()
    assert [r.value for r in Spool(tmp_path, max_bytes=1 << 20).pending(10)] == [b"owed"]  # the next holder's
    with pytest.raises(ValueError, match="cannot name a spool"):
        spool_dir(tmp_path, "../c0")


def test_a_second_run_of_a_live_client_id_is_refused_before_it_acts(tmp_path):
    """`flywheel edge` with a client id whose spool a live process holds exits 1 saying so, before its browser."""
    held = Spool(spool_dir(tmp_path, "twin-c0"), max_bytes=1 << 20)  # the first run, alive
    try:
        # No episodes: were it not refused, it would end at once instead of acting beside the first run.
        command = [sys.executable, "-m", "flywheel.cli", "edge", "--client-id", "twin-c0", "--episodes", "0",
                   "--metrics-port", "none"]  # fmt: skip
        env = {**os.environ, "FLYWHEEL_HOME": str(tmp_path)}
        second = subprocess.run(command, env=env, cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        held.close()
    assert second.returncode == 1 and f"in use by process {os.getpid()}" in second.stderr, second.stderr


@pytest.mark.kafka
def test_a_client_killed_with_events_spooled_sends_them_on_its_next_start_each_once(stack, tmp_path):
    """Cut off from Kafka after its first batch, the client spools the rest and is SIGKILLed; its next start (same
    client id, same FLYWHEEL_HOME) sends the leftover first, then its own: every event_id once in the topic."""
    home, ids_file = tmp_path / "home", tmp_path / "ids"
    with cut_off_client(stack, home, "killed-c0", ids_file, 300, delivered=100) as client:
        client.send_signal(signal.SIGKILL)
        assert client.wait(30) == -signal.SIGKILL
    spooled = ids_file.read_text().split()
    assert logged_event_ids(stack.settings) == Counter(spooled[:100]), "only the first batch reached Kafka"

    restarted = run_spool_client(stack, home, "killed-c0", str(ids_file), "50")
    assert restarted.returncode == 0, restarted.stderr
    assert "200 events left in" in restarted.stderr  # it said what it found
    spooled = ids_file.read_text().split()
    assert len(spooled) == 350
    assert logged_event_ids(stack.settings) == Counter(spooled)  # each once: none lost, none replayed and re-sent
    assert (spool_dir(home, "killed-c0") / "spool.log").stat().st_size == 0  # nothing stays spooled


@pytest.mark.kafka
def test_spool_replay_sends_what_a_dead_client_left_once_and_empties_its_spool(stack, tmp_path):
    """A client that never comes back: `flywheel spool replay` sends what it left, each event_id once; a second
    replay finds nothing left to send."""
    home, ids_file = tmp_path / "home", tmp_path / "ids"
    with cut_off_client(stack, home, "dead-c0", ids_file, 300, delivered=100) as client:
        client.send_signal(signal.SIGKILL)
        client.wait(30)
    replayed = replay_command(stack, home, "dead-c0")
    assert replayed.returncode == 0, replayed.stderr
    assert json.loads(replayed.stdout)["sent"] == 200 and json.loads(replayed.stdout)["left"] == 0
    spooled = ids_file.read_text().split()
    assert logged_event_ids(stack.settings) == Counter(spooled)
    again = replay_command(stack, home, "dead-c0")
    assert again.returncode == 0 and json.loads(again.stdout)["sent"] == 0, again.stderr
    assert logged_event_ids(stack.settings) == Counter(spooled)  # nothing sent twice


@pytest.mark.kafka
def test_spool_replay_refuses_a_live_client_and_sends_nothing(stack, tmp_path):
    home, ids_file = tmp_path / "home", tmp_path / "ids"
    with cut_off_client(stack, home, "live-c0", ids_file, 50, delivered=0) as client:
        refused = replay_command(stack, home, "live-c0")
        assert refused.returncode == 1 and f"in use by process {client.pid}" in refused.stderr, refused.stderr
        assert client.poll() is None  # the client goes on
    assert logged_event_ids(stack.settings) == Counter()
    left = Spool(spool_dir(home, "live-c0"), max_bytes=1 << 20)  # the client is dead now: its spool is untouched
    assert left.pending_records == 50
    left.close()
    assert replay_command(stack, home, "nobody").returncode == 1  # a client id that never spooled here: said so


@pytest.mark.kafka
def test_an_edge_client_killed_between_ack_and_cursor_write_sends_again_and_every_step_lands_once(stack, tmp_path):
    """SIGKILLed after Kafka acknowledged its first batch, before the spool's cursor moved: restarted, the client
    sends that batch again, so the log holds it twice; the tables hold every step once."""
    pipeline = Pipeline(stack, tmp_path)
    worker = pipeline.start_worker()
    home, ids_file = tmp_path / "home", tmp_path / "ids"

    def client(*args: str) -> subprocess.CompletedProcess:
        return run_spool_client(stack, home, "acked-c0", str(ids_file), *args)

    killed = client("300", "--die-after-ack")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    cursor = spool_dir(home, "acked-c0") / "cursor"
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
        ["edge", "--client-id", "stopped-c0", "--policy", "expert", "--tasks", "click-checkboxes,enter-text",
         "--episodes", "100000",
         "--summary", str(summary_path), "--ledger-path", str(ledger_path)],
    )  # fmt: skip
    wait_until(lambda: ledger_path.exists() and len(read_client_ledgers([ledger_path])) > 20, 120,
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
    assert sum(len(steps) for steps in episodes.values()) == len(read_client_ledgers([ledger_path]))
    assert len(episodes) == summary["episodes"]
    for steps in episodes.values():  # every episode ends with its final step, and only there
        assert [s.done for s in sorted(steps, key=lambda s: s.step)] == [False] * (len(steps) - 1) + [True]
