"""Delta maintenance that loses nothing (processors/maintenance.py): the planning functions, then real tables built
by the sink: compacted and vacuumed with every pinned version still readable, offsets unchanged, log cleanup only
below the oldest needed version, appends running meanwhile; and, with the real broker and worker, every event
exactly once across a compaction and a restart that redelivers the whole log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import polars as pl
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError

from core.object_store import join
from core.processes import wait_until
from core.settings import Settings
from flywheel.bench.maintenance import rows_at
from lake.pins import live_pins, pinned
from lake.tables import EPISODES, STEPS, TRAINING_SAMPLES, open_table, scan, table_uri
from learner.data.tables import load_samples, table_versions
from processors.delta_sink import DeltaSink, Record, app_id
from processors.maintenance import (
    MB,
    MaintenanceConfig,
    cleanup_floor,
    commits_since_checkpoint,
    format_report,
    maintain_tables,
    mergeable_small_files,
    needed_versions,
    needs_checkpoint,
    needs_compaction,
    start_background,
    versions_to_keep,
)
from processors.table_rows import step_row
from tests.factories import step_event

PARTITIONS = 2
NOW_AND_NO_RETENTION = MaintenanceConfig(min_retention_hours=0)  # files just removed go at once


# --- planning ---------------------------------------------------------------------------------------------------


def test_needed_versions_are_every_lineage_and_live_pin_of_the_table():
    manifests = [{"lineage": {STEPS: 3, TRAINING_SAMPLES: 1}}, {"lineage": {STEPS: 9}}, {"version": "no lineage"}]
    pins = [{STEPS: 12}, {EPISODES: 4}]
    assert needed_versions(STEPS, manifests, pins) == {3, 9, 12}
    assert needed_versions(TRAINING_SAMPLES, manifests, pins) == {1}
    assert needed_versions(EPISODES, manifests, pins) == {4}
    assert versions_to_keep({3, 9, 12, -1}, current=10) == [3, 9]  # 12: an earlier table of that name
    assert cleanup_floor([3, 9], 10) == 3
    assert cleanup_floor([], 10) == 10


def test_compaction_counts_only_the_small_files_it_can_merge():
    config = MaintenanceConfig(min_small_files=3, small_file_mb=1.0)
    one_per_day = [((f"2026-12-0{day}",), 1000) for day in range(1, 5)]
    assert mergeable_small_files(one_per_day, MB) == 0
    assert not needs_compaction(one_per_day, config)
    one_day = [(("2026-12-01",), 1000)] * 3 + [(("2026-12-01",), 2 * MB)]
    assert mergeable_small_files(one_day, MB) == 3
    assert needs_compaction(one_day, config)


def test_a_checkpoint_after_enough_commits():
    config = MaintenanceConfig(checkpoint_after=10)
    assert commits_since_checkpoint(9, None) == 10
    assert needs_checkpoint(9, None, config)
    assert not needs_checkpoint(108, 99, config)
    assert needs_checkpoint(109, 99, config)


def test_pins_count_while_their_process_runs(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / f"{dead.pid}.json").write_text(json.dumps({STEPS: 1}))  # a learner that crashed
    (tmp_path / "notes.json").write_text("{}")
    with pinned(tmp_path, {STEPS: 7}) as path:
        assert path.name == f"{os.getpid()}.json"
        assert live_pins(tmp_path) == [{STEPS: 7}]
    assert not path.exists()
    assert live_pins(tmp_path) == []


# --- real tables ------------------------------------------------------------------------------------------------


def write_commits(settings: Settings, commits: range) -> None:
    """One sink commit per table and commit number c (table version c), one step per Kafka partition at offset c,
    over two date partitions; the training samples name every step."""
    steps, samples = DeltaSink(settings.tables_dir, STEPS), DeltaSink(settings.tables_dir, TRAINING_SAMPLES)
    for c in commits:
        produced_at = time.time() - 86400 * (c % 2)
        events = [step_event(f"c0-click-test-{c}-{p}", produced_at=produced_at) for p in range(PARTITIONS)]
        steps.write([Record("t.steps", p, c, [step_row(e, p, c)]) for p, e in enumerate(events)])
        samples.write([Record("t.episodes", p, c, [sample_row(e, p, c)]) for p, e in enumerate(events)])


def sample_row(event, partition: int, offset: int) -> dict:
    return {"episode_id": event.episode_id, "step": event.step, "task": event.task, "purpose": "demo", "weight": 1.0,
            "score": 1.0, "model_version": "expert", "kafka_partition": partition, "kafka_offset": offset,
            "ingested_at": 0.0}  # fmt: skip


def publish_lineage(settings: Settings, lineage: dict[str, int], name: str = "sft-0001") -> None:
    manifest = {"version": name, "produced_at": time.time(), "lineage": lineage}
    settings.files().write(join(settings.artifacts_dir, "manifests", f"{name}.json"), json.dumps(manifest).encode())


def column(uri: str, name: str) -> list:
    return open_table(uri).to_pyarrow_table(columns=[name]).column(0).to_pylist()


def offsets(uri: str, topic: str = "t.steps") -> list[int | None]:
    table = open_table(uri)
    return [table.transaction_version(app_id(os.path.basename(uri), topic, p)) for p in range(PARTITIONS)]


def sorted_samples(frame: pl.DataFrame) -> pl.DataFrame:
    return frame.sort("episode_id", "step")


@pytest.fixture(params=["local", "s3"])
def data_settings(request, tmp_path) -> Settings:
    """Settings of a data dir on the local disk, then on the object store (S3Proxy): the same maintenance on both."""
    return Settings(data_dir=tmp_path / "data") if request.param == "local" else request.getfixturevalue("s3_settings")


def test_compaction_and_vacuum_keep_every_pinned_version_and_every_offset(data_settings):
    settings = data_settings
    write_commits(settings, range(60))
    uri = table_uri(settings.tables_dir, STEPS)
    model_v, learner_v = 19, 39  # a published model's lineage, a running learner's pin
    publish_lineage(settings, {STEPS: model_v, TRAINING_SAMPLES: model_v})
    lineage = {STEPS: model_v, TRAINING_SAMPLES: model_v}
    samples_before = sorted_samples(load_samples(settings.tables_dir, ("demo",), lineage))
    rows_before = {v: rows_at(uri, v) for v in (5, model_v, learner_v, 50)}
    ids, offsets_before = sorted(column(uri, "event_id")), offsets(uri)
    assert offsets_before == [59, 59]

    with pinned(settings.pins_dir, {STEPS: learner_v}):
        report = maintain_tables(settings, NOW_AND_NO_RETENTION)
    assert report.ok, report.tables
    steps = next(t for t in report.tables if t.table == STEPS)
    assert (steps.before.files, steps.after.files) == (60, 2)  # one per date partition
    assert steps.kept_versions == [model_v, learner_v]
    assert steps.vacuumed and steps.checkpoint == steps.after.version
    assert steps.after.open_s > 0

    assert sorted(column(uri, "event_id")) == ids  # every row, once
    assert offsets(uri) == offsets_before  # the sink's app transactions survived compaction and checkpoint
    for version in (model_v, learner_v, 5):  # pinned, and older ones (their files are a subset in append-only)
        assert rows_at(uri, version) == rows_before[version]
    assert rows_at(uri, 50) is None  # unpinned and newer than the pins: vacuumed
    with pytest.raises(FileNotFoundError):
        scan(uri, version=50).collect()
    # the learner reads its lineage as before
    assert sorted_samples(load_samples(settings.tables_dir, ("demo",), lineage)).equals(samples_before)

    # a restarted worker redelivering the last commits writes nothing, then goes on
    write_commits(settings, range(55, 61))
    assert sorted(column(uri, "event_id")) == sorted(ids + column_of_commit(uri, 60))
    assert len(column(uri, "event_id")) == 61 * PARTITIONS

    # the learner has finished: its version's own files go, the model's lineage stays
    again = next(t for t in maintain_tables(settings, NOW_AND_NO_RETENTION).tables if t.table == STEPS)
    assert again.kept_versions == [model_v]
    assert len(again.vacuumed) == learner_v - model_v  # the files of commits 20..39
    assert rows_at(uri, learner_v) is None
    assert rows_at(uri, model_v) == rows_before[model_v]
    # and a pass with nothing to do commits nothing
    idle = next(t for t in maintain_tables(settings, NOW_AND_NO_RETENTION).tables if t.table == STEPS)
    assert idle.vacuumed == [] and idle.after.version == idle.before.version


def column_of_commit(uri: str, commit: int) -> list[str]:
    frame = scan(uri).filter(pl.col("kafka_offset") == commit).collect()
    return frame["event_id"].to_list()


def age_logs(uri: str, days: float = 60) -> None:
    """Make every log file look `days` old (log cleanup goes by file modification time)."""
    old = time.time() - days * 86400
    log_dir = os.path.join(uri, "_delta_log")
    for name in os.listdir(log_dir):
        os.utime(os.path.join(log_dir, name), (old, old))


def test_log_cleanup_only_below_the_oldest_needed_version(tmp_path):
    settings = Settings(data_dir=tmp_path / "data")
    uri = table_uri(settings.tables_dir, STEPS)
    write_commits(settings, range(90))
    age_logs(uri)
    write_commits(settings, range(90, 120))  # the sink's commits, its checkpoint at 99 too, leave the aged ones
    assert os.path.exists(os.path.join(uri, "_delta_log", f"{0:020d}.json"))
    config = MaintenanceConfig(tables=(STEPS,), min_retention_hours=0)
    # as a table made before lake.tables.TABLE_CONFIGURATION: delta-rs would clean up after each commit
    DeltaTable(uri).alter.set_table_properties({"delta.enableExpiredLogCleanup": "true"})

    publish_lineage(settings, {STEPS: 30})
    age_logs(uri)
    with pinned(settings.pins_dir, {STEPS: 110}):
        report = maintain_tables(settings, config)
    assert report.ok and report.tables[0].configured  # before its compaction's commit could clean up
    assert report.tables[0].log_files_removed == 0  # no checkpoint at or below 30 to cut at
    assert rows_at(uri, 30) == 31 * PARTITIONS

    (settings.artifacts_dir / "manifests" / "sft-0001.json").unlink()  # that model is gone from the store
    age_logs(uri)
    with pinned(settings.pins_dir, {STEPS: 110}):
        report = maintain_tables(settings, config)
    assert report.ok and not report.tables[0].configured
    assert report.tables[0].log_files_removed == 99  # commits 0..98, below the checkpoint at 99
    assert rows_at(uri, 110) == 111 * PARTITIONS
    assert rows_at(uri, 99) == 100 * PARTITIONS
    with pytest.raises(TableNotFoundError, match="No files in log segment"):
        DeltaTable(uri, version=30)
    assert offsets(uri) == [119, 119]


def test_appends_while_maintenance_runs_lose_and_duplicate_nothing(tmp_path):
    settings = Settings(data_dir=tmp_path / "data")
    uri = table_uri(settings.tables_dir, STEPS)
    write_commits(settings, range(20))
    errors: list[BaseException] = []

    def append() -> None:
        try:
            write_commits(settings, range(20, 120))
        except BaseException as error:  # noqa: BLE001 - the test thread reports it
            errors.append(error)

    sink = threading.Thread(target=append)
    sink.start()
    config = MaintenanceConfig(tables=(STEPS,), min_retention_hours=0, min_small_files=2, checkpoint_after=1)
    reports = []
    while sink.is_alive():
        reports.append(maintain_tables(settings, config))
    sink.join()
    assert errors == []  # the sink never failed because of a compaction
    assert any(r.ok and r.tables[0].files_compacted for r in reports)
    ids = column(uri, "event_id")
    assert len(ids) == len(set(ids)) == 120 * PARTITIONS
    assert offsets(uri) == [119, 119]


def test_a_table_that_cannot_be_opened_is_reported_and_the_others_are_maintained(tmp_path):
    settings = Settings(data_dir=tmp_path / "data")
    write_commits(settings, range(12))
    broken = Path(table_uri(settings.tables_dir, EPISODES)) / "_delta_log"
    broken.mkdir(parents=True)
    (broken / "00000000000000000000.json").write_text("not a delta log")
    report = maintain_tables(settings, MaintenanceConfig(min_retention_hours=0))
    by_table = {t.table: t for t in report.tables}
    assert not report.ok and by_table[EPISODES].before is None and by_table[EPISODES].error
    assert by_table[STEPS].error == "" and by_table[STEPS].after.files < by_table[STEPS].before.files
    assert EPISODES in format_report(report)


def test_background_maintenance_runs_until_stopped(tmp_path):
    settings = Settings(data_dir=tmp_path / "data")
    uri = table_uri(settings.tables_dir, STEPS)
    write_commits(settings, range(12))
    stop = start_background(settings, 0.05)
    try:
        wait_until(lambda: len(DeltaTable(uri).file_uris()) == 2, 60, interval=0.1, what="a background compaction")
    finally:
        stop.set()
    assert len(column(uri, "event_id")) == 12 * PARTITIONS


def test_maintain_command_once(tmp_path):
    settings = Settings(data_dir=tmp_path / "data")
    write_commits(settings, range(10))
    done = subprocess.run(
        [sys.executable, "-m", "flywheel.cli", "maintain", "--once", "--json", "--min-retention-hours", "0"],
        env={**os.environ, "FLYWHEEL_DATA_DIR": str(settings.data_dir)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    tables = {t["table"]: t for t in json.loads(done.stdout)["tables"]}
    assert set(tables) == {STEPS, TRAINING_SAMPLES}  # episodes: not created yet
    assert tables[STEPS]["before"]["files"] == 10
    assert tables[STEPS]["after"]["files"] == 2


# --- the real worker --------------------------------------------------------------------------------------------


@pytest.mark.kafka
def test_exactly_once_across_maintenance_and_a_full_redelivery(stack, tmp_path):
    """The worker commits while maintenance compacts, vacuums and checkpoints its tables; then it restarts with its
    Kafka group deleted, so the whole episodes log is delivered again and the steps stream reads on from the offsets
    in the compacted steps table: the offsets drop every repeat,
    the new events land once, the learner's lineage reads as before, and a replay rebuilds the tables."""
    from streams.kafka_clients import make_admin
    from tests.test_faults import FAST_FAILOVER, Pipeline, Producer, episodes, produce_now

    pipeline, settings = Pipeline(stack, tmp_path), stack.settings
    worker = pipeline.start_worker()
    warmup = episodes("w", 1)
    produce_now(settings, warmup)
    wait_until(pipeline.landed([worker], len(warmup), 1), 120, what="the worker consuming")
    first = warmup + episodes("m", 500)  # then 1500 steps over ~10 s: a commit or so a second per table
    producer = Producer(settings, first[len(warmup) :], rate=150.0)
    producer.start()
    wait_until(pipeline.landed([worker], 300, 50), 120, interval=0.2, what="the first commits")
    wait_until(lambda: pipeline.column(TRAINING_SAMPLES, "episode_id"), 60, interval=0.2, what="the first samples")
    lineage = table_versions(settings.tables_dir)
    publish_lineage(settings, lineage)
    samples_before = sorted_samples(load_samples(settings.tables_dir, ("demo",), lineage))

    config = MaintenanceConfig(min_retention_hours=0, min_small_files=2, checkpoint_after=1)
    reports = [maintain_tables(settings, config)]
    while producer.is_alive() or not pipeline.landed([worker], len(first), 501)():
        reports.append(maintain_tables(settings, config))
    assert len(producer.result(60)) == len(first) - len(warmup)
    reports.append(maintain_tables(settings, config))
    assert any(t.files_compacted and t.vacuumed for r in reports for t in r.tables if t.table == STEPS)
    assert all(r.ok for r in reports), [t.error for r in reports for t in r.tables if t.error]
    pipeline.assert_exactly_once(first)

    worker.stop()  # SIGTERM: it leaves the group, which can then be deleted
    admin = make_admin(settings, "test-maintenance")
    group = f"{settings.topic_prefix}-flywheel-processors"
    try:
        # 'OK', or NonEmptyGroupError until the broker has seen the worker leave
        wait_until(lambda: dict(admin.delete_groups([group]))[group] == "OK", 60, what="the worker's group deleted")
    finally:
        admin.close()
    # the restarted worker maintains its tables itself too, in the background
    restarted = stack.start_worker("--maintenance-interval-s=1", env=FAST_FAILOVER)
    second = episodes("n", 100)
    producer = Producer(settings, second, rate=300.0)
    producer.start()
    assert len(producer.result(60)) == len(second)
    wait_until(pipeline.landed([restarted], len(first + second), 601), 180, what="the redelivered and new events")
    pipeline.assert_exactly_once(first + second)
    assert sorted_samples(load_samples(settings.tables_dir, ("demo",), lineage)).equals(samples_before)
    assert restarted.running(), restarted.tail()
