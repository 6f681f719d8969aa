"""Compare two copies of the Delta projections row for row: by key and by content, ignoring the
columns that record when a row was ingested (they differ between a live table and its replay).

Used by `flywheel replay` (live tables vs the rebuilt ones) and by the replay and fault tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import polars as pl

from core.object_store import Location
from lake.tables import EPISODES, IDENTITY, STEPS, TRAINING_SAMPLES, scan, table_exists, table_uri

KEYS: dict[str, list[str]] = {
    STEPS: ["event_id"],
    EPISODES: ["event_id"],
    TRAINING_SAMPLES: list(IDENTITY[TRAINING_SAMPLES]),  # gold rows have no event id of their own
}
INGESTION_COLUMNS = frozenset({"ingested_at"})  # when the sink wrote the row, not what the log says


@dataclass
class TableDiff:
    table: str
    live_rows: int
    rebuilt_rows: int
    missing: int  # keys in live, not rebuilt
    extra: int  # keys rebuilt, not in live
    changed: int  # same key, different content
    live_duplicates: int  # rows sharing a key with another row
    rebuilt_duplicates: int
    changed_columns: list[str] = field(default_factory=list)

    @property
    def equal(self) -> bool:
        return not (self.missing or self.extra or self.changed or self.live_duplicates or self.rebuilt_duplicates)


def read_table(tables_dir: Location, table: str, horizon: dict[int, int] | None = None) -> pl.DataFrame | None:
    """The table without ingestion-time columns (None before its first commit); with a horizon
    ({partition: end offset}), only rows whose source offset lies below it."""
    uri = table_uri(tables_dir, table)
    if not table_exists(uri):
        return None
    frame = scan(uri).collect()
    frame = frame.drop([c for c in frame.columns if c in INGESTION_COLUMNS])
    if horizon is not None:
        below = pl.lit(False)
        for partition, end in horizon.items():
            below = below | ((pl.col("kafka_partition") == partition) & (pl.col("kafka_offset") < end))
        frame = frame.filter(below)
    return frame


def compare_table(live_dir: Path, rebuilt_dir: Path, table: str, horizon: dict[int, int] | None = None) -> TableDiff:
    keys = KEYS[table]
    live = read_table(live_dir, table, horizon)
    rebuilt = read_table(rebuilt_dir, table, horizon)
    empty = pl.DataFrame(schema={k: pl.String for k in keys})
    live = live if live is not None else (rebuilt.clear() if rebuilt is not None else empty)
    rebuilt = rebuilt if rebuilt is not None else live.clear()
    rebuilt = rebuilt.select(live.columns) if set(rebuilt.columns) == set(live.columns) else rebuilt

    joined = live.join(rebuilt, on=keys, how="inner", suffix="__rebuilt")
    changed_mask = pl.Series([False] * joined.height, dtype=pl.Boolean)
    changed_columns = []
    for column in live.columns:
        if column in keys:
            continue
        other = f"{column}__rebuilt"
        if other not in joined.columns:
            changed_columns.append(column)
            changed_mask = pl.Series([True] * joined.height)
            continue
        differs = ~joined[column].eq_missing(joined[other])
        if differs.any():
            changed_columns.append(column)
            changed_mask = changed_mask | differs
    return TableDiff(
        table=table,
        live_rows=live.height,
        rebuilt_rows=rebuilt.height,
        missing=live.join(rebuilt, on=keys, how="anti").height,
        extra=rebuilt.join(live, on=keys, how="anti").height,
        changed=int(changed_mask.sum() or 0),
        live_duplicates=live.height - live.select(keys).n_unique() if live.height else 0,
        rebuilt_duplicates=rebuilt.height - rebuilt.select(keys).n_unique() if rebuilt.height else 0,
        changed_columns=changed_columns,
    )


def compare_tables(
    live_dir: Path, rebuilt_dir: Path, horizon_by_table: dict[str, dict[int, int]] | None = None
) -> list[TableDiff]:
    horizon_by_table = horizon_by_table or {}
    tables = (STEPS, EPISODES, TRAINING_SAMPLES)
    return [compare_table(live_dir, rebuilt_dir, table, horizon_by_table.get(table)) for table in tables]


def format_diffs(diffs: list[TableDiff]) -> str:
    columns = ("live", "rebuilt", "missing", "extra", "changed")
    header = f"{'table':18s} " + " ".join(f"{c:>8s}" for c in columns) + f" {'dups':>6s}  result"
    lines = [header, "-" * len(header)]
    for d in diffs:
        dups = d.live_duplicates + d.rebuilt_duplicates
        result = "equal" if d.equal else "DIFFERENT"
        if d.changed_columns:
            result += f" ({', '.join(d.changed_columns)})"
        counts = (d.live_rows, d.rebuilt_rows, d.missing, d.extra, d.changed)
        lines.append(f"{d.table:18s} " + " ".join(f"{n:8d}" for n in counts) + f" {dups:6d}  {result}")
    return "\n".join(lines)
