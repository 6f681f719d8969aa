"""A real Apache Kafka cluster on 127.0.0.1 (KRaft: `settings.kafka_nodes` combined broker+controller nodes, one by
default), run from Maven Central jars: started, stopped, described. The same code serves one node or three; only
the settings differ. Nodes outlive the Python process that started them; `down` stops them again. `stop_node`,
`start_node` and `streams.topic_admin.partitions` are the handles of the fault tests.

The parts, one job each, are this package's other modules: `jars` (the jars, the JVM), `files` (the cluster's
directory), `properties` (server.properties, SASL), `storage` (formatting), `nodes` (a node as a process),
`readiness` (when a node serves), `tls` and `roles`. Topics are `streams.topic_admin`'s, which an external cluster
uses alone.
"""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from core.processes import spawn_detached
from core.settings import Settings
from streams.broker.files import BrokerError, log_path, pid_path, read_log, tail
from streams.broker.jars import ensure_jars, java_command
from streams.broker.nodes import running_pid, wait_gone
from streams.broker.properties import refuse_unsupported_security, write_server_properties
from streams.broker.readiness import answers_api_versions, await_ready
from streams.broker.roles import grant_roles
from streams.broker.storage import ensure_storage
from streams.kafka_clients import ssl_context
from streams.topic_admin import ensure_topics, list_topics


def up(settings: Settings, timeout: float = 90.0) -> dict[int, int]:
    """Start every node of the local cluster that is not running, wait until all serve requests, create missing
    topics. Returns node id -> pid.

    Raises BrokerError, with the tail of the node's log, if a node dies or is not ready within `timeout` seconds
    (the nodes started here are then stopped, so nothing half-started is left behind).
    """
    pids = _start_nodes(settings, settings.kafka_node_ids, timeout)
    ensure_topics(settings)
    grant_roles(settings)  # with SCRAM: each role's login and ACLs on these topics
    return pids


def start_node(settings: Settings, node: int, timeout: float = 90.0) -> int:
    """Start one node (id 1..kafka_nodes) unless it runs, e.g. after `stop_node`; wait until it serves. Its pid."""
    return _start_nodes(settings, [node], timeout)[node]


def down(settings: Settings, timeout: float = 30.0) -> list[int]:
    """Stop every running node (SIGTERM, then SIGKILL after `timeout` seconds); return the ids of those stopped.

    All are signalled at once: a node's clean shutdown needs the controller quorum, which stopping them one by one
    would take away from the last.
    """
    return _stop_nodes(settings, settings.kafka_node_ids, signal.SIGTERM, timeout)


def stop_node(settings: Settings, node: int, sig: int = signal.SIGTERM, timeout: float = 30.0) -> bool:
    """Signal one node (SIGKILL: a crash; SIGTERM: a clean shutdown, leaderships handed over first) and wait until
    it is gone, SIGKILLed after `timeout` seconds. False when it was not running."""
    return bool(_stop_nodes(settings, [node], sig, timeout))


def node_pids(settings: Settings) -> dict[int, int | None]:
    """Node id -> pid of each node of the local cluster, None for those not running."""
    return {node: running_pid(settings, node) for node in settings.kafka_node_ids}


def status(settings: Settings) -> dict:
    """Describe the broker: running, pid (of the first running local node), bootstrap, topics (None when
    unreachable), and per local node its address and pid (no nodes for an external cluster)."""
    pids = {} if settings.uses_external_kafka else node_pids(settings)
    topics = None
    if any(answers_api_versions(server, tls=ssl_context(settings)) for server in settings.bootstrap.split(",")):
        topics = list_topics(settings)
    running = [pid for pid in pids.values() if pid is not None]
    return {
        "running": bool(running) or topics is not None,
        "pid": running[0] if running else None,
        "bootstrap": settings.bootstrap,
        "topics": topics,
        "nodes": [
            {"node": node, "address": settings.local_node_address(node), "pid": pid} for node, pid in pids.items()
        ],
    }


@contextmanager
def running_broker(settings: Settings) -> Iterator[Settings]:
    """Have a broker with the flywheel's topics for the duration of the block; stop it after only if we started it."""
    if settings.uses_external_kafka:
        ensure_topics(settings)
        yield settings
        return
    started_here = not any(node_pids(settings).values())
    up(settings)
    try:
        yield settings
    finally:
        if started_here:
            down(settings)


def _start_nodes(settings: Settings, nodes: Sequence[int], timeout: float) -> dict[int, int]:
    pids = {node: running_pid(settings, node) for node in nodes}
    stopped = [node for node, pid in pids.items() if pid is None]
    if stopped:
        refuse_unsupported_security(settings)
        _refuse_busy_ports(settings, stopped)
        libs = ensure_jars(settings)
        pids |= {node: _start(settings, libs, node) for node in stopped}  # all at once: a quorum needs a majority
    failed = await_ready(settings, pids, timeout)  # at once when they already run
    if failed is not None:
        node, problem = failed
        log_tail = tail(read_log(settings, node))
        _stop_nodes(settings, stopped, signal.SIGTERM, 30.0)  # nothing half-started is left behind
        raise BrokerError(
            f"Kafka node {node} {problem} (the nodes started were stopped); "
            f"{log_path(settings, node)} ends with:\n{log_tail}"
        )
    return pids


def _start(settings: Settings, libs: Path, node: int) -> int:
    props = write_server_properties(settings, node)
    ensure_storage(settings, libs, props, node)
    pid = spawn_detached(java_command(settings, libs) + ["kafka.Kafka", str(props)], log_path(settings, node))
    pid_path(settings, node).write_text(f"{pid}\n")
    return pid


def _stop_nodes(settings: Settings, nodes: Sequence[int], sig: int, timeout: float) -> list[int]:
    pids = {node: pid for node in nodes if (pid := running_pid(settings, node)) is not None}
    for pid in pids.values():
        os.kill(pid, sig)  # SIGTERM: Kafka's shutdown hook closes the logs cleanly, so the next start skips recovery
    deadline = time.monotonic() + timeout
    for node, pid in pids.items():
        if not wait_gone(settings, node, pid, deadline - time.monotonic()):
            os.kill(pid, signal.SIGKILL)
            wait_gone(settings, node, pid, 10.0)
    for node in nodes:
        pid_path(settings, node).unlink(missing_ok=True)
    return list(pids)


def _refuse_busy_ports(settings: Settings, nodes: list[int]) -> None:
    client_host = settings.local_node_address(1).rpartition(":")[0].strip("[]")
    for node in nodes:
        port = settings.kafka_node_port(node)
        edges = [("127.0.0.1", settings.kafka_edge_port(node, j)) for j in range(settings.kafka_edge_listeners)]
        for host, busy in ((client_host, port), ("127.0.0.1", port + 1), *edges):
            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
                if sock.connect_ex((host, busy)) == 0:
                    raise BrokerError(f"port {busy} is already in use by another process; set FLYWHEEL_KAFKA_PORT")
