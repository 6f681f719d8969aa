"""Closing the loop: versions arrive over Kafka, are checked, and swapped in (or refused)."""

from __future__ import annotations

import time
from dataclasses import dataclass

import msgspec
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edge_client.model_updates import ModelSwapper, ModelVersionWatcher
from registry.signing import TrustedKeys, load_or_create_key, sign
from registry.store import ModelRejected, store_artifact
from schemas import ModelVersionEvent, encode_event, new_event_id
from streams.kafka_clients import make_producer
from streams.topics import topics_for

pytestmark = pytest.mark.kafka


@dataclass
class LoadedModel:
    """Stands in for OnnxPolicy: the swapper calls load(path, version)."""

    path: str
    version: str


def publish(settings, version: str, uri: str, sha256: str, key=None, tamper: bool = False) -> None:
    event = ModelVersionEvent(new_event_id(), time.time(), version, "", "sft", uri, sha256)
    if key is not None:
        event = msgspec.structs.replace(event, signature=sign(event, key))
    if tamper:  # e.g. a manifest edited after signing to point at another artifact
        event = msgspec.structs.replace(event, lineage={"steps": 999})
    producer = make_producer(settings, "test-learner")
    producer.send(topics_for(settings).model_versions.name, key=b"stable", value=encode_event(event)).get(30)
    producer.close()


def test_client_swaps_verified_versions_and_refuses_untrusted_ones(stack, tmp_path):
    settings = stack.settings
    learner_key = load_or_create_key(tmp_path / "keys")  # also trusts its own public half
    stranger_key = Ed25519PrivateKey.generate()
    artifacts = tmp_path / "artifacts"
    (tmp_path / "a.onnx").write_bytes(b"model A")
    (tmp_path / "c.onnx").write_bytes(b"model C")
    uri_a, sha_a = store_artifact(tmp_path / "a.onnx", artifacts)
    uri_c, sha_c = store_artifact(tmp_path / "c.onnx", artifacts)

    swapper = ModelSwapper(ModelVersionWatcher(settings, "edge-test"), LoadedModel, tmp_path / "keys" / "trusted")
    assert swapper.maybe_swap(timeout_ms=500) is None  # nothing published yet

    publish(settings, "sft-0001", uri_a, sha_a, learner_key)
    current = _poll_until(swapper, lambda p: p is not None)
    assert current.version == "sft-0001" and open(current.path, "rb").read() == b"model A"

    refused = {
        "sft-0002": dict(uri=uri_c, sha256=sha_a, key=learner_key),  # digest does not match the file
        "sft-0003": dict(uri=uri_c, sha256=sha_c, key=None),  # unsigned
        "sft-0004": dict(uri=uri_c, sha256=sha_c, key=stranger_key),  # unknown key (retried later, not loaded)
        "sft-0005": dict(uri=uri_c, sha256=sha_c, key=learner_key, tamper=True),  # bad signature
    }
    for version, how in refused.items():
        publish(settings, version, **how)
        _poll_until(swapper, lambda p, v=version: v in swapper.rejected or v in swapper.retry_at)
        assert swapper.current.version == "sft-0001", version  # the fleet keeps the previous model

    assert {"sft-0002", "sft-0003", "sft-0005"} <= swapper.rejected  # bad checksum, unsigned, bad signature
    assert "sft-0004" in swapper.retry_at and "sft-0004" not in swapper.rejected  # its key may be trusted later

    publish(settings, "sft-0006", uri_c, sha_c, learner_key)
    assert _poll_until(swapper, lambda p: p.version == "sft-0006").path.endswith(f"{sha_c}.onnx")
    swapper.watcher.close()


def test_rejections_say_why(tmp_path):
    key = load_or_create_key(tmp_path / "keys")
    trusted = TrustedKeys(tmp_path / "keys" / "trusted")
    event = ModelVersionEvent(new_event_id(), 1.0, "sft-0009", "", "sft", "file:///m.onnx", "ab" * 32)
    with pytest.raises(ModelRejected, match="unsigned"):
        trusted.verify(event)
    with pytest.raises(ModelRejected, match="unknown key"):
        trusted.verify(msgspec.structs.replace(event, signature=sign(event, Ed25519PrivateKey.generate())))
    signed = msgspec.structs.replace(event, signature=sign(event, key))
    trusted.verify(signed)
    trusted.verify(msgspec.structs.replace(signed, channel="canary"))  # the channel is not signed
    with pytest.raises(ModelRejected, match="bad signature"):
        trusted.verify(msgspec.structs.replace(signed, sha256="cd" * 32))


def test_a_manifest_whose_uri_does_not_parse_is_refused_and_the_client_goes_on():
    """A version that passes decoding but trips the fetch (urlparse's ValueError) is refused, not raised: the topic is
    compacted and read from its start, so a raise would stop the client at every start."""

    class Watcher:
        def poll(self, timeout_ms: int = 0) -> ModelVersionEvent:
            return ModelVersionEvent(new_event_id(), 1.0, "sft-0010", "", "sft", "file://[::1/m.vla", "ab" * 32)

    swapper = ModelSwapper(Watcher(), lambda path, version: pytest.fail("nothing to load"), trusted_dir=None)
    assert swapper.maybe_swap() is None and swapper.rejected == {"sft-0010"}


def _poll_until(swapper: ModelSwapper, done, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        policy = swapper.maybe_swap(timeout_ms=500)
        if done(policy):
            return policy
    raise TimeoutError("model swap condition not reached")
