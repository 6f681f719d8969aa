"""Event contracts: immutable, flat, versioned, msgpack-encoded (see docs/architecture.md, Contracts)."""

from schemas.events import (
    Action,
    EpisodeEnding,
    EpisodeEvent,
    EventDecodeError,
    ModelVersionEvent,
    RolloutDecisionEvent,
    StepEvent,
    Termination,
    Verify,
    decode_event,
    encode_event,
    new_event_id,
)

__all__ = [
    "Action",
    "EpisodeEnding",
    "EpisodeEvent",
    "EventDecodeError",
    "ModelVersionEvent",
    "RolloutDecisionEvent",
    "StepEvent",
    "Termination",
    "Verify",
    "decode_event",
    "encode_event",
    "new_event_id",
]
