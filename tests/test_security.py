"""Secure by default: a broker of its own with SCRAM over SASL_PLAINTEXT, used through the project's client helpers
and by a real faust worker; a wrong password is refused; the password is in no log; everything binds to loopback."""

from __future__ import annotations

import ipaddress
import logging
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka import TopicPartition
from kafka.errors import KafkaError
from pydantic import SecretStr

from core.processes import wait_until
from core.settings import Settings
from flywheel.run.stack import local_stack
from lake.queries import step_count
from processors.faust_app import auth_options
from schemas import encode_event
from streams.broker import local_broker
from streams.kafka_clients import make_admin, make_consumer, make_producer, security_options
from streams.topics import topics_for
from tests.conftest import isolated_broker_settings
from tests.factories import step_event

SECRET_PART = uuid.uuid4().hex  # what must appear in no log; the password around it exercises the config quoting
PASSWORD = f'Fly"wheel\\{SECRET_PART}é'


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A separate local broker whose client listener requires SCRAM over SASL_PLAINTEXT."""
    settings = isolated_broker_settings(
        tmp_path_factory.mktemp("flywheel-secure"),
        "sec",
        listen_host="127.0.0.1",
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="SCRAM-SHA-256",
        sasl_username="flywheel-test",
        sasl_password=PASSWORD,
    )
    with local_stack(settings, settings.home / "logs", worker=False) as stack:
        yield stack.settings


@pytest.mark.kafka
def test_the_right_credentials_round_trip_a_message(secure):
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):  # the broker knows the user under both
        settings = secure.model_copy(update={"sasl_mechanism": mechanism})
        topic = topics_for(settings).dead_letters.name
        producer = make_producer(settings, "sec-test")
        sent = producer.send(topic, key=mechanism.encode(), value=b"hello over SCRAM", partition=0).get(timeout=30)
        producer.close()
        consumer = make_consumer(settings, "sec-test", consumer_timeout_ms=2000)
        consumer.assign([TopicPartition(topic, 0)])
        consumer.seek(TopicPartition(topic, 0), sent.offset)
        records = wait_until(lambda: list(consumer) or None, 30, what="the message back")  # noqa: B023
        consumer.close()
        assert (records[0].key, records[0].value) == (mechanism.encode(), b"hello over SCRAM")


@pytest.mark.kafka
def test_a_wrong_password_is_refused(secure):
    def refusals() -> int:
        log = (secure.kafka_dir / "broker.log").read_text(errors="replace")
        return log.count("Authentication failed during authentication due to invalid credentials")

    before = refusals()
    wrong = secure.model_copy(update={"sasl_password": SecretStr("not-the-password")})
    # The broker closes the connection on a failed SCRAM exchange, often before kafka-python reads its
    # SaslAuthenticationFailedError: the client sees that or a lost connection, so it cannot bootstrap.
    with pytest.raises(KafkaError):
        make_admin(wrong, "sec-wrong", bootstrap_timeout_ms=5000).close()
    wait_until(lambda: refusals() > before, 10, interval=0.2, what="the broker's 'invalid credentials' line")
    # and no credentials at all: the listener does not fall back to plaintext
    plain = secure.model_copy(update={"security_protocol": "PLAINTEXT"})
    with pytest.raises(KafkaError):
        make_admin(plain, "sec-none", bootstrap_timeout_ms=5000).close()


@pytest.mark.kafka
def test_a_faust_worker_ingests_over_scram(secure, tmp_path):
    events = [step_event(f"s0-click-test-{n}-{n}", step=0, done=True, reward=1.0) for n in range(5)]
    producer = make_producer(secure, "sec-edge")
    for event in events:
        producer.send(topics_for(secure).steps.name, key=event.episode_id.encode(), value=encode_event(event))
    producer.flush()
    producer.close()

    scram_512 = secure.model_copy(update={"sasl_mechanism": "SCRAM-SHA-512"})  # the worker logs in the other way
    with local_stack(scram_512, tmp_path / "logs", data_dir=tmp_path / "data", worker=False) as stack:
        worker, tables = stack.start_worker("--loglevel", "info"), stack.settings.tables_dir

        def landed() -> bool:
            assert worker.running(), f"the faust worker died:\n{worker.tail()}"
            return step_count(tables) >= len(events)

        wait_until(landed, 180, what="steps in Delta over SASL")
        assert step_count(tables) == len(events)
    worker_log = worker.log_path.read_text(errors="replace")
    assert "via SCRAM-SHA-512" in worker_log  # aiokafka's "Authenticated as <user> via <mechanism>"
    assert SECRET_PART not in worker_log


@pytest.mark.kafka
def test_the_password_is_in_no_log_and_not_in_the_settings_text(secure, caplog):
    with caplog.at_level(logging.DEBUG, logger="kafka"):  # kafka-python's admin client logs its whole config
        make_admin(secure, "sec-debug").close()
    assert "Starting KafkaAdminClient" in caplog.text and SECRET_PART not in caplog.text
    broker_log = (secure.kafka_dir / "broker.log").read_text(errors="replace")
    assert "Kafka Server started" in broker_log  # the log is the real one, not empty
    assert SECRET_PART not in broker_log
    for text in (str(secure), repr(secure), secure.model_dump_json(), str(secure.model_dump())):
        assert SECRET_PART not in text
    props = secure.kafka_dir / "server.properties"  # holds the broker's own login: owner only
    assert props.stat().st_mode & 0o077 == 0
    assert SECRET_PART not in (secure.kafka_dir / "scram-users").read_text()


@pytest.mark.kafka
def test_the_broker_listens_on_loopback_only(secure):
    pid = local_broker.node_pids(secure)[1]
    assert pid is not None
    listening = _listening_sockets(pid)
    assert {port for _, port in listening} >= {secure.kafka_port, secure.kafka_port + 1}
    assert all(address in ("127.0.0.1", "::ffff:127.0.0.1", "::1") for address, _ in listening), listening
    assert (
        "listener.security.protocol.map=SASL_PLAINTEXT:SASL_PLAINTEXT"
        in (secure.kafka_dir / "server.properties").read_text()
    )


def test_tls_options_reach_both_client_libraries():
    """SASL_SSL / SSL against an external cluster (no TLS broker here): what kafka-python and faust are given."""
    import certifi
    import faust

    cafile = Path(certifi.where())
    sasl_ssl = Settings(security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512", sasl_username="u",
                        sasl_password=PASSWORD, ssl_cafile=cafile)  # fmt: skip
    assert security_options(sasl_ssl) == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "u",
        "sasl_plain_password": PASSWORD,
        "ssl_cafile": str(cafile),
        "ssl_certfile": None,
        "ssl_keyfile": None,
    }
    credentials = auth_options(sasl_ssl)["broker_credentials"]
    assert isinstance(credentials, faust.SASLCredentials) and credentials.protocol.value == "SASL_SSL"
    assert credentials.mechanism.value == "SCRAM-SHA-512" and credentials.ssl_context is not None
    assert SECRET_PART not in repr(credentials)

    ssl_only = Settings(security_protocol="SSL", ssl_cafile=cafile)
    options = security_options(ssl_only)
    assert options["security_protocol"] == "SSL" and "sasl_mechanism" not in options
    assert isinstance(auth_options(ssl_only)["broker_credentials"], faust.SSLCredentials)
    assert auth_options(Settings(security_protocol="PLAINTEXT")) == {}


def test_sasl_without_credentials_is_refused_without_echoing_the_input():
    with pytest.raises(ValueError, match="FLYWHEEL_SASL_USERNAME") as error:
        Settings(security_protocol="SASL_PLAINTEXT", sasl_password=PASSWORD)
    assert SECRET_PART not in str(error.value)


def _listening_sockets(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that process pid holds, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state == "0A" and inode in inodes:  # 0A: TCP_LISTEN
                address, port = local.split(":")
                found.append((_proc_address(address), int(port, 16)))
    return found


def _proc_address(hex_address: str) -> str:
    """/proc/net/tcp{,6} addresses: 32-bit words in host (little-endian) order."""
    words = [bytes.fromhex(hex_address[i : i + 8])[::-1] for i in range(0, len(hex_address), 8)]
    raw = b"".join(words)
    if len(raw) == 4:
        return ".".join(str(b) for b in raw)
    if raw[:12] == b"\0" * 10 + b"\xff\xff":
        return "::ffff:" + ".".join(str(b) for b in raw[12:])
    return str(ipaddress.IPv6Address(raw))
