"""No poison pills: any bytes on any topic end as rows or as a dead letter with a reason, never as an exception that
stops a consumer (which would re-read them on restart and stop again, forever). Fuzzed with hypothesis over mutated
valid events of every kind: bit flips, truncations, insertions, invalid UTF-8 in string fields, wrong types."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass

import msgspec
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.processes import wait_until
from flywheel.admin.dlq import read_dead_letters
from lake.tables import EPISODES, SCHEMAS, STEPS, TRAINING_SAMPLES
from processors.messages import episode_records, step_records
from processors.scoring import EpisodeProgress, score_episode
from schemas import (
    EpisodeEvent,
    EventDecodeError,
    ModelVersionEvent,
    RolloutDecisionEvent,
    StepEvent,
    decode_event,
    encode_event,
    new_event_id,
)
from streams.kafka_clients import make_producer
from streams.topics import topics_for
from tests.factories import EpisodeEventV1, step_event, v1_step_bytes
from tests.test_faults import Pipeline, episodes

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MAX_SCREENSHOT = 512 * 1024


def _episode() -> EpisodeEvent:
    last = step_event(step=2)
    progress = EpisodeProgress()
    progress.add(last)
    return score_episode(last, progress)


VALID: list[bytes] = [
    encode_event(step_event()),
    encode_event(step_event(done=False, reward=0.0, behaviour_logprob=-0.5, thought="ünïcode ✓")),
    v1_step_bytes(step_event()),
    encode_event(_episode()),
    msgspec.msgpack.encode(
        EpisodeEventV1(
            new_event_id(),
            "c0",
            1.0,
            "c0-click-test-7-0",
            "click-test",
            7,
            3,
            1.0,
            1.0,
            True,
            "done",
            "expert",
            "expert",
        )  # fmt: skip
    ),
    encode_event(
        ModelVersionEvent(new_event_id(), 1.0, "sft-0001", "", "sft", "file:///m.vla", "ab" * 32, lineage={"steps": 3})
    ),
    encode_event(
        RolloutDecisionEvent(new_event_id(), 1.0, "promote", "sft-0002", "sft-0001", 0.9, 20, 0.8, 20, 0.05, "better")
    ),
]
ODD_VALUES = [None, True, -1, 0, 2**31, 2**63 - 1, 2**64 - 1, -(2**63), 1e308, float("nan"), float("inf"), -0.0, "",
              "x" * 300, b"\xff\x00", [], [1, "a"], {}, {"type": "click"}, {"1": {"2": {"3": []}}}]  # fmt: skip


@st.composite
def mutated(draw) -> bytes:
    """A valid event of some kind, then one or more mutations of its bytes or of its fields."""
    payload = draw(st.sampled_from(VALID))
    for _ in range(draw(st.integers(1, 3))):
        payload = draw(st.sampled_from([_flip, _truncate, _insert, _bad_utf8, _wrong_type]))(draw, payload)
    return payload


def _flip(draw, payload: bytes) -> bytes:
    if not payload:
        return payload
    at = draw(st.integers(0, len(payload) - 1))
    return payload[:at] + bytes([payload[at] ^ (1 << draw(st.integers(0, 7)))]) + payload[at + 1 :]


def _truncate(draw, payload: bytes) -> bytes:
    return payload[: draw(st.integers(0, max(0, len(payload) - 1)))]


def _insert(draw, payload: bytes) -> bytes:
    at = draw(st.integers(0, len(payload)))
    return payload[:at] + draw(st.binary(min_size=1, max_size=8)) + payload[at:]


def _fields(payload: bytes) -> dict | None:
    try:
        raw = msgspec.msgpack.decode(payload)
    except (msgspec.DecodeError, RecursionError):
        return None
    return raw if isinstance(raw, dict) and raw else None


def _bad_utf8(draw, payload: bytes) -> bytes:
    """One string field's bytes replaced by as many bytes that are not UTF-8 (the framing stays valid)."""
    raw = _fields(payload)
    strings = sorted(k for k, v in (raw or {}).items() if isinstance(k, str) and isinstance(v, str) and v)
    if not strings:
        return payload
    name = draw(st.sampled_from(strings))
    marker = "\x01" * len(raw[name].encode())
    encoded = msgspec.msgpack.encode({**raw, name: marker})
    junk = draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80"]))
    bad = (junk * len(marker))[: len(marker)]
    return encoded.replace(marker.encode(), bad, 1)


def _wrong_type(draw, payload: bytes) -> bytes:
    raw = _fields(payload)
    if raw is None:
        return payload
    name = draw(st.sampled_from(sorted(raw, key=repr)))
    return msgspec.msgpack.encode({**raw, name: draw(st.sampled_from(ODD_VALUES))})


@dataclass(frozen=True)
class Message:
    """What the sinks read of a Kafka record (kafka-python's ConsumerRecord and faust's Message have these)."""

    value: bytes | None
    topic: str = "fuzz.steps"
    partition: int = 0
    offset: int = 0


@FUZZ
@given(mutated(), st.sampled_from([None, StepEvent, EpisodeEvent, ModelVersionEvent, RolloutDecisionEvent]))
def test_decode_event_raises_only_event_decode_error(payload, expect):
    try:
        event = decode_event(payload, expect=expect)
    except EventDecodeError as error:
        assert error.reason and str(error)
    else:
        assert expect is None or isinstance(event, expect)


@FUZZ
@given(st.lists(mutated(), min_size=1, max_size=4))
def test_every_step_record_ends_as_rows_arrow_takes_or_as_a_dead_letter(payloads):
    messages = [Message(payload, offset=i) for i, payload in enumerate(payloads)]
    batch = step_records(messages, MAX_SCREENSHOT)
    assert len(batch.records) == len(messages)
    assert set(batch.steps).isdisjoint(batch.dead) and len(batch.steps) + len(batch.dead) == len(messages)
    pa.Table.from_pylist([row for r in batch.records for row in r.rows], schema=SCHEMAS[STEPS])


