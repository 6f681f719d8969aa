"""Canary rollout: the verdict as a pure function, then the controller against real Kafka + Delta."""

from __future__ import annotations

import time

import pytest
from kafka import TopicPartition

from edge_client.model_updates import ModelVersionWatcher
from flywheel.admin.canary import CanaryConfig, LiveSuccess, decide, review_canary
from lake.tables import EPISODES
from processors.delta_sink import DeltaSink, Record
from processors.scoring import EpisodeProgress, score_episode
from processors.table_rows import episode_row
from registry.channels import channel_for
from schemas import ModelVersionEvent, RolloutDecisionEvent, decode_event, encode_event, new_event_id
from streams.kafka_clients import make_consumer, make_producer
from streams.topics import topics_for
from tests.factories import step_event


def test_verdict_waits_for_evidence_then_compares_within_margin():
    assert decide(LiveSuccess(19, 19), LiveSuccess(50, 25), margin=0.05, min_episodes=20) is None
    assert decide(LiveSuccess(20, 9), LiveSuccess(20, 10), margin=0.05, min_episodes=20)[0] == "promote"  # 0.45 vs 0.5
    assert decide(LiveSuccess(20, 8), LiveSuccess(20, 10), margin=0.05, min_episodes=20)[0] == "rollback"  # 0.40
    assert decide(LiveSuccess(20, 20), LiveSuccess(20, 10), margin=0.0, min_episodes=20)[0] == "promote"


def test_canary_membership_is_stable_and_near_the_fraction():
    clients = [f"client-{i}" for i in range(2000)]
    canary = [c for c in clients if channel_for(c, 0.1) == "canary"]
    assert 150 < len(canary) < 250
    assert canary == [c for c in clients if channel_for(c, 0.1) == "canary"]
    assert all(channel_for(c, 0.0) == "stable" for c in clients[:100])


def _version(settings, version: str, channel: str) -> None:
    event = ModelVersionEvent(new_event_id(), time.time(), version, "", "sft", "file:///x.onnx", "ab" * 32, channel)
    producer = make_producer(settings, "test")
    producer.send(topics_for(settings).model_versions.name, key=channel.encode(), value=encode_event(event)).get(30)
    producer.close()


def _live_episodes(settings, version: str, successes: int, failures: int, offset: int) -> None:
    records = []
    for i in range(successes + failures):
        last = step_event(f"c{i}-click-test-{i}-{i}", reward=1.0 if i < successes else -1.0, model_version=version)
        progress = EpisodeProgress()
        progress.add(last)
        row = episode_row(score_episode(last, progress), 0, offset + i)
        records.append(Record("live", 0, offset + i, [row]))
    DeltaSink(settings.tables_dir, EPISODES).write(records)


@pytest.mark.kafka
def test_controller_rolls_back_a_worse_canary_and_promotes_a_good_one(stack):
    settings, config = stack.settings, CanaryConfig(min_episodes=20)
    _version(settings, "sft-0001", "stable")
    _version(settings, "sft-0002", "canary")
    canary_client = ModelVersionWatcher(settings, "edge-canary", channel="canary")
    assert _settle(canary_client).version == "sft-0002"

    _live_episodes(settings, "sft-0001", successes=18, failures=2, offset=0)  # stable 0.9
    _live_episodes(settings, "sft-0002", successes=10, failures=5, offset=100)  # 15 episodes: too few
    assert review_canary(settings, config) is None
    _live_episodes(settings, "sft-0002", successes=0, failures=5, offset=200)  # canary 0.5 over 20
    rollback = review_canary(settings, config)
    assert rollback.decision == "rollback" and rollback.canary_episodes == 20
    assert _settle(canary_client).version == "sft-0001"  # canary clients are back on stable

    _version(settings, "sft-0003", "canary")
    _live_episodes(settings, "sft-0003", successes=19, failures=1, offset=300)
    promote = review_canary(settings, config)
    assert promote.decision == "promote" and promote.canary_version == "sft-0003"
    stable_client = ModelVersionWatcher(settings, "edge-stable", channel="stable")
    assert _settle(stable_client).version == "sft-0003"

    consumer = make_consumer(settings, "decisions", consumer_timeout_ms=2000)
    partition = TopicPartition(topics_for(settings).rollout_decisions.name, 0)
    consumer.assign([partition])
    decisions = [decode_event(r.value, expect=RolloutDecisionEvent).decision for r in consumer]
    assert decisions == ["rollback", "promote"]  # every decision is an event
    for closable in (consumer, canary_client, stable_client):
        closable.close()


def _settle(watcher: ModelVersionWatcher, seconds: float = 3.0):
    """Poll until the topic has been read to its end (small topic: a few polls)."""
    deadline, latest = time.monotonic() + seconds, None
    while time.monotonic() < deadline:
        latest = watcher.poll(timeout_ms=300) or latest
    return latest
