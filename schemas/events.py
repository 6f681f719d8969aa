"""The three events of the flywheel and their binary encoding.

Every event is a frozen msgspec Struct carrying `kind` and `schema_version`. On the wire it is
MessagePack. Decoding is strict: a wrong type or a missing field raises EventDecodeError whose
message names the field (msgspec reports the JSON path, e.g. "at `$.action.x`"). Older schema
versions are upcast on read by the functions in UPCASTERS; versions newer than this code knows
are refused rather than guessed at. Whatever the bytes, `decode_event` returns an event or raises
EventDecodeError, never anything else: a consumer dead-letters what it cannot read and goes on.
Numbers are bounded to what their Delta columns hold, so a decoded event always becomes rows.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal

import msgspec

# Bounds of the numbers that land in Delta columns (lake.tables): a value outside them is an invalid field,
# dead-lettered, rather than a row that Arrow refuses and a batch that can never be written.
MAX_EPISODE_STEPS = 10_000  # far above any step budget; bounds the training_samples rows of one episode
UnixTime = Annotated[float, msgspec.Meta(ge=0.0, le=253_402_300_799.0)]  # up to 9999-12-31: a partition date
StepIndex = Annotated[int, msgspec.Meta(ge=0, lt=MAX_EPISODE_STEPS)]
StepCount = Annotated[int, msgspec.Meta(ge=0, le=MAX_EPISODE_STEPS)]
Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), lt=2**31)]
Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
LogProb = Annotated[float, msgspec.Meta(ge=-1e6, le=0.0)]  # a finite log-probability

ActionType = Literal["click", "type", "key", "scroll", "noop"]

# How an episode ended, decided once by the episode loop (edge_client.episode) and carried on its final step.
# "success" is the only successful ending: the env ended the episode with raw reward > 0.
Termination = Literal[
    "success",  # the env ended it with reward > 0
    "failure",  # the env ended it with reward <= 0
    "timeout",  # the task's JavaScript timer ended it
    "max_steps",  # still running after the step budget
    "gave_up",  # the policy could not read the screen (a scripted expert's LookupError)
    "error",  # the browser failed; says nothing about the policy
]
# How an episode was closed: the edge loop's ending, or "abandoned": no step came for a while (its client died or
# went quiet mid-episode), so assembly closed it without a final step (processors.assembly). Never a success.
EpisodeEnding = Literal[Termination, "abandoned"]


class Action(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    """What the agent did. x, y are pixels in the 160x210 MiniWoB task area (x right, y down)."""

    type: ActionType
    x: float = 0.0
    y: float = 0.0
    text: str = ""
    key: str = ""
    scroll_dy: float = 0.0


class Verify(msgspec.Struct, frozen=True):
    """Think -> act -> verify: what the agent expected to see after acting, and what it saw."""

    expected: str = ""
    observed: str = ""
    ok: bool | None = None  # None: nothing checkable was expected


class StepEvent(msgspec.Struct, frozen=True, tag_field="kind", tag="step"):
    """One step as the edge saw it. Its fields are the `steps` table's columns too (processors.table_rows derives the
    row); tests/test_step_contract.py names what else must follow a field added here."""

    event_id: str
    client_id: str
    produced_at: UnixTime  # unix seconds, set by the producer
    episode_id: str
    step: StepIndex
    task: str
    instruction: str
    screenshot: bytes  # PNG of the screen the action was chosen on
    thought: str
    action: Action
    model_version: str
    verify: Verify
    reward: float  # env reward after this step (terminal reward on the last step)
    done: bool
    behaviour_logprob: float | None = None
    inference_ms: float = 0.0
    env_ms: float = 0.0
    visual_tokens_total: Int32 = 0
    visual_tokens_kept: Int32 = 0
    screenshot_ref: str = ""  # content address when the PNG lives in the blob store instead
    termination: Termination | None = None  # set on the final step (done) only
    seed: Int64 | None = None  # the env seed of the episode; None when unknown (v1 ids that do not parse)
    # What a model generated, for the learner's importance ratios (policy.sampling); empty for experts.
    # Optional fields with defaults: v2 readers that do not know them skip them, so no version bump.
    tokens: tuple[Int32, ...] = ()  # generated target ids: thought + action, <eos> included
    token_logprobs: tuple[LogProb, ...] = ()  # log mu of each token under the distribution it was drawn from
    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=100.0)] = 0.0  # 0: greedy
    top_k: Int32 = 0  # 0: every token the grammar allows
    # An expert click's target element (left, top, right, bottom) in screenshot pixels, empty otherwise: what
    # semi-online RL and SOP match a model's click against (any point inside it is the expert's action).
    target_box: tuple[float, ...] = ()
    # A teacher's label of the screen this step was chosen on (edge_client.teacher): what it would have done here,
    # why it was asked, and its click's element box. The learner aggregates (own state, teacher action) as DAgger
    # does. None / empty: no teacher was asked (most steps: every label is a budgeted call).
    teacher_action: Action | None = None
    teacher_thought: str = ""
    teacher_box: tuple[float, ...] = ()
    teacher_reason: str = ""  # edge_client.teacher.REASONS: why this state was worth a label
    schema_version: int = 2


class EpisodeEvent(msgspec.Struct, frozen=True, tag_field="kind", tag="episode"):
    event_id: str  # minted by the scorer: a re-emission of the episode after a crash has another one
    client_id: str
    produced_at: UnixTime  # its final step's produced_at, so every emission of the episode carries the same
    episode_id: str  # the episode's identity: one row per episode_id in Delta `episodes`
    task: str
    seed: Int64 | None
    steps: StepCount
    raw_reward: float
    binary_reward: float  # +1 success, -1 otherwise
    success: bool
    termination: EpisodeEnding  # v3: "abandoned" too
    model_version: str
    policy: str  # "expert" | "model"
    first_produced_at: float = 0.0
    # reward components, filled by the scorer
    completion: float = 0.0
    step_efficiency: float = 0.0
    verification: float = 0.0
    score: float = 0.0
    schema_version: int = 3


class ModelVersionEvent(msgspec.Struct, frozen=True, tag_field="kind", tag="model_version"):
    event_id: str
    produced_at: float
    version: str
    parent: str
    stage: str  # "sft" | "offline_rl" | "online_rl" | ...
    artifact_uri: str
    sha256: str
    channel: str = "stable"
    signature: str = ""
    lineage: dict[str, int] = {}  # Delta table name -> table version trained on
    eval: dict[str, float] = {}  # task -> success rate
    client_id: str = "learner"
    schema_version: int = 1


class RolloutDecisionEvent(msgspec.Struct, frozen=True, tag_field="kind", tag="rollout_decision"):
    """A canary verdict: promote the canary version to stable, or roll the canary channel back."""

    event_id: str
    produced_at: float
    decision: str  # "promote" | "rollback"
    canary_version: str
    stable_version: str
    canary_success: float
    canary_episodes: int
    stable_success: float
    stable_episodes: int
    margin: float
    reason: str
    client_id: str = "canary-controller"
    schema_version: int = 1


Event = StepEvent | EpisodeEvent | ModelVersionEvent | RolloutDecisionEvent
CURRENT_VERSION: dict[str, int] = {"step": 2, "episode": 3, "model_version": 1, "rollout_decision": 1}
_TYPES: dict[str, type] = {
    "step": StepEvent,
    "episode": EpisodeEvent,
    "model_version": ModelVersionEvent,
    "rollout_decision": RolloutDecisionEvent,
}


# --- upcasters ------------------------------------------------------------------------------------
# Each turns the decoded dict of one version into the next version's dict. They only fill in what the
# old version lacked and never raise on a malformed payload: validation afterwards names the bad field.


def _step_v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """v1 steps carried neither termination nor seed: derive them as the v1 scorer did, so old logs keep
    their meaning (this is the only place that still reads them from free text and the episode id)."""
    return {**raw, "termination": _v1_termination(raw), "seed": _v1_seed(raw.get("episode_id"))}


def _v1_termination(raw: dict[str, Any]) -> str | None:
    if raw.get("done") is not True:
        return None
    verify = raw.get("verify")
    observed = verify.get("observed") if isinstance(verify, dict) else None
    if isinstance(observed, str) and ("timed out" in observed or "timeout" in observed):
        return "timeout"
    reward = raw.get("reward")
    return "success" if isinstance(reward, int | float) and reward > 0 else "failure"


def _v1_seed(episode_id: object) -> int | None:
    """v1 episode ids were '<client>-<task>-<seed>-<n>' (the v1 runner)."""
    parts = episode_id.rsplit("-", 2) if isinstance(episode_id, str) else []
    try:
        return int(parts[1]) if len(parts) == 3 else None
    except ValueError:
        return None


def _episode_v1_to_v2(raw: dict[str, Any]) -> dict[str, Any]:
    """v1 named every env-ended episode 'done' (reward > 0) or 'failed', and an unknown seed -1."""
    termination = raw.get("termination")
    if termination in ("done", "failed"):
        termination = "success" if raw.get("success") is True else "failure"
    seed = raw.get("seed")
    return {**raw, "termination": termination, "seed": None if seed == -1 else seed}


def _episode_v2_to_v3(raw: dict[str, Any]) -> dict[str, Any]:
    """v3 only adds the ending "abandoned": every v2 episode is a v3 one as it is. The version moved so that a v2
    reader dead-letters an abandoned episode as a version it does not know, instead of as an invalid field."""
    return raw


# (kind, version) -> the upcaster from that version to the next.
UPCASTERS: dict[tuple[str, int], Callable[[dict[str, Any]], dict[str, Any]]] = {
    ("step", 1): _step_v1_to_v2,
    ("episode", 1): _episode_v1_to_v2,
    ("episode", 2): _episode_v2_to_v3,
}


class EventDecodeError(ValueError):
    """Bytes that are not a valid event. `reason` is short and machine-groupable, the message explains."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class _Header(msgspec.Struct):
    kind: str = ""
    schema_version: int = 0


