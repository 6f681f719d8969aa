"""kafka-delta-ingest, the Rust peer that does the steps sink's job, as a mode of `flywheel bench pipeline`.

kafka-delta-ingest (delta-io) reads JSON (or Avro) messages and appends them to an existing Delta table, its
Kafka offsets in the table's own transactions: exactly once by offset, as our sinks, without the identity
de-duplication. It is not on crates.io: it is built by hand from its repository (`cargo build --release --features
s3`) and given to the bench as `--kdi-binary PATH`; the project ships no build of it.

It sees the same synthetic steps as the other modes, JSON-encoded (its decoder takes no MessagePack; msgspec writes
bytes as base64, so a screenshot is a string a third longer), on a topic of their own, into a table created
beforehand with the schema of that JSON. Its batches follow our rule: 2,000 messages or 1 s.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import msgspec.inspect
import pyarrow as pa
from deltalake import write_deltalake

from schemas import StepEvent

STEP_JSON = msgspec.json.Encoder()


def json_step(step: StepEvent) -> bytes:
    """A step as kafka-delta-ingest reads it: the event's fields as JSON, bytes as base64 strings."""
    return STEP_JSON.encode(step)


def kdi_schema() -> pa.Schema:
    """The table's schema: a step's JSON fields as Arrow types (its tag `kind` first; bytes as base64 strings)."""
    step = msgspec.inspect.type_info(StepEvent)
    return pa.schema(
        [pa.field(step.tag_field, pa.string()), *(pa.field(f.encode_name, _arrow(f.type)) for f in step.fields)]
    )


def _arrow(t: msgspec.inspect.Type) -> pa.DataType:
    """The Arrow type of a msgspec type, as its JSON decodes (an optional value: the value's type, nullable)."""
    mi = msgspec.inspect
    if isinstance(t, mi.UnionType):
        (value,) = [u for u in t.types if not isinstance(u, mi.NoneType)]
        return _arrow(value)
    if isinstance(t, mi.StructType):
        return pa.struct([pa.field(f.encode_name, _arrow(f.type)) for f in t.fields])
    if isinstance(t, mi.VarTupleType | mi.ListType):
        return pa.list_(_arrow(t.item_type))
    simple = {mi.StrType: pa.string(), mi.BytesType: pa.string(), mi.LiteralType: pa.string(),
              mi.FloatType: pa.float64(), mi.IntType: pa.int64(), mi.BoolType: pa.bool_()}  # fmt: skip
    return simple[type(t)]


def create_table(table_path: Path, schema: pa.Schema) -> None:
    """The empty table kafka-delta-ingest appends to (it opens a table; it creates none)."""
    write_deltalake(str(table_path), schema.empty_table(), mode="error")


def kdi_command(binary: str, topic: str, table_path: Path, bootstrap: str, batch_max: int) -> list[str]:
    """Its command line: our batch rule (batch_max messages or 1 s; files never held back for size), its offsets
    from the table's transactions under one app id, the backlog from the earliest offset, and our steps stream's
    fetches (librdkafka's default of 1 MiB a partition held it to ~200 screenshot-sized steps a fetch)."""
    from processors.steps_stream import FETCH_MAX_WAIT_MS, MAX_PARTITION_FETCH_BYTES  # the worker's (faust, aiokafka)

    return [
        binary, "ingest", topic, str(table_path),
        "--checkpoints",  # a checkpoint every 10th commit: without one, each commit reads the whole growing log
        "--kafka", bootstrap,
        "--consumer_group", "flywheel-bench-kdi",
        "--app_id", "flywheel-bench-kdi",
        "--auto_offset_reset", "earliest",
        "--allowed_latency", "1",
        "--max_messages_per_batch", str(batch_max),
        "--min_bytes_per_file", "1",
        "-K", f"max.partition.fetch.bytes={MAX_PARTITION_FETCH_BYTES}",
        "-K", f"fetch.wait.max.ms={FETCH_MAX_WAIT_MS}",
    ]  # fmt: skip
