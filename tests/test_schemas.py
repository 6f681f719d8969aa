import msgspec
import pytest

from schemas import (
    EpisodeEvent,
    EventDecodeError,
    ModelVersionEvent,
    StepEvent,
    Verify,
    decode_event,
    encode_event,
    new_event_id,
)
from schemas import events as events_module
from tests.factories import EpisodeEventV1, step_event, v1_step_bytes


def test_step_event_round_trips():
    event = step_event()
    assert decode_event(encode_event(event)) == event


def test_v2_final_step_carries_termination_and_seed():
    event = step_event(reward=-1.0, termination="max_steps", seed=42)
    decoded = decode_event(encode_event(event))
    assert decoded == event and decoded.schema_version == 2
    assert (decoded.termination, decoded.seed) == ("max_steps", 42)
    running = decode_event(encode_event(step_event(done=False, reward=0.0)))
    assert running.termination is None


def test_episode_event_v2_round_trips():
    episode = EpisodeEvent(
        new_event_id(), "c0", 1.0, "c0-click-test-7-0", "click-test", None, 3, -1.0, -1.0, False, "timeout", "expert",
        "expert",
    )  # fmt: skip
    assert decode_event(encode_event(episode)) == episode


def test_unknown_termination_is_named():
    raw = msgspec.msgpack.decode(encode_event(step_event()))
    raw["termination"] = "done"  # v1's word, not one of v2's
    with pytest.raises(EventDecodeError) as info:
        decode_event(msgspec.msgpack.encode(raw))
    assert info.value.reason == "invalid_field" and "$.termination" in str(info.value)


@pytest.mark.parametrize(
    ("episode_id", "done", "reward", "observed", "termination", "seed"),
    [
        ("c0-click-test-7-0", True, 0.8, "episode ended with reward 0.8", "success", 7),
        ("c0-click-test-7-0", True, -1.0, "episode ended with reward -1", "failure", 7),
        ("c0-click-test-7-0", True, -1.0, "task timed out", "timeout", 7),
        ("c0-click-test-7-0", False, 0.0, "screen unchanged", None, 7),
        ("c0-click-test-x-0", True, 1.0, "episode ended with reward 1", "success", None),
        ("loose", True, 1.0, "episode ended with reward 1", "success", None),
    ],
)
def test_v1_step_is_upcast_with_derived_termination_and_seed(episode_id, done, reward, observed, termination, seed):
    """Bytes as a v1 client wrote them decode to v2, with the ending and the seed the v1 scorer inferred."""
    v2 = step_event(episode_id, done=done, reward=reward, verify=Verify("x", observed, None))
    decoded = decode_event(v1_step_bytes(v2), expect=StepEvent)
    assert decoded.schema_version == 2
    assert (decoded.termination, decoded.seed) == (termination, seed)
    assert decoded.episode_id == episode_id and decoded.reward == reward and decoded.screenshot == v2.screenshot


def test_v1_bytes_are_really_v1():
    raw = msgspec.msgpack.decode(v1_step_bytes(step_event()))
    assert raw["schema_version"] == 1 and "termination" not in raw and "seed" not in raw


def test_malformed_v1_step_still_names_the_field():
    """The upcaster tolerates what it cannot read; validation afterwards says what was wrong."""
    raw = msgspec.msgpack.decode(v1_step_bytes(step_event()))
    for field, value in (("verify", "not a struct"), ("reward", "high"), ("episode_id", 12)):
        with pytest.raises(EventDecodeError) as info:
            decode_event(msgspec.msgpack.encode({**raw, field: value}))
        assert info.value.reason == "invalid_field" and f"$.{field}" in str(info.value)
    del raw["episode_id"]
    with pytest.raises(EventDecodeError, match="episode_id"):
        decode_event(msgspec.msgpack.encode(raw))


@pytest.mark.parametrize(
    ("termination", "success", "seed", "expected"),
    [
        ("done", True, 7, ("success", 7)),
        ("failed", False, -1, ("failure", None)),
        ("timeout", False, 3, ("timeout", 3)),
    ],
)
def test_v1_episode_is_upcast_to_v2_vocabulary(termination, success, seed, expected):
    v1 = EpisodeEventV1(
        new_event_id(), "c0", 1.0, "c0-click-test-7-0", "click-test", seed, 1, 1.0 if success else -1.0,
        1.0 if success else -1.0, success, termination, "expert", "expert",
    )  # fmt: skip
    decoded = decode_event(msgspec.msgpack.encode(v1), expect=EpisodeEvent)
    assert (decoded.termination, decoded.seed) == expected and decoded.schema_version == 3
    assert decoded.success is success


