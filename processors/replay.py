"""Rebuild the Delta projections from the Kafka log into a fresh location (docs/architecture.md: the log is the
source of truth, every table a projection of it).

A bare kafka-python consumer (no group) assigns every partition of the steps and episodes topics,
reads from the beginning up to the end offsets captured when it starts (the replay's horizon), and
turns records into rows through the same functions the faust agents use (`processors.messages`, the
de-duplication by identity of `processors.dedup`, `DeltaSink` with the offsets in the commit, so a replay
interrupted half-way resumes where it stopped, and a second replay of the same horizon writes nothing).

Past the log's retention, the tables are the record of truth: the rows of offsets Kafka has deleted (below a
partition's log start) are carried over from the live tables as they are, each offset once, and the replay reads
the log from its start (`carry_past_retention`). So a table is rebuilt whole for as long as the live table keeps
what the log lost; a rebuild then proves the projection of what the log still holds.

Episodes are read from the `episodes` topic, not re-assembled from steps: the log holds the scored
EpisodeEvents the live sink wrote, with their event ids. Re-scoring would mint
new event ids (and could not know which of two copies emitted after a crash the live table kept),
so the rebuilt `episodes` table could not equal the live one row for row. Assembly and scoring are
pure functions (processors.scoring) covered by their own tests; replay reproduces the projection
of what the log says happened.
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import polars as pl
from kafka import KafkaConsumer, TopicPartition

from core.settings import Settings
from lake.queries import scan_table
from lake.tables import EPISODES, STEPS, TRAINING_SAMPLES
from processors.curation import CurationHistory
from processors.dedup import RecentIds
from processors.delta_sink import DeltaSink, Record
from processors.messages import BATCH_MAX, episode_records, step_records
from processors.worker_config import WorkerConfig
from streams.kafka_clients import make_consumer
from streams.topics import topics_for

log = logging.getLogger(__name__)

# Offsets per (topic, partition): the first offset NOT included (Kafka's "end offset").
Horizon = dict[tuple[str, int], int]


# --- reading the log up to a horizon ----------------------------------------------------------------------------


def log_starts(consumer: KafkaConsumer, horizon: Horizon) -> Horizon:
    """The first offset the log still holds, per partition of `horizon` (above 0 once retention deleted some)."""
    partitions = [TopicPartition(t, p) for t, p in horizon]
    return {(tp.topic, tp.partition): start for tp, start in consumer.beginning_offsets(partitions).items()}


def assign_from_beginning(consumer: KafkaConsumer, topics: list[str], timeout_s: float = 30.0) -> Horizon:
    """Assign every partition of `topics`, seek to their beginnings; return the end offsets as of now."""
    deadline = time.monotonic() + timeout_s
    partitions: list[TopicPartition] = []
    for topic in topics:
        while not (ids := consumer.partitions_for_topic(topic)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"no metadata for topic {topic} after {timeout_s:.0f} s")
            time.sleep(0.2)
        partitions += [TopicPartition(topic, p) for p in sorted(ids)]
    consumer.assign(partitions)
    consumer.seek_to_beginning(*partitions)
    return {(tp.topic, tp.partition): end for tp, end in consumer.end_offsets(partitions).items()}


def read_until(
    consumer: KafkaConsumer, horizon: Horizon, max_records: int = BATCH_MAX, stall_s: float = 60.0
) -> Iterator[list]:
    """Polled batches of records below the horizon, until every partition has reached it.

    Raises TimeoutError when nothing arrives for `stall_s` seconds while records are still missing.
    """
    pending = {TopicPartition(t, p) for (t, p), end in horizon.items() if consumer.position(TopicPartition(t, p)) < end}
    consumer.pause(*[tp for tp in consumer.assignment() if tp not in pending])
    last_progress = time.monotonic()
    while pending:
        polled = consumer.poll(timeout_ms=500, max_records=max_records)
        batch = []
        for tp, records in polled.items():
            end = horizon[(tp.topic, tp.partition)]
            batch += [r for r in records if r.offset < end]
        for tp in list(pending):
            if consumer.position(tp) >= horizon[(tp.topic, tp.partition)]:
                pending.discard(tp)
                consumer.pause(tp)
        if batch:
            last_progress = time.monotonic()
            yield batch
        elif time.monotonic() - last_progress > stall_s:
            short = len(pending)
            raise TimeoutError(f"reading stalled for {stall_s:.0f} s with {short} partitions short of the horizon")


# --- replay -----------------------------------------------------------------------------------------------------


@dataclass
class ReplaySummary:
    horizon: Horizon
    records: dict[str, int] = field(default_factory=dict)  # topic -> records read
    carried: dict[str, int] = field(default_factory=dict)  # table -> rows carried from the live table (past retention)
    rows: dict[str, int] = field(default_factory=dict)  # table -> rows written
    dead_letters: int = 0  # undecodable steps skipped (the live worker dead-lettered them already)
    wall_s: float = 0.0

    def horizon_by_table(self, settings: Settings) -> dict[str, dict[int, int]]:
        """{table: {partition: end offset}} of the topic each table is projected from."""
        topics = topics_for(settings)
        source = {STEPS: topics.steps.name, EPISODES: topics.episodes.name, TRAINING_SAMPLES: topics.episodes.name}
        return {
            table: {p: end for (t, p), end in self.horizon.items() if t == topic} for table, topic in source.items()
        }


def replay(
    settings: Settings,
    out_dir: Path,
    worker: WorkerConfig | None = None,
    batch_size: int = BATCH_MAX,
    progress: Callable[[ReplaySummary], None] | None = None,
) -> ReplaySummary:
    """Rebuild `steps`, `episodes` and `training_samples` under `out_dir` from the log of `settings`' topics, with
    the screenshot bound and dedup window of the workers that wrote the live tables (`worker`; None: the defaults)."""
    worker = worker or WorkerConfig()
    started = time.monotonic()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    topics = topics_for(settings)
    steps_topic, episodes_topic = topics.steps.name, topics.episodes.name
    step_ids, episode_ids, sample_ids = (
        RecentIds(DeltaSink(out_dir, table), worker.dedup_window_s) for table in (STEPS, EPISODES, TRAINING_SAMPLES)
    )

    consumer = make_consumer(settings, "flywheel-replay", consumer_timeout_ms=1000, fetch_max_bytes=64 * 1024 * 1024)
    try:
        horizon = assign_from_beginning(consumer, [steps_topic, episodes_topic])
        summary = ReplaySummary(horizon, records={steps_topic: 0, episodes_topic: 0},
                                rows={STEPS: 0, EPISODES: 0, TRAINING_SAMPLES: 0})  # fmt: skip
        starts = log_starts(consumer, horizon)
        sources = {STEPS: (steps_topic, step_ids), EPISODES: (episodes_topic, episode_ids),
                   TRAINING_SAMPLES: (episodes_topic, sample_ids)}  # fmt: skip
        for table, (topic, ids) in sources.items():
            summary.carried[table] = carry_past_retention(settings, table, topic, starts, ids, batch_size)
            summary.rows[table] += summary.carried[table]
        buffers: dict[str, list] = {steps_topic: [], episodes_topic: []}
        history = CurationHistory(episode_ids.sink)  # what curation judged each episode on, as the worker does

        def flush(topic: str) -> None:
            batch, buffers[topic] = buffers[topic], []
            if not batch:
                return
            summary.records[topic] += len(batch)
            if topic == steps_topic:
                steps = step_records(batch, worker.max_screenshot_bytes)
                summary.dead_letters += len(steps.dead)
                summary.rows[STEPS] += _write(step_ids, steps.records)
            else:
                episodes, samples, _dead = episode_records(batch, history.curate)
                summary.rows[EPISODES] += _write(episode_ids, episodes)
                history.committed()
                summary.rows[TRAINING_SAMPLES] += _write(sample_ids, samples)
            if progress is not None:
                progress(summary)

        # Records of one partition arrive in offset order, and every sink drops offsets it already holds, so
        # writing per-topic batches in poll order keeps each table's projection identical to the live one.
        for batch in read_until(consumer, horizon, max_records=batch_size):
            for record in batch:
                buffers[record.topic].append(record)
            for topic, buffer in buffers.items():
                if len(buffer) >= batch_size:
                    flush(topic)
        for topic in buffers:
            flush(topic)
    finally:
        consumer.close()
    summary.wall_s = time.monotonic() - started
    return summary


def carry_past_retention(settings: Settings, table: str, topic: str, starts: Horizon, ids: RecentIds,
                         batch_size: int = BATCH_MAX) -> int:  # fmt: skip
    """Copy the live `table`'s rows of `topic`'s offsets below each partition's log start into the rebuilt one (its
    sink in `ids`), `batch_size` offsets at a time as the live sink wrote them (days of screenshots never in memory
    at once); the rows carried."""
    live = scan_table(settings.tables_dir, table)
    carried = 0
    for (source, partition), start in sorted(starts.items()):
        if source != topic or start == 0 or live is None:
            continue
        below = live.filter((pl.col("kafka_partition") == partition) & (pl.col("kafka_offset") < start))
        offsets = below.select(pl.col("kafka_offset").unique().sort()).collect()["kafka_offset"].to_list()
        for first in range(0, len(offsets), batch_size):
            chunk = offsets[first : first + batch_size]
            rows = below.filter(pl.col("kafka_offset").is_between(chunk[0], chunk[-1])).sort("kafka_offset")
            records = [Record(topic, partition, offset, list(group)) for offset, group in
                       itertools.groupby(rows.collect().to_dicts(), key=lambda row: row["kafka_offset"])]  # fmt: skip
            carried += _write(ids, records)
    return carried


def _write(ids: RecentIds, records: list) -> int:
    """Append the records neither written nor repeating a row already written, as the live sink does; the rows."""
    rows = ids.sink.append(ids.fresh(records))
    ids.written()
    return rows
