"""Delta maintenance that loses nothing: compaction, vacuum, checkpoints and log cleanup, off the sinks' path.

`flywheel maintain` runs it, or a background thread of the worker (`flywheel process --maintenance-interval-s`);
a sink's commit never does. Per table, in this order:

1. Compact small files (`optimize.compact`). Its commit only rearranges files (dataChange false) and carries
   no app transactions, so the sinks' offsets (`transaction_version`) stay what they were, and delta-rs does
   not count it as a conflict for a concurrent append: a sink never fails because of it. When appends win
   the race for the next version too often, the compaction fails instead (CommitFailedError) and is retried.
2. Vacuum, lite (only files a commit removed, never an uncommitted file a sink is still writing), with
   `keep_versions`: the files of every version still needed stay. Needed: each published model's lineage
   version of the table (the registry's manifests) and each running learner's pin (lake.pins). A retention
   of `min_retention_hours` protects readers of any other recent version (a query, the episode de-duper).
   Keeping by version rather than by a retention reaching back to the oldest needed version: the first
   model's lineage would otherwise hold every file ever removed, forever.
3. Checkpoint when commits have piled up since the last one (the sinks also write one every 100 commits,
   delta-rs's default), so opening the table reads one parquet file and a few JSON commits.
4. Remove expired log files (older than the table's delta.logRetentionDuration, 30 days by default), but
   only below the oldest needed version: `cleanup_metadata` on the table loaded at that version keeps every
   commit from the last checkpoint at or below it, so each needed version stays loadable. delta-rs's own
   cleanup after each commit, which keeps only what the newest version needs, is off by the tables'
   configuration (lake.tables.TABLE_CONFIGURATION; `configure` sets it on a table made before it).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError

from core.object_store import join
from core.settings import Settings
from lake.pins import live_pins
from lake.tables import (
    EPISODES,
    STEPS,
    TABLE_CONFIGURATION,
    TRAINING_SAMPLES,
    open_table,
    table_exists,
    table_files,
    table_uri,
)
from registry.store import read_manifests

log = logging.getLogger(__name__)
T = TypeVar("T")
MB = 1024 * 1024


@dataclass(frozen=True)
class MaintenanceConfig:
    """`flywheel maintain`: when a table is compacted and checkpointed, and what vacuum keeps."""

    tables: tuple[str, ...] = (STEPS, EPISODES, TRAINING_SAMPLES)
    """Tables to maintain."""
    min_small_files: int = 8
    """Compact when at least this many small files could be merged (two or more in a partition)."""
    small_file_mb: float = 32.0
    """A file below this size is small."""
    target_file_mb: float = 128.0
    """Compaction writes files of about this size."""
    checkpoint_after: int = 10
    """Checkpoint when at least this many commits are newer than the last checkpoint."""
    min_retention_hours: int = 1
    """Vacuum deletes a removed file only this long after its removal (readers of versions nobody pinned)."""
    vacuum: bool = True
    """Delete the files no needed version reads."""
    cleanup_logs: bool = True
    """Delete expired log files below the oldest needed version."""
    attempts: int = 5
    """Tries of a compaction or vacuum whose commit lost to concurrent writers."""


# --- planning: pure functions of what the table and the registry say ---------------------------------------------


def needed_versions(table: str, manifests: Iterable[Mapping], pins: Iterable[Mapping[str, int]]) -> set[int]:
    """Versions of `table` that a published model's lineage or a running learner's pin names."""
    lineages = [manifest.get("lineage") or {} for manifest in manifests]
    return {int(versions[table]) for versions in (*lineages, *pins) if table in versions}


def versions_to_keep(needed: Iterable[int], current: int) -> list[int]:
    """The needed versions this table has (one above its current version names an earlier table of the name)."""
    return sorted({v for v in needed if 0 <= v <= current})


def mergeable_small_files(files: Iterable[tuple[tuple, int]], small_bytes: float) -> int:
    """Small files compaction can merge, of (partition values, size) pairs: those sharing a partition."""
    per_partition = Counter(partition for partition, size in files if size < small_bytes)
    return sum(count for count in per_partition.values() if count >= 2)


def needs_compaction(files: Iterable[tuple[tuple, int]], config: MaintenanceConfig) -> bool:
    return mergeable_small_files(files, config.small_file_mb * MB) >= config.min_small_files


def commits_since_checkpoint(version: int, last_checkpoint: int | None) -> int:
    """JSON commits a reader replays on top of the last checkpoint (all of them without one)."""
    return version - (-1 if last_checkpoint is None else last_checkpoint)


def needs_checkpoint(version: int, last_checkpoint: int | None, config: MaintenanceConfig) -> bool:
    return commits_since_checkpoint(version, last_checkpoint) >= config.checkpoint_after


def cleanup_floor(keep: Iterable[int], current: int) -> int:
    """The oldest version log cleanup must leave loadable."""
    return min([*keep, current])


# --- one table -------------------------------------------------------------------------------------------------


@dataclass
class TableStats:
    version: int
    files: int  # data files of the current version
    size_bytes: int
    log_files: int  # JSON commits and checkpoint files in _delta_log
    commits_since_checkpoint: int
    open_s: float  # open_table(uri) + to_pyarrow_dataset(): what every reader pays first


@dataclass
class TableReport:
    table: str
    before: TableStats | None  # None when the table could not even be opened (then `error` says why)
    after: TableStats | None = None
    kept_versions: list[int] = field(default_factory=list)  # needed versions whose files vacuum left
    files_compacted: int = 0  # small files merged
    files_written: int = 0  # files compaction wrote
    vacuumed: list[str] = field(default_factory=list)  # files deleted
    configured: bool = False  # this pass set lake.tables.TABLE_CONFIGURATION (a table made before it existed)
    checkpoint: int | None = None  # version checkpointed by this pass
    log_files_removed: int = 0
    error: str = ""


@dataclass
class MaintenanceReport:
    tables: list[TableReport]
    wall_s: float

    @property
    def ok(self) -> bool:
        return not any(t.error for t in self.tables)

    def as_json(self) -> dict:
        return {"tables": [asdict(t) for t in self.tables], "wall_s": self.wall_s}


def partitioned_files(dt: DeltaTable) -> list[tuple[tuple, int]]:
    """(partition values, size in bytes) of every data file of the table's version."""
    adds = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
    columns = [c for c in adds if c.startswith("partition.")]
    return [(tuple(adds[c][i] for c in columns), size) for i, size in enumerate(adds["size_bytes"])]


