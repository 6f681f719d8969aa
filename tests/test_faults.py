"""Faults a fleet meets, against the real broker and real Delta tables: the Kafka log stays the source of
truth and every table holds each produced event exactly once (checked by event_id / episode_id / episode, step and
purpose), even when the log holds an event twice, at two offsets (an edge client's re-send):

* a faust worker killed with SIGKILL while it drains a backlog, then restarted, and steps sent again after it;
* the same steps sent twice, before and after a worker restart;
* the broker restarted while a producer keeps sending and the worker keeps consuming;
* two workers sharing 4 partitions, one killed with SIGKILL: the other takes over its partitions, and the steps
  the dead one wrote are sent again;
* malformed events (undecodable bytes, unknown schema version, missing fields, oversize screenshot) go to the
  dead-letter topic with their original bytes and a reason, the stream goes on, `flywheel dlq` lists them;
* the tables on an object store (S3Proxy) that goes down for 30 s mid-stream: the worker exits on the batch it
  cannot write, its supervisor starts it again until the store is back, and nothing is lost or duplicated.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter

import msgspec
import pytest
from kafka import TopicPartition
from pydantic import SecretStr

from core.processes import Child, wait_until
from core.settings import get_settings
from flywheel.admin.dlq import read_dead_letters
from flywheel.run.stack import LocalStack, local_stack
from lake import s3proxy
from lake.queries import step_count
from lake.tables import EPISODES, STEPS, TRAINING_SAMPLES, open_table, table_uri
from processors.compare import compare_tables
from processors.delta_sink import app_id
from processors.replay import replay
from processors.steps_stream import steps_group
from processors.worker_config import WorkerConfig
from schemas import encode_event
from streams.broker import local_broker
from streams.kafka_clients import make_admin, make_consumer, make_producer
from streams.topics import topics_for
from tests.conftest import free_port, link_shared_s3proxy
from tests.factories import step_event

pytestmark = pytest.mark.kafka
# faust's default session timeout is 60 s: a group waits that long before it hands a SIGKILLed worker's partitions
# to another member (or to its own restart). faust reads these from the environment.
FAST_FAILOVER = {"BROKER_SESSION_TIMEOUT": "6", "BROKER_HEARTBEAT_INTERVAL": "1"}


class Pipeline:
    """One test's stack (topics, tables, worker processes, the broker's handles) and checks of what it produced."""

    def __init__(self, stack: LocalStack, tmp_path):
        self.stack = stack
        self.settings = stack.settings
        self.tmp_path = tmp_path

    def start_worker(self) -> Child:
        return self.stack.start_worker(env=FAST_FAILOVER)

    def column(self, table: str, column: str) -> list:
        uri = table_uri(self.settings.tables_dir, table)
        try:
            return open_table(uri).to_pyarrow_table(columns=[column]).column(0).to_pylist()
        except Exception:  # not created yet
            return []

    def landed(self, workers: list[Child], steps: int, episodes: int):
        """Predicate: every step and episode is in Delta; fails at once when a worker died."""

        def check() -> bool:
            for worker in workers:
                assert worker.running(), f"{worker.name} died:\n{worker.tail()}"
            return (
                step_count(self.settings.tables_dir) >= steps and len(self.column(EPISODES, "episode_id")) >= episodes
            )

        return check

    def ends(self, topic: str) -> dict[int, int]:
        """The end offset of each partition of `topic` now."""
        consumer = make_consumer(self.settings, "test-faults-ends")
        try:
            ends = consumer.end_offsets([TopicPartition(topic, p) for p in range(self.settings.topic_partitions)])
        finally:
            consumer.close()
        return {tp.partition: end for tp, end in ends.items()}

    def sunk(self, table: str, topic: str, ends: dict[int, int]) -> bool:
        """Whether the table's sink recorded in Delta every offset below `ends`, repeats and dead letters included."""
        try:
            delta = open_table(table_uri(self.settings.tables_dir, table))
        except Exception:  # not created yet
            return not any(ends.values())
        recorded = {p: delta.transaction_version(app_id(table, topic, p)) for p in ends}
        return all(end == 0 or (recorded[p] or -1) >= end - 1 for p, end in ends.items())

    def caught_up(self, workers: list[Child]):
        """Predicate: every sink consumed every record the steps topic holds now (repeats included), and the episodes
        they finished; fails at once when a worker died."""
        topics = topics_for(self.settings)
        step_ends = self.ends(topics.steps.name)

        def check() -> bool:
            for worker in workers:
                assert worker.running(), f"{worker.name} died:\n{worker.tail()}"
            if not self.sunk(STEPS, topics.steps.name, step_ends):
                return False
            # the worker sends the episodes a batch finishes before it commits the batch: they are in the log now
            episode_ends = self.ends(topics.episodes.name)
            return all(self.sunk(table, topics.episodes.name, episode_ends) for table in (EPISODES, TRAINING_SAMPLES))

        return check

    def assert_steps_and_episodes_once(self, steps: list) -> None:
        """The steps and episodes tables hold each of `steps`, and each of their finished episodes, exactly once."""
        step_ids = self.column(STEPS, "event_id")
        assert len(step_ids) == len(set(step_ids)), f"duplicated steps: {_repeats(step_ids)}"
        assert set(step_ids) == {s.event_id for s in steps}, "lost or foreign steps"
        episode_ids = self.column(EPISODES, "episode_id")
        assert len(episode_ids) == len(set(episode_ids)), f"duplicated episodes: {_repeats(episode_ids)}"
        assert set(episode_ids) == {s.episode_id for s in steps if s.done}

    def assert_exactly_once(self, steps: list) -> None:
        """steps, episodes and training_samples hold each produced event exactly once."""
        self.assert_steps_and_episodes_once(steps)
        samples = [self.column(TRAINING_SAMPLES, name) for name in ("episode_id", "step", "purpose")]
        samples = list(zip(*samples, strict=True))
        assert len(samples) == len(set(samples)), f"duplicated samples: {_repeats(samples)}"
        # every test episode is an expert success: all its steps are demonstrations
        assert set(samples) == {(s.episode_id, s.step, "demo") for s in steps}
        # and the tables are exactly the projection of the log: a replay rebuilds them row for row
        summary = replay(self.settings, self.tmp_path / "rebuilt")
        diffs = compare_tables(
            self.settings.tables_dir, self.tmp_path / "rebuilt", summary.horizon_by_table(self.settings)
        )
        assert all(d.equal for d in diffs), diffs


