"""The worker: the steps stream (a plain consumer taking whole fetches, processors.steps_stream) and a faust agent
for episodes, routing batches through the functions of processors.messages, processors.assembly and
processors.scoring into the Delta sinks of processors.delta_sink.

  steps topic ──▶ ingest_steps ──▶ Delta `steps`            (bad events ──▶ dead-letter topic)
                       └── assembly + scoring ──▶ episodes topic ──▶ sink_episodes ──▶ Delta `episodes`,
                                                                                        `training_samples`
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from pathlib import Path

import faust
import uvloop

from core.metrics import serve_metrics
from core.settings import Settings
from lake.tables import EPISODES, STEPS, TRAINING_SAMPLES
from processors import maintenance, metrics
from processors.assembly import EpisodeAssembler
from processors.batching import Batcher
from processors.curation import CurationHistory
from processors.dedup import RecentIds
from processors.delta_sink import DeltaSink, Record
from processors.faust_app import app_topics, make_app
from processors.lag import LagExporter
from processors.messages import BATCH_MAX, dead_among, dead_letter_headers, episode_records, step_records
from processors.steps_stream import StepsStream
from processors.worker_config import WorkerConfig
from schemas import encode_event

log = logging.getLogger(__name__)
BATCH_WITHIN_S = 1.0  # a batch is committed when it holds BATCH_MAX records or its oldest is this old,
BATCH_EARLY, BATCH_EARLY_S = 250, 0.5  # or, busy, when it holds this many and is this old (processors.batching)
IDLE_CHECK_S = 5.0  # how often partitions gone quiet are checked for episodes to close (processors.assembly.tick)


def crash(error: BaseException) -> None:
    """A batch could not be written, or the steps stream stopped: exit at once, acking nothing. faust would restart
    only the agent and carry on past the lost batch; a new process reads again from what the tables hold instead
    (steps from their Delta offsets; episodes from Kafka's committed offsets, the Delta offsets dropping repeats)."""
    log.critical("a batch write failed or the steps stream stopped, exiting to read again: %r", error)
    logging.shutdown()
    os._exit(70)


def build_app(settings: Settings, config: WorkerConfig) -> faust.App:
    app = make_app(settings)
    topics = app_topics(app, settings)
    batchers: list[Batcher] = []
    assembler = EpisodeAssembler(settings.tables_dir, config.abandon_after_s, on_late=metrics.LATE_STEPS.inc)

    assembly_turn = asyncio.Lock()  # assembly runs in a thread: one batch or tick at a time

    async def emit_episodes(episodes) -> list:
        """Send scored episodes, keyed by task (a task's episodes in one partition, in one order:
        processors.curation); return the delivery futures."""
        sent = []
        for episode in episodes:
            sent.append(await topics["episodes"].send(key=episode.task.encode(), value=encode_event(episode)))
            metrics.count_episode(episode)
        return sent

    @app.timer(interval=BATCH_WITHIN_S / 10)
    async def flush_due_batches():
        for batcher in batchers:
            await batcher.flush_if_due()

    @app.timer(interval=IDLE_CHECK_S)
    async def close_idle_partitions():
        # Their steps are committed already; a crash before delivery leaves the episodes open in `steps`, and the
        # next worker to hold the partition recovers and closes them.
        async with assembly_turn:
            await asyncio.gather(*await emit_episodes(await asyncio.to_thread(assembler.tick)))

    async def dead_letter(dead) -> list:
        """Send dead letters; return the delivery futures (await them before committing offsets)."""
        sent = []
        for message, error in dead:
            value = message.value or b""  # a record without a value (a tombstone) has nothing else to keep
            sent.append(await topics["dead_letters"].send(value=value, headers=dead_letter_headers(message, error)))
            metrics.DEAD_LETTERS.labels(error.reason).inc()
        return sent

    @app.task
    async def ingest_steps():
        sink = DeltaSink(settings.tables_dir, STEPS)
        step_ids = RecentIds(sink, config.dedup_window_s)

        async def write_steps(events) -> None:
            batch = step_records(events, config.max_screenshot_bytes)
            fresh = batch.keep_only(await asyncio.to_thread(step_ids.fresh, batch.records))
            # Dead letters and finished episodes reach Kafka before the commit (faust's send only buffers,
            # so wait for delivery): a crash in between re-sends them (the episodes sink drops repeats)
            # rather than losing them.
            sent = await dead_letter(fresh.dead.values())
            async with assembly_turn:
                sent += await emit_episodes(await asyncio.to_thread(assembler.observe_batch, fresh.steps))
            await asyncio.gather(*sent)
            await _commit(sink, fresh.records)
            step_ids.written()
            committed_at = time.time()
            for step in fresh.steps.values():
                metrics.END_TO_END_SECONDS.observe(max(0.0, committed_at - step.produced_at))
            metrics.BATCH_EVENTS.labels(STEPS).observe(len(events))
            metrics.EVENTS.labels("steps", "ok").inc(len(fresh.steps))
            metrics.EVENTS.labels("steps", "dead_letter").inc(len(fresh.dead))
            metrics.EVENTS.labels("steps", "duplicate").inc(len(events) - len(fresh.steps) - len(fresh.dead))

        batcher = Batcher(write_steps, crash, BATCH_MAX, BATCH_WITHIN_S, BATCH_EARLY, BATCH_EARLY_S,
                          acknowledge=lambda records: None)  # fmt: skip
        batchers.append(batcher)
        # The assignment is whole: what assembly holds of any other partition is stale from here on.
        stream = StepsStream(settings, batcher, assembler.assign)
        try:
            await stream.run()
        except asyncio.CancelledError:
            raise  # the worker stops
        except Exception as error:  # a stream that stopped reading must not leave a worker that looks alive
            crash(error)

    @app.agent(topics["episodes"])
    async def sink_episodes(stream):
        episode_ids = RecentIds(DeltaSink(settings.tables_dir, EPISODES), config.dedup_window_s)
        sample_ids = RecentIds(DeltaSink(settings.tables_dir, TRAINING_SAMPLES), config.dedup_window_s)
        history = CurationHistory(episode_ids.sink)

        async def write_episodes(events) -> None:
            episodes, samples, dead = await asyncio.to_thread(
                episode_records, [event.message for event in events], history.curate
            )
            fresh_episodes = await asyncio.to_thread(episode_ids.fresh, episodes)
            await asyncio.gather(*await dead_letter(dead_among(dead, fresh_episodes)))
            await _commit(episode_ids.sink, fresh_episodes)
            episode_ids.written()
            history.committed()
            await _commit(sample_ids.sink, await asyncio.to_thread(sample_ids.fresh, samples))
            sample_ids.written()
            metrics.BATCH_EVENTS.labels(EPISODES).observe(len(events))
            metrics.EVENTS.labels("episodes", "ok").inc(len(events) - len(dead))

        batcher = Batcher(write_episodes, crash, BATCH_MAX, BATCH_WITHIN_S, BATCH_EARLY, BATCH_EARLY_S)
        batchers.append(batcher)
        async for event in stream.noack().events():
            await batcher.add(event)

    return app


async def _commit(sink: DeltaSink, fresh: list[Record]) -> None:
    """Append records that `RecentIds.fresh` already let through."""
    if not fresh:
        return
    started = time.perf_counter()
    rows = await asyncio.to_thread(sink.append, fresh)
    metrics.DELTA_COMMIT_SECONDS.labels(sink.table).observe(time.perf_counter() - started)
    metrics.DELTA_COMMITS.labels(sink.table).inc()
    metrics.DELTA_ROWS.labels(sink.table).inc(rows)


def run_worker(settings: Settings, config: WorkerConfig) -> None:
    """Run the faust worker in the foreground until SIGTERM/SIGINT."""
    # faust runs two event loops (the agents', and the consumer thread's) whose scheduling took about a
    # quarter of the worker's CPU; uvloop's loop is C (measured +15% steps/s).
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    # faust allocates a few dozen short-lived objects per event, so the cyclic collector ran its young
    # generation every couple of dozen events: collect less often and keep the startup heap out of it (+12%).
    gc.freeze()
    gc.set_threshold(100_000, 50, 100)
    if not settings.data_is_remote:
        Path(settings.tables_dir).mkdir(parents=True, exist_ok=True)
    serve_metrics("flywheel-processors", settings.metrics_host, config.metrics_port)
    LagExporter(settings).start()  # consumer lag from Delta offsets, kafka_exporter's names
    if config.maintenance_interval_s > 0:  # its own thread, never a sink's: compaction does not block a commit
        maintenance.start_background(settings, config.maintenance_interval_s)
    app = build_app(settings, config)
    worker = faust.Worker(app, loglevel=config.loglevel, quiet=True)
    # faust's terminal spinner sets the root logger to DEBUG so that every record moves it: each debug
    # call in faust and aiokafka then builds a LogRecord per event. A service has no terminal to spin.
    worker.spinner = None
    worker.execute_from_commandline()
