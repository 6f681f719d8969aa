from deltalake import DeltaTable

from lake.tables import EPISODES, STEPS
from processors.dedup import RecentIds
from processors.delta_sink import DeltaSink, Record, app_id
from processors.scoring import EpisodeProgress, score_episode
from processors.table_rows import episode_row, step_row
from tests.factories import step_event


def records(offsets, partition=0, topic="t.steps"):
    return [Record(topic, partition, o, [step_row(step_event(step=o), partition, o)]) for o in offsets]


def test_offsets_commit_with_rows_and_redelivery_is_skipped(tmp_path):
    sink = DeltaSink(tmp_path, STEPS)
    assert sink.write(records(range(0, 5))) == 5
    # a restarted worker gets 3..7 again: only 5..7 are new
    fresh_sink = DeltaSink(tmp_path, STEPS)
    assert fresh_sink.write(records(range(3, 8))) == 3
    table = DeltaTable(str(tmp_path / STEPS))
    assert table.transaction_version(app_id(STEPS, "t.steps", 0)) == 7
    assert sorted(table.to_pyarrow_table(columns=["kafka_offset"]).column(0).to_pylist()) == list(range(8))


def test_partitions_are_tracked_separately(tmp_path):
    sink = DeltaSink(tmp_path, STEPS)
    sink.write(records([10, 11], partition=0) + records([3], partition=1))
    assert sink.committed_offsets({("t.steps", 0), ("t.steps", 1), ("t.steps", 2)}) == {
        ("t.steps", 0): 11,
        ("t.steps", 1): 3,
        ("t.steps", 2): -1,
    }


def test_dead_letter_offsets_advance_without_rows(tmp_path):
    sink = DeltaSink(tmp_path, STEPS)
    sink.write(records([0]) + [Record("t.steps", 0, 1, [])])
    assert sink.committed_offsets({("t.steps", 0)}) == {("t.steps", 0): 1}
    assert sink.write([Record("t.steps", 0, 1, [])]) == 0
    assert DeltaTable(str(tmp_path / STEPS)).to_pyarrow_table().num_rows == 1


def test_repeats_within_a_batch_are_written_once(tmp_path):
    """After a rebalance faust redelivers from the committed offset what the batch already holds."""
    sink = DeltaSink(tmp_path, STEPS)
    assert sink.write(records([0, 1, 2]) + records([1, 2, 3])) == 4
    offsets = DeltaTable(str(tmp_path / STEPS)).to_pyarrow_table(columns=["kafka_offset"]).column(0).to_pylist()
    assert sorted(offsets) == [0, 1, 2, 3]


def test_a_failed_batch_write_is_neither_acked_nor_dropped():
    import asyncio

    import pytest

    from processors.batching import Batcher

    class Event:
        acked = False

        def ack(self):
            self.acked = True

    async def failing_flush(events):
        raise OSError("disk full")

    failures = []
    batcher = Batcher(failing_flush, failures.append, max_size=2)
    events = [Event(), Event()]

    async def run():
        await batcher.add(events[0])
        await batcher.add(events[1])
        await batcher.drain()
        with pytest.raises(OSError):  # the stream stops at its next event
            await batcher.add(Event())

    asyncio.run(run())
    assert [type(f) for f in failures] == [OSError]
    assert batcher.events == events and not any(e.acked for e in events)


def test_the_stream_keeps_reading_while_a_batch_is_written_and_writes_stay_in_order():
    """The next batch fills behind the write in flight; writes never overlap; a full batch queued
    behind the write makes the stream wait."""
    import asyncio

    from processors.batching import Batcher

    class Event:
        acked = False

        def ack(self):
            self.acked = True

    written, writing = [], []

    async def run():
        store_answers = asyncio.Event()

        async def slow_flush(events):
            writing.append(1)
            assert len(writing) == 1, "two writes at once"
            await store_answers.wait()
            written.append(list(events))
            writing.pop()

        batcher = Batcher(slow_flush, lambda error: None, max_size=2, max_age_s=60)
        events = [Event() for _ in range(5)]
        for event in events[:3]:  # the first two fill a batch and start its write, the third queues
            await asyncio.wait_for(batcher.add(event), timeout=1)
        assert written == [] and batcher.events == events[2:3] and not any(e.acked for e in events)

        fourth = asyncio.ensure_future(batcher.add(events[3]))  # a second full batch: the stream waits
        await asyncio.sleep(0.05)
        assert not fourth.done()
        store_answers.set()
        await asyncio.wait_for(fourth, timeout=1)
        await batcher.add(events[4])
        await asyncio.wait_for(batcher.drain(), timeout=1)
        return events

    events = asyncio.run(run())
    assert [len(batch) for batch in written] == [2, 2, 1]
    assert [e for batch in written for e in batch] == events and all(e.acked for e in events)


def episode_records_of(episode_ids, first_offset=0, topic="t.episodes"):
    """Episodes-table records as the worker builds them: one scored episode per id."""
    built = []
    for i, episode_id in enumerate(episode_ids):
        last = step_event(episode_id=episode_id)
        progress = EpisodeProgress()
        progress.add(last)
        offset = first_offset + i
        built.append(Record(topic, 0, offset, [episode_row(score_episode(last, progress), 0, offset)]))
    return built


def test_an_episode_another_worker_wrote_after_we_loaded_the_ids_is_still_dropped(tmp_path):
    ours, theirs = DeltaSink(tmp_path, EPISODES), DeltaSink(tmp_path, EPISODES)
    seen = RecentIds(ours, window_s=3600)
    ours.append(seen.fresh(episode_records_of(["c0-a-1-1"])))
    seen.written()
    # The other worker held the partition before a rebalance and wrote episode b; the crash re-emits b at a
    # later offset, which reaches us.
    theirs.write(episode_records_of(["c0-b-2-2"], first_offset=1))
    again = seen.fresh(episode_records_of(["c0-b-2-2", "c0-c-3-3"], first_offset=2))
    assert [r.rows[0]["episode_id"] for r in again if r.rows] == ["c0-c-3-3"]
    ours.append(again)
    seen.written()
    ids = DeltaTable(str(tmp_path / EPISODES)).to_pyarrow_table(columns=["episode_id"]).column(0).to_pylist()
    assert sorted(ids) == ["c0-a-1-1", "c0-b-2-2", "c0-c-3-3"]


def test_a_busy_streams_batch_is_due_at_half_the_age_a_quiet_ones_at_the_whole():
    """At 1,000 steps/s a batch of 250 is due at 0.5 s (the p99 was the whole age plus a commit); 10 steps/s still
    wait the whole second (few files); a backlog fills whole batches."""
    from processors.batching import batch_due
    from processors.messages import BATCH_MAX
    from processors.worker import BATCH_EARLY, BATCH_EARLY_S, BATCH_WITHIN_S

    def due(size: int, age_s: float) -> bool:
        return batch_due(size, age_s, BATCH_MAX, BATCH_WITHIN_S, BATCH_EARLY, BATCH_EARLY_S)

    assert due(500, 0.5) and not due(499, 0.49)  # busy: 1,000/s
    assert not due(5, 0.5) and not due(9, 0.99) and due(10, 1.0)  # quiet: 10/s
    assert due(BATCH_MAX, 0.01) and not due(BATCH_MAX - 1, 0.01)  # a backlog: whole batches
    assert not due(0, 5.0)
    assert not batch_due(500, 0.6, BATCH_MAX, BATCH_WITHIN_S, 0, 0.0)  # early_size 0: never early
