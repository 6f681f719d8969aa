"""Least privilege on the broker: the local cluster over SASL_SSL (its own CA, TLS 1.2+, SCRAM), each
process logged in as its role; every operation a role does not need is refused for every role, and the ones it
needs work. The whole flywheel over SASL_SSL, each process as its role: tests/test_continuous.py."""

from __future__ import annotations

import socket
import ssl
import uuid
from collections.abc import Callable, Iterator

import pytest
from kafka import TopicPartition
from kafka.admin import ACL, ACLOperation, ACLPermissionType, ACLResourcePatternType, NewTopic, ResourcePattern
from kafka.admin import ResourceType as Resource
from kafka.errors import KafkaError

from core.settings import Settings
from flywheel.chaos.proxy import Proxy
from flywheel.run.stack import local_stack
from streams.broker.roles import ROLES, role_settings, role_user
from streams.broker.tls import local_cafile, tls_dir
from streams.kafka_clients import make_admin, make_consumer, make_producer
from streams.topics import topics_for
from tests.conftest import isolated_broker_settings

pytestmark = pytest.mark.kafka


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    settings = isolated_broker_settings(
        tmp_path_factory.mktemp("flywheel-tls"), "tls", security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512", sasl_username="flywheel-admin", sasl_password=uuid.uuid4().hex,
        kafka_edge_listeners=1,  # an edge client's own listener, behind a proxy (flywheel.chaos.proxy)
    )  # fmt: skip
    with local_stack(settings, settings.home / "logs", worker=False) as stack:
        yield stack.settings


def produce(settings: Settings, topic: str) -> None:
    producer = make_producer(settings, f"lp-{uuid.uuid4().hex[:6]}")
    try:
        producer.send(topic, key=b"k", value=b"v", partition=0).get(timeout=20)
    finally:
        producer.close(timeout=5)


