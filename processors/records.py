"""Kafka records -> sink records: what the faust worker, the replay and the bare-consumer benchmark all do
to a batch, as functions of the batch. Messages need topic, partition, offset and value (kafka-python's
ConsumerRecord and faust's Message both have them)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from processors.delta_sink import DeltaSink, Record
from processors.rows import episode_row, sample_rows, step_row
from processors.scoring import curate
from schemas import EpisodeEvent, EventDecodeError, StepEvent, decode_event

BATCH_MAX = 2000  # records per Delta commit at most (bigger batches amortise the commit under load)


def decode_step(payload: bytes, max_screenshot_bytes: int) -> StepEvent:
    step = decode_event(payload, expect=StepEvent)
    if len(step.screenshot) > max_screenshot_bytes:
        raise EventDecodeError(
            "oversize_screenshot", f"screenshot is {len(step.screenshot)} bytes > {max_screenshot_bytes}"
        )
    return step


def dead_letter_headers(message, error: EventDecodeError) -> dict[str, bytes]:
    return {
        "reason": error.reason.encode(),
        "detail": str(error)[:1000].encode(),
        "source_topic": message.topic.encode(),
        "source_partition": str(message.partition).encode(),
        "source_offset": str(message.offset).encode(),
    }


@dataclass
class StepBatch:
    records: list[Record]  # one per message; a dead letter has no rows but keeps its offset
    steps: dict[tuple[str, int, int], StepEvent] = field(default_factory=dict)  # by (topic, partition, offset)
    dead: dict[tuple[str, int, int], tuple[object, EventDecodeError]] = field(default_factory=dict)

    def keep_only(self, fresh: list[Record]) -> StepBatch:
        """The part of this batch that `fresh` (the records not yet in Delta) covers, in batch order."""
        at = {(r.topic, r.partition, r.offset) for r in fresh}
        return StepBatch(
            fresh,
            {k: v for k, v in self.steps.items() if k in at},
            {k: v for k, v in self.dead.items() if k in at},
        )


def step_records(messages: Iterable, max_screenshot_bytes: int) -> StepBatch:
    batch = StepBatch([])
    for message in messages:
        at = (message.topic, message.partition, message.offset)
        try:
            step = decode_step(message.value, max_screenshot_bytes)
        except EventDecodeError as error:
            batch.dead[at] = (message, error)
            batch.records.append(Record(*at, []))
            continue
        batch.steps[at] = step
        batch.records.append(Record(*at, [step_row(step, message.partition, message.offset)]))
    return batch


def episode_records(messages: Iterable) -> tuple[list[Record], list[Record], list[tuple[object, EventDecodeError]]]:
    """(episodes records, training_samples records, dead letters), keyed by episode_id for the
    de-duplication above the offset level."""
    episodes, samples, dead = [], [], []
    for message in messages:
        at = (message.topic, message.partition, message.offset)
        try:
            episode = decode_event(message.value, expect=EpisodeEvent)
        except EventDecodeError as error:
            dead.append((message, error))
            episodes.append(Record(*at, []))
            samples.append(Record(*at, []))
            continue
        kept = curate(episode)
        rows = sample_rows(episode, *kept, message.partition, message.offset) if kept else []
        episodes.append(Record(*at, [episode_row(episode, message.partition, message.offset)], episode.episode_id))
        samples.append(Record(*at, rows, episode.episode_id))
    return episodes, samples, dead


class EpisodeDeduper:
    """Episode ids already in a table: assembly may emit an episode twice after a crash, with two
    different offsets, so the offset check alone cannot catch it.

    The ids are loaded once and then kept up to date by this process's own commits; should the table
    move by a commit that is not ours (another worker, which held these partitions before a rebalance),
    they are loaded again, so a copy that worker already wrote is still recognised.
    """

    def __init__(self, sink: DeltaSink):
        self.sink = sink
        self.seen: set[str] | None = None
        self.synced_version = -2  # the table version `seen` reflects

    def fresh(self, records: list[Record]) -> list[Record]:
        """Records whose episode is not in the table yet (call after `sink.not_yet_written`, which refreshes
        the table); repeats become row-less records that still carry their offsets."""
        if self.seen is None or self.sink.version() != self.synced_version:
            self.seen = self.sink.existing_values("episode_id")  # refreshes the table again
            self.synced_version = self.sink.version()
        kept = []
        for record in records:
            if record.key in self.seen:
                record = Record(record.topic, record.partition, record.offset, [], record.key)
            elif record.key:
                self.seen.add(record.key)
            kept.append(record)
        return kept

    def written(self) -> None:
        """Our commit of what `fresh` kept landed: its ids are in `seen` already. Only when it directly
        follows the version `seen` reflects is nothing else missed."""
        if self.sink.written_version == self.synced_version + 1:
            self.synced_version = self.sink.written_version