_encoder = msgspec.msgpack.Encoder()
_header_decoder = msgspec.msgpack.Decoder(_Header)
_decoders = {kind: msgspec.msgpack.Decoder(cls) for kind, cls in _TYPES.items()}


def encode_event(event: Event) -> bytes:
    return _encoder.encode(event)


def decode_event(payload: bytes, expect: type | None = None) -> Event:
    """Strictly decode one event; raise EventDecodeError naming what is wrong, and nothing else, whatever the
    bytes (a body that is not MessagePack behind a readable header included): no input stops a consumer."""
    if not isinstance(payload, bytes | bytearray | memoryview):
        raise EventDecodeError("undecodable", f"expected bytes, got {type(payload).__name__} (a record without value?)")
    header = _decode(_header_decoder.decode, payload, "invalid_header")
    if header.kind not in _TYPES:
        raise EventDecodeError("unknown_kind", f"kind {header.kind!r} is not one of {sorted(_TYPES)}")
    cls = _TYPES[header.kind]
    if expect is not None and cls is not expect:
        raise EventDecodeError("wrong_kind", f"expected {expect.__name__}, got kind {header.kind!r}")
    current = CURRENT_VERSION[header.kind]
    if not 1 <= header.schema_version <= current:
        raise EventDecodeError(
            "unknown_schema_version",
            f"{header.kind} schema_version {header.schema_version} (this reader knows 1..{current})",
        )
    if header.schema_version == current:
        return _decode(_decoders[header.kind].decode, payload, "invalid_field")
    return _upcast(_decode(msgspec.msgpack.decode, payload, "invalid_field"), header.kind, header.schema_version)


