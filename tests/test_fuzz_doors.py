"""Every door fuzzed: what a client loads (a model bundle, its manifest, its signature) is refused with an
error naming what was wrong, or loads as the model it was, and a client keeps the model it runs.

The event decoder's fuzzing lives in test_poison_pills; the settings and CLI in test_cli_config; the Delta readers
in test_delta_schema."""

from __future__ import annotations

import base64
import json
import time
import zipfile
from pathlib import Path

import msgspec
import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from edge_client.model_updates import ModelSwapper
from policy.bundle import REQUIRED, BundleError, read_bundle, read_members, write_bundle
from policy.runtime import VLARuntime, load_policy
from registry.signing import TrustedKeys, load_or_create_key, sign
from registry.store import (
    ModelRejected,
    fetch_verified,
    read_manifest,
    read_manifests,
    resolve_model,
    store_artifact,
    write_manifest,
)
from schemas import ModelVersionEvent, new_event_id

BUNDLE = Path(__file__).resolve().parents[1] / "release" / "model-int8.vla"  # the committed release, 3 MB
SCREEN = np.random.default_rng(0).integers(0, 255, (210, 160, 3), dtype=np.uint8)


def decide(path: Path) -> list[int]:
    """The tokens a bundle generates greedily on a fixed screen: the model's behaviour, to compare by."""
    return VLARuntime(path).step(SCREEN, "click the button", None)[0].ids


@pytest.fixture(scope="module")
def original() -> list[int]:
    return decide(BUNDLE)


def test_truncated_and_bit_flipped_bundles_are_refused_or_load_as_the_same_model(tmp_path, original):
    """Any cut of the file is refused; a flipped byte is refused (CRC, header, graph) or, where it lands on bytes
    nothing reads (a timestamp), loads as the model it was. Never another exception, never a different model."""
    data, rng = BUNDLE.read_bytes(), np.random.default_rng(33)
    refused = 0
    for trial, cut in enumerate(rng.integers(1, len(data), 8)):
        path = tmp_path / f"cut-{trial}.vla"
        path.write_bytes(data[:cut])
        with pytest.raises(BundleError, match=str(path)):
            read_bundle(path)
    for trial, offset in enumerate(rng.integers(0, len(data), 12)):
        flipped = bytearray(data)
        flipped[offset] ^= 1 << int(rng.integers(8))
        path = tmp_path / f"flip-{trial}.vla"
        path.write_bytes(bytes(flipped))
        try:
            tokens = decide(path)
        except BundleError:
            refused += 1
            continue
        assert tokens == original, f"a flip at byte {offset} loaded as another model"
    assert refused >= 8  # nearly every byte of a bundle is compressed data under a CRC


