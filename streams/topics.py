"""Every topic of the flywheel, defined once. Importable without faust (the edge install has none)."""

from __future__ import annotations

from dataclasses import dataclass

from core.settings import Settings
from streams.kafka_clients import DEAD_LETTER_MAX_BYTES, MAX_REQUEST_BYTES


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    config: dict[str, str]


@dataclass(frozen=True)
class Topics:
    steps: TopicSpec  # StepEvent, keyed by episode_id so an episode stays ordered in one partition
    episodes: TopicSpec  # scored EpisodeEvent, keyed by episode_id
    model_versions: TopicSpec  # ModelVersionEvent, compacted, keyed by channel
    dead_letters: TopicSpec  # original bytes + reason in headers
    rollout_decisions: TopicSpec  # RolloutDecisionEvent: every canary promotion and rollback

    def all(self) -> list[TopicSpec]:
        return [self.steps, self.episodes, self.model_versions, self.dead_letters, self.rollout_decisions]


SEGMENT_MS = 3_600_000  # Kafka deletes whole closed segments: rolled hourly, the log outlives retention by 1 h at most


def topics_for(settings: Settings) -> Topics:
    prefix = settings.topic_prefix
    retention = {"retention.ms": str(settings.topic_retention_ms), "segment.ms": str(SEGMENT_MS),
                 "max.message.bytes": str(MAX_REQUEST_BYTES)}  # fmt: skip
    return Topics(
        steps=TopicSpec(f"{prefix}.steps", settings.topic_partitions, retention),
        episodes=TopicSpec(f"{prefix}.episodes", settings.topic_partitions, retention),
        model_versions=TopicSpec(f"{prefix}.model_versions", 1, {"cleanup.policy": "compact"}),
        dead_letters=TopicSpec(
            f"{prefix}.dead_letters", 1, retention | {"max.message.bytes": str(DEAD_LETTER_MAX_BYTES)}
        ),  # fmt: skip
        rollout_decisions=TopicSpec(f"{prefix}.rollout_decisions", 1, {"retention.ms": "-1"}),  # the canary's record
    )
