"""The Delta tables of the flywheel: names, locations and Arrow schemas, defined once."""

from __future__ import annotations

import functools
from pathlib import Path
from urllib.parse import unquote

import polars as pl
import pyarrow as pa
from deltalake import DeltaTable

from core.object_store import Files, Location, S3Config, is_remote, join

STEPS = "steps"  # bronze: every valid step event, append-only, partitioned by date
EPISODES = "episodes"  # silver: one scored row per episode
TRAINING_SAMPLES = "training_samples"  # gold: curated step references labelled by purpose

# A StepEvent flattened (processors.table_rows says how), then where and when it was read. Written out for the Arrow
# types; tests/test_step_contract.py fails, naming the column, when it and the event disagree.
STEPS_SCHEMA = pa.schema(
    [
        ("event_id", pa.string()),
        ("client_id", pa.string()),
        ("produced_at", pa.float64()),
        ("episode_id", pa.string()),
        ("step", pa.int32()),
        ("task", pa.string()),
        ("instruction", pa.string()),
        ("screenshot", pa.binary()),
        ("thought", pa.string()),
        ("action_type", pa.string()),
        ("x", pa.float32()),
        ("y", pa.float32()),
        ("text", pa.string()),
        ("key", pa.string()),
        ("scroll_dy", pa.float32()),
        ("model_version", pa.string()),
        ("verify_expected", pa.string()),
        ("verify_observed", pa.string()),
        ("verify_ok", pa.bool_()),
        ("reward", pa.float32()),
        ("done", pa.bool_()),
        ("behaviour_logprob", pa.float32()),
        ("inference_ms", pa.float32()),
        ("env_ms", pa.float32()),
        ("visual_tokens_total", pa.int32()),
        ("visual_tokens_kept", pa.int32()),
        ("termination", pa.string()),  # the episode's ending, on its final step only (null before)
        ("seed", pa.int64()),  # null when unknown
        ("tokens", pa.list_(pa.int32())),  # a model's generated ids (thought + action); empty for experts
        ("token_logprobs", pa.list_(pa.float32())),  # behaviour log mu of each of them (policy.sampling)
        ("temperature", pa.float32()),  # 0: greedy
        ("top_k", pa.int32()),
        ("target_box", pa.list_(pa.float32())),  # an expert click's element (left, top, right, bottom); else empty
        # A teacher's label of the step's screen (StepEvent.teacher_action, flattened; null where none was asked).
        ("teacher_action_type", pa.string()),
        ("teacher_action_x", pa.float32()),
        ("teacher_action_y", pa.float32()),
        ("teacher_action_text", pa.string()),
        ("teacher_action_key", pa.string()),
        ("teacher_action_scroll_dy", pa.float32()),
        ("teacher_thought", pa.string()),
        ("teacher_box", pa.list_(pa.float32())),
        ("teacher_reason", pa.string()),
        ("schema_version", pa.int16()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("ingested_at", pa.float64()),
        ("date", pa.string()),
    ]
)

EPISODES_SCHEMA = pa.schema(
    [
        ("event_id", pa.string()),
        ("client_id", pa.string()),
        ("produced_at", pa.float64()),
        ("episode_id", pa.string()),
        ("task", pa.string()),
        ("seed", pa.int64()),
        ("steps", pa.int32()),
        ("raw_reward", pa.float32()),
        ("binary_reward", pa.float32()),
        ("success", pa.bool_()),
        ("termination", pa.string()),  # schemas.EpisodeEnding: the edge loop's ending, or "abandoned" (assembly's)
        ("model_version", pa.string()),
        ("policy", pa.string()),
        ("completion", pa.float32()),
        ("step_efficiency", pa.float32()),
        ("verification", pa.float32()),
        ("score", pa.float32()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("ingested_at", pa.float64()),
    ]
)

TRAINING_SAMPLES_SCHEMA = pa.schema(
    [
        ("episode_id", pa.string()),
        ("step", pa.int32()),
        ("task", pa.string()),
        ("purpose", pa.string()),  # demo | success | failure | on_policy
        ("weight", pa.float32()),  # processors.curation: how much the learner weighs the row ...
        ("reason", pa.string()),  # ... and why ("hard success", "near miss", ...)
        ("score", pa.float32()),
        ("model_version", pa.string()),
        ("kafka_partition", pa.int32()),
        ("kafka_offset", pa.int64()),
        ("ingested_at", pa.float64()),
        ("produced_at", pa.float64()),  # the episode's (its final step's): the time the de-duplication windows on
    ]
)

SCHEMAS = {STEPS: STEPS_SCHEMA, EPISODES: EPISODES_SCHEMA, TRAINING_SAMPLES: TRAINING_SAMPLES_SCHEMA}
PARTITION_BY = {STEPS: ["date"], EPISODES: None, TRAINING_SAMPLES: None}
# Set when a table is created. delta-rs's commits would otherwise each delete log files older than 30 days below the
# newest checkpoint (its compaction ignores a commit's own setting), making old versions a model's lineage still
# reads unloadable; processors.maintenance cleans up below the oldest version still needed instead.
TABLE_CONFIGURATION = {"delta.enableExpiredLogCleanup": "false"}
# What makes a row the same row: each table holds one row per identity, whatever the Kafka offsets
# (processors.dedup). An episode's event_id is minted by the scorer, so a re-emission has a new one: the
# episode is its episode_id. Every copy of a row has the same produced_at, the time the de-duplication windows on.
IDENTITY: dict[str, tuple[str, ...]] = {
    STEPS: ("event_id",),
    EPISODES: ("episode_id",),
    TRAINING_SAMPLES: ("episode_id", "step", "purpose"),
}


def table_uri(tables_dir: Location, name: str) -> str:
    """Where table `name` lives: an absolute local path, or an s3:// URI."""
    return str(join(tables_dir, name)) if is_remote(tables_dir) else str(Path(tables_dir).resolve() / name)


# Every open, read and write of a table goes through these, so a table on the object store gets its storage options
# (the endpoint and credential of core.settings) wherever it is touched. A DeltaTable object keeps its own options,
# but polars needs them with the URI: `pl.scan_delta(DeltaTable(...))` would drop them.
def storage_options(uri: str) -> dict[str, str] | None:
    from core.settings import get_settings

    return get_settings().storage_options(uri)


def table_files() -> Files:
    """The files around a table (its log's checkpoint pointer, vacuum's candidates), local or on the object store."""
    from core.settings import get_settings

    return get_settings().files()


def data_file_paths(uri: str, log_paths: list[str]):
    """(paths, pyarrow filesystem) to read a table's data files, given their paths as its log has them (relative,
    URL-quoted): local paths and None, or the object store's bucket/key paths and its S3FileSystem."""
    paths = [f"{uri.rstrip('/')}/{unquote(p)}" for p in log_paths]
    if not is_remote(uri):
        return paths, None
    from core.settings import get_settings

    return [p.removeprefix("s3://") for p in paths], arrow_s3(get_settings().s3_config)


@functools.lru_cache(maxsize=4)
def arrow_s3(store: S3Config):
    """pyarrow's S3FileSystem on the store, one per process (path-style: virtual addressing is off by default)."""
    from pyarrow import fs

    scheme, host = store.endpoint.split("://", 1)
    return fs.S3FileSystem(access_key=store.access_key, secret_key=store.secret_key, region=store.region,
                           endpoint_override=host, scheme=scheme)  # fmt: skip


def table_exists(uri: str) -> bool:
    """True once the table's first commit is in."""
    if not is_remote(uri):
        return (Path(uri) / "_delta_log").is_dir()
    return DeltaTable.is_deltatable(uri, storage_options=storage_options(uri))


def open_table(uri: str, version: int | None = None) -> DeltaTable:
    return DeltaTable(uri, version=version, storage_options=storage_options(uri))


def scan(uri: str, version: int | None = None, columns: list[str] | None = None) -> pl.LazyFrame:
    """The table (at `version`, else its newest) as a LazyFrame; with `columns`, only those, after checking that the
    table holds each as SCHEMAS defines it: SchemaMismatch, naming the table and each column, for a table whose
    schema was changed under its reader (a column dropped, retyped), before anything reads a wrong value."""
    frame = pl.scan_delta(uri, version=version, storage_options=storage_options(uri))
    if columns is None:
        return frame
    check_columns(uri, version, frame.collect_schema(), columns)
    return frame.select(columns)


class SchemaMismatch(ValueError):
    """A table no longer holds a column as the project defines it: it was changed by something other than the
    flywheel's writers. Not retried: someone must restore or migrate the table."""


@functools.cache
def expected_types(table: str) -> dict[str, pl.DataType]:
    """The polars types of SCHEMAS[table], what a reader of that table relies on."""
    return dict(pl.from_arrow(SCHEMAS[table].empty_table()).schema)


def check_columns(uri: str, version: int | None, found: pl.Schema | dict, columns: list[str]) -> None:
    """Raise SchemaMismatch unless `found` (a table's schema) holds each of `columns` with its SCHEMAS type (a
    wider integer or float is fine: Delta's type widening). Columns it has beyond those are none of our business."""
    expected, problems = expected_types(uri.rstrip("/").rsplit("/", 1)[-1]), []
    for column in columns:
        have, want = found.get(column), expected.get(column)
        if have is None:
            problems.append(f"{column} is missing")
        elif want is not None and have != want and not _widened(want, have):
            problems.append(f"{column} is {have}, the flywheel writes {want}")
    if problems:
        at = "its newest version" if version is None else f"version {version}"
        raise SchemaMismatch(f"table {uri} ({at}) was changed outside the flywheel: {'; '.join(problems)}")


def check_writable(uri: str, table: DeltaTable) -> None:
    """SchemaMismatch unless a writer's rows (SCHEMAS) fit the table as it is: its merge would otherwise cast them
    into a retyped column silently. A column the table lacks is fine: the writer's schema merge adds it back."""
    found = dict(pl.from_arrow(pa.schema(table.schema().to_arrow()).empty_table()).schema)
    name = uri.rstrip("/").rsplit("/", 1)[-1]
    check_columns(uri, table.version(), found, [c for c in SCHEMAS[name].names if c in found])


def _widened(want: pl.DataType, have: pl.DataType) -> bool:
    """`have` holds every value of `want`: a signed integer or a float of at least as many bits."""
    bits = {pl.Int8: 8, pl.Int16: 16, pl.Int32: 32, pl.Int64: 64, pl.Float32: 32, pl.Float64: 64}
    same_kind = want.is_integer() == have.is_integer() and want.is_float() == have.is_float()
    return same_kind and bits.get(type(have), 0) >= bits.get(type(want), 65)
