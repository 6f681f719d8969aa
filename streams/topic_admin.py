"""Topic administration on any Kafka cluster, the local one or an external one (`settings.bootstrap` and its
security settings): the flywheel's topics created when missing, the topics listed, a topic's partitions described.

Nothing here starts or knows a local node, so an external cluster needs only this module. A metadata request goes
to any one node, perhaps a cluster's dead one: each is retried, and the retry goes to another node.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TypeVar

from kafka import KafkaAdminClient
from kafka.errors import KafkaConnectionError

from core.settings import Settings
from streams.kafka_clients import make_admin
from streams.topics import topics_for

TOPIC_ALREADY_EXISTS = 36  # Kafka protocol error code: another client created the topic first
T = TypeVar("T")


class TopicAdminError(RuntimeError):
    """The cluster refused to create a topic."""


@dataclass(frozen=True)
class PartitionState:
    leader: int  # node id; -1 while the partition has none
    replicas: tuple[int, ...]
    isr: tuple[int, ...]  # the in-sync replicas: those an acks=all write waits for


def ensure_topics(settings: Settings) -> list[str]:
    """Create every flywheel topic that is missing (on `settings.bootstrap`) and return the names created."""
    specs = topics_for(settings).all()
    with _admin(settings) as admin:
        existing = set(_on_any_node(admin.list_topics))
        missing = [spec for spec in specs if spec.name not in existing]
        if missing:
            # replication_factor -1: the cluster's default.replication.factor, so external clusters get theirs.
            wanted = {
                s.name: {"num_partitions": s.partitions, "replication_factor": -1, "configs": s.config} for s in missing
            }
            result = admin.create_topics(wanted, raise_errors=False)
            failed = [t for t in result["topics"] if t["error_code"] not in (0, TOPIC_ALREADY_EXISTS)]
            if failed:
                raise TopicAdminError(f"creating topics failed: {failed}")
        # CreateTopics returns before the new partitions have leaders; producers right after would stall.
        admin.wait_for_topics([spec.name for spec in specs], timeout_ms=30_000)
    return [spec.name for spec in missing]


def list_topics(settings: Settings) -> list[str]:
    """Every topic of the cluster, the flywheel's and others', sorted."""
    with _admin(settings) as admin:
        return sorted(_on_any_node(admin.list_topics))


def partitions(settings: Settings, topic: str) -> dict[int, PartitionState]:
    """Partition -> its leader, replicas and in-sync replicas, as the cluster's metadata has them now."""
    with _admin(settings) as admin:
        (described,) = _on_any_node(lambda: admin.describe_topics([topic]))
    return {
        p["partition_index"]: PartitionState(p["leader_id"], tuple(p["replica_nodes"]), tuple(p["isr_nodes"]))
        for p in described["partitions"]
    }


def _on_any_node(call: Callable[[], T], attempts: int = 5) -> T:
    """call(), again on a connection error. A metadata request goes to any one node, perhaps a cluster's dead one;
    the node that just refused is in reconnect backoff, so the next try goes to another."""
    for _ in range(attempts - 1):
        try:
            return call()
        except KafkaConnectionError:
            pass
    return call()


@contextmanager
def _admin(settings: Settings) -> Iterator[KafkaAdminClient]:
    admin = make_admin(settings, "flywheel-broker-ctl", bootstrap_timeout_ms=10_000, request_timeout_ms=30_000)
    try:
        yield admin
    finally:
        admin.close()
