import msgspec
import pytest

from schemas import EpisodeEvent, EventDecodeError, ModelVersionEvent, decode_event, encode_event, new_event_id
from schemas import events as events_module
from tests.factories import step_event


def test_step_event_round_trips():
    event = step_event()
    assert decode_event(encode_event(event)) == event


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
