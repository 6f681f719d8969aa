"""A Delta table whose schema was changed under its reader (every door fuzzed): the learner's reads and
the sinks' writes refuse it with an error naming the table and the column, before a wrong value is read or a
row is cast into a retyped column; a reader pinned to a version from before the change reads on."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import write_deltalake

from lake.tables import PARTITION_BY, STEPS, TRAINING_SAMPLES, SchemaMismatch, open_table, table_uri
from learner.data.tables import load_rollouts, load_samples, table_versions
from processors.delta_sink import DeltaSink, Record
from processors.table_rows import step_row
from schemas import Action
from tests.factories import TablesLog, step_event


@pytest.fixture
def tables(tmp_path: Path) -> Path:
    log = TablesLog(tmp_path)
    for seed in range(3):
        log.episode(f"demo-{seed}", seed, Action("click", 10.0, 20.0), True, "expert")
    log.episode("fail-9", 9, Action("click", 1.0, 1.0), False, "sft-0001")
    return tmp_path


def rewrite(tables_dir: Path, table: str, change) -> None:
    """Replace `table`'s contents and schema by `change(arrow table)`, as a tool outside the flywheel might."""
    uri = table_uri(tables_dir, table)
    data = change(pl.read_delta(uri).to_arrow())
    write_deltalake(uri, data, mode="overwrite", schema_mode="overwrite", partition_by=PARTITION_BY[table])


def retype(column: str, to: pa.DataType):
    return lambda data: data.set_column(data.schema.get_field_index(column), column, data[column].cast(to))


CHANGES = {
    "steps: screenshot dropped": (STEPS, lambda data: data.drop_columns(["screenshot"]), "screenshot is missing"),
    "steps: x retyped": (STEPS, retype("x", pa.string()), "x is String"),
    "training_samples: weight retyped": (TRAINING_SAMPLES, retype("weight", pa.string()), "weight is String"),
    "training_samples: purpose dropped": (TRAINING_SAMPLES, lambda data: data.drop_columns(["purpose"]), "purpose"),
}


@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
def test_the_learner_refuses_a_table_changed_under_it_and_reads_on_at_its_pinned_version(tables, change):
    table, edit, problem = CHANGES[change]
    pinned = table_versions(tables)
    before = load_samples(tables, ("demo",), pinned).sort("episode_id")  # a join's row order is not fixed
    assert len(before) == 3
    rewrite(tables, table, edit)
    for read in (lambda: load_samples(tables, ("demo",)), lambda: load_rollouts(tables, ("failure",))):
        with pytest.raises(SchemaMismatch, match=problem) as refused:
            read()
        assert table_uri(tables, table) in str(refused.value)
    assert (
        load_samples(tables, ("demo",), pinned).sort("episode_id").equals(before)
    )  # time travel: the old schema, the old rows


def test_widened_and_added_columns_are_read(tables):
    rewrite(tables, STEPS, lambda data: retype("x", pa.float64())(data).append_column("note", pa.array(["n"] * 4)))
    samples = load_samples(tables, ("demo",))
    assert len(samples) == 3 and samples["x"].to_list() == [10.0] * 3


def test_a_sink_refuses_to_cast_rows_into_a_retyped_column_and_restores_a_dropped_one(tables):
    uri = table_uri(tables, STEPS)
    rewrite(tables, STEPS, retype("x", pa.string()))
    version = open_table(uri).version()
    row = step_row(step_event("new-episode", step=0, done=True), 0, 100)
    with pytest.raises(SchemaMismatch, match="x is String"):
        DeltaSink(tables, STEPS).write([Record("steps", 0, 100, [row])])
    assert open_table(uri).version() == version  # nothing committed

    rewrite(tables, STEPS, lambda data: retype("x", pa.float32())(data).drop_columns(["thought"]))
    assert DeltaSink(tables, STEPS).write([Record("steps", 0, 100, [row])]) == 1
    assert "thought" in pl.scan_delta(uri).collect_schema()  # the writer's schema merge put it back
