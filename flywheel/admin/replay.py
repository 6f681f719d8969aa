"""`flywheel replay`: rebuild the Delta tables from the Kafka log into a fresh directory, and compare them with
the live ones (rows below the replay's end offsets; ingested_at ignored): the log is the source of truth."""

from __future__ import annotations

from pathlib import Path

from core.settings import Settings
from processors.worker_config import WorkerConfig

# The worker's settings that do not shape what it writes from the log (its process, assembly, maintenance).
NOT_REPLAY_FLAGS = ("metrics_port", "loglevel", "restart", "abandon_after_s", "maintenance_interval_s")


def replay_and_compare(settings: Settings, out: Path, worker: WorkerConfig, compare: bool = True) -> bool:
    """Rebuild into `out`, print what was rebuilt and how it compares; False when a table differs."""
    from processors.compare import compare_tables, format_diffs
    from processors.replay import replay

    summary = replay(settings, out, worker)
    print(f"replayed {summary.records} records in {summary.wall_s:.1f} s into {out}: rows {summary.rows}, of them "
          f"carried from the live tables past the log's retention {summary.carried}")  # fmt: skip
    if not compare:
        return True
    diffs = compare_tables(settings.tables_dir, out, summary.horizon_by_table(settings))
    print(f"live {settings.tables_dir} vs rebuilt {out} (rows below the replay's end offsets, ingested_at ignored):")
    print(format_diffs(diffs))
    return all(d.equal for d in diffs)
