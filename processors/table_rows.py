"""Events to table rows: flat dicts matching lake.tables schemas."""

from __future__ import annotations

import functools
import operator
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, get_args, get_origin

import msgspec

from processors.curation import Curated
from schemas import EpisodeEvent, StepEvent

# --- steps: a row is its StepEvent, flattened ----------------------------------------------------------------------
# The rule, written here once. lake.tables.STEPS_SCHEMA types the columns by hand; tests/test_step_contract.py fails,
# naming the field, where it or a producer of steps (the edge's, the benchmark's, the tests') disagrees with the event.
# * Each field of StepEvent is a column of its name, in the event's order, but for those in STEP_EVENT_ONLY.
# * A nested struct's fields are columns of their own, named <struct>_<field> (verify_ok), but the action's, which
#   are bare (x, text), its type excepted (action_type). An optional struct (teacher_action: Action | None) is
#   flattened alike, every column null where the struct is None.
# * A tuple is a list, of floats where typed tuple[float, ...] (an expert may give its target_box in ints).
# * The STEP_ROW_ONLY columns follow: where and when the row was read; `date`, the table's partition, is the UTC day
#   of produced_at.
STEP_EVENT_ONLY = ("screenshot_ref",)  # a blob-store address for the PNG: nothing sets it yet, the row holds the PNG
STEP_ROW_ONLY = ("kafka_partition", "kafka_offset", "ingested_at", "date")


def _flat_column(struct: str, name: str) -> str:
    """The column of field `name` of the nested struct in StepEvent field `struct`."""
    if struct == "action":
        return "action_type" if name == "type" else name
    return f"{struct}_{name}"


def struct_of(kind: Any) -> tuple[type | None, bool]:
    """(the msgspec Struct a field of type `kind` holds, whether it may be None); (None, False): not a struct."""
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        return kind, False
    args = get_args(kind)
    structs = [a for a in args if isinstance(a, type) and issubclass(a, msgspec.Struct)]
    if len(args) == 2 and type(None) in args and len(structs) == 1:
        return structs[0], True
    return None, False


def _step_fields() -> list[tuple[str, str, Any, bool]]:
    """(column, path of the field in StepEvent, its type, whether its struct may be None) of each column an event
    fills, in the event's order."""
    found = []
    for field in msgspec.structs.fields(StepEvent):
        if field.name in STEP_EVENT_ONLY:
            continue
        struct, optional = struct_of(field.type)
        if struct is not None:
            for sub in msgspec.structs.fields(struct):
                found.append((_flat_column(field.name, sub.name), f"{field.name}.{sub.name}", sub.type, optional))
        else:
            found.append((field.name, field.name, field.type, False))
    return found


def _as_list(kind: Any) -> Callable[[Any], Any] | None:
    """How a field of type `kind` becomes its column's value: tuples as lists; None: as it is."""
    if get_origin(kind) is not tuple:
        return None
    if get_args(kind)[0] is float:
        return lambda values: [float(v) for v in values]
    return list


_STEP_FIELDS = _step_fields()
# The `steps` columns an event fills -> the field each holds ("action_type" -> "action.type"), in the row's order.
STEP_COLUMNS: dict[str, str] = {column: path for column, path, _, _ in _STEP_FIELDS}
# One attrgetter call for every column whose path is always there (step_row is on the ingest path); the columns of
# an optional struct are read apart, null when it is None.
_ALWAYS = [column for column, _, _, optional in _STEP_FIELDS if not optional]
_always_values = operator.attrgetter(*(STEP_COLUMNS[c] for c in _ALWAYS))
_OPTIONAL: dict[str, list[tuple[str, str]]] = {}  # struct field -> [(column, its field in the struct)]
for _column, _path, _, _optional in _STEP_FIELDS:
    if _optional:
        _struct, _sub = _path.split(".")
        _OPTIONAL.setdefault(_struct, []).append((_column, _sub))
_STEP_LISTS = tuple((column, convert) for column, _, kind, _ in _STEP_FIELDS if (convert := _as_list(kind)))


def step_row(event: StepEvent, partition: int, offset: int) -> dict:
    """The `steps` row of an event read at (partition, offset) of its topic: STEP_COLUMNS, then STEP_ROW_ONLY."""
    known = dict(zip(_ALWAYS, _always_values(event), strict=True))
    for struct, columns in _OPTIONAL.items():
        value = getattr(event, struct)
        known.update((column, None if value is None else getattr(value, sub)) for column, sub in columns)
    row = {column: known[column] for column in STEP_COLUMNS} if _OPTIONAL else known
    for column, convert in _STEP_LISTS:
        row[column] = convert(row[column])
    row["kafka_partition"] = partition
    row["kafka_offset"] = offset
    row["ingested_at"] = time.time()
    row["date"] = utc_date(event.produced_at)
    return row


def utc_date(timestamp: float) -> str:
    """The partition date of a unix time, 'YYYY-MM-DD' (cached per day: strftime per row was 4% of ingest)."""
    return _date_of_day(int(timestamp // 86400))


@functools.lru_cache(maxsize=64)
def _date_of_day(day: int) -> str:
    return datetime.fromtimestamp(day * 86400, UTC).strftime("%Y-%m-%d")


def episode_row(event: EpisodeEvent, partition: int, offset: int) -> dict:
    return {
        "event_id": event.event_id,
        "client_id": event.client_id,
        "produced_at": event.produced_at,
        "episode_id": event.episode_id,
        "task": event.task,
        "seed": event.seed,
        "steps": event.steps,
        "raw_reward": event.raw_reward,
        "binary_reward": event.binary_reward,
        "success": event.success,
        "termination": event.termination,
        "model_version": event.model_version,
        "policy": event.policy,
        "completion": event.completion,
        "step_efficiency": event.step_efficiency,
        "verification": event.verification,
        "score": event.score,
        "kafka_partition": partition,
        "kafka_offset": offset,
        "ingested_at": time.time(),
    }


def sample_rows(event: EpisodeEvent, curated: Curated, partition: int, offset: int) -> list[dict]:
    """One gold row per step of a kept episode; the learner joins them to `steps` on (episode_id, step)."""
    now = time.time()
    return [
        {
            "episode_id": event.episode_id,
            "step": step,
            "task": event.task,
            "purpose": curated.purpose,
            "weight": curated.weight,
            "reason": curated.reason,
            "score": event.score,
            "model_version": event.model_version,
            "kafka_partition": partition,
            "kafka_offset": offset,
            "ingested_at": now,
            "produced_at": event.produced_at,
        }
        for step in range(event.steps)
    ]
