"""kafka-python producers/consumers configured one way for the whole project (edge clients,
learner, demo): idempotent, acks=all, bounded request size."""

from __future__ import annotations

from kafka import KafkaConsumer, KafkaProducer

from flywheel.settings import Settings

MAX_REQUEST_BYTES = 2 * 1024 * 1024  # the topics allow 2 MiB messages (streams.topics)


def make_producer(settings: Settings, client_id: str) -> KafkaProducer:
    return KafkaProducer(
        bootstrap_servers=settings.bootstrap.split(","),
        client_id=client_id,
        acks="all",
        enable_idempotence=True,  # a retried send is not written twice
        linger_ms=5,
        max_request_size=MAX_REQUEST_BYTES,
        retries=2**31 - 1,
        delivery_timeout_ms=120_000,
    )


def make_consumer(settings: Settings, client_id: str, **overrides) -> KafkaConsumer:
    """A consumer with no group (partitions are assigned by the caller)."""
    return KafkaConsumer(
        bootstrap_servers=settings.bootstrap.split(","),
        client_id=client_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        consumer_timeout_ms=overrides.pop("consumer_timeout_ms", 1000),
        **overrides,
    )
