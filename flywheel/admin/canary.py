"""Canary rollout: a new model version first reaches a fraction of the fleet; it is promoted to
stable if its live success is not worse than stable's by more than a margin over enough episodes,
and rolled back otherwise. Every verdict is a RolloutDecisionEvent.

Channels live on the compacted model-versions topic (one key per channel). Promotion republishes
the canary's signed manifest on "stable"; rollback republishes stable's on "canary", so canary
clients return to the stable model at their next episode boundary.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import msgspec

from core.object_store import Location
from core.settings import Settings
from lake.queries import episodes_by_version
from schemas import (
    ModelVersionEvent,
    RolloutDecisionEvent,
    encode_event,
    new_event_id,
)
from streams.kafka_clients import make_producer
from streams.model_versions import latest_by_channel
from streams.topics import topics_for


@dataclass(frozen=True)
class CanaryConfig:
    """`flywheel canary`: how often the controller reviews the canary, and the evidence a verdict needs."""

    interval_s: float = 10.0
    """Seconds between reviews."""
    once: bool = False
    """Review once and exit."""
    min_episodes: int = 20
    """Live episodes on each side (canary, stable) before a verdict."""
    margin: float = 0.05
    """Promote unless the canary's live success is below stable's by more than this."""

    def __post_init__(self) -> None:
        if self.min_episodes < 1 or not 0 <= self.margin <= 1 or not 0 < self.interval_s < float("inf"):
            raise ValueError(f"min_episodes must be >= 1, margin in [0, 1] and interval_s > 0, not {self}")


@dataclass(frozen=True)
class LiveSuccess:
    episodes: int
    successes: int

    @property
    def rate(self) -> float:
        return self.successes / self.episodes if self.episodes else 0.0


def decide(canary: LiveSuccess, stable: LiveSuccess, margin: float, min_episodes: int) -> tuple[str, str] | None:
    """("promote" | "rollback", why), or None while either side has fewer than `min_episodes`."""
    if canary.episodes < min_episodes or stable.episodes < min_episodes:
        return None
    comparison = f"canary {canary.rate:.3f} over {canary.episodes} vs stable {stable.rate:.3f} over {stable.episodes}"
    if canary.rate >= stable.rate - margin:
        return "promote", f"{comparison}: within margin {margin}"
    return "rollback", f"{comparison}: worse by more than {margin}"


def live_success(tables_dir: Location) -> dict[str, LiveSuccess]:
    """Episodes and successes per model_version in the `episodes` table."""
    return {
        row["model_version"]: LiveSuccess(row["episodes"], row["successes"]) for row in episodes_by_version(tables_dir)
    }


def publish_channel(settings: Settings, event: ModelVersionEvent, channel: str) -> None:
    """Put a (signed) manifest on a channel; the signature does not cover the channel."""
    moved = msgspec.structs.replace(event, channel=channel, event_id=new_event_id(), produced_at=time.time())
    producer = make_producer(settings, "canary-controller")
    try:
        producer.send(topics_for(settings).model_versions.name, key=channel.encode(), value=encode_event(moved)).get(30)
    finally:
        producer.close()


def review_canary(settings: Settings, config: CanaryConfig) -> RolloutDecisionEvent | None:
    """One review: decide on the current canary if there is enough evidence, and act on it."""
    channels = latest_by_channel(settings)
    canary, stable = channels.get("canary"), channels.get("stable")
    if canary is None or stable is None or canary.version == stable.version:
        return None
    success = live_success(settings.tables_dir)
    canary_live = success.get(canary.version, LiveSuccess(0, 0))
    stable_live = success.get(stable.version, LiveSuccess(0, 0))
    verdict = decide(canary_live, stable_live, config.margin, config.min_episodes)
    if verdict is None:
        return None
    decision, reason = verdict
    event = RolloutDecisionEvent(
        event_id=new_event_id(),
        produced_at=time.time(),
        decision=decision,
        canary_version=canary.version,
        stable_version=stable.version,
        canary_success=canary_live.rate,
        canary_episodes=canary_live.episodes,
        stable_success=stable_live.rate,
        stable_episodes=stable_live.episodes,
        margin=config.margin,
        reason=reason,
    )
    producer = make_producer(settings, "canary-controller")
    try:
        producer.send(topics_for(settings).rollout_decisions.name, value=encode_event(event)).get(30)
    finally:
        producer.close()
    if decision == "promote":
        publish_channel(settings, canary, "stable")
    else:
        publish_channel(settings, stable, "canary")
    return event


def run_canary_controller(settings: Settings, config: CanaryConfig) -> None:
    while True:
        decision = review_canary(settings, config)
        if decision is not None:
            print(f"{decision.decision} {decision.canary_version}: {decision.reason}", flush=True)
        if config.once:
            return
        time.sleep(config.interval_s)
