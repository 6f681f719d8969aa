"""Replay: the Delta projections rebuilt from the Kafka log equal the live ones row for row."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from flywheel.processes import Child, wait_until
from processors.compare import compare_tables
from processors.queries import episode_stats, step_count
from processors.replay import replay
from processors.tables import EPISODES, STEPS, TRAINING_SAMPLES
from streams.broker import ensure_topics
from tests.factories import step_event
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
            steps.append(step_event(episode_id, step=i, done=last, reward=reward, model_version=model))
    return steps


def test_replay_rebuilds_tables_equal_to_the_live_ones(kafka_settings, tmp_path):
    settings = kafka_settings.model_copy(
        update={"data_dir": tmp_path / "data", "topic_prefix": f"test-{uuid.uuid4().hex[:8]}"}
    )
    ensure_topics(settings)
    env = {"FLYWHEEL_DATA_DIR": str(settings.data_dir), "FLYWHEEL_TOPIC_PREFIX": settings.topic_prefix}
    steps = mixed_episodes(60)
    produce(settings, [*steps[:50], b"\xc1 not an event", *steps[50:]])  # a dead letter in the log too
    worker = Child("processors", ["process"], tmp_path / "logs", env)
    try:
        wait_until(lambda: step_count(settings.tables_dir) >= len(steps), 120, what="steps in Delta")
        wait_until(lambda: episode_stats(settings.tables_dir)["episodes"] >= 60, 60, what="episodes in Delta")
    finally:
        worker.stop()

    rebuilt = tmp_path / "rebuilt"
    summary = replay(settings, rebuilt)
    assert summary.dead_letters == 1
    assert summary.rows[STEPS] == len(steps) and summary.rows[EPISODES] == 60
    diffs = compare_tables(settings.tables_dir, rebuilt, summary.horizon_by_table(settings))
    assert all(d.equal for d in diffs), diffs
    by_table = {d.table: d for d in diffs}
    assert by_table[STEPS].live_rows == len(steps) and by_table[EPISODES].live_rows == 60
    assert 0 < by_table[TRAINING_SAMPLES].live_rows < len(steps)  # curation dropped the failed demonstrations

    # The sinks' offsets are in the rebuilt tables too: replaying the same log again writes nothing.
    again = replay(settings, rebuilt)
    assert sum(again.rows.values()) == 0

    # The comparison does see a difference: an empty location misses every live row.
    empty = compare_tables(settings.tables_dir, tmp_path / "nothing")
    assert not any(d.equal for d in empty) and empty[0].missing == len(steps)

    # The command: fresh location, prints the comparison, exit 0 when equal.
    done = subprocess.run(
        [sys.executable, "-m", "flywheel.cli", "replay", "--out", str(tmp_path / "cli")],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("equal") == 3, done.stdout
