"""The step's fields are StepEvent's (schemas/events.py), and processors.table_rows.step_row derives the `steps` row
from them by the rule written beside it (STEP_EVENT_ONLY: fields the table does not hold; STEP_ROW_ONLY: columns only
the row has). What is still written out by hand is held to them here, and each failure names the field:

* lake.tables.STEPS_SCHEMA, the columns' Arrow types (the lake cannot import the processors that make the rows);
* the producers, which set the fields from what they have: the edge's step_event (from its step records), the
  pipeline benchmark's bench_step and the tests' factory. Each must set every field, but those it leaves to
  StepEvent's default on purpose, listed with why in NEVER_SET and LEFT_AT_DEFAULT below. A field a producer
  passes that StepEvent does not have fails its construction ("Unexpected keyword argument").
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
import numpy as np
import pyarrow as pa
import pytest

from edge_client.episode import StepRecord
from edge_client.runner import step_event as edge_step_event
from flywheel.bench.synthetic import bench_step
from lake.tables import STEPS_SCHEMA
from policy.interface import Decision, Observation
from policy.sampling import Sampling
from processors.table_rows import STEP_COLUMNS, STEP_EVENT_ONLY, STEP_ROW_ONLY, step_row, struct_of
from schemas import Action, StepEvent, Verify
from tests import factories

# Fields that every producer leaves to StepEvent's default, and why ...
NEVER_SET = {
    "schema_version": "the struct's own default is the version this code writes",
    "screenshot_ref": "there is no blob store yet: the PNG travels in `screenshot`",
}
# ... and those each producer leaves to it beyond them. A field added to StepEvent is set by each producer or
# listed here with the reason it is not.
NOTHING_GENERATED = "an expert's step: no tokens generated, no sampling"
NO_TEACHER = "no teacher was asked about this step"
TEACHER_FIELDS = ("teacher_action", "teacher_thought", "teacher_box", "teacher_reason")
LEFT_AT_DEFAULT: dict[str, dict[str, str]] = {
    "edge_client.runner.step_event": {},
    "flywheel.bench.synthetic.bench_step": {
        **dict.fromkeys(("tokens", "token_logprobs", "temperature", "top_k"), NOTHING_GENERATED),
        "target_box": "not in the steps the pipeline's numbers were measured on (docs/results.md)",
        **dict.fromkeys(TEACHER_FIELDS, NO_TEACHER),
    },
    "tests.factories.step_event": {
        **dict.fromkeys(("tokens", "token_logprobs", "temperature", "top_k"), NOTHING_GENERATED),
        **dict.fromkeys(
            ("behaviour_logprob", "inference_ms", "env_ms", "visual_tokens_total", "visual_tokens_kept", "target_box"),
            "a minimal expert step: a test that needs the field passes it",
        ),
        **dict.fromkeys(TEACHER_FIELDS, NO_TEACHER),
    },
}


def edge_final_step() -> StepEvent:
    """The edge's final step of a model's sampled click, from a record with every value step_event reads."""
    decision = Decision(
        thought="The button is in the middle.",
        action=Action("click", 80.0, 105.0),
        expected="screen changes near (80, 105)",
        logprob=-0.5,
        extras={"visual_tokens_total": 420, "visual_tokens_kept": 105},
        tokens=(5, 6, 7),
        token_logprobs=(-0.1, -0.2, -0.3),
        sampling=Sampling(temperature=1.0, top_k=5),
        target_box=(70.0, 95.0, 90.0, 115.0),
    )
    screen = np.zeros((210, 160, 3), dtype=np.uint8)
    record = StepRecord(
        step=2,
        obs=Observation(task="click-test", instruction="Click the button.", screenshot=screen, step=2),
        decision=decision,
        verify=Verify("screen changes near (80, 105)", "screen changed near the click", True),
        reward=1.0,
        termination="success",
        think_ms=12.0,
        act_ms=30.0,
        verify_ms=2.0,
        teacher=Decision(
            thought="The OK button is on the left.",
            action=Action("click", 40.0, 100.0),
            target_box=(30.0, 90.0, 50.0, 110.0),
        ),
        teacher_reason="uncertain",
    )
    return edge_step_event(record, "c0", "c0-click-test-7-0", "click-test", 7, "v3")


PRODUCERS: dict[str, Callable[[], StepEvent]] = {
    "edge_client.runner.step_event": edge_final_step,
    "flywheel.bench.synthetic.bench_step": lambda: bench_step([b"\x89PNG fake"], "c0", 3, 4, 5),
    "tests.factories.step_event": factories.step_event,
}


def leaf_paths(struct: type, prefix: str = "") -> list[str]:
    """The dotted path of each field of `struct`, nested structs' fields instead of the structs ("action.x")."""
    paths = []
    for field in msgspec.structs.fields(struct):
        nested, _ = struct_of(field.type)  # a struct, or an optional one (teacher_action: Action | None)
        if nested is not None:
            paths += leaf_paths(nested, f"{prefix}{field.name}.")
        else:
            paths.append(prefix + field.name)
    return paths


