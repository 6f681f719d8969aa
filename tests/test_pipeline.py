"""The processors against the real broker and real Delta tables (no fakes)."""

from __future__ import annotations

import signal
import time

import pytest
from kafka import KafkaConsumer, TopicPartition
from msgspec.structs import replace

from core.processes import Child, wait_until
from lake.queries import episode_stats, step_count
from lake.tables import EPISODES, STEPS, TRAINING_SAMPLES, table_uri
from processors.worker_config import WorkerConfig
from schemas import encode_event
from streams.kafka_clients import MAX_REQUEST_BYTES, make_producer
from streams.topics import topics_for
from tests.factories import step_event

pytestmark = pytest.mark.kafka


def produce(settings, events_or_bytes) -> None:
    producer = make_producer(settings, "test")
    topic = topics_for(settings).steps.name
    for item in events_or_bytes:
        if isinstance(item, bytes):
            producer.send(topic, key=b"bad", value=item)
        else:
            producer.send(topic, key=item.episode_id.encode(), value=encode_event(item))
    producer.flush()
    producer.close()


def episode(client: str, n: int, steps: int = 2, reward: float = 1.0):
    episode_id = f"{client}-click-test-{n}-{n}"
    return [step_event(episode_id, step=i, done=i == steps - 1, reward=reward if i == steps - 1 else 0.0)
            for i in range(steps)]  # fmt: skip


def landed(settings, worker: Child, count: int):
    """Predicate for wait_until: `count` steps are in Delta; fails at once if the worker died."""

    def check() -> bool:
        assert worker.running(), f"the faust worker died:\n{worker.tail()}"
        return step_count(settings.tables_dir) >= count

    return check


def delta_event_ids(settings) -> list[str]:
    from deltalake import DeltaTable

    return (
        DeltaTable(table_uri(settings.tables_dir, STEPS)).to_pyarrow_table(columns=["event_id"]).column(0).to_pylist()
    )


def test_steps_land_exactly_once_across_a_worker_restart(stack):
    settings = stack.settings
    first = [e for n in range(30) for e in episode("c0", n)]
    second = [e for n in range(30, 50) for e in episode("c0", n)]
    produce(settings, first)
    worker = stack.start_worker()
    wait_until(landed(settings, worker, len(first)), 120, what="first batch in Delta")
    assert worker.stop() is not None
    produce(settings, second)  # produced while no worker runs
    worker = stack.start_worker()
    total = len(first) + len(second)
    wait_until(landed(settings, worker, total), 120, what="second batch in Delta")
    wait_until(lambda: episode_stats(settings.tables_dir)["episodes"] >= 50, 60, what="episodes in Delta")

    ids = delta_event_ids(settings)
    assert len(ids) == total
    assert set(ids) == {e.event_id for e in first + second}
    stats = episode_stats(settings.tables_dir)
    assert stats["episodes"] == 50 and stats["success_rate"] == 1.0


def test_malformed_events_go_to_dead_letters_and_the_stream_goes_on(stack):
    settings, worker = stack.settings, stack.start_worker()
    good_before = episode("c1", 1)
    bad_field = encode_event(step_event()).replace(b"\xa4step\x00", b"\xa4step\xa1x")  # step: "x"
    oversize = step_event(screenshot=b"\0" * (WorkerConfig().max_screenshot_bytes + 1))
    good_after = episode("c1", 2, steps=1, reward=-1.0)
    huge = b"\xc1" + b"x" * (MAX_REQUEST_BYTES - 64 * 1024)  # near the steps topic's limit: the letter is larger
    produce(settings, [*good_before, b"\xc1 definitely not msgpack", bad_field, oversize, huge, *good_after])

    wait_until(landed(settings, worker, 3), 120, what="good steps in Delta")
    assert sorted(delta_event_ids(settings)) == sorted(e.event_id for e in good_before + good_after)

    consumer = KafkaConsumer(bootstrap_servers=settings.bootstrap, consumer_timeout_ms=2000,
                             auto_offset_reset="earliest", enable_auto_commit=False)  # fmt: skip
    partition = TopicPartition(topics_for(settings).dead_letters.name, 0)
    consumer.assign([partition])
    letters = wait_until(lambda: list(consumer) or None, 60, what="dead letters")
    while len(letters) < 4:
        letters += list(consumer)
    consumer.close()
    assert huge in [r.value for r in letters]  # a worker could not dead-letter it once, and died on it for ever
    reasons = {dict(r.headers)["reason"].decode(): r.value for r in letters if r.value != huge}
    assert reasons["undecodable"] == b"\xc1 definitely not msgpack"  # the original bytes, untouched
    assert "invalid_field" in reasons and "oversize_screenshot" in reasons
    detail = next(dict(r.headers)["detail"].decode() for r in letters if dict(r.headers)["reason"] == b"invalid_field")
    assert "$.step" in detail

    # the curated gold table references only the successful episode's steps
    wait_until(lambda: episode_stats(settings.tables_dir)["episodes"] >= 2, 60, what="episodes")
    import polars as pl

    samples = pl.read_delta(table_uri(settings.tables_dir, TRAINING_SAMPLES))
    assert samples.height == 2 and set(samples["purpose"]) == {"demo"}


