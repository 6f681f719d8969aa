"""Closing the loop: versions arrive over Kafka, are checked, and swapped in (or refused)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass

import pytest

from edge_client.model_updates import ModelSwapper, ModelVersionWatcher
from flywheel.kafka_clients import make_producer
from flywheel.registry import store_artifact
from schemas import ModelVersionEvent, encode_event, new_event_id
from streams.broker import ensure_topics
from streams.topics import topics_for

pytestmark = pytest.mark.kafka


@dataclass
class LoadedModel:
    """Stands in for OnnxPolicy: the swapper calls load(path, version)."""

    path: str
    version: str


def publish(settings, version: str, uri: str, sha256: str) -> None:
    event = ModelVersionEvent(new_event_id(), time.time(), version, "", "sft", uri, sha256)
    producer = make_producer(settings, "test-learner")
    producer.send(topics_for(settings).model_versions.name, key=b"stable", value=encode_event(event)).get(30)
    producer.close()


def test_client_swaps_verified_versions_and_refuses_a_bad_checksum(kafka_settings, tmp_path):
    settings = kafka_settings.model_copy(update={"topic_prefix": f"swap-{uuid.uuid4().hex[:8]}"})
    ensure_topics(settings)
    artifacts = tmp_path / "artifacts"
    (tmp_path / "a.onnx").write_bytes(b"model A")
    (tmp_path / "c.onnx").write_bytes(b"model C")
    uri_a, sha_a = store_artifact(tmp_path / "a.onnx", artifacts)
    uri_c, sha_c = store_artifact(tmp_path / "c.onnx", artifacts)

    swapper = ModelSwapper(ModelVersionWatcher(settings, "edge-test"), LoadedModel)
    assert swapper.maybe_swap(timeout_ms=500) is None  # nothing published yet

    publish(settings, "sft-0001", uri_a, sha_a)
    current = _poll_until(swapper, lambda p: p is not None)
    assert current.version == "sft-0001" and open(current.path, "rb").read() == b"model A"

    publish(settings, "sft-0002", uri_c, sha_a)  # the digest does not match the file: refused
    _poll_until(swapper, lambda p: "sft-0002" in swapper.rejected)
    assert swapper.current.version == "sft-0001"  # the fleet keeps the previous model

    publish(settings, "sft-0003", uri_c, sha_c)
    assert _poll_until(swapper, lambda p: p.version == "sft-0003").path.endswith(f"{sha_c}.onnx")
    swapper.watcher.close()


def _poll_until(swapper: ModelSwapper, done, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        policy = swapper.maybe_swap(timeout_ms=500)
        if done(policy):
            return policy
    raise TimeoutError("model swap condition not reached")
