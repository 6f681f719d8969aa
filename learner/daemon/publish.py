"""Publishing a trained model: content-addressed store, signed manifest, ModelVersionEvent.

With a canary stage configured (settings.canary_fraction > 0) every version after the first goes to
the canary channel; flywheel.admin.canary promotes or rolls it back.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec

from core.object_store import Location, PreconditionFailed, join
from core.settings import Settings, get_settings
from registry.signing import load_or_create_key, sign
from registry.store import manifest_locations, store_artifact, write_manifest
from schemas import ModelVersionEvent, encode_event, new_event_id
from streams.kafka_clients import make_producer
from streams.model_versions import latest_by_channel
from streams.topics import topics_for


def claim_version(artifacts_dir: Location, stage: str) -> str:
    """'sft-0003': the stage and a number above every one claimed or published so far, claimed (put only if absent
    at `claims/0003`) before anything is sent. A learner killed after sending a version but before writing its
    manifest, or a second learner publishing at the same moment, can then never give two versions one id."""
    files = get_settings().files()
    taken = [*files.list(join(artifacts_dir, "claims")), *manifest_locations(artifacts_dir)]
    number = max((_number(str(location)) for location in taken), default=0)
    while True:
        number += 1
        try:
            files.write(join(artifacts_dir, "claims", f"{number:04d}"), stage.encode(), if_absent=True)
            return f"{stage}-{number:04d}"
        except PreconditionFailed:
            continue  # claimed meanwhile by another learner: the next one


def _number(location: str) -> int:
    """The number a claim or manifest names ('.../claims/0003', '.../manifests/sft-0003.json' -> 3), 0 if none."""
    digits = location.rsplit("/", 1)[-1].removesuffix(".json").rsplit("-", 1)[-1]
    return int(digits) if digits.isdigit() else 0


def publish_artifact(
    artifact: Path,
    settings: Settings,
    *,
    stage: str,
    parent: str,
    lineage: dict[str, int],
    extra_manifest: dict | None = None,
) -> ModelVersionEvent:
    """Store a model file (a `.vla` bundle) by digest, sign its event, send it, write its manifest."""
    channel = "canary" if settings.canary_fraction > 0 and "stable" in latest_by_channel(settings) else "stable"
    uri, digest = store_artifact(artifact, settings.artifacts_dir)
    event = ModelVersionEvent(
        event_id=new_event_id(),
        produced_at=time.time(),
        version=claim_version(settings.artifacts_dir, stage),
        parent=parent,
        stage=stage,
        artifact_uri=uri,
        sha256=digest,
        channel=channel,
        lineage=lineage,
    )
    event = msgspec.structs.replace(event, signature=sign(event, load_or_create_key(settings.keys_dir)))
    producer = make_producer(settings, "learner")
    try:
        # keyed by channel: the compacted topic keeps the newest version of each channel
        producer.send(topics_for(settings).model_versions.name, key=channel.encode(), value=encode_event(event)).get(30)
    finally:
        producer.close()
    # Only a version the fleet can receive becomes "latest" locally (the next run's parent).
    write_manifest(event, settings.artifacts_dir, extra_manifest)
    return event
