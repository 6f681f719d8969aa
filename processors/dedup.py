"""Exactly once by identity, above the offset level: each Delta table holds one row per identity
(lake.tables.IDENTITY: a step's event_id; an episode's episode_id; a training sample's episode, step and
purpose), however many times the log holds it. The offsets in the Delta commit (processors.delta_sink) drop
a redelivered record; this drops a record that is in the log twice at two offsets: a step the edge spool
re-sent (the client died between Kafka's acknowledgement and its cursor write), an episode that assembly
emitted again after a crash.

`RecentIds` holds the identities of the table's rows produced within a window (WorkerConfig.dedup_window_s) in
memory, by time bucket, so memory stays bounded however long the worker runs. Every copy of a row carries the
same `produced_at` (a re-send is the same bytes; an episode's is its final step's), so for a row produced at or
after the index's horizon, the index alone knows whether a copy is in the table. An older row is looked up in
the table instead (a scan that partition values and file statistics narrow to the files that can hold it). The
window ends at the stream's newest produced_at (never later than now), so a replay of an old log keeps one too;
rows produced after now (a client whose clock runs ahead) are held until the horizon passes them.

The index is loaded from Delta with the first batch it checks, and kept up to date by the sink's own commits.
Should a partition in a batch have moved by a commit that is not ours (another worker held it before a
rebalance, or wrote it once more as a zombie after one), its rows in the window are read again: a copy of an
event is always in the same partition as the original (the topics are keyed by episode_id).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Hashable, Iterable
from operator import itemgetter

import pyarrow as pa
import pyarrow.compute as pc

from lake.tables import IDENTITY, PARTITION_BY
from processors.delta_sink import DeltaSink, Record
from processors.table_rows import utc_date

BUCKETS = 60  # the window is forgotten a sixtieth at a time
TIME = "produced_at"  # the column every table windows on


class RecentIds:
    """Identities of one table's rows produced since `horizon`, and the check of a batch against them."""

    def __init__(self, sink: DeltaSink, window_s: float, clock: Callable[[], float] = time.time):
        self.sink = sink
        self.window_s = window_s
        self.clock = clock
        self.columns = list(IDENTITY[sink.table])
        self.identity = itemgetter(*self.columns)  # row -> its identity (a tuple when several columns)
        self.bucket_s = max(1.0, window_s / BUCKETS)
        self.horizon = -math.inf  # every row of the table produced at or after it is in `ids`
        self.newest = -math.inf  # the newest produced_at in `ids`: the stream's time
        self.ids: set[Hashable] = set()
        self.buckets: dict[int, list[Hashable]] = {}  # time bucket -> the identities first seen in it, to forget them
        self.offsets: dict[tuple[str, int], int] | None = None  # the Delta offset per partition that `ids` reflects
        self.synced_version = -2  # the table version `ids` reflects whole (None but our own commits since)
        self.kept_offsets: dict[tuple[str, int], int] = {}  # the last offset per partition `fresh` let through

    def fresh(self, records: list[Record]) -> list[Record]:
        """The records not yet written (`sink.not_yet_written`: by offset), without the rows whose identity is in
        the table or earlier in the batch: a record that loses rows keeps its offset. Commit them with
        `sink.append`, then call `written`."""
        records = self.sink.not_yet_written(records)  # refreshes the table and reads its offsets
        self._sync()
        self._forget()
        old = [row for record in records for row in record.rows if not self._covers(row[TIME])]
        seen = self._in_table(old)  # older rows are checked against the table, then remembered for this batch only
        kept, self.kept_offsets = [], {}
        for record in records:
            rows = [row for row in record.rows if self._first(row, seen)]
            kept.append(record if len(rows) == len(record.rows) else dataclasses.replace(record, rows=rows))
            at = (record.topic, record.partition)
            self.kept_offsets[at] = max(self.kept_offsets.get(at, -1), record.offset)
        return kept

    def written(self) -> None:
        """The sink committed what `fresh` kept (its identities are in `ids` already): the offsets it recorded are
        ours. Only a commit directly after the version `ids` reflects whole leaves nothing missed."""
        self.offsets.update(self.kept_offsets)
        self.kept_offsets = {}
        if self.sink.written_version == self.synced_version + 1:
            self.synced_version = self.sink.written_version

    # --- the index --------------------------------------------------------------------------------------------

    def _covers(self, produced_at: float) -> bool:
        """Whether the index alone knows the rows produced then (and so any copy of such a row)."""
        return produced_at >= self.horizon

    def _first(self, row: dict, seen: set) -> bool:
        """Whether `row` is the first of its identity (neither in the table nor earlier in the batch); remembers it."""
        key = self.identity(row)
        if key in self.ids or key in seen:
            return False
        if self._covers(row[TIME]):
            self._add(key, row[TIME])
        else:
            seen.add(key)
        return True

    def _add(self, key: Hashable, produced_at: float) -> None:
        if key in self.ids:
            return
        self.ids.add(key)
        self.buckets.setdefault(int(produced_at // self.bucket_s), []).append(key)
        if produced_at > self.newest:
            self.newest = produced_at

    def _forget(self) -> None:
        """Move the horizon to the window's start and forget the buckets before it. The window ends at the stream's
        time, never later than now: a replay of an old log keeps its own window, a clock ahead cannot empty it."""
        horizon = min(self.clock(), self.newest) - self.window_s
        if horizon <= self.horizon:
            return
        self.horizon = horizon
        first_kept = int(horizon // self.bucket_s)
        for bucket in [b for b in self.buckets if b < first_kept]:
            self.ids.difference_update(self.buckets.pop(bucket))

    # --- Delta ------------------------------------------------------------------------------------------------

    def _sync(self) -> None:
        """Load the window on first use; read again the partitions of this batch that moved without us."""
        committed = self.sink.committed
        if self.offsets is None:
            newest = self.sink.newest(TIME)
            if newest is not None:  # else the table is empty: every row of it is known, whenever produced
                self.horizon = min(self.clock(), newest) - self.window_s
            self._load(None)
            self.offsets, self.synced_version = {}, self.sink.version()
        moved = [at for at, offset in committed.items() if self._moved_without_us(at, offset)]
        if moved:
            self._load({partition for _topic, partition in moved})
        self.offsets.update(committed)

    def _moved_without_us(self, at: tuple[str, int], offset: int) -> bool:
        """Whether another writer may have committed rows of this partition that `ids` lacks."""
        if at in self.offsets:
            return self.offsets[at] != offset
        return self.sink.version() != self.synced_version  # first seen: unknown unless nothing else committed

    def _load(self, partitions: set[int] | None) -> None:
        """Add the rows produced since the horizon (of these Kafka partitions; None: all) from the table."""
        where = pc.field(TIME) >= self.horizon
        if partitions is not None:
            where &= pc.field("kafka_partition").isin(sorted(partitions))
        table = self.sink.read([*self.columns, TIME], where, self._within(self.horizon, math.inf))
        for key, produced_at in zip(_identities(table, self.columns), table.column(TIME).to_pylist(), strict=True):
            self._add(key, produced_at)

    def _within(self, low: float, high: float) -> dict[str, tuple]:
        """The ranges that narrow a scan for rows produced in [low, high] to the files that may hold them."""
        within: dict[str, tuple] = {TIME: (low, high)}
        if self._by_date() and math.isfinite(low):  # the partition column: whole days skipped unread
            within["date"] = (utc_date(low), utc_date(high) if math.isfinite(high) else "9999-12-31")
        return within

    def _by_date(self) -> bool:
        return "date" in (PARTITION_BY[self.sink.table] or ())

    def _in_table(self, rows: list[dict]) -> set:
        """The identities of `rows` already in the table (rows older than the horizon)."""
        if not rows:
            return set()
        times = sorted({row[TIME] for row in rows})
        first = self.columns[0]
        where = pc.field(TIME).isin(times) & pc.field(first).isin(sorted({row[first] for row in rows}))
        found = self.sink.read(self.columns, where, self._within(times[0], times[-1]))
        return {self.identity(row) for row in rows} & set(_identities(found, self.columns))


def _identities(table: pa.Table, columns: list[str]) -> Iterable[Hashable]:
    """The identity of each row of `table`, as `itemgetter(*columns)` makes it of a row dict."""
    values = [table.column(column).to_pylist() for column in columns]
    return values[0] if len(values) == 1 else zip(*values, strict=True)