def abandoned_episode(**fields) -> EpisodeEvent:
    return EpisodeEvent(
        new_event_id(), "c0", 1.0, "c0-click-test-7-0", "click-test", 7, 2, 0.0, -1.0, False, "abandoned", "expert",
        "expert", **fields,
    )  # fmt: skip


def test_episode_v3_may_be_abandoned_and_a_step_may_not():
    episode = abandoned_episode()
    decoded = decode_event(encode_event(episode))
    assert decoded == episode and decoded.schema_version == 3 and decoded.termination == "abandoned"
    raw = msgspec.msgpack.decode(encode_event(step_event()))
    with pytest.raises(EventDecodeError) as info:  # only assembly abandons: no client can say so of its own step
        decode_event(msgspec.msgpack.encode({**raw, "termination": "abandoned"}))
    assert info.value.reason == "invalid_field" and "$.termination" in str(info.value)


def test_v2_episode_is_upcast_to_v3_as_it_is():
    raw = msgspec.msgpack.decode(encode_event(abandoned_episode()))
    v2 = {**raw, "schema_version": 2, "termination": "timeout"}
    decoded = decode_event(msgspec.msgpack.encode(v2), expect=EpisodeEvent)
    assert decoded == msgspec.convert({**v2, "schema_version": 3}, EpisodeEvent) and decoded.termination == "timeout"


def test_a_v2_reader_dead_letters_a_v3_episode_as_a_version_it_does_not_know(monkeypatch):
    monkeypatch.setitem(events_module.CURRENT_VERSION, "episode", 2)
    with pytest.raises(EventDecodeError) as info:
        decode_event(encode_event(abandoned_episode()))
    assert info.value.reason == "unknown_schema_version"


def test_wrong_type_names_the_field():
    raw = msgspec.msgpack.decode(encode_event(step_event()))
    raw["action"]["x"] = "left"
    with pytest.raises(EventDecodeError) as info:
        decode_event(msgspec.msgpack.encode(raw))
    assert info.value.reason == "invalid_field"
    assert "$.action.x" in str(info.value)


def test_missing_field_is_named():
    raw = msgspec.msgpack.decode(encode_event(step_event()))
    del raw["episode_id"]
    with pytest.raises(EventDecodeError, match="episode_id"):
        decode_event(msgspec.msgpack.encode(raw))


def test_unknown_schema_version_is_refused():
    raw = msgspec.msgpack.decode(encode_event(step_event()))
    raw["schema_version"] = 99
    with pytest.raises(EventDecodeError) as info:
        decode_event(msgspec.msgpack.encode(raw))
    assert info.value.reason == "unknown_schema_version"


def test_garbage_bytes_are_undecodable():
    with pytest.raises(EventDecodeError) as info:
        decode_event(b"\xc1\xc1 not msgpack")
    assert info.value.reason == "undecodable"


def test_expected_kind_is_enforced():
    with pytest.raises(EventDecodeError) as info:
        decode_event(encode_event(step_event()), expect=EpisodeEvent)
    assert info.value.reason == "wrong_kind"


def test_older_version_is_upcast(monkeypatch):
    """A v1 event read by a reader at v2 goes through the registered upcaster."""
    monkeypatch.setitem(events_module.CURRENT_VERSION, "model_version", 2)
    monkeypatch.setitem(events_module.UPCASTERS, ("model_version", 1), lambda raw: {**raw, "channel": "canary"})
    v1 = ModelVersionEvent(new_event_id(), 1.0, "sft-0001", "", "sft", "file:///m.onnx", "ab" * 32)
    decoded = decode_event(encode_event(v1))
    assert decoded.channel == "canary" and decoded.schema_version == 2


def test_event_ids_sort_by_creation_time():
    ids = [new_event_id() for _ in range(50)]
    assert len(set(ids)) == 50
    assert [i[:13] for i in ids] == sorted(i[:13] for i in ids)  # the millisecond prefix never goes back
