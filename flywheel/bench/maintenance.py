"""`flywheel bench maintenance --rows N --out DIR`: a steps table as the sink leaves it, before and after maintenance.

Builds a `steps` table of N steps the way the worker does (DeltaSink appends with their Kafka offsets, `commits`
commits of N/commits rows each, over `days` date partitions, each step with a random screenshot of
`screenshot_bytes`), pins two versions (a published model's lineage and a running learner's pin), runs one
maintenance pass (processors.maintenance) and measures, before and after: data files, log files, commits a
reader replays past the last checkpoint, the time to open the table (DeltaTable + pyarrow dataset, and a polars
scan), and which versions still read. Writes DIR/maintenance_bench.json and prints the two side by side.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import msgspec
import polars as pl

from core.machine import machine
from core.settings import Settings
from flywheel.bench.synthetic import bench_step
from lake.pins import pinned
from lake.tables import STEPS, open_table, scan, table_uri
from processors.delta_sink import DeltaSink, Record
from processors.maintenance import MaintenanceConfig, format_report, maintain_tables, table_stats
from processors.table_rows import step_row

PARTITIONS = 4  # Kafka partitions of the synthetic steps topic
STEPS_PER_EPISODE = 5


@dataclass(frozen=True)
class MaintenanceBenchConfig:
    out: Path
    """The table (out/data) and maintenance_bench.json go here; an earlier run's table is replaced."""
    rows: int = 100_000
    """Steps (rows) in the table."""
    commits: int = 1000
    """Sink commits that append them (rows / commits each)."""
    days: int = 5
    """Date partitions the steps spread over."""
    screenshot_bytes: int = 2048
    """Size of each step's (random, incompressible) screenshot."""
    tries: int = 5
    """Timings are the median of this many tries."""


def build_steps_table(settings: Settings, config: MaintenanceBenchConfig) -> float:
    """Append the steps as the worker's sink does; return the seconds it took."""
    sink, rng = DeltaSink(settings.tables_dir, STEPS), random.Random(0)
    per_commit, next_offset = config.rows // config.commits, [0] * PARTITIONS
    started, now = time.perf_counter(), time.time()
    for commit in range(config.commits):
        produced_at = now - 86400 * (config.days - 1 - commit * config.days // config.commits)
        records = []
        for n in range(commit * per_commit, (commit + 1) * per_commit):
            episode, step = divmod(n, STEPS_PER_EPISODE)
            event = bench_step([rng.randbytes(config.screenshot_bytes)], "b", episode, step, STEPS_PER_EPISODE)
            event = msgspec.structs.replace(event, produced_at=produced_at)
            partition = episode % PARTITIONS
            offset, next_offset[partition] = next_offset[partition], next_offset[partition] + 1
            records.append(Record("bench.steps", partition, offset, [step_row(event, partition, offset)]))
        sink.write(records)
    return time.perf_counter() - started


def median_s(operation: Callable[[], object], tries: int) -> float:
    times = []
    for _ in range(tries):
        started = time.perf_counter()
        operation()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def rows_at(uri: str, version: int) -> int | None:
    """Rows of the table at `version`, None when that version no longer reads (its files were vacuumed)."""
    try:
        return scan(uri, version=version).select(pl.len()).collect().item()
    except (FileNotFoundError, OSError):
        return None


def measure(uri: str, probes: dict[str, int], tries: int) -> dict:
    stats = table_stats(uri)
    return {
        "version": stats.version,
        "data_files": stats.files,
        "data_mb": round(stats.size_bytes / 2**20, 1),
        "log_files": stats.log_files,
        "commits_since_checkpoint": stats.commits_since_checkpoint,
        "open_ms": 1000 * median_s(lambda: open_table(uri).to_pyarrow_dataset(), tries),
        "polars_count_ms": 1000 * median_s(lambda: scan(uri).select(pl.len()).collect(), tries),
        "polars_read_ms": 1000 * median_s(lambda: scan(uri).select("episode_id", "step").collect(), tries),
        "rows_at": {label: rows_at(uri, version) for label, version in probes.items()},
    }


def run_bench(config: MaintenanceBenchConfig, settings: Settings) -> dict:
    if config.commits < 60:  # the probes read versions down to 50 below the last
        raise ValueError(f"--commits {config.commits}: the benchmark probes versions 50 below the last; use >= 60")
    settings = settings.model_copy(update={"data_dir": str((config.out / "data").resolve())})
    shutil.rmtree(settings.data_dir, ignore_errors=True)
    build_s = build_steps_table(settings, config)
    uri = table_uri(settings.tables_dir, STEPS)
    last = config.commits - 1
    model_v, learner_v = last // 2, 3 * last // 4
    probes = {f"v{model_v} (model lineage)": model_v, f"v{learner_v} (learner pin)": learner_v,
              f"v{last // 5} (unpinned, older)": last // 5, f"v{last - 50} (unpinned, newer)": last - 50}  # fmt: skip
    manifest = settings.artifacts_dir / "manifests" / "bench-0001.json"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"version": "bench-0001", "produced_at": time.time(), "lineage": {STEPS: model_v}}))

    before = measure(uri, probes, config.tries)
    # Files of an unpinned version go at once (no retention), and this run's commits are checkpointed too.
    maintenance = MaintenanceConfig(tables=(STEPS,), min_retention_hours=0, checkpoint_after=1)
    with pinned(settings.pins_dir, {STEPS: learner_v}):
        report = maintain_tables(settings, maintenance)
    print(format_report(report))
    after = measure(uri, probes, config.tries)
    result = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in asdict(config).items()},
        "machine": machine(),
        "build_s": round(build_s, 1),
        "maintenance_s": round(report.wall_s, 1),
        "files_vacuumed": len(report.tables[0].vacuumed),
        "maintenance_error": report.tables[0].error,
        "before": before,
        "after": after,
    }
    config.out.mkdir(parents=True, exist_ok=True)
    (config.out / "maintenance_bench.json").write_text(json.dumps(result, indent=2))
    print(format_bench(result))
    return result


def format_bench(result: dict) -> str:
    before, after = result["before"], result["after"]
    labels = {
        "version": "table version",
        "data_files": "data files",
        "data_mb": "data MB",
        "log_files": "log files (commits + checkpoints)",
        "commits_since_checkpoint": "commits past the last checkpoint",
        "open_ms": "open ms (DeltaTable + pyarrow dataset)",
        "polars_count_ms": "polars scan + count ms",
        "polars_read_ms": "polars read of 2 columns ms",
    }
    lines = [f"{'':42s} {'before':>12s} {'after':>12s}"]
    lines += [f"{label:42s} {_cell(before[key]):>12s} {_cell(after[key]):>12s}" for key, label in labels.items()]
    lines += [f"rows at {probe:34s} {_cell(before['rows_at'][probe]):>12s} {_cell(after['rows_at'][probe]):>12s}"
              for probe in before["rows_at"]]  # fmt: skip
    lines.append(f"built in {result['build_s']} s; maintenance {result['maintenance_s']} s, "
                 f"{result['files_vacuumed']} files vacuumed {result['maintenance_error']}".rstrip())  # fmt: skip
    return "\n".join(lines)


def _cell(value: object) -> str:
    return "unreadable" if value is None else f"{value:.1f}" if isinstance(value, float) else str(value)


def command(config: MaintenanceBenchConfig, settings: Settings) -> int:
    """`flywheel bench maintenance`: exit 1 when the maintenance failed."""
    result = run_bench(config, settings)
    print(f"wrote {result['config']['out']}/maintenance_bench.json")
    return 0 if not result["maintenance_error"] else 1
