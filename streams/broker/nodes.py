"""A local node as an OS process: spawned detached, so it outlives the Python process that started it; found again
through its pid file; told apart from a reused pid or an unreaped dead node by its command line."""

from __future__ import annotations

import time

from core.processes import runs_service, service_pid
from core.settings import Settings
from streams.broker.files import pid_path, props_path


def running_pid(settings: Settings, node: int) -> int | None:
    """The pid of the node's broker when it runs, from its pid file; None when it does not."""
    return service_pid(pid_path(settings, node), b"kafka.Kafka", str(props_path(settings, node)).encode())


def is_broker(settings: Settings, node: int, pid: int) -> bool:
    """True while pid runs this home's node; a reused pid or a dead, unreaped node does not count."""
    return runs_service(pid, b"kafka.Kafka", str(props_path(settings, node)).encode())


def wait_gone(settings: Settings, node: int, pid: int, timeout: float) -> bool:
    """Wait up to `timeout` seconds for the node's broker to exit; False when it still runs."""
    deadline = time.monotonic() + timeout
    while is_broker(settings, node, pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True