def last_checkpoint(uri: str) -> int | None:
    pointer = table_files().read(join(uri, "_delta_log", "_last_checkpoint"))
    return json.loads(pointer)["version"] if pointer is not None else None


def log_file_count(uri: str) -> int:
    return sum(1 for p in table_files().list(join(uri, "_delta_log")) if str(p).endswith((".json", ".parquet")))


def table_stats(uri: str) -> TableStats:
    started = time.perf_counter()
    dt = open_table(uri)
    dt.to_pyarrow_dataset()
    open_s = time.perf_counter() - started
    files = partitioned_files(dt)
    since = commits_since_checkpoint(dt.version(), last_checkpoint(uri))
    return TableStats(dt.version(), len(files), sum(s for _, s in files), log_file_count(uri), since, open_s)


def unloadable(uri: str, versions: Iterable[int]) -> list[int]:
    """Versions whose log is gone already: vacuum could not keep their files, so it must not run."""
    lost = []
    for version in versions:
        try:
            open_table(uri, version=version)
        except Exception:  # noqa: BLE001 - delta-rs reports a missing version several ways
            lost.append(version)
    return lost


def _retrying(operation: Callable[[], T], attempts: int, what: str) -> T:
    """Run `operation` again when its commit lost to concurrent writers (each try opens the table afresh)."""
    for attempt in range(1, attempts + 1):
        try:
            return operation()
        except CommitFailedError as error:
            if attempt == attempts:
                raise
            log.info("%s lost its commit to concurrent writers (%s); retrying", what, error)
            time.sleep(0.2 * attempt)
    raise AssertionError("unreachable")


def configure(uri: str) -> bool:
    """Give a table made before lake.tables.TABLE_CONFIGURATION existed that configuration, before any commit of
    ours could clean up its log; True when it had to. A metadata change: a sink committing at that very moment
    fails once, and its worker restarts and is redelivered what it had not written (processors.worker.crash)."""
    dt = open_table(uri)
    if TABLE_CONFIGURATION.items() <= dt.metadata().configuration.items():
        return False
    log.warning("%s: setting %s (once per table)", uri, TABLE_CONFIGURATION)
    dt.alter.set_table_properties(TABLE_CONFIGURATION, raise_if_not_exists=False)
    return True


def vacuum(uri: str, keep: list[int], config: MaintenanceConfig) -> list[str]:
    """Delete the removed files no kept version reads; return those deleted. A removal stays in the log for a week
    (delta.deletedFileRetentionDuration) and vacuum lists its file again each time, gone or not: only files still
    there count, and without any the vacuum (two commits) is skipped."""
    dt = open_table(uri)
    options = dict(retention_hours=config.min_retention_hours, enforce_retention_duration=False,
                   keep_versions=keep or None)  # fmt: skip
    files = table_files()
    present = [path for path in dt.vacuum(dry_run=True, **options) if files.exists(join(uri, path))]
    if present:
        dt.vacuum(dry_run=False, **options)
    return present