def _decode(decode: Callable[[Any], Any], data: Any, invalid: str) -> Any:
    """`decode(data)` with every msgspec error as EventDecodeError: `invalid` for a wrong or missing field,
    "undecodable" for what is not MessagePack (a truncated body, invalid UTF-8 in a string, nesting too deep)."""
    try:
        return decode(data)
    except msgspec.ValidationError as exc:  # a subclass of DecodeError: test it first
        raise EventDecodeError(invalid, str(exc)) from exc
    except msgspec.MsgspecError as exc:
        raise EventDecodeError("undecodable", str(exc)) from exc
    except RecursionError as exc:  # msgspec refuses nesting deeper than the interpreter's recursion limit
        raise EventDecodeError("undecodable", "nested too deeply") from exc


def _upcast(raw: Any, kind: str, version: int) -> Event:
    """The decoded dict of an older version, upcast to the current one and validated."""
    current = CURRENT_VERSION[kind]
    try:
        for step in range(version, current):
            raw = UPCASTERS[(kind, step)](raw)
        raw = {**raw, "schema_version": current}
    except Exception as exc:  # an upcaster met a payload it did not foresee: the payload is what is wrong
        raise EventDecodeError("invalid_field", f"{kind} v{version} could not be upcast: {exc!r}") from exc
    return _decode(lambda fields: msgspec.convert(fields, _TYPES[kind]), raw, "invalid_field")


def new_event_id() -> str:
    """UUIDv7-style id: 48-bit unix milliseconds then randomness, so ids sort by creation time."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms << 80) | (0x7 << 76) | ((rand >> 68) & 0xFFF) << 64 | (0b10 << 62) | (rand & ((1 << 62) - 1))
    return str(uuid.UUID(int=value))
