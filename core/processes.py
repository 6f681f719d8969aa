"""Child processes started by the demo and the tests: `flywheel <subcommand>` in a fresh interpreter,
output to a log file, stopped with SIGTERM then SIGKILL. Every process started is stopped. And the pieces the
local services (the Kafka nodes, the object store) are run with: a detached spawn, a file lock."""

from __future__ import annotations

import fcntl
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path


def pin_process(pid: int, cpus: set[int]) -> None:
    """Restrict every thread of process `pid`, and of the processes it started, to `cpus`; what they start from now
    on inherits it. (Linux affinity is per thread: a running process's existing threads are pinned one by one.)"""
    for tid in _listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except ProcessLookupError:
            pass  # the thread ended meanwhile
        try:
            children = Path(f"/proc/{pid}/task/{tid}/children").read_text().split()
        except OSError:
            children = []
        for child in children:
            pin_process(int(child), cpus)


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except FileNotFoundError:
        return []  # the process ended meanwhile


FLYWHEEL = (sys.executable, "-m", "flywheel.cli")


class Child:
    """`program args` (by default `flywheel args`) in a process group of its own, logged to log_dir/<name>.log."""

    def __init__(self, name: str, args: list[str], log_dir: Path, env: dict[str, str] | None = None,
                 cpus: set[int] | None = None, cwd: Path | None = None, program: Sequence[str] = FLYWHEEL):  # fmt: skip
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        log_dir.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [*program, *args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
            cwd=cwd,
            start_new_session=True,  # its own process group: a stop reaches chromium/driver children too
        )
        if cpus:
            pin_process(self.proc.pid, cpus)  # still starting its interpreter: its threads and children inherit

    def running(self) -> bool:
        return self.proc.poll() is None

    def wait(self, timeout: float | None = None) -> int:
        try:
            return self.proc.wait(timeout)
        finally:
            self._log.flush()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 20.0, leader_only: bool = False) -> int | None:
        """Signal the process group, wait, then SIGKILL what is left. `leader_only`: signal the process alone, for
        one that finishes its unit of work on SIGTERM (an edge client its episode) with children it still needs
        meanwhile (its browser) and closes itself. Stopping twice does nothing: by then the group's id may belong
        to another process."""
        if self._log.closed:
            return self.proc.returncode
        if self.running():
            if leader_only:
                self.proc.send_signal(sig)
            else:
                _signal_group(self.proc.pid, sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                _signal_group(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        _signal_group(self.proc.pid, signal.SIGKILL)  # stragglers (a browser) left in the group
        self._log.close()
        return self.proc.returncode

    def tail(self, lines: int = 30) -> str:
        if not self._log.closed:
            self._log.flush()
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


@contextmanager
def sigterm_requests_stop() -> Iterator[threading.Event]:
    """An event that SIGTERM sets while inside, instead of ending the process at once (Python's default): the
    caller finishes the unit of work it is in and stops cleanly. Signal handlers live in the main thread only;
    elsewhere the event is set by nothing but its holder."""
    requested = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield requested
        return
    previous = signal.signal(signal.SIGTERM, lambda _signum, _frame: requested.set())
    try:
        yield requested
    finally:
        signal.signal(signal.SIGTERM, previous)


def wait_until(predicate, timeout: float, interval: float = 0.5, what: str = "condition"):
    """Poll `predicate` until it returns a truthy value; TimeoutError naming `what` otherwise."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def spawn_detached(cmd: list[str], log_path: Path) -> int:
    """Start cmd in a new session (no terminal signals reach it), stdout/stderr to log_path; return its pid.

    posix_spawn rather than Popen: no Popen object to warn about a still-running child, yet the broker stays our
    child while we live, so `down` can reap it (orphans are left to PID 1, which in some containers never does).
    """
    if log_path.exists():  # keep the previous run's log, but not every run's
        log_path.replace(log_path.with_suffix(".log.1"))
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
    files = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(log_path), flags, 0o644),
        (os.POSIX_SPAWN_DUP2, 1, 2),
    ]
    return os.posix_spawn(cmd[0], cmd, os.environ, file_actions=files, setsid=True)


def service_pid(pid_file: Path, *markers: bytes) -> int | None:
    """The pid in `pid_file` when that process still runs the detached service named by `markers`, else None."""
    try:
        pid = int(pid_file.read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if runs_service(pid, *markers) else None


def runs_service(pid: int, *markers: bytes) -> bool:
    """True while `pid` runs a service whose command line holds every one of `markers`; a reused pid, or a service
    that died and stays an unreaped zombie (some container inits never reap orphans), does not count."""
    try:
        # Our own child (spawned here): waitpid is authoritative, and reaps it once it exits. /proc is not, right
        # after the spawn: the new program's cmdline shows up only part-way through exec.
        return os.waitpid(pid, os.WNOHANG)[0] == 0
    except ChildProcessError:
        pass  # started by another process
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z" and all(marker in cmdline for marker in markers)


@contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (created) for the block: one of several processes sharing a cache does
    the work."""
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def supervise(cmd: list[str], name: str, max_backoff_s: float = 30.0, healthy_after_s: float = 60.0) -> int:
    """Run `cmd` and start it again whenever it exits with an error, as systemd's Restart=on-failure would: after
    1 s, doubling to `max_backoff_s` while it keeps failing within `healthy_after_s` of its start. SIGTERM/SIGINT
    are passed on to it and end the loop; returns its last exit code (0 after a clean stop)."""
    import logging

    log, stopping, backoff = logging.getLogger(__name__), False, 1.0
    child: subprocess.Popen | None = None

    def stop(signum, _frame) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        started = time.monotonic()
        child = subprocess.Popen(cmd)
        code = child.wait()
        if stopping or code == 0:
            return code
        backoff = 1.0 if time.monotonic() - started > healthy_after_s else min(max_backoff_s, backoff * 2)
        log.warning("%s exited with %d; starting it again in %.0f s", name, code, backoff)
        deadline = time.monotonic() + backoff
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.1)
        if stopping:
            return code


def free_ports(count: int = 1, host: str = "127.0.0.1") -> int:
    """A port p such that p .. p + count - 1 are all free on `host` now (a Kafka node's client and controller
    listeners, a server of a test's own)."""
    for _ in range(50):
        port = _bind_probe(host, 0)
        if port + count <= 65536 and all(_bind_probe(host, port + i) for i in range(1, count)):
            return port
    raise RuntimeError(f"no {count} adjacent free ports found on {host}")


def _bind_probe(host: str, port: int) -> int:
    """Bind host:port (0: any) and release it; the port bound, or 0 when it is taken."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return 0
        return sock.getsockname()[1]


def child_pids(pid: int) -> list[int]:
    """Children of every thread of `pid` (chromedriver starts chromium from a thread other than its main one)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return found


def descendants(root: int) -> list[int]:
    """Every process under `root`: its children, theirs, and so on."""
    found, frontier = [], [root]
    while frontier:
        kids = child_pids(frontier.pop())
        found += kids
        frontier += kids
    return found


def browser_pids(root: int) -> list[int]:
    """The chromium browser processes among `root`'s descendants, not their helpers (whose command lines carry
    --type=; chromium rewrites its helpers' titles into one space-separated string, so the whole line is searched)."""
    return [pid for pid in descendants(root) if _is_browser_main(pid)]


def _is_browser_main(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    name = Path(cmdline.replace(b"\0", b" ").split(b" ")[0].decode(errors="replace")).name
    return "chrom" in name and "chromedriver" not in name and b"--type=" not in cmdline