def _repeats(values: list) -> list:
    return [v for v, n in Counter(values).most_common(5) if n > 1]


@pytest.fixture
def pipeline(stack, tmp_path):
    return Pipeline(stack, tmp_path)


@pytest.fixture
def s3_pipeline(kafka_settings, tmp_path, monkeypatch):
    """A Pipeline whose tables are on an object store its stack starts itself (the data dir s3://, no endpoint
    given: a local S3Proxy on a free port), its endpoint and credential in FLYWHEEL_* for this process too."""
    blank = {"s3_endpoint": "", "s3_access_key": "", "s3_secret_key": SecretStr(""), "s3_port": free_port()}
    settings = kafka_settings.model_copy(update={"data_dir": "s3://flywheel-faults/runs", **blank})
    link_shared_s3proxy(settings)
    with local_stack(settings, tmp_path / "logs", run="test", data_dir=tmp_path / "data", worker=False) as stack:
        assert s3proxy.status(stack.settings)["running"]  # started by the stack, stopped when it closes
        for name, value in stack.env.items():
            monkeypatch.setenv(name, value)
        get_settings.cache_clear()
        yield Pipeline(stack, tmp_path)
    get_settings.cache_clear()
    assert not s3proxy.status(settings)["running"]


def episodes(client: str, count: int, steps: int = 3, first: int = 0) -> list:
    return [
        step_event(f"{client}-click-test-{n}-{n}", step=i, done=i == steps - 1, reward=1.0 if i == steps - 1 else 0.0)
        for n in range(first, first + count)
        for i in range(steps)
    ]


class Producer(threading.Thread):
    """Sends steps in the background at about `rate` steps/s; `acked` holds those Kafka acknowledged."""

    def __init__(self, settings, steps: list, rate: float):
        super().__init__(daemon=True)
        self.settings, self.steps, self.rate = settings, steps, rate
        self.acked: list = []
        self.sent = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            producer = make_producer(self.settings, "test-faults")
            topic = topics_for(self.settings).steps.name
            futures = []
            started = time.monotonic()
            for i, step in enumerate(self.steps):
                time.sleep(max(0.0, started + i / self.rate - time.monotonic()))
                futures.append((step, producer.send(topic, key=step.episode_id.encode(), value=encode_event(step))))
                self.sent = i + 1
            producer.flush()
            producer.close()
            self.acked = [step for step, future in futures if future.succeeded()]
        except BaseException as error:  # noqa: B036 - reported by the test thread
            self.error = error

    def result(self, timeout: float) -> list:
        self.join(timeout)
        assert not self.is_alive(), "producer did not finish"
        assert self.error is None, f"producer failed: {self.error!r}"
        return self.acked


