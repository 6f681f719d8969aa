"""Event contracts: immutable, flat, versioned, msgpack-encoded (see DESIGN §2)."""

from schemas.events import (
    Action,
    EpisodeEvent,
    EventDecodeError,
    ModelVersionEvent,
    RolloutDecisionEvent,
    StepEvent,
    Verify,
    decode_event,
    encode_event,
    new_event_id,
)

__all__ = [
    "Action",
    "EpisodeEvent",
    "EventDecodeError",
    "ModelVersionEvent",
    "RolloutDecisionEvent",
    "StepEvent",
    "Verify",
    "decode_event",
    "encode_event",
    "new_event_id",
]
