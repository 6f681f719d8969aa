"""Exactly once by identity (processors.dedup): the same event at two offsets lands once, across batches, restarts,
another writer's commits and the window's edge, with the index bounded by the window."""

from __future__ import annotations

import time

import pytest
from deltalake import DeltaTable

from lake.tables import EPISODES, STEPS, TRAINING_SAMPLES
from processors.curation import Curated
from processors.dedup import RecentIds
from processors.delta_sink import DeltaSink, Record
from processors.scoring import EpisodeProgress, score_episode
from processors.table_rows import episode_row, sample_rows, step_row
from tests.factories import step_event

TOPIC = "t.steps"


class Clock:
    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def record(step, offset: int, partition: int = 0) -> Record:
    return Record(TOPIC, partition, offset, [step_row(step, partition, offset)])


def write(ids: RecentIds, records: list[Record]) -> list[Record]:
    """What the worker does with a batch: keep what is new, commit it, tell the index."""
    fresh = ids.fresh(records)
    ids.sink.append(fresh)
    ids.written()
    return fresh


def column(tmp_path, table: str, name: str) -> list:
    return DeltaTable(str(tmp_path / table)).to_pyarrow_table(columns=[name]).column(0).to_pylist()


def test_the_same_step_at_two_offsets_lands_once_within_and_across_batches(tmp_path):
    ids = RecentIds(DeltaSink(tmp_path, STEPS), window_s=3600)
    a, b, c = step_event(step=0), step_event(step=1), step_event(step=2)
    fresh = write(ids, [record(a, 0), record(b, 1), record(a, 2)])  # a re-sent within the batch
    assert [len(r.rows) for r in fresh] == [1, 1, 0]  # the repeat keeps its offset, without its row
    write(ids, [record(b, 3), record(c, 4)])
    assert sorted(column(tmp_path, STEPS, "event_id")) == sorted([a.event_id, b.event_id, c.event_id])
    assert DeltaTable(str(tmp_path / STEPS)).transaction_version(f"{STEPS}-{TOPIC}-0") == 4


def test_a_resend_after_a_restart_lands_once(tmp_path):
    first = RecentIds(DeltaSink(tmp_path, STEPS), window_s=3600)
    a = step_event()
    write(first, [record(a, 0)])
    restarted = RecentIds(DeltaSink(tmp_path, STEPS), window_s=3600)  # a new process: loads the window from Delta
    assert [r.rows for r in write(restarted, [record(a, 7)])] == [[]]
    assert column(tmp_path, STEPS, "event_id") == [a.event_id]


def test_rows_another_worker_wrote_to_our_partitions_are_read_again(tmp_path):
    ours = RecentIds(DeltaSink(tmp_path, STEPS), window_s=3600)
    theirs = RecentIds(DeltaSink(tmp_path, STEPS), window_s=3600)
    a, b, c = step_event(step=0), step_event(step=1), step_event(step=2)
    write(ours, [record(a, 0, partition=0)])  # our index is loaded now
    write(theirs, [record(b, 0, partition=1), record(c, 1, partition=0)])  # before a rebalance gave us both
    again = write(ours, [record(b, 1, partition=1), record(c, 2, partition=0)])  # their steps, re-sent
    assert [r.rows for r in again] == [[], []]
    assert sorted(column(tmp_path, STEPS, "event_id")) == sorted([a.event_id, b.event_id, c.event_id])


def test_an_event_older_than_the_window_is_looked_up_in_the_table(tmp_path):
    clock = Clock(time.time())
    ids = RecentIds(DeltaSink(tmp_path, STEPS), window_s=60, clock=clock)
    recent, old = step_event(step=0), step_event(step=1, produced_at=clock.now - 7200)
    write(ids, [record(recent, 0)])
    write(ids, [record(old, 1)])
    assert ids.horizon == pytest.approx(recent.produced_at - 60)
    assert old.event_id not in ids.ids  # older than the window: not held in memory
    again = write(ids, [record(old, 2), record(step_event(step=2, produced_at=old.produced_at + 1), 3)])
    assert [len(r.rows) for r in again] == [0, 1]  # the copy found in the table, the new old step kept
    restarted = RecentIds(DeltaSink(tmp_path, STEPS), window_s=60, clock=clock)
    assert [r.rows for r in write(restarted, [record(old, 4)])] == [[]]
    assert len(column(tmp_path, STEPS, "event_id")) == 3


def test_the_index_holds_only_the_window_however_long_it_runs(tmp_path):
    clock = Clock(1_700_000_000.0)
    ids = RecentIds(DeltaSink(tmp_path, STEPS), window_s=60, clock=clock)
    held = []
    for batch in range(40):  # 40 batches 10 s apart, 50 steps each: 2000 steps over 400 s
        clock.now += 10
        steps = [step_event(step=i, produced_at=clock.now - i * 0.01) for i in range(50)]
        write(ids, [record(s, batch * 50 + i) for i, s in enumerate(steps)])
        held.append(len(ids.ids))
    assert max(held) <= 50 * (60 / 10 + 2)  # the window (6 batches) and the bucket it starts in
    assert sum(len(keys) for keys in ids.buckets.values()) == len(ids.ids)


def test_a_replay_of_an_old_log_keeps_a_window_of_its_own(tmp_path, monkeypatch):
    """Days-old steps read in order: the window follows the log's time, so they need no table lookups."""
    sink = DeltaSink(tmp_path, STEPS)
    ids = RecentIds(sink, window_s=60)
    reads = []
    monkeypatch.setattr(sink, "read", lambda *args: reads.append(args) or DeltaSink.read(sink, *args))
    start = time.time() - 3 * 86400
    steps = [step_event(step=i % 10, produced_at=start + i) for i in range(300)]
    for first in range(0, 300, 50):
        write(ids, [record(s, first + i) for i, s in enumerate(steps[first : first + 50])])
    write(ids, [record(steps[-1], 300)])  # a copy at the end of the log
    assert len(reads) <= 1  # the load on first use; no lookups of "old" steps
    assert len(column(tmp_path, STEPS, "event_id")) == 300


def scored(last, offset: int):
    """The episode `last` ends, scored as assembly emits it (a fresh event_id every time), and its records."""
    progress = EpisodeProgress()
    progress.add(last)
    episode = score_episode(last, progress)
    episodes = Record("t.episodes", 0, offset, [episode_row(episode, 0, offset)])
    samples = Record("t.episodes", 0, offset, sample_rows(episode, Curated("demo", 1.0, "demonstration"), 0, offset))
    return episode, episodes, samples


def test_an_episode_emitted_twice_lands_once_with_its_samples_once(tmp_path):
    episodes = RecentIds(DeltaSink(tmp_path, EPISODES), window_s=3600)
    samples = RecentIds(DeltaSink(tmp_path, TRAINING_SAMPLES), window_s=3600)
    last = step_event(step=2)
    first, first_episode, first_samples = scored(last, 0)
    write(episodes, [first_episode])
    write(samples, [first_samples])
    # the crash re-emits it: another event_id, the same episode, the same produced_at (its final step's)
    again, again_episode, again_samples = scored(last, 1)
    assert again.event_id != first.event_id and again.produced_at == first.produced_at
    restarted = RecentIds(DeltaSink(tmp_path, TRAINING_SAMPLES), window_s=3600)
    assert [r.rows for r in write(episodes, [again_episode])] == [[]]
    assert [r.rows for r in write(restarted, [again_samples])] == [[]]
    assert column(tmp_path, EPISODES, "event_id") == [first.event_id]
    assert sorted(column(tmp_path, TRAINING_SAMPLES, "step")) == [0, 1, 2]