def produce_now(settings, steps: list) -> None:
    producer = make_producer(settings, "test-faults")
    topic = topics_for(settings).steps.name
    for step in steps:
        producer.send(topic, key=step.episode_id.encode(), value=encode_event(step))
    producer.flush()
    producer.close()


def test_sigkill_mid_batch_then_restart_leaves_every_event_exactly_once(pipeline):
    steps = episodes("k", 1000)  # 3000 steps: several 500-record batches, so a kill lands between commits
    produce_now(pipeline.settings, steps)
    worker = pipeline.start_worker()
    wait_until(lambda: step_count(pipeline.settings.tables_dir) > 0, 120, interval=0.05, what="first commit")
    worker.stop(signal.SIGKILL)
    at_kill = step_count(pipeline.settings.tables_dir)
    assert 0 < at_kill < len(steps), f"the kill should land mid-stream, {at_kill} of {len(steps)} rows were in"

    worker = pipeline.start_worker()
    wait_until(pipeline.landed([worker], len(steps), 1000), 120, what="every step and episode in Delta")
    produce_now(pipeline.settings, steps[:300] + steps[-300:])  # sent again: written before the kill, and after it
    wait_until(pipeline.caught_up([worker]), 120, what="the copies consumed")
    pipeline.assert_exactly_once(steps)


def test_a_step_sent_twice_lands_once_before_and_after_a_worker_restart(pipeline):
    steps = episodes("t", 50)
    produce_now(pipeline.settings, steps + steps[:30])  # the same bytes at other offsets, within one backlog
    worker = pipeline.start_worker()
    wait_until(pipeline.caught_up([worker]), 120, what="every step and its copy consumed")
    produce_now(pipeline.settings, steps[30:60])  # a re-send a batch later
    wait_until(pipeline.caught_up([worker]), 120, what="the second copies consumed")
    worker.stop()
    worker = pipeline.start_worker()  # a new process: what it knows of the table is loaded from Delta
    produce_now(pipeline.settings, steps[::7])
    wait_until(pipeline.caught_up([worker]), 120, what="the copies sent after the restart consumed")
    pipeline.assert_exactly_once(steps)


def test_broker_restart_mid_stream_loses_and_duplicates_nothing(pipeline):
    worker = pipeline.start_worker()
    warmup = episodes("w", 1)
    produce_now(pipeline.settings, warmup)
    wait_until(pipeline.landed([worker], len(warmup), 1), 120, what="the worker consuming")

    producer = Producer(pipeline.settings, episodes("b", 400), rate=200.0)  # 1200 steps over ~6 s
    producer.start()
    wait_until(lambda: producer.sent >= 300, 30, interval=0.05, what="the stream under way")
    pipeline.stack.stop_broker()  # the session's broker: its data persists across the restart
    assert not local_broker.status(pipeline.settings)["running"]
    assert producer.sent < 1200, "the broker should go down mid-stream"
    time.sleep(1.0)
    pipeline.stack.start_broker()
    acked = producer.result(180)
    assert len(acked) == 1200, "an idempotent producer with unbounded retries rides out a broker restart"

    steps = warmup + acked
    wait_until(pipeline.landed([worker], len(steps), 401), 180, what="every acknowledged step in Delta")
    pipeline.assert_exactly_once(steps)


def _group_members(settings, group: str) -> dict[str, set[int]]:
    """member id -> partitions of the steps topic the group's coordinator assigned to it."""
    admin = make_admin(settings, "test-faults")
    try:
        description = admin.describe_groups([group])[group]
    finally:
        admin.close()
    steps_topic = topics_for(settings).steps.name
    members = {}
    for member in description.get("members", []):
        assigned = (member.get("member_assignment") or {}).get("assigned_partitions", [])
        members[member["member_id"]] = {p for tp in assigned if tp["topic"] == steps_topic for p in tp["partitions"]}
    return members


def test_the_object_store_down_for_30_s_mid_stream_loses_and_duplicates_nothing(s3_pipeline):
    pipeline, settings = s3_pipeline, s3_pipeline.settings
    assert str(settings.tables_dir).startswith("s3://flywheel-faults/runs/test-")
    worker = pipeline.start_worker()
    warmup = episodes("w", 1)
    produce_now(settings, warmup)
    wait_until(pipeline.landed([worker], len(warmup), 1), 120, what="the worker writing to the object store")
    bad = b"\xc1 not msgpack at all"
    make_producer(settings, "test-faults").send(topics_for(settings).steps.name, key=b"bad", value=bad).get(30)

    producer = Producer(settings, episodes("s", 300), rate=100.0)  # 900 steps over ~9 s
    producer.start()
    wait_until(lambda: producer.sent >= 200, 30, interval=0.05, what="the stream under way")
    s3proxy.down(settings)
    assert producer.sent < 900, "the object store should go down mid-stream"
    time.sleep(30)
    s3proxy.up(settings)
    acked = producer.result(120)
    assert len(acked) == 900

    steps = warmup + acked
    wait_until(pipeline.landed([worker], len(steps), 301), 240, what="every acknowledged step on the object store")
    wait_until(pipeline.caught_up([worker]), 120, what="the sinks past every record")
    pipeline.assert_exactly_once(steps)
    letters = read_dead_letters(settings)
    assert [d.value for d in letters] == [bad]  # the one dead letter, not re-sent by a retry
    # the worker could not write during the outage: it exited, acking nothing, and its supervisor started it again
    assert worker.running() and "starting it again" in worker.tail(400)


