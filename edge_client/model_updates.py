"""Model versions arrive over the compacted model-versions topic; a client verifies the artifact
and swaps it in only at an episode boundary, keeping the old model on any failure."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from kafka import TopicPartition

from core.settings import Settings
from edge_client import metrics
from policy.interface import Policy
from registry.signing import TrustedKeys
from registry.store import ModelRejected, fetch_verified
from schemas import EventDecodeError, ModelVersionEvent, decode_event
from streams.kafka_clients import make_consumer
from streams.topics import topics_for

log = logging.getLogger(__name__)
RETRY_AFTER_S = 10.0  # a transient refusal (artifact or key not there yet) is retried after this


class ModelVersionWatcher:
    """Tracks the newest ModelVersionEvent of each channel (the topic is compacted by channel).

    A canary client runs the canary channel's version when there is one, else stable's; a stable
    client runs stable's only.
    """

    def __init__(self, settings: Settings, client_id: str, channel: str = "stable"):
        self.channel = channel
        self.by_channel: dict[str, ModelVersionEvent] = {}
        self._consumer = make_consumer(settings, f"{client_id}-models", consumer_timeout_ms=200)
        partition = TopicPartition(topics_for(settings).model_versions.name, 0)
        self._consumer.assign([partition])
        self._consumer.seek_to_beginning(partition)

    def poll(self, timeout_ms: int = 0) -> ModelVersionEvent | None:
        """Read what has arrived; return the version this client should run now."""
        batches = self._consumer.poll(timeout_ms=timeout_ms)
        for records in batches.values():
            for record in records:
                try:
                    event = decode_event(record.value, expect=ModelVersionEvent)
                except EventDecodeError as error:
                    log.warning("ignoring malformed model version event at offset %d: %s", record.offset, error)
                    continue
                self.by_channel[event.channel] = event
        if self.channel == "canary" and "canary" in self.by_channel:
            return self.by_channel["canary"]
        return self.by_channel.get("stable")

    def close(self) -> None:
        self._consumer.close()


class ModelSwapper:
    """Holds the policy in use; `maybe_swap` is called between episodes."""

    def __init__(
        self,
        watcher: ModelVersionWatcher,
        load: Callable[[str, str], Policy],
        trusted_dir: Path | None,
        current: Policy | None = None,
    ):
        self.watcher = watcher
        self.load = load  # (local artifact path, version) -> Policy
        self.trusted_dir = trusted_dir  # None: accept unsigned models (settings.require_signed_models off)
        self.current = current
        self.rejected: set[str] = set()
        self.retry_at: dict[str, float] = {}

    def maybe_swap(self, timeout_ms: int = 0) -> Policy | None:
        latest = self.watcher.poll(timeout_ms)
        if latest is None or latest.version in self.rejected:
            return self.current
        if time.monotonic() < self.retry_at.get(latest.version, 0.0):
            return self.current  # the artifact or its key may appear later: try again after a pause
        if self.current is not None and latest.version == self.current.version:
            return self.current
        try:
            if self.trusted_dir is not None:
                TrustedKeys(self.trusted_dir).verify(latest)  # read anew: keys may be added while running
            path = fetch_verified(latest.artifact_uri, latest.sha256)
            policy = self.load(str(path), latest.version)
        except (ModelRejected, OSError, RuntimeError, ValueError) as error:  # ValueError: a manifest's odd URI
            log.error("refusing model %s, keeping %s: %s", latest.version, self._current_version(), error)
            metrics.MODEL_SWAPS.labels("rejected").inc()
            if getattr(error, "permanent", not isinstance(error, OSError)):
                self.rejected.add(latest.version)  # a bad checksum or signature never gets better
            else:
                self.retry_at[latest.version] = time.monotonic() + RETRY_AFTER_S
            return self.current
        log.warning("model %s -> %s", self._current_version(), latest.version)
        if self.current is not None:
            metrics.MODEL_VERSION.labels(self.current.version).set(0)
        metrics.MODEL_VERSION.labels(latest.version).set(1)
        metrics.MODEL_SWAPS.labels("swapped").inc()
        self.current = policy
        return policy

    def _current_version(self) -> str:
        return self.current.version if self.current is not None else "none"