def consume(settings: Settings, topic: str) -> None:
    consumer = make_consumer(settings, f"lp-{uuid.uuid4().hex[:6]}", consumer_timeout_ms=500)
    try:
        partition = TopicPartition(topic, 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        consumer.poll(timeout_ms=3000)
        consumer.position(partition)
    finally:
        consumer.close()


def admin_call(settings: Settings, call: Callable) -> None:
    admin = make_admin(settings, f"lp-{uuid.uuid4().hex[:6]}", request_timeout_ms=20_000)
    try:
        result = call(admin)
    finally:
        admin.close()
    failed = result.get("failed") if isinstance(result, dict) else None
    codes = [t.get("error_code") for t in result.get("topics", [])] if isinstance(result, dict) else []
    if failed or any(codes):
        raise PermissionError(f"refused: {failed or codes}")


def forbidden(settings: Settings) -> dict[str, Callable[[Settings], None]]:
    """Operation name -> the operation, for everything any role might try."""
    t = topics_for(settings)
    grant_all = ACL("User:intruder", "*", ACLOperation.ALL, ACLPermissionType.ALLOW,
                    ResourcePattern(Resource.TOPIC, t.steps.name, ACLResourcePatternType.LITERAL))  # fmt: skip
    return {
        "write steps": lambda s: produce(s, t.steps.name),
        "read steps": lambda s: consume(s, t.steps.name),
        "write episodes": lambda s: produce(s, t.episodes.name),
        "read episodes": lambda s: consume(s, t.episodes.name),
        "write dead letters": lambda s: produce(s, t.dead_letters.name),
        "read dead letters": lambda s: consume(s, t.dead_letters.name),
        "write model versions": lambda s: produce(s, t.model_versions.name),
        "read model versions": lambda s: consume(s, t.model_versions.name),
        "write rollout decisions": lambda s: produce(s, t.rollout_decisions.name),
        "create a topic": lambda s: admin_call(
            s, lambda a: a.create_topics([NewTopic(f"{settings.topic_prefix}.extra", 1, 1)], raise_errors=False)
        ),
        "delete the steps topic": lambda s: admin_call(s, lambda a: a.delete_topics([t.steps.name])),
        "grant itself an ACL": lambda s: admin_call(s, lambda a: a.create_acls([grant_all])),
    }


ALLOWED = {
    "edge": {"write steps", "read model versions"},
    "worker": {"read steps", "write episodes", "read episodes", "write dead letters", "read model versions"},
    "learner": {"write model versions", "read model versions", "write rollout decisions"},
}


@pytest.mark.parametrize("role", ROLES)
def test_each_role_may_do_what_it_needs_and_nothing_else(cluster, role):
    login = role_settings(cluster, role)
    assert login.sasl_username == role_user(cluster, role) != cluster.sasl_username
    wrongly_allowed, wrongly_refused = [], []
    for name, operation in forbidden(cluster).items():
        try:
            operation(login)
        except (KafkaError, PermissionError) as error:
            if name in ALLOWED[role]:
                wrongly_refused.append(f"{name}: {error!r}")
        else:
            if name not in ALLOWED[role]:
                wrongly_allowed.append(name)
    assert not wrongly_allowed, f"{role} may {wrongly_allowed}"
    assert not wrongly_refused, f"{role} may not {wrongly_refused}"


def test_the_super_user_may_do_everything_the_roles_may(cluster):
    for name in set().union(*ALLOWED.values()):
        forbidden(cluster)[name](cluster)


def test_the_client_listener_is_tls_with_the_projects_ca_and_refuses_plaintext(cluster):
    host, port = "127.0.0.1", cluster.kafka_port
    context = ssl.create_default_context(cafile=str(tls_dir(cluster) / "ca.pem"))
    with (
        socket.create_connection((host, port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        assert tls.version() in ("TLSv1.3", "TLSv1.2")
    untrusting = ssl.create_default_context()  # the system CAs: the project's CA is not among them
    with socket.create_connection((host, port), timeout=10) as raw, pytest.raises(ssl.SSLCertVerificationError):
        untrusting.wrap_socket(raw, server_hostname=host)
    plaintext = cluster.model_copy(update={"security_protocol": "SASL_PLAINTEXT"})
    with pytest.raises(KafkaError):
        make_admin(plaintext, "lp-plain", bootstrap_timeout_ms=5000).close()
    assert (tls_dir(cluster) / "node.pem").stat().st_mode & 0o077 == 0
    assert (cluster.kafka_dir / "roles.json").stat().st_mode & 0o077 == 0


def test_an_edge_client_behind_its_proxy_is_cut_off_and_comes_back_with_its_role_only(cluster):
    """The edge listener is the client listener's twin (TLS, SCRAM, the same ACLs), advertised at the proxy's port,
    so a cut of the proxy is a cut from every node: a send then fails; after the restore it goes through."""
    node_port = cluster.kafka_edge_port(1, 0)
    proxy = Proxy(node_port + 1, node_port).start()
    edge = role_settings(cluster, "edge").model_copy(
        update={"bootstrap_servers": cluster.edge_bootstrap(0), "ssl_cafile": local_cafile(cluster)}
    )  # as the stack's children see it: an external cluster, the CA named
    steps, versions = topics_for(cluster).steps.name, topics_for(cluster).model_versions.name
    try:
        produce(edge, steps)
        assert proxy.connections >= 2  # bootstrap and the node it advertised: both through the proxy
        with pytest.raises(KafkaError):
            produce(edge, versions)  # the same ACLs on this listener
        producer = make_producer(edge, "lp-cut")  # connected before the cut: its connections are reset
        proxy.cut()
        try:
            with pytest.raises(KafkaError):
                producer.send(steps, key=b"k", value=b"v", partition=0).get(timeout=8)
        finally:
            producer.close(timeout=1)
        proxy.restore()
        produce(edge, steps)
    finally:
        proxy.close()
