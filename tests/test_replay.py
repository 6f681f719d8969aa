"""Replay: the Delta projections rebuilt from the Kafka log equal the live ones row for row."""

from __future__ import annotations

import os
import subprocess
import sys

import msgspec
import polars as pl
import pytest
from kafka import TopicPartition

from core.processes import wait_until
from lake.queries import episode_stats, step_count
from lake.tables import EPISODES, STEPS, TRAINING_SAMPLES, table_uri
from processors.compare import compare_tables
from processors.replay import replay
from streams.kafka_clients import make_admin, make_producer
from streams.topics import topics_for
from tests.factories import EpisodeEventV1, step_event, v1_step_bytes
from tests.test_pipeline import produce

pytestmark = pytest.mark.kafka


def mixed_episodes(count: int) -> list:
    """Expert and model episodes, successes and failures, of 1-4 steps (so curation keeps some and drops some)."""
    steps = []
    for n in range(count):
        length, success, model = 1 + n % 4, n % 3 != 0, "expert" if n % 2 else "sft-0001"
        episode_id = f"r{n % 3}-click-test-{n}-{n}"
        for i in range(length):
            last = i == length - 1
            reward = (1.0 if success else -1.0) if last else 0.0
            steps.append(step_event(episode_id, step=i, done=last, reward=reward, model_version=model, seed=n))
    return steps


# Scored by a v1 worker before the upgrade: still in the episodes topic, in v1's words ("done", "failed", seed -1).
V1_EPISODES = [
    EpisodeEventV1("e-old-0", "old", 1.0, "old-click-test-5-0", "click-test", 5, 1, 1.0, 1.0, True, "done", "expert",
                   "expert", score=1.0),
    EpisodeEventV1("e-old-1", "old", 1.0, "old-click-test-x-1", "click-test", -1, 2, -1.0, -1.0, False, "failed",
                   "sft-0001", "model"),
]  # fmt: skip


def produce_v1(settings, steps: list, episodes: list) -> None:
    """A log written before schema v2: steps as v1 clients encoded them, episodes as the v1 worker did."""
    producer = make_producer(settings, "test-v1")
    topics = topics_for(settings)
    for step in steps:
        producer.send(topics.steps.name, key=step.episode_id.encode(), value=v1_step_bytes(step))
    for episode in episodes:
        producer.send(topics.episodes.name, key=episode.episode_id.encode(), value=msgspec.msgpack.encode(episode))
    producer.flush()
    producer.close()


def test_replay_rebuilds_tables_equal_to_the_live_ones(stack, tmp_path):
    settings = stack.settings
    steps = mixed_episodes(60)
    old = [s for s in steps if int(s.episode_id.split("-")[-1]) < 20]  # the first 20 episodes predate v2
    produce_v1(settings, old, V1_EPISODES)
    new = steps[len(old) :]
    produce(settings, [*new[:30], b"\xc1 not an event", *new[30:]])  # a dead letter in the log too
    episodes = 60 + len(V1_EPISODES)
    worker = stack.start_worker()
    wait_until(lambda: step_count(settings.tables_dir) >= len(steps), 120, what="steps in Delta")
    wait_until(lambda: episode_stats(settings.tables_dir)["episodes"] >= episodes, 60, what="episodes in Delta")
    worker.stop()

    rebuilt = tmp_path / "rebuilt"
    summary = replay(settings, rebuilt)
    assert summary.dead_letters == 1
    assert summary.rows[STEPS] == len(steps) and summary.rows[EPISODES] == episodes
    diffs = compare_tables(settings.tables_dir, rebuilt, summary.horizon_by_table(settings))
    assert all(d.equal for d in diffs), diffs
    by_table = {d.table: d for d in diffs}
    assert by_table[STEPS].live_rows == len(steps) and by_table[EPISODES].live_rows == episodes
    assert 0 < by_table[TRAINING_SAMPLES].live_rows < len(steps)  # curation dropped the failed demonstrations

    # v1 events kept their meaning, in v2's words: the ending and the seed the v1 scorer would have given them.
    rows = pl.read_delta(table_uri(rebuilt, EPISODES)).select("episode_id", "termination", "seed", "success")
    by_id = {r["episode_id"]: r for r in rows.iter_rows(named=True)}
    assert (by_id["old-click-test-5-0"]["termination"], by_id["old-click-test-5-0"]["seed"]) == ("success", 5)
    assert (by_id["old-click-test-x-1"]["termination"], by_id["old-click-test-x-1"]["seed"]) == ("failure", None)
    for n in range(60):  # assembled from v1 and v2 steps alike
        episode = by_id[f"r{n % 3}-click-test-{n}-{n}"]
        assert episode["seed"] == n  # v1: parsed from the episode id by the upcaster; v2: carried by the step
        assert episode["termination"] == ("success" if episode["success"] else "failure")

    # The sinks' offsets are in the rebuilt tables too: replaying the same log again writes nothing.
    again = replay(settings, rebuilt)
    assert sum(again.rows.values()) == 0

    # The comparison does see a difference: an empty location misses every live row.
    empty = compare_tables(settings.tables_dir, tmp_path / "nothing")
    assert not any(d.equal for d in empty) and empty[0].missing == len(steps)

    # The command: fresh location, prints the comparison, exit 0 when equal.
    done = subprocess.run(
        [sys.executable, "-m", "flywheel.cli", "replay", "--out", str(tmp_path / "cli")],
        env={**os.environ, **stack.env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("equal") == 3, done.stdout

    # Retention deletes the log's oldest records (here: half of each partition): the tables are the record of truth
    # past it, so the rows of the deleted offsets are carried over from them and the rest replayed from the log.
    topics = topics_for(settings)
    admin = make_admin(settings, "test-retention")
    ends = {tp: end for (t, p), end in summary.horizon.items() for tp in [TopicPartition(t, p)] if end}
    admin.delete_records({tp: end // 2 for tp, end in ends.items()}, timeout_ms=30_000)
    admin.close()
    past = replay(settings, tmp_path / "past-retention")
    assert past.carried[STEPS] > 0 and past.carried[EPISODES] > 0 and past.records[topics.steps.name] < len(steps)
    assert past.rows[STEPS] == len(steps) and past.rows[EPISODES] == episodes
    diffs = compare_tables(settings.tables_dir, tmp_path / "past-retention", past.horizon_by_table(settings))
    assert all(d.equal for d in diffs), diffs
