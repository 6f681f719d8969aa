"""The faust app and its topic handles, built from Settings (the edge client never imports this)."""

from __future__ import annotations

from typing import Any

import faust

from core.settings import Settings
from processors import faust_transport
from streams.kafka_clients import DEAD_LETTER_MAX_BYTES, hide_secret_in_logs, ssl_context
from streams.topics import topics_for


def broker_url(bootstrap: str, scheme: str = "kafka") -> str:
    """'h1:9092,h2:9092' -> 'kafka://h1:9092;kafka://h2:9092' (faust's multi-broker form)."""
    return ";".join(f"{scheme}://{server.strip()}" for server in bootstrap.split(",") if server.strip())


def auth_options(settings: Settings) -> dict[str, Any]:
    """faust.App keyword arguments for settings.security_protocol: the same security as streams.kafka_clients."""
    context = ssl_context(settings)
    if settings.uses_sasl:
        hide_secret_in_logs(settings)
        # faust turns SASLCredentials into aiokafka's security_protocol SASL_PLAINTEXT, or SASL_SSL when given a
        # context; its repr shows the username only.
        credentials = faust.SASLCredentials(
            username=settings.sasl_username,
            password=settings.sasl_password.get_secret_value(),
            mechanism=settings.sasl_mechanism,
            ssl_context=context,
        )
        return {"broker_credentials": credentials}
    if context is not None:
        return {"broker_credentials": faust.SSLCredentials(context)}
    return {}


def make_app(settings: Settings, app_id: str = "flywheel-processors") -> faust.App:
    datadir = settings.home / "faust" / settings.topic_prefix
    datadir.mkdir(parents=True, exist_ok=True)  # faust creates only the last level
    return faust.App(
        f"{settings.topic_prefix}-{app_id}",
        broker=broker_url(settings.bootstrap),
        broker_consumer=broker_url(settings.bootstrap, faust_transport.SCHEME),
        value_serializer="raw",
        key_serializer="raw",
        store="memory://",  # state is rebuilt from its changelog topic on start
        # faust's own topics (its leader-assignor topic) as replicated as ours: a lost node must not take them along.
        topic_replication_factor=settings.replication_factor,
        topic_partitions=settings.topic_partitions,
        web_enabled=False,  # /metrics is served by prometheus_client instead
        producer_acks=-1,
        producer_max_request_size=DEAD_LETTER_MAX_BYTES,  # the largest record a worker sends: a dead letter
        broker_commit_every=200,
        broker_commit_interval=1.0,
        # A dead worker's partitions move after the session timeout (faust's default 60 s would stall
        # them, the dead worker's own restart included, for a minute).
        broker_session_timeout=10.0,
        broker_heartbeat_interval=1.0,
        consumer_auto_offset_reset="earliest",
        # Up to ~6,000 screenshot-sized steps per partition and fetch instead of faust's 4 MB (~750): fewer
        # fetch rounds, each paying a round trip and at times the fetch wait (processors.faust_transport);
        # measured +8% steps/s draining a backlog.
        consumer_max_fetch_size=32 * 1024 * 1024,
        # Our sinks ack only after the Delta commit; unacked events on shutdown are simply redelivered, so
        # waiting for them (faust's default) only delays a stop by the whole shutdown timeout.
        stream_wait_empty=False,
        datadir=str(datadir),
        **auth_options(settings),
    )


def app_topics(app: faust.App, settings: Settings) -> dict[str, faust.TopicT]:
    """faust handles for every flywheel topic (created beforehand by streams.topic_admin.ensure_topics)."""
    specs = topics_for(settings)
    return {
        name: app.topic(spec.name, partitions=spec.partitions, value_serializer="raw", key_serializer="raw")
        for name, spec in (
            ("steps", specs.steps),
            ("episodes", specs.episodes),
            ("model_versions", specs.model_versions),
            ("dead_letters", specs.dead_letters),
        )
    }