def maintain_table(uri: str, needed: set[int], config: MaintenanceConfig) -> TableReport:
    """Compact, vacuum, checkpoint and clean up one table (module docstring), keeping every `needed` version."""
    report = TableReport(Path(uri).name, None)
    name = report.table
    try:
        report.before = table_stats(uri)
        report.configured = _retrying(lambda: configure(uri), config.attempts, f"{name}: configuration")
        if needs_compaction(partitioned_files(open_table(uri)), config):
            target = int(config.target_file_mb * MB)
            metrics = _retrying(
                lambda: open_table(uri).optimize.compact(target_size=target),
                config.attempts,
                f"{name}: compaction",
            )
            report.files_compacted, report.files_written = metrics["numFilesRemoved"], metrics["numFilesAdded"]
        current = open_table(uri).version()
        keep = versions_to_keep(needed, current)
        report.kept_versions = keep
        if config.vacuum:
            if lost := unloadable(uri, keep):
                raise RuntimeError(f"needed versions {lost} of {name} are no longer loadable: vacuum skipped")
            report.vacuumed = _retrying(lambda: vacuum(uri, keep, config), config.attempts, f"{name}: vacuum")
        dt = open_table(uri)
        if needs_checkpoint(dt.version(), last_checkpoint(uri), config):
            dt.create_checkpoint()
            report.checkpoint = dt.version()
        if config.cleanup_logs:
            before = log_file_count(uri)
            open_table(uri, version=cleanup_floor(keep, dt.version())).cleanup_metadata()
            report.log_files_removed = before - log_file_count(uri)
    except Exception as error:  # noqa: BLE001 - one table's failure is reported; the sinks never see it
        log.warning("maintenance of %s failed: %r", name, error)
        report.error = repr(error)
    with contextlib.suppress(Exception):  # the error above is the report's; no stats is no news
        report.after = table_stats(uri)
    return report


# --- every table, on a schedule -----------------------------------------------------------------------------------


def maintain_tables(settings: Settings, config: MaintenanceConfig | None = None) -> MaintenanceReport:
    """One maintenance pass over the tables of `settings` that exist."""
    config = config or MaintenanceConfig()
    started = time.perf_counter()
    # Strict: a manifest it cannot read may pin versions; the pass fails (and says why) rather than vacuum them.
    manifests, pins = read_manifests(settings.artifacts_dir, skip_unreadable=False), live_pins(settings.pins_dir)
    reports = []
    for table in config.tables:
        uri = table_uri(settings.tables_dir, table)
        if table_exists(uri):
            reports.append(maintain_table(uri, needed_versions(table, manifests, pins), config))
    return MaintenanceReport(reports, time.perf_counter() - started)


def maintain_every(
    settings: Settings,
    interval_s: float,
    stop: threading.Event,
    config: MaintenanceConfig | None = None,
    on_report: Callable[[MaintenanceReport], None] | None = None,
    wait_first: bool = False,
) -> None:
    """A pass every `interval_s` seconds until `stop` is set; a failed pass is logged and the next one tries again."""
    if wait_first and stop.wait(interval_s):
        return
    while True:
        try:
            report = maintain_tables(settings, config)
            log.info("delta maintenance: %s", format_report(report))
            if on_report is not None:
                on_report(report)
        except Exception:  # noqa: BLE001 - maintenance must never take the worker down
            log.exception("delta maintenance pass failed")
        if stop.wait(interval_s):
            return


def start_background(settings: Settings, interval_s: float) -> threading.Event:
    """Maintain in a daemon thread (the worker's option): set the returned event to stop it. delta-rs releases
    the GIL while it compacts, so the sinks' event loop keeps running meanwhile."""
    stop = threading.Event()
    thread = threading.Thread(
        target=maintain_every, args=(settings, interval_s, stop), kwargs={"wait_first": True},
        name="delta-maintenance", daemon=True,
    )  # fmt: skip
    thread.start()
    return stop


def format_report(report: MaintenanceReport) -> str:
    header = (f"{'table':18s} {'version':>13s} {'files':>13s} {'log files':>11s} {'open ms':>13s} "
              f"{'vacuumed':>8s} {'checkpoint':>10s}  kept versions")  # fmt: skip
    lines = [header, "-" * len(header)]
    for t in report.tables:
        if t.before is None:
            lines.append(f"{t.table:18s}  ERROR {t.error}")
            continue
        b, a = t.before, t.after or t.before
        checkpoint = "" if t.checkpoint is None else t.checkpoint
        error = f"  ERROR {t.error}" if t.error else ""
        lines.append(
            f"{t.table:18s} {_change(b.version, a.version):>13s} {_change(b.files, a.files):>13s} "
            f"{_change(b.log_files, a.log_files):>11s} {_change(b.open_s * 1000, a.open_s * 1000, '.0f'):>13s} "
            f"{len(t.vacuumed):8d} {checkpoint:>10}  {t.kept_versions or '-'}{error}"
        )
    lines.append(f"{len(report.tables)} table(s) in {report.wall_s:.1f} s")
    return "\n".join(lines)


def _change(before: float, after: float, spec: str = "d") -> str:
    return f"{before:{spec}} -> {after:{spec}}"