@FUZZ
@given(st.lists(mutated(), min_size=1, max_size=4))
def test_every_episode_record_ends_as_rows_arrow_takes_or_as_a_dead_letter(payloads):
    messages = [Message(payload, topic="fuzz.episodes", offset=i) for i, payload in enumerate(payloads)]
    episodes, samples, dead = episode_records(messages)
    assert len(episodes) == len(samples) == len(messages)
    assert sum(1 for r in episodes if r.rows) + len(dead) == len(messages)
    pa.Table.from_pylist([row for r in episodes for row in r.rows], schema=SCHEMAS[EPISODES])
    pa.Table.from_pylist([row for r in samples for row in r.rows], schema=SCHEMAS[TRAINING_SAMPLES])


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (None, "undecodable"),  # a record without a value (a tombstone)
        (b"\x82\xa4kind\xa4step\xa1x" + b"\x91" * 100_000 + b"\xc0", "undecodable"),  # nested too deep
        (encode_event(step_event()).replace(b"Click the button.", b"Click the butto\xff.", 1), "undecodable"),
        (encode_event(step_event(step=10_000)), "invalid_field"),  # more rows than any episode has
        (encode_event(step_event(seed=2**63)), "invalid_field"),  # does not fit the int64 column
        (encode_event(step_event(produced_at=float("nan"))), "invalid_field"),  # no partition date
    ],
)
def test_what_once_stopped_a_worker_is_a_dead_letter_with_a_reason(payload, reason):
    batch = step_records([Message(payload)], MAX_SCREENSHOT)
    assert [error.reason for _message, error in batch.dead.values()] == [reason]


def test_a_malformed_v1_dict_that_trips_an_upcaster_is_an_invalid_field(monkeypatch):
    from schemas import events

    def fragile(raw: dict) -> dict:
        return {**raw, "seed": int(raw["episode_id"].rsplit("-", 2)[1])}  # assumes what a malformed v1 lacks

    monkeypatch.setitem(events.UPCASTERS, ("step", 1), fragile)
    raw = msgspec.msgpack.decode(v1_step_bytes(step_event()))
    with pytest.raises(EventDecodeError) as info:
        decode_event(msgspec.msgpack.encode({**raw, "episode_id": "loose"}))
    assert info.value.reason == "invalid_field" and "upcast" in str(info.value)


def poison_pills(count: int = 40, seed: int = 7) -> list[bytes | None]:
    """Bytes every one of which decode_event refuses: the cases that once stopped a worker, and seeded random
    flips, truncations and insertions of valid steps."""
    good = encode_event(step_event())
    raw = msgspec.msgpack.decode(good)
    pills: list[bytes | None] = [
        None,  # a record without a value
        good.replace(b"Click the button.", b"Click the \xff\xfe\xfd\xfc\xfb\xfa\xf9", 1),  # invalid UTF-8 in the body
        v1_step_bytes(step_event()).replace(b"The button is", b"The \xc3utton is", 1),
        good[: len(good) * 2 // 3],  # a truncated body behind a whole header
        msgspec.msgpack.encode({**raw, "step": 2**31}),  # once an Arrow error: the batch could never be written
        msgspec.msgpack.encode({**raw, "seed": 2**64 - 1}),
        msgspec.msgpack.encode({**raw, "produced_at": float("inf")}),
        b"\x82\xa4kind\xa4step\xa1x" + b"\x91" * 100_000 + b"\xc0",
    ]
    rng = random.Random(seed)
    while len(pills) < count:
        at = rng.randrange(len(good))
        flipped = good[:at] + bytes([good[at] ^ (1 << rng.randrange(8))]) + good[at + 1 :]
        candidate = rng.choice([flipped, good[:at], good[:at] + b"\xff" + good[at:]])
        try:
            decode_event(candidate, expect=StepEvent)
        except EventDecodeError:
            pills.append(candidate)
    for pill in pills:
        with pytest.raises(EventDecodeError):
            decode_event(pill, expect=StepEvent)
    return pills


@pytest.mark.kafka
def test_poison_pills_between_good_steps_are_dead_lettered_once_and_the_worker_goes_on(stack, tmp_path):
    pipeline = Pipeline(stack, tmp_path)
    worker = pipeline.start_worker()
    good_before, good_after = episodes("p", 5), episodes("p", 5, first=5)
    producer = make_producer(pipeline.settings, "test-poison")
    topic = topics_for(pipeline.settings).steps.name
    for step in good_before:
        producer.send(topic, key=step.episode_id.encode(), value=encode_event(step))
    sent = [producer.send(topic, key=b"bad", value=pill) for pill in poison_pills()]
    for step in good_after:
        producer.send(topic, key=step.episode_id.encode(), value=encode_event(step))
    producer.flush()
    producer.close()
    bad_at = Counter((future.get().partition, future.get().offset) for future in sent)

    good = good_before + good_after
    wait_until(pipeline.caught_up([worker]), 120, what="every record consumed, the good after the bad")
    assert worker.running(), worker.tail()
    pipeline.assert_exactly_once(good)
    letters = wait_until(
        lambda: (d := read_dead_letters(pipeline.settings)) and len(d) >= len(bad_at) and d, 60, what="the letters"
    )
    assert Counter((d.source_partition, d.source_offset) for d in letters) == bad_at  # each exactly once
    assert all(d.reason and d.detail and d.source_topic == topic for d in letters)
