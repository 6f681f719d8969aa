"""Exactly-once appends from Kafka to a Delta table (kafka-delta-ingest's scheme, docs/architecture.md).

Each commit carries, per Kafka partition in the batch, a Delta app transaction
`{sink}-{topic}-{partition}` whose version is the last offset written. Before writing, records at or
below the recorded offset are dropped, so redelivery after a crash or rebalance never duplicates a
row, and since offsets live in the same atomic commit as the rows, nothing is lost either.
faust's own exactly-once mode is not used (docs/architecture.md: it duplicates and swallows errors).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake
from deltalake.exceptions import TableNotFoundError

from core.object_store import Location
from lake.tables import (
    PARTITION_BY,
    SCHEMAS,
    TABLE_CONFIGURATION,
    check_writable,
    data_file_paths,
    open_table,
    storage_options,
    table_uri,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Record:
    """One Kafka record turned into a row for this sink."""

    topic: str
    partition: int
    offset: int
    rows: list[dict]  # empty: nothing to write (a dead letter, a duplicate), but the offset still counts


def _may_hold(actions: pa.Table, column: str, low, high) -> pa.ChunkedArray:
    """Per file (a row of the flattened add actions): whether it may hold values of `column` in [low, high]."""
    names = actions.column_names
    if f"partition.{column}" in names:
        value = actions.column(f"partition.{column}")
        return pc.and_kleene(pc.greater_equal(value, low), pc.less_equal(value, high))
    if f"min.{column}" not in names:
        return pa.chunked_array([pa.array([True] * actions.num_rows)])  # no statistics kept for this column
    overlaps = pc.and_kleene(
        pc.less_equal(actions.column(f"min.{column}"), high), pc.greater_equal(actions.column(f"max.{column}"), low)
    )
    return pc.fill_null(overlaps, True)  # a file without statistics may hold anything


def app_id(sink: str, topic: str, partition: int) -> str:
    return f"{sink}-{topic}-{partition}"


class DeltaSink:
    """Appends rows of one table, with their source offsets, in single atomic Delta commits."""

    def __init__(self, tables_dir: Location, table: str, sink: str | None = None):
        self.table = table
        self.sink = sink or table
        self.uri = table_uri(tables_dir, table)
        self.schema = SCHEMAS[table]
        self.partition_by = PARTITION_BY[table]
        self._dt: DeltaTable | None = None
        self.written_version: int | None = None  # the table version of this sink's last commit
        self.committed: dict[tuple[str, int], int] = {}  # offsets in the table, as `not_yet_written` last read them
        self._checked_version: int | None = None  # the table version whose schema check_writable last passed

    def _table(self) -> DeltaTable | None:
        """The table at its newest version (None before the first commit)."""
        if self._dt is None:
            try:
                self._dt = open_table(self.uri)
            except TableNotFoundError:
                return None
        else:
            self._dt.update_incremental()
        if self._dt.version() != self._checked_version:
            check_writable(self.uri, self._dt)  # a table retyped by someone else: refuse, naming the columns
            self._checked_version = self._dt.version()
        return self._dt

    def refresh(self) -> None:
        """Move to the table's newest version (what `read` and `newest` then see)."""
        self._table()

    def committed_offsets(self, keys: set[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Last offset of each (topic, partition) already in the table, -1 if none."""
        dt = self._table()
        offsets = {}
        for topic, partition in keys:
            version = None if dt is None else dt.transaction_version(app_id(self.sink, topic, partition))
            offsets[(topic, partition)] = -1 if version is None else version
        return offsets

    def not_yet_written(self, records: Sequence[Record]) -> list[Record]:
        """Drop records whose offsets an earlier commit already holds (redelivery after a restart),
        and repeats of an offset within the batch (redelivery after a rebalance, before the ack)."""
        committed = self.committed = self.committed_offsets({(r.topic, r.partition) for r in records})
        fresh, seen = [], set()
        for record in records:
            at = (record.topic, record.partition, record.offset)
            if record.offset > committed[(record.topic, record.partition)] and at not in seen:
                seen.add(at)
                fresh.append(record)
        return fresh

    def write(self, records: Sequence[Record]) -> int:
        """Append the rows of records not yet written, with their offsets, in one commit; return the rows."""
        return self.append(self.not_yet_written(records))

    def append(self, fresh: Sequence[Record]) -> int:
        """Append records already checked by `not_yet_written` (at most one table refresh per batch).

        A record without rows (a dead letter) still advances the recorded offset, so it is not
        reconsidered after a restart. Should another writer have committed the same partition since
        the check, Delta refuses this commit as a concurrent transaction instead of duplicating rows.
        """
        if not fresh:
            return 0
        last: dict[tuple[str, int], int] = {}
        for record in fresh:
            key = (record.topic, record.partition)
            last[key] = max(last.get(key, -1), record.offset)
        transactions = [Transaction(app_id(self.sink, topic, part), offset) for (topic, part), offset in last.items()]
        rows = [row for record in fresh for row in record.rows]
        write_deltalake(
            self._dt if self._dt is not None else self.uri,
            pa.Table.from_pylist(rows, schema=self.schema),
            mode="append",
            partition_by=self.partition_by,
            schema_mode="merge",
            commit_properties=CommitProperties(app_transactions=transactions),
            configuration=TABLE_CONFIGURATION,  # used only when this commit creates the table
            storage_options=storage_options(self.uri),
        )
        # Writing through the DeltaTable object moves it to exactly our commit's version; a table this call
        # created is opened afresh, and its version then may include others' commits, so it is not claimed.
        self.written_version = self._dt.version() if self._dt is not None else None
        log.debug("%s: committed %d rows, offsets %s", self.table, len(rows), last)
        return len(rows)

    def version(self) -> int:
        """The table version as of the last refresh (`not_yet_written` refreshes; -1 before any commit)."""
        return -1 if self._dt is None else self._dt.version()

    def read(self, columns: list[str], where: pc.Expression, within: Mapping[str, tuple]) -> pa.Table:
        """`columns` of the rows matching `where` (data columns only), as of the last refresh, read from the files
        that may hold rows with each column of `within` in its closed range [low, high]: by the file's partition
        value, else by its min/max statistics (a file without them is read). The Delta log's own file list and
        statistics: deltalake's dataset costs seconds per call on a table of a few hundred files."""
        if self._dt is None:
            return self.schema.empty_table().select(columns)
        actions = pa.table(self._dt.get_add_actions(flatten=True))
        for column, (low, high) in within.items():
            actions = actions.filter(_may_hold(actions, column, low, high))
        paths, filesystem = data_file_paths(self.uri, actions.column("path").to_pylist())
        schema = pa.schema([f for f in self.schema if f.name not in (self.partition_by or ())])
        dataset = pads.dataset(paths, schema=schema, format="parquet", filesystem=filesystem)
        return dataset.to_table(columns=columns, filter=where)

    def newest(self, column: str) -> float | None:
        """The largest value of `column` by the files' statistics (None: no rows, or no statistics)."""
        if self._dt is None:
            return None
        actions = pa.table(self._dt.get_add_actions(flatten=True))
        name = f"max.{column}"
        return pc.max(actions.column(name)).as_py() if name in actions.column_names else None
