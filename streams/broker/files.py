"""Where the local cluster keeps its state, and the error every local-broker module raises.

Under `settings.kafka_dir`: `libs-<version>/` (the jars, `streams.broker.jars`) and the cluster's directory,
`kafka_dir` itself for one node (so a single broker keeps the layout it always had) and `kafka_dir/cluster-<N>/`
for N, holding `cluster.id`, `scram-users` and each node's `server.properties`, `data/`, `broker.log` (the JVM's
stdout/stderr) and `broker.pid` (node k of N in `node-<k>/`).
"""

from __future__ import annotations

from pathlib import Path

from core.settings import Settings


class BrokerError(RuntimeError):
    """The local broker could not be fetched, formatted, started or stopped."""


def cluster_dir(settings: Settings) -> Path:
    return settings.kafka_dir if settings.kafka_nodes == 1 else settings.kafka_dir / f"cluster-{settings.kafka_nodes}"


def node_dir(settings: Settings, node: int) -> Path:
    return cluster_dir(settings) if settings.kafka_nodes == 1 else cluster_dir(settings) / f"node-{node}"


def props_path(settings: Settings, node: int) -> Path:
    return node_dir(settings, node) / "server.properties"


def pid_path(settings: Settings, node: int) -> Path:
    return node_dir(settings, node) / "broker.pid"


def scram_users_path(settings: Settings) -> Path:
    return cluster_dir(settings) / "scram-users"  # names only: which SCRAM users the storage was formatted with


def log_path(settings: Settings, node: int) -> Path:
    return node_dir(settings, node) / "broker.log"


def read_log(settings: Settings, node: int) -> str:
    try:
        return log_path(settings, node).read_text(errors="replace")
    except FileNotFoundError:
        return "(no broker log)"


def tail(text: str, lines: int = 40) -> str:
    """The last lines of a log or a tool's output, for an error message."""
    return "\n".join(text.rstrip().splitlines()[-lines:])
