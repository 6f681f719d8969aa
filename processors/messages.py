"""Kafka messages -> sink records: what the faust worker, the replay and the bare-consumer benchmark all do
to a batch, as functions of the batch. Messages need topic, partition, offset and value (kafka-python's
ConsumerRecord and faust's Message both have them)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from processors.curation import Curated, curate_batch
from processors.delta_sink import Record
from processors.table_rows import episode_row, sample_rows, step_row
from schemas import EpisodeEvent, EventDecodeError, StepEvent, decode_event

Dead = tuple[object, EventDecodeError]  # a message that is not a valid event, and why

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
        "detail": str(error)[:1000].encode(errors="replace"),
        "source_topic": message.topic.encode(),
        "source_partition": str(message.partition).encode(),
        "source_offset": str(message.offset).encode(),
    }


@dataclass
class StepBatch:
    records: list[Record]  # one per message; a dead letter has no rows but keeps its offset
    steps: dict[tuple[str, int, int], StepEvent] = field(default_factory=dict)  # by (topic, partition, offset)
    dead: dict[tuple[str, int, int], Dead] = field(default_factory=dict)

    def keep_only(self, fresh: list[Record]) -> StepBatch:
        """The part of this batch that `fresh` (the records not yet in Delta) covers, in batch order; a step whose
        record lost its row repeats one already written (processors.dedup), so assembly does not see it again."""
        kept = {(r.topic, r.partition, r.offset): r for r in fresh}
        return StepBatch(
            fresh,
            {k: v for k, v in self.steps.items() if k in kept and kept[k].rows},
            {k: v for k, v in self.dead.items() if k in kept},
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


def episode_records(
    messages: Iterable, curate: Callable[[list[tuple[int, int, EpisodeEvent]]], list[Curated | None]] | None = None
) -> tuple[list[Record], list[Record], list[Dead]]:
    """(episodes records, training_samples records, dead letters).

    `curate`: each (partition, offset, episode)'s curation, judged on the episodes before it (a
    processors.curation.CurationHistory's); None: on the batch alone (a fresh table)."""
    episodes, samples, dead = [], [], []
    decoded: list[tuple[object, EpisodeEvent | None]] = []
    for message in messages:
        try:
            decoded.append((message, decode_event(message.value, expect=EpisodeEvent)))
        except EventDecodeError as error:
            dead.append((message, error))
            decoded.append((message, None))
    valid = [(m.partition, m.offset, e) for m, e in decoded if e is not None]
    # Called for an empty batch too: a CurationHistory notes the version each batch was judged at.
    curated = iter((curate or (lambda batch: curate_batch(batch, [])))(valid))
    for message, episode in decoded:
        at = (message.topic, message.partition, message.offset)
        if episode is None:
            episodes.append(Record(*at, []))
            samples.append(Record(*at, []))
            continue
        kept = next(curated)
        rows = sample_rows(episode, kept, message.partition, message.offset) if kept else []
        episodes.append(Record(*at, [episode_row(episode, message.partition, message.offset)]))
        samples.append(Record(*at, rows))
    return episodes, samples, dead


def dead_among(dead: list[Dead], fresh: list[Record]) -> list[Dead]:
    """The dead letters whose offsets `fresh` holds: those not sent by an earlier run already."""
    kept = {(r.topic, r.partition, r.offset) for r in fresh}
    return [(m, e) for m, e in dead if (m.topic, m.partition, m.offset) in kept]