@pytest.mark.parametrize("member", REQUIRED)
@pytest.mark.parametrize("damage", ["junk", "half", "missing"])
def test_a_damaged_member_is_refused_naming_the_bundle(tmp_path, member, damage):
    """Members that are each a valid zip entry but not what the loader needs: the loader refuses them, whatever
    part of the runtime would have failed (json, numpy, the tokenizer, onnxruntime, the dry-run step)."""
    members = read_members(BUNDLE)
    if damage == "missing":
        del members[member]
    elif damage == "half":
        members[member] = members[member][: len(members[member]) // 2]
    else:
        members[member] = np.random.default_rng(len(member)).bytes(len(members[member]))
    path = tmp_path / "damaged.vla"
    with zipfile.ZipFile(path, "w") as zf:  # not write_bundle: it refuses to write a bundle that lacks a member
        for name, data in members.items():
            zf.writestr(name, data)
    with pytest.raises(BundleError, match="damaged.vla"):
        load_policy(path, "damaged")


@pytest.mark.parametrize(
    "meta",
    [
        [],
        {"format": "flywheel-vla/3"},
        {"format": "flywheel-vla/2", "model_config": {}, "pruning": {}},
        {"format": "flywheel-vla/3", "model_config": {"patch_px": "ten"}, "pruning": {"keep_ratio": 0.5}},
        {"format": "flywheel-vla/3", "model_config": "x", "pruning": {}},
    ],
)
def test_an_altered_manifest_inside_the_bundle_is_refused(tmp_path, meta):
    members = read_members(BUNDLE)
    base = json.loads(members["vla.json"])
    if isinstance(meta, dict) and meta.get("model_config") == {"patch_px": "ten"}:
        meta = {**base, "model_config": {**base["model_config"], "patch_px": "ten"}}
    members["vla.json"] = json.dumps(meta).encode()
    with pytest.raises(BundleError):
        load_policy(write_bundle(tmp_path / "meta.vla", members), "meta")


def test_oversized_bundles_are_refused_before_they_are_inflated(tmp_path):
    """A zip bomb (64 MB of zeros in a 64 kB file) and a file over the bound: refused from the sizes the file
    declares, before any member is inflated."""
    members = read_members(BUNDLE)
    members["padding.bin"] = bytes(64 * 1024 * 1024)
    bomb = write_bundle(tmp_path / "bomb.vla", members)
    assert bomb.stat().st_size < 8 * 1024 * 1024
    with pytest.raises(BundleError, match="inflate to"):
        read_bundle(bomb, max_bytes=32 * 1024 * 1024)
    with pytest.raises(BundleError, match="over the"):
        read_bundle(BUNDLE, max_bytes=1024 * 1024)
    many = {**read_members(BUNDLE), **{f"extra-{i}": b"" for i in range(100)}}
    with pytest.raises(BundleError, match="members"):
        read_bundle(write_bundle(tmp_path / "many.vla", many))


class Versions:
    """The watcher's part, without Kafka: the newest version event, replaced by the test."""

    def __init__(self):
        self.latest: ModelVersionEvent | None = None

    def poll(self, timeout_ms: int = 0) -> ModelVersionEvent | None:
        return self.latest


def version_event(path: Path, version: str, artifacts: Path) -> ModelVersionEvent:
    uri, sha256 = store_artifact(path, artifacts)
    return ModelVersionEvent(new_event_id(), time.time(), version, "", "sft", uri, sha256)


def test_a_client_keeps_its_model_when_a_correctly_addressed_bundle_is_broken(tmp_path):
    """The digest matches (the learner itself published junk, or a signing key leaked): the loader is the last
    door, and the swapper keeps the running model and never retries that version."""
    artifacts, versions = tmp_path / "artifacts", Versions()
    swapper = ModelSwapper(versions, load_policy, trusted_dir=None)
    versions.latest = version_event(BUNDLE, "good-0001", artifacts)
    assert swapper.maybe_swap().version == "good-0001"
    members = read_members(BUNDLE)
    members["decode.onnx"] = members["decode.onnx"][:1000]
    broken = write_bundle(tmp_path / "broken.vla", members)
    versions.latest = version_event(broken, "broken-0002", artifacts)
    assert swapper.maybe_swap().version == "good-0001"
    assert "broken-0002" in swapper.rejected
    oversized = tmp_path / "big.vla"
    oversized.write_bytes(BUNDLE.read_bytes() + bytes(1024))  # a zip with trailing bytes: still one, but too big
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FLYWHEEL_MAX_MODEL_BYTES", str(BUNDLE.stat().st_size))
        from core.settings import get_settings

        get_settings.cache_clear()
        try:
            versions.latest = version_event(oversized, "big-0003", artifacts)
            assert swapper.maybe_swap().version == "good-0001"
            with pytest.raises(ModelRejected, match="max_model_bytes"):
                fetch_verified(versions.latest.artifact_uri, versions.latest.sha256)
        finally:
            get_settings.cache_clear()
    assert swapper.rejected == {"broken-0002", "big-0003"}


def test_store_manifests_that_are_not_manifests_are_refused_by_name_and_hide_only_themselves(tmp_path, monkeypatch):
    artifacts = tmp_path / "artifacts"
    good = version_event(BUNDLE, "sft-0001", artifacts)
    write_manifest(good, artifacts)
    manifests = artifacts / "manifests"
    bad = {
        "cut-0002": json.dumps({"version": "cut-0002", "artifact_uri": "x"})[:20].encode(),
        "binary-0003": bytes(range(256)),
        "list-0004": b"[1, 2]",
        "fields-0005": json.dumps({"version": "fields-0005", "sha256": ["a"], "produced_at": 1.0}).encode(),
        "huge-0006": b'{"version": "' + b"x" * (2 * 1024 * 1024) + b'"}',
    }
    for version, data in bad.items():
        (manifests / f"{version}.json").write_bytes(data)
    for version in bad:
        with pytest.raises(ValueError, match=version):
            read_manifest(artifacts, version)
    assert [m["version"] for m in read_manifests(artifacts)] == ["sft-0001"]
    assert resolve_model("latest", artifacts)[1] == "sft-0001"
    with pytest.raises(ValueError):
        read_manifests(artifacts, skip_unreadable=False)  # what maintenance reads: no partial view


def signature_bytes(event: ModelVersionEvent) -> bytes:
    return base64.b64decode(event.signature.rsplit(":", 1)[1])


def test_any_change_to_a_signed_version_event_is_refused_as_a_model_rejection(tmp_path):
    """Mutate each signed field, and the signature text itself, at random: ModelRejected every time, never
    another exception (a malformed base64, a key id of odd characters)."""
    key = load_or_create_key(tmp_path / "keys")
    trusted = TrustedKeys(tmp_path / "keys" / "trusted")
    event = ModelVersionEvent(new_event_id(), 1.0, "sft-0001", "", "sft", "file:///m.vla", "ab" * 32, lineage={"s": 1})
    event = msgspec.structs.replace(event, signature=sign(event, key))
    trusted.verify(event)
    rng = np.random.default_rng(7)
    changes = [
        {"version": "sft-0002"}, {"parent": "x"}, {"stage": "online_rl"}, {"artifact_uri": "file:///other.vla"},
        {"sha256": "cd" * 32}, {"lineage": {"s": 2}}, {"signature": ""},
        {"signature": sign(event, Ed25519PrivateKey.generate())},
    ]  # fmt: skip
    for _ in range(30):
        text = bytearray(event.signature.encode())
        for _ in range(int(rng.integers(1, 4))):
            text[int(rng.integers(len(text)))] = int(rng.integers(32, 127))
        changes.append({"signature": text.decode()})
    changes.append({"signature": event.signature[: len(event.signature) // 2]})
    refused = 0
    for change in changes:
        changed = msgspec.structs.replace(event, **change)
        try:
            trusted.verify(changed)
        except ModelRejected:
            refused += 1
            continue
        # Accepted: only where the mutation changed nothing signed (base64's padding bits, a character it skips).
        assert msgspec.structs.replace(changed, signature="") == msgspec.structs.replace(event, signature="")
        assert signature_bytes(changed) == signature_bytes(event)
    assert refused >= 30