def test_every_field_of_the_event_is_a_column_of_its_own_or_event_only():
    fields = msgspec.structs.fields(StepEvent)
    problems = [
        f"processors.table_rows.STEP_EVENT_ONLY lists {name!r}, which is not a field of StepEvent"
        for name in STEP_EVENT_ONLY
        if name not in {f.name for f in fields}
    ]
    held = set(STEP_COLUMNS.values())
    problems += [
        f"StepEvent.{path} has no column of its own (another field's column has its name: processors.table_rows)"
        for path in leaf_paths(StepEvent)
        if path.split(".")[0] not in STEP_EVENT_ONLY and path not in held
    ]
    assert not problems, "\n".join(problems)


def test_the_row_has_the_columns_of_the_table_schema():
    row = step_row(edge_final_step(), partition=3, offset=17)
    assert list(row) == [*STEP_COLUMNS, *STEP_ROW_ONLY], "step_row's columns: STEP_COLUMNS, then STEP_ROW_ONLY"
    schema = set(STEPS_SCHEMA.names)
    problems = [
        f"column {column!r} (StepEvent.{STEP_COLUMNS[column]}) is not in lake.tables.STEPS_SCHEMA: add it with its "
        "Arrow type, or list the field in processors.table_rows.STEP_EVENT_ONLY"
        for column in STEP_COLUMNS
        if column not in schema
    ]
    problems += [
        f"row-only column {column!r} (processors.table_rows.STEP_ROW_ONLY) is not in lake.tables.STEPS_SCHEMA"
        for column in STEP_ROW_ONLY
        if column not in schema
    ]
    problems += [
        f"lake.tables.STEPS_SCHEMA's column {column!r} is filled by no field of StepEvent and is not in "
        "processors.table_rows.STEP_ROW_ONLY"
        for column in STEPS_SCHEMA.names
        if column not in row
    ]
    assert not problems, "\n".join(problems)


def test_a_row_of_every_field_set_fits_the_table_schema():
    row = step_row(edge_final_step(), partition=3, offset=17)
    problems = []
    for field in STEPS_SCHEMA:
        if field.name not in row:
            continue  # the test above names it
        try:
            pa.array([row[field.name]], type=field.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            problems.append(f"lake.tables.STEPS_SCHEMA types column {field.name!r} {field.type}; its value: {exc}")
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("producer", sorted(PRODUCERS))
def test_each_producer_sets_every_field_of_the_step(producer):
    event = PRODUCERS[producer]()
    defaults = {f.name: f.default for f in msgspec.structs.fields(StepEvent) if f.default is not msgspec.NODEFAULT}
    left = {**NEVER_SET, **LEFT_AT_DEFAULT[producer]}
    problems = [
        f"{producer} lists {name!r} as left at its default, but StepEvent has no such field with a default"
        for name in left
        if name not in defaults
    ]
    for name, default in defaults.items():
        at_default = getattr(event, name) == default
        if at_default and name not in left:
            problems.append(
                f"{producer} leaves StepEvent.{name} at its default {default!r}: set it, or list it with why in "
                "NEVER_SET or LEFT_AT_DEFAULT (tests/test_step_contract.py)"
            )
        elif not at_default and name in left:
            problems.append(f"{producer} sets StepEvent.{name}, listed as left at its default: unlist it")
    assert not problems, "\n".join(problems)