def test_two_workers_one_killed_the_other_takes_over(pipeline):
    assert pipeline.settings.topic_partitions >= 4
    group = steps_group(pipeline.settings)
    survivor = pipeline.start_worker()
    victim = pipeline.start_worker()

    def both_assigned() -> bool:
        members = _group_members(pipeline.settings, group)
        return len(members) == 2 and all(members.values())

    wait_until(both_assigned, 120, what="both workers holding steps partitions")

    producer = Producer(pipeline.settings, episodes("s", 500), rate=150.0)  # 1500 steps over ~10 s
    producer.start()
    wait_until(lambda: step_count(pipeline.settings.tables_dir) >= 200, 60, interval=0.1, what="rows flowing")
    victim.stop(signal.SIGKILL)
    assert step_count(pipeline.settings.tables_dir) < 1500, "the worker should die mid-stream"

    def survivor_holds_all() -> bool:
        assert survivor.running(), f"the surviving worker died:\n{survivor.tail()}"
        members = _group_members(pipeline.settings, group)
        return len(members) == 1 and next(iter(members.values())) == set(range(pipeline.settings.topic_partitions))

    wait_until(survivor_holds_all, 90, what="the survivor holding every partition")
    steps = producer.result(120)
    assert len(steps) == 1500
    wait_until(pipeline.landed([survivor], len(steps), 500), 120, what="every step and episode in Delta")
    produce_now(pipeline.settings, steps[:600])  # the victim wrote many of these on partitions the survivor took
    wait_until(pipeline.caught_up([survivor]), 120, what="the copies consumed")
    pipeline.assert_exactly_once(steps)


def test_dead_letters_keep_original_bytes_and_reason_and_dlq_lists_them(pipeline):
    worker = pipeline.start_worker()
    good_before, good_after = episodes("d", 1), episodes("d", 1, first=1)
    raw = msgspec.msgpack.decode(encode_event(step_event()))
    unknown_version = msgspec.msgpack.encode(raw | {"schema_version": 99})
    missing_field = msgspec.msgpack.encode({k: v for k, v in raw.items() if k != "episode_id"})
    oversize = encode_event(step_event(screenshot=b"\0" * (WorkerConfig().max_screenshot_bytes + 1)))
    bad = {
        "undecodable": b"\xc1 not msgpack at all",
        "unknown_schema_version": unknown_version,
        "invalid_field": missing_field,
        "oversize_screenshot": oversize,
    }
    producer = make_producer(pipeline.settings, "test-faults")
    topic = topics_for(pipeline.settings).steps.name
    for step in good_before:
        producer.send(topic, key=step.episode_id.encode(), value=encode_event(step))
    for value in bad.values():
        producer.send(topic, key=b"bad", value=value)
    for step in good_after:
        producer.send(topic, key=step.episode_id.encode(), value=encode_event(step))
    producer.flush()
    producer.close()

    good = good_before + good_after
    wait_until(pipeline.landed([worker], len(good), 2), 120, what="the good steps after the bad ones")
    pipeline.assert_exactly_once(good)
    letters = wait_until(
        lambda: (d := read_dead_letters(pipeline.settings)) and len(d) >= 4 and d, 60, what="4 letters"
    )
    assert {d.reason: d.value for d in letters} == bad  # original bytes, untouched, one letter each
    by_reason = {d.reason: d for d in letters}
    assert "episode_id" in by_reason["invalid_field"].detail
    assert "99" in by_reason["unknown_schema_version"].detail
    assert all(d.source_topic == topic and d.source_offset >= 0 and d.size == len(d.value) for d in letters)

    listed = subprocess.run(
        [sys.executable, "-m", "flywheel.cli", "dlq", "--limit", "10"],
        env={**os.environ, **pipeline.stack.env},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert listed.returncode == 0, listed.stderr
    print(listed.stdout)
    for reason in bad:
        assert reason in listed.stdout
    assert "4 dead letter(s)" in listed.stdout
