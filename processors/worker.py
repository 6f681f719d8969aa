"""The faust worker: three short agents that route events through the pure functions of
processors.scoring into the Delta sinks of processors.delta_sink.

  steps topic ──▶ ingest_steps ──▶ Delta `steps` (bad events ──▶ dead-letter topic)
             └──▶ assemble_episodes ──▶ episodes topic ──▶ sink_episodes ──▶ Delta `episodes`, `training_samples`
"""

from __future__ import annotations

import asyncio
import logging
import time

import faust

from flywheel.observe import LagExporter, serve_metrics
from flywheel.settings import Settings, get_settings
from processors import metrics
from processors.batching import Batcher
from processors.delta_sink import DeltaSink, Record
from processors.rows import episode_row, sample_rows, step_row
from processors.scoring import EpisodeProgress, curate, score_episode
from processors.tables import EPISODES, STEPS, TRAINING_SAMPLES
from schemas import EpisodeEvent, EventDecodeError, StepEvent, decode_event, encode_event
from streams.faust_app import app_topics, make_app

log = logging.getLogger(__name__)
BATCH_MAX = 500
BATCH_WITHIN_S = 1.0


def decode_step(payload: bytes, max_screenshot_bytes: int) -> StepEvent:
    step = decode_event(payload, expect=StepEvent)
    if len(step.screenshot) > max_screenshot_bytes:
        raise EventDecodeError(
            "oversize_screenshot", f"screenshot is {len(step.screenshot)} bytes > {max_screenshot_bytes}"
        )
    return step


def dead_letter_headers(message: faust.types.Message, error: EventDecodeError) -> dict[str, bytes]:
    return {
        "reason": error.reason.encode(),
        "detail": str(error)[:1000].encode(),
        "source_topic": message.topic.encode(),
        "source_partition": str(message.partition).encode(),
        "source_offset": str(message.offset).encode(),
    }


class EpisodeDeduper:
    """Episode ids already in a table: assembly may emit an episode twice after a crash, with two
    different offsets, so the offset check alone cannot catch it."""

    def __init__(self, sink: DeltaSink):
        self.sink = sink
        self.seen: set[str] | None = None

    def fresh(self, records: list[Record]) -> list[Record]:
        if self.seen is None:
            self.seen = self.sink.existing_values("episode_id")
        kept = []
        for record in records:
            if record.key in self.seen:
                record = Record(record.topic, record.partition, record.offset, [], record.key)
            elif record.key:
                self.seen.add(record.key)
            kept.append(record)
        return kept


