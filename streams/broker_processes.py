"""A local node as an OS process: spawned detached, so it outlives the Python process that started it; found again
through its pid file; told apart from a reused pid or an unreaped dead node by its command line."""

from __future__ import annotations

import os
import time
from pathlib import Path

from core.settings import Settings
from streams.broker_files import pid_path, props_path


def running_pid(settings: Settings, node: int) -> int | None:
    """The pid of the node's broker when it runs, from its pid file; None when it does not."""
    try:
        pid = int(pid_path(settings, node).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if is_broker(settings, node, pid) else None


def is_broker(settings: Settings, node: int, pid: int) -> bool:
    """True while pid runs this home's node; a reused pid or a dead, unreaped node does not count."""
    try:
        # Our own child (up() ran in this process): waitpid is authoritative, and reaps the broker once it exits.
        # /proc is not, right after the spawn: the new program's cmdline shows up only part-way through exec.
        return os.waitpid(pid, os.WNOHANG)[0] == 0
    except ChildProcessError:
        pass  # started by another process
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    # An orphaned broker that died stays a zombie until PID 1 reaps it, which some container inits never do.
    props = str(props_path(settings, node)).encode()
    return state != "Z" and b"kafka.Kafka" in cmdline and props in cmdline


def wait_gone(settings: Settings, node: int, pid: int, timeout: float) -> bool:
    """Wait up to `timeout` seconds for the node's broker to exit; False when it still runs."""
    deadline = time.monotonic() + timeout
    while is_broker(settings, node, pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True
