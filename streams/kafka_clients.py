"""kafka-python producers/consumers/admin clients configured one way for the whole project (edge clients,
learner, demo, broker control): idempotent, acks=all, bounded request size, and the security settings
(SASL / TLS) of `Settings`. Every kafka-python client is made here; the faust worker gets the same security
from `processors.faust_app.auth_options`, which uses `ssl_context` below."""

from __future__ import annotations

import logging
import ssl
from typing import Any

from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer

from core.settings import Settings
from streams.broker.tls import local_cafile

MAX_REQUEST_BYTES = 2 * 1024 * 1024  # the topics allow 2 MiB messages (streams.topics)
# A dead letter is the original bytes (anything the steps topic took, up to 2 MiB) plus its reason in headers: its
# topic and the workers' producer allow that much more, or a large poison event could not be dead-lettered and
# would stop every worker that meets it (found by `flywheel chaos`).
DEAD_LETTER_MAX_BYTES = MAX_REQUEST_BYTES + 64 * 1024


# Client loggers that print the password at DEBUG: kafka-python's admin client logs its whole configuration,
# its connection and parser log SASL/PLAIN's auth bytes (user and password in the clear); aiokafka's too.
_LOGGERS_THAT_SEE_SECRETS = ("kafka.admin.client", "kafka.net.connection", "kafka.protocol.parser", "aiokafka.conn")


class _RedactSecret(logging.Filter):
    def __init__(self, secret: str):
        super().__init__()
        self.forms = {secret, repr(secret)[1:-1], repr(secret.encode())[2:-1]}

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if any(form in message for form in self.forms):
            for form in self.forms:
                message = message.replace(form, "**********")
            record.msg, record.args = message, None
        return True


_redacted: set[str] = set()


def hide_secret_in_logs(settings: Settings) -> None:
    """Mask the SASL password in what the Kafka client libraries log (at DEBUG), once per password."""
    secret = settings.sasl_password.get_secret_value()
    if secret and secret not in _redacted:
        _redacted.add(secret)
        for name in _LOGGERS_THAT_SEE_SECRETS:
            logging.getLogger(name).addFilter(_RedactSecret(secret))


def sasl_options(settings: Settings) -> dict[str, Any]:
    """SASL keyword arguments, the same for kafka-python and aiokafka ({} without SASL; the password goes only here)."""
    if not settings.uses_sasl:
        return {}
    hide_secret_in_logs(settings)
    return {
        "sasl_mechanism": settings.sasl_mechanism,
        "sasl_plain_username": settings.sasl_username,
        "sasl_plain_password": settings.sasl_password.get_secret_value(),
    }


def security_options(settings: Settings) -> dict[str, Any]:
    """kafka-python keyword arguments for settings.security_protocol."""
    options: dict[str, Any] = {"security_protocol": settings.security_protocol, **sasl_options(settings)}
    if settings.uses_ssl:
        options |= {
            "ssl_cafile": _str_or_none(local_cafile(settings)),
            "ssl_certfile": _str_or_none(settings.ssl_certfile),
            "ssl_keyfile": _str_or_none(settings.ssl_keyfile),
        }
    return options


def ssl_context(settings: Settings) -> ssl.SSLContext | None:
    """The TLS context for SSL / SASL_SSL (server verified against ssl_cafile, or the system CAs), else None."""
    if not settings.uses_ssl:
        return None
    context = ssl.create_default_context(cafile=_str_or_none(local_cafile(settings)))
    if settings.ssl_certfile is not None:
        context.load_cert_chain(str(settings.ssl_certfile), _str_or_none(settings.ssl_keyfile))
    return context


def make_producer(settings: Settings, client_id: str) -> KafkaProducer:
    return KafkaProducer(
        bootstrap_servers=settings.bootstrap.split(","),
        client_id=client_id,
        acks="all",
        enable_idempotence=True,  # a retried send is not written twice
        linger_ms=5,
        max_request_size=MAX_REQUEST_BYTES,
        retries=2**31 - 1,
        delivery_timeout_ms=600_000,  # a broker restart, a leader change or a short outage is retried, idempotently
        reconnect_backoff_max_ms=5_000,  # notice a returning broker within seconds
        **security_options(settings),
    )


def make_consumer(settings: Settings, client_id: str, **overrides) -> KafkaConsumer:
    """A consumer with no group (partitions are assigned by the caller)."""
    return KafkaConsumer(
        bootstrap_servers=settings.bootstrap.split(","),
        client_id=client_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        consumer_timeout_ms=overrides.pop("consumer_timeout_ms", 1000),
        **(security_options(settings) | overrides),
    )


def make_admin(settings: Settings, client_id: str, **overrides) -> KafkaAdminClient:
    return KafkaAdminClient(
        bootstrap_servers=settings.bootstrap.split(","),
        client_id=client_id,
        **(security_options(settings) | overrides),
    )


def _str_or_none(path) -> str | None:
    return None if path is None else str(path)