def build_app(settings: Settings) -> faust.App:
    app = make_app(settings)
    topics = app_topics(app, settings)
    progress_table = app.Table("episode_progress", default=None, partitions=settings.topic_partitions)

    batchers: list[Batcher] = []

    @app.timer(interval=BATCH_WITHIN_S / 4)
    async def flush_due_batches():
        for batcher in batchers:
            await batcher.flush_if_due()

    @app.agent(topics["steps"])
    async def ingest_steps(stream):
        sink = DeltaSink(settings.tables_dir, STEPS)

        async def write_steps(events) -> None:
            records, dead, produced_at = [], [], {}
            for event in events:
                message = event.message
                try:
                    step = decode_step(message.value, settings.max_screenshot_bytes)
                    rows = [step_row(step, message.partition, message.offset)]
                    produced_at[(message.topic, message.partition, message.offset)] = step.produced_at
                except EventDecodeError as error:
                    dead.append((message, error))
                    rows = []
                records.append(Record(message.topic, message.partition, message.offset, rows))
            fresh = await asyncio.to_thread(sink.not_yet_written, records)
            fresh_offsets = {(r.topic, r.partition, r.offset) for r in fresh}
            sent = 0
            for message, error in dead:
                at = (message.topic, message.partition, message.offset)
                if at in fresh_offsets:
                    fresh_offsets.discard(at)  # a redelivered copy in the same batch is not sent twice
                    # before the Delta commit: a crash in between re-sends it rather than losing it
                    await topics["dead_letters"].send(value=message.value, headers=dead_letter_headers(message, error))
                    metrics.DEAD_LETTERS.labels(error.reason).inc()
                    sent += 1
            await _commit(sink, fresh)
            committed_at = time.time()
            for record in fresh:
                if record.rows:
                    at = (record.topic, record.partition, record.offset)
                    metrics.END_TO_END_SECONDS.observe(max(0.0, committed_at - produced_at[at]))
            metrics.BATCH_EVENTS.labels(STEPS).observe(len(events))
            metrics.EVENTS.labels("steps", "ok").inc(len(fresh) - sent)
            metrics.EVENTS.labels("steps", "dead_letter").inc(sent)
            metrics.EVENTS.labels("steps", "duplicate").inc(len(events) - len(fresh))

        batcher = Batcher(write_steps, BATCH_MAX, BATCH_WITHIN_S)
        batchers.append(batcher)
        async for event in stream.noack().events():
            await batcher.add(event)

    @app.agent(topics["steps"])
    async def assemble_episodes(stream):
        async for event in stream.events():
            try:
                step = decode_step(event.message.value, settings.max_screenshot_bytes)
            except EventDecodeError:
                continue  # ingest_steps dead-letters it
            progress = EpisodeProgress.from_dict(progress_table.get(step.episode_id))
            progress.add(step)
            if not step.done:
                progress_table[step.episode_id] = progress.to_dict()
                continue
            episode = score_episode(step, progress)
            await topics["episodes"].send(key=step.episode_id.encode(), value=encode_event(episode))
            metrics.count_episode(episode.task, episode.success, episode.model_version)
            progress_table.pop(step.episode_id, None)

    @app.agent(topics["episodes"])
    async def sink_episodes(stream):
        episodes_sink = DeltaSink(settings.tables_dir, EPISODES)
        samples_sink = DeltaSink(settings.tables_dir, TRAINING_SAMPLES)
        episodes_seen, samples_seen = EpisodeDeduper(episodes_sink), EpisodeDeduper(samples_sink)

        async def write_episodes(events) -> None:
            episode_records, sample_records = [], []
            for event in events:
                message = event.message
                at = (message.topic, message.partition, message.offset)
                try:
                    episode = decode_event(message.value, expect=EpisodeEvent)
                except EventDecodeError as error:
                    await topics["dead_letters"].send(value=message.value, headers=dead_letter_headers(message, error))
                    metrics.DEAD_LETTERS.labels(error.reason).inc()
                    episode_records.append(Record(*at, []))
                    sample_records.append(Record(*at, []))
                    continue
                kept = curate(episode)
                samples = sample_rows(episode, *kept, message.partition, message.offset) if kept else []
                episode_records.append(
                    Record(*at, [episode_row(episode, message.partition, message.offset)], episode.episode_id)
                )
                sample_records.append(Record(*at, samples, episode.episode_id))
            for sink, seen, records in (
                (episodes_sink, episodes_seen, episode_records),
                (samples_sink, samples_seen, sample_records),
            ):
                fresh = await asyncio.to_thread(sink.not_yet_written, records)
                await _commit(sink, seen.fresh(fresh))
            metrics.BATCH_EVENTS.labels(EPISODES).observe(len(events))
            metrics.EVENTS.labels("episodes", "ok").inc(len(events))

        batcher = Batcher(write_episodes, BATCH_MAX, BATCH_WITHIN_S)
        batchers.append(batcher)
        async for event in stream.noack().events():
            await batcher.add(event)

    return app


async def _commit(sink: DeltaSink, records: list[Record]) -> None:
    if not records:
        return
    started = time.perf_counter()
    rows = await asyncio.to_thread(sink.write, records)
    metrics.DELTA_COMMIT_SECONDS.labels(sink.table).observe(time.perf_counter() - started)
    metrics.DELTA_COMMITS.labels(sink.table).inc()
    metrics.DELTA_ROWS.labels(sink.table).inc(rows)


def run_worker(settings: Settings | None = None, metrics_port: int = 0, loglevel: str = "warning") -> None:
    """Run the faust worker in the foreground until SIGTERM/SIGINT."""
    settings = settings or get_settings()
    settings.tables_dir.mkdir(parents=True, exist_ok=True)
    serve_metrics("flywheel-processors", settings.metrics_host, metrics_port)
    LagExporter(settings).start()  # consumer lag from Delta offsets, kafka_exporter's names
    app = build_app(settings)
    faust.Worker(app, loglevel=loglevel, quiet=True).execute_from_commandline()