def test_an_episode_whose_client_went_quiet_is_closed_as_abandoned_and_its_late_step_lands(stack):
    """Event time: the other client's steps, produced 400 s later on the same partition, close the quiet episode at
    once (the default 300 s gap), however soon the worker reads them; its final step, after the close, lands in
    `steps` but neither reopens nor duplicates it."""
    settings, t0 = stack.settings, time.time() - 3600
    quiet = "c0-click-test-1-1"
    steps = [step_event(quiet, step=0, done=False, reward=0.0, produced_at=t0)]
    steps += [replace(s, produced_at=t0 + 400) for s in episode("c1", 2)]
    steps += [step_event(quiet, step=1, done=True, reward=1.0, produced_at=t0 + 401)]  # late
    producer = make_producer(settings, "test")
    for step in steps:  # one partition, in this order
        producer.send(topics_for(settings).steps.name, key=step.episode_id.encode(), value=encode_event(step),
                      partition=0)  # fmt: skip
    producer.flush()
    producer.close()
    worker = stack.start_worker()
    wait_until(landed(settings, worker, len(steps)), 120, what="every step in Delta, the late one too")
    wait_until(lambda: episode_stats(settings.tables_dir)["episodes"] >= 2, 60, what="episodes")
    time.sleep(3)  # a second row of the quiet episode would have come by now
    import polars as pl

    episodes = pl.read_delta(table_uri(settings.tables_dir, EPISODES)).sort("episode_id")
    rows = episodes.select("episode_id", "termination", "success", "steps").rows()
    assert rows == [(quiet, "abandoned", False, 1), ("c1-click-test-2-2", "success", True, 2)]
    samples = pl.read_delta(table_uri(settings.tables_dir, TRAINING_SAMPLES))
    assert set(samples["episode_id"]) == {"c1-click-test-2-2"}  # the abandoned one is never curated


def test_an_episode_left_open_by_a_killed_worker_and_a_gone_client_is_closed_by_the_next_worker(stack):
    """The client died mid-episode and the worker died after committing its steps: nothing will ever come on that
    partition again. The restarted worker recovers the open episode from `steps` and, its partition quiet for the gap
    of wall clock, closes it as abandoned, once."""
    settings, gone = stack.settings, "c0-click-test-1-1"
    produce(settings, [step_event(gone, step=0, done=False, reward=0.0)])
    worker = stack.start_worker("--no-restart", "--abandon-after-s=8")
    wait_until(landed(settings, worker, 1), 120, what="the open episode's step in Delta")
    worker.stop(signal.SIGKILL, timeout=5)  # before the gap: it dies holding the episode open
    assert episode_stats(settings.tables_dir)["episodes"] == 0
    worker = stack.start_worker("--no-restart", "--abandon-after-s=8")
    wait_until(lambda: episode_stats(settings.tables_dir)["episodes"] >= 1, 90, what="the abandoned episode")
    time.sleep(10)  # another gap: a second close would have come by now
    import polars as pl

    rows = pl.read_delta(table_uri(settings.tables_dir, EPISODES)).select("episode_id", "termination", "steps").rows()
    assert rows == [(gone, "abandoned", 1)] and worker.running()
