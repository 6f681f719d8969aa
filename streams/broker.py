"""A real Apache Kafka cluster on 127.0.0.1 (KRaft: `settings.kafka_nodes` combined broker+controller nodes, one by
default), run from Maven Central jars. The same code serves one node or three; only the settings differ.

Under `settings.kafka_dir`: `libs-<version>/` (the jars) and the cluster's directory, `kafka_dir` itself for one
node (so a single broker keeps the layout it always had) and `kafka_dir/cluster-<N>/` for N, holding `cluster.id`
and each node's `server.properties`, `data/`, `broker.log` (the JVM's stdout/stderr) and `broker.pid` (node k of N
in `node-<k>/`). Nodes outlive the Python process that started them; `down` stops them again.

Cluster: node k (ids 1..N) serves clients on kafka_port + 2(k-1) and the quorum on the port after; the quorum is
static (every node a voter, all formatted with one cluster id). Topics get min(3, N) replicas and, with 3,
min.insync.replicas 2: an acks=all write is acknowledged once it is on two nodes, so any one node may die without
losing it or stopping producers. `stop_node`, `start_node` and `streams.topic_admin.partitions` are the handles of
the fault tests. Topics are `streams.topic_admin`'s, which an external cluster uses alone.

Security: the client listener binds `settings.listen_host` (127.0.0.1 by default), the controller listener always
127.0.0.1. With `security_protocol=SASL_PLAINTEXT` the client listener requires SASL (SCRAM-SHA-256/512, or PLAIN):
the SCRAM user is written into the metadata log when the storage is formatted (salted, so the password is on no
command line), and the broker's own inter-broker login sits in `server.properties`, which is then mode 0600.
"""

from __future__ import annotations

import base64
import fcntl
import hashlib
import os
import shutil
import signal
import socket
import struct
import subprocess
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from pydantic import SecretStr

from core.settings import Settings
from streams.topic_admin import ensure_topics, list_topics

OPS_DIR = Path(__file__).resolve().parents[1] / "ops" / "kafka"
POM = OPS_DIR / "pom.xml"
LOG4J2_CONFIG = OPS_DIR / "log4j2.properties"
SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
SCRAM_ITERATIONS = 8192


class BrokerError(RuntimeError):
    """The local broker could not be fetched, formatted, started or stopped."""


# --- jars -------------------------------------------------------------------------------------------------------


def ensure_jars(settings: Settings) -> Path:
    """Return the directory holding the broker's jars, resolving them with Maven only when not done before."""
    libs = settings.kafka_dir / f"libs-{settings.kafka_version}"
    stamp = libs / ".complete"  # written last: a copy interrupted half-way has no stamp and is redone
    if stamp.exists():
        return libs
    libs.parent.mkdir(parents=True, exist_ok=True)
    # Several processes (parallel test sessions) may share one jar cache: only one of them runs Maven.
    with _file_lock(libs.parent / f"{libs.name}.lock"):
        if not stamp.exists():
            shutil.rmtree(libs, ignore_errors=True)
            _copy_dependencies(settings.kafka_version, libs)
            stamp.write_text(f"org.apache.kafka:kafka_2.13:{settings.kafka_version}\n")
    return libs


@contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def _copy_dependencies(version: str, libs: Path) -> None:
    mvn = shutil.which("mvn")
    if mvn is None:
        raise BrokerError("Maven (mvn) is not on PATH: it is needed once to fetch the Kafka jars")
    cmd = [
        mvn,
        "-B",
        "-q",
        "-f",
        str(POM),
        "dependency:copy-dependencies",
        f"-Dkafka.version={version}",
        f"-DoutputDirectory={libs}",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise BrokerError(f"fetching Kafka {version} jars failed:\n{_tail(done.stdout + done.stderr)}")


# --- start / stop -----------------------------------------------------------------------------------------------


def up(settings: Settings, timeout: float = 90.0) -> dict[int, int]:
    """Start every node of the local cluster that is not running, wait until all serve requests, create missing
    topics. Returns node id -> pid.

    Raises BrokerError, with the tail of the node's log, if a node dies or is not ready within `timeout` seconds
    (the nodes started here are then stopped, so nothing half-started is left behind).
    """
    pids = _start_nodes(settings, settings.kafka_node_ids, timeout)
    ensure_topics(settings)
    return pids


def start_node(settings: Settings, node: int, timeout: float = 90.0) -> int:
    """Start one node (id 1..kafka_nodes) unless it runs, e.g. after `stop_node`; wait until it serves. Its pid."""
    return _start_nodes(settings, [node], timeout)[node]


def _start_nodes(settings: Settings, nodes: Sequence[int], timeout: float) -> dict[int, int]:
    pids = {node: _running_pid(settings, node) for node in nodes}
    stopped = [node for node, pid in pids.items() if pid is None]
    if stopped:
        _refuse_unsupported_security(settings)
        _refuse_busy_ports(settings, stopped)
        libs = ensure_jars(settings)
        pids |= {node: _start(settings, libs, node) for node in stopped}  # all at once: a quorum needs a majority
    _await_ready(settings, pids, stopped, timeout)  # at once when they already run
    return pids


def _start(settings: Settings, libs: Path, node: int) -> int:
    props = _write_server_properties(settings, node)
    if not (_node_dir(settings, node) / "data" / "meta.properties").exists():
        _format_storage(settings, libs, props, node)
    elif settings.uses_sasl and settings.sasl_mechanism in SCRAM_MECHANISMS:
        _refuse_unknown_scram_user(settings)
    pid = _spawn_detached(_java(settings, libs) + ["kafka.Kafka", str(props)], _log_path(settings, node))
    _pid_path(settings, node).write_text(f"{pid}\n")
    return pid


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


def _stop_nodes(settings: Settings, nodes: Sequence[int], sig: int, timeout: float) -> list[int]:
    pids = {node: pid for node in nodes if (pid := _running_pid(settings, node)) is not None}
    for pid in pids.values():
        os.kill(pid, sig)  # SIGTERM: Kafka's shutdown hook closes the logs cleanly, so the next start skips recovery
    deadline = time.monotonic() + timeout
    for node, pid in pids.items():
        if not _wait_gone(settings, node, pid, deadline - time.monotonic()):
            os.kill(pid, signal.SIGKILL)
            _wait_gone(settings, node, pid, 10.0)
    for node in nodes:
        _pid_path(settings, node).unlink(missing_ok=True)
    return list(pids)


def node_pids(settings: Settings) -> dict[int, int | None]:
    """Node id -> pid of each node of the local cluster, None for those not running."""
    return {node: _running_pid(settings, node) for node in settings.kafka_node_ids}


def status(settings: Settings) -> dict:
    """Describe the broker: running, pid (of the first running local node), bootstrap, topics (None when
    unreachable), and per local node its address and pid (no nodes for an external cluster)."""
    pids = {} if settings.uses_external_kafka else node_pids(settings)
    topics = None
    if any(_answers_api_versions(server) for server in settings.bootstrap.split(",")):
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


# --- broker configuration ---------------------------------------------------------------------------------------


def _server_properties(settings: Settings, node: int) -> dict[str, str | int]:
    port = settings.kafka_node_port(node)
    client = "SASL_PLAINTEXT" if settings.uses_sasl else "PLAINTEXT"  # listener name = its security protocol
    bind = _url_host(settings.listen_host)
    advertised = bind if settings.listen_host not in ("", "0.0.0.0", "::") else _url_host(socket.getfqdn())
    replicas, min_isr = settings.replication_factor, settings.min_insync_replicas
    return {
        "process.roles": "broker,controller",
        "node.id": node,
        # Static quorum, every node a voter: storage is formatted without --standalone and ports may change
        # between starts.
        "controller.quorum.voters": ",".join(
            f"{voter}@127.0.0.1:{settings.kafka_node_port(voter) + 1}" for voter in settings.kafka_node_ids
        ),
        # The controller listener is for the quorum alone: plaintext, but on loopback whatever listen_host says.
        "listeners": f"{client}://{bind}:{port},CONTROLLER://127.0.0.1:{port + 1}",
        "advertised.listeners": f"{client}://{advertised}:{port}",
        "listener.security.protocol.map": f"{client}:{client},CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": client,
        "controller.listener.names": "CONTROLLER",
        **(_sasl_properties(settings, client) if settings.uses_sasl else {}),
        "log.dirs": str(_node_dir(settings, node) / "data"),
        # Topics created with replication factor -1 (streams.topics via ensure_topics, faust's) get this one.
        "default.replication.factor": replicas,
        "min.insync.replicas": min_isr,
        # Internal topics as replicated as ours: consumer offsets must survive a node, as the events do. Their
        # default 50 partitions each only cost startup time and file handles here.
        "offsets.topic.replication.factor": replicas,
        "offsets.topic.num.partitions": 4,
        "transaction.state.log.replication.factor": replicas,
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": 4,
        "share.coordinator.state.topic.replication.factor": replicas,
        "share.coordinator.state.topic.min.isr": min_isr,
        "share.coordinator.state.topic.num.partitions": 4,
        "group.initial.rebalance.delay.ms": 0,
        "auto.create.topics.enable": "false",  # topics come from streams.topics only; typos must fail loudly
        "message.max.bytes": 2 * 1024 * 1024 + 64 * 1024,  # a 2 MiB record plus batch overhead
        # The 2-core box is shared: far fewer threads than the defaults (3 network, 8 I/O).
        "num.network.threads": 2,
        "num.io.threads": 2,
        "background.threads": 2,
        # The cleaner's dedupe map is allocated on the heap (128 MiB by default); our compacted topic is tiny.
        "log.cleaner.dedupe.buffer.size": 8 * 1024 * 1024,
    }


def _sasl_properties(settings: Settings, listener: str) -> dict[str, str]:
    """SASL on the client listener; the broker logs in to itself (inter-broker) as settings.sasl_username.

    The JAAS config is a password-type config: Kafka prints it as [hidden]. The file holding it is mode 0600.
    """
    user, password = _checked_username(settings.sasl_username), settings.sasl_password.get_secret_value()
    login = f'username="{_jaas_quote(user)}" password="{_jaas_quote(password)}"'
    if settings.sasl_mechanism == "PLAIN":
        # PLAIN checks passwords against the user_<name> entries of the broker's own JAAS config.
        mechanisms = {"PLAIN": f"org.apache.kafka.common.security.plain.PlainLoginModule required {login} "
                               f'user_{user}="{_jaas_quote(password)}";'}  # fmt: skip
    else:
        # SCRAM checks against the credentials in the metadata log (written by _format_storage).
        login_module = f"org.apache.kafka.common.security.scram.ScramLoginModule required {login};"
        mechanisms = dict.fromkeys(SCRAM_MECHANISMS, login_module)
    prefix = f"listener.name.{listener.lower()}"
    return {
        "sasl.enabled.mechanisms": ",".join(mechanisms),
        "sasl.mechanism.inter.broker.protocol": settings.sasl_mechanism,
        **{f"{prefix}.{mechanism.lower()}.sasl.jaas.config": jaas for mechanism, jaas in mechanisms.items()},
    }


def _write_server_properties(settings: Settings, node: int) -> Path:
    # Rewritten on every start so changed settings (port, paths) take effect; the data dir keeps the state.
    path = _props_path(settings, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{key}={_properties_escape(str(value))}" for key, value in _server_properties(settings, node).items()]
    text = "# Written by streams/broker.py on each start; edits are overwritten.\n" + "\n".join(lines) + "\n"
    # 0600: with SASL the file holds the broker's login. fchmod too, for a file left by an older version.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as handle:  # _properties_escape leaves ASCII only
        os.fchmod(fd, 0o600)
        handle.write(text)
    return path


def _format_storage(settings: Settings, libs: Path, props: Path, node: int) -> None:
    cluster_id = _cluster_id(settings)
    cmd = _java(settings, libs) + ["kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props)]
    scram = settings.uses_sasl and settings.sasl_mechanism in SCRAM_MECHANISMS
    if scram:
        for mechanism in SCRAM_MECHANISMS:  # both, so clients may pick either
            cmd += ["--add-scram", _scram_credential(mechanism, settings.sasl_username, settings.sasl_password)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=_node_dir(settings, node))
    if done.returncode != 0:
        raise BrokerError(f"formatting Kafka storage failed:\n{_tail(done.stdout + done.stderr)}")
    if scram:
        _scram_users_path(settings).write_text(f"{settings.sasl_username}\n")


def _scram_credential(mechanism: str, user: str, password: SecretStr) -> str:
    """StorageTool's --add-scram value in its salted form: the password itself never reaches a command line.

    SCRAM's SaltedPassword = Hi(password, salt, i) = PBKDF2-HMAC-<hash>(UTF-8 password, salt, i) (RFC 5802), what
    Kafka's ScramFormatter computes from a plain `password=`.
    """
    digest = "sha256" if mechanism == "SCRAM-SHA-256" else "sha512"
    salt = os.urandom(32)
    salted = hashlib.pbkdf2_hmac(digest, password.get_secret_value().encode(), salt, SCRAM_ITERATIONS)
    b64 = base64.b64encode
    return (
        f'{mechanism}=[name={_checked_username(user)},iterations={SCRAM_ITERATIONS},salt="{b64(salt).decode()}",'
        f'saltedpassword="{b64(salted).decode()}"]'
    )


def _refuse_unknown_scram_user(settings: Settings) -> None:
    """SCRAM users are created only when the storage is formatted: an older storage may not know this one."""
    path = _scram_users_path(settings)
    users = path.read_text().split() if path.exists() else []
    if settings.sasl_username not in users:
        raise BrokerError(
            f"the broker storage in {_cluster_dir(settings)} was formatted without SCRAM user "
            f"{settings.sasl_username!r}; remove that directory (its topics are lost) to format it again with SCRAM"
        )


def _refuse_unsupported_security(settings: Settings) -> None:
    if settings.uses_ssl:
        raise BrokerError(
            f"the local broker serves PLAINTEXT or SASL_PLAINTEXT, not {settings.security_protocol}: "
            "set FLYWHEEL_BOOTSTRAP_SERVERS to a cluster with TLS listeners"
        )


def _checked_username(user: str) -> str:
    # Plain names only: they go unquoted into --add-scram and into the PLAIN module's user_<name> option.
    if not user or not all(c.isalnum() or c in "._-@" for c in user):
        raise BrokerError(f"SASL username {user!r}: the local broker accepts letters, digits and ._-@ only")
    return user


def _jaas_quote(value: str) -> str:
    """A value for inside double quotes in a JAAS config (Kafka parses it with java.io.StreamTokenizer)."""
    if any(c in value for c in "\r\n\0"):
        raise BrokerError("SASL username and password must not contain line breaks or NUL")
    return value.replace("\\", "\\\\").replace('"', '\\"')


def _properties_escape(value: str) -> str:
    """A java.util.Properties value: backslashes doubled, leading blanks kept, non-ASCII as \\uXXXX."""
    out = value.replace("\\", "\\\\")
    if out.startswith(" "):
        out = "\\" + out
    return "".join(c if 32 <= ord(c) < 127 else _u_escape(c) for c in out)


def _u_escape(char: str) -> str:
    units = char.encode("utf-16-be")
    return "".join(f"\\u{units[i : i + 2].hex()}" for i in range(0, len(units), 2))


def _url_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _cluster_id(settings: Settings) -> str:
    """The cluster's id, made on the first format: every node's storage must carry the same one."""
    path = _cluster_dir(settings) / "cluster.id"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_new_cluster_id() + "\n")
    return path.read_text().strip()


def _new_cluster_id() -> str:
    # Kafka's Uuid text form (what `kafka-storage random-uuid` prints): 16 random bytes, url-safe base64, no
    # padding; Kafka itself never hands out ids starting with '-' (they read as command-line flags).
    while (cluster_id := base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")).startswith("-"):
        pass
    return cluster_id


def _java(settings: Settings, libs: Path) -> list[str]:
    java = shutil.which("java")
    if java is None:
        raise BrokerError("java is not on PATH: the Kafka broker needs Java 17+")
    return [
        java,
        "-Xms64m",
        f"-Xmx{settings.kafka_heap}",
        # Serial GC: no concurrent GC threads competing for 2 shared cores; pauses on a small heap are short.
        "-XX:+UseSerialGC",
        # C1 only: about 40% less CPU and half the start time (~3 s instead of ~6 s measured here) and ~30 MB less
        # RSS; the C2 peak speed it gives up does not matter at a dev flywheel's message rates.
        "-XX:TieredStopAtLevel=1",
        "-XX:+ExitOnOutOfMemoryError",  # a dead broker gets noticed; a thrashing one only slows everything
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={LOG4J2_CONFIG}",
        "-cp",
        f"{libs}/*",
    ]


# --- process handling -------------------------------------------------------------------------------------------


def _spawn_detached(cmd: list[str], log_path: Path) -> int:
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


def _await_ready(settings: Settings, pids: dict[int, int], started: list[int], timeout: float) -> None:
    """Wait until every node in `pids` answers; if one dies or the time is up, stop those in `started` and raise."""
    deadline = time.monotonic() + timeout
    waiting = dict(pids)
    while waiting:
        waiting = {n: pid for n, pid in waiting.items() if not _answers_api_versions(settings.local_node_address(n))}
        dead = [n for n, pid in waiting.items() if not _is_broker(settings, n, pid)]
        if dead or (waiting and time.monotonic() > deadline):
            node = (dead or list(waiting))[0]
            problem = "exited during startup" if dead else f"was not ready after {timeout:.0f}s"
            log_tail = _tail(_read_log(settings, node))
            _stop_nodes(settings, started, signal.SIGTERM, 30.0)
            raise BrokerError(
                f"Kafka node {node} {problem} (the nodes started were stopped); "
                f"{_log_path(settings, node)} ends with:\n{log_tail}"
            )
        if waiting:
            time.sleep(0.25)


def _running_pid(settings: Settings, node: int) -> int | None:
    try:
        pid = int(_pid_path(settings, node).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if _is_broker(settings, node, pid) else None


def _is_broker(settings: Settings, node: int, pid: int) -> bool:
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
    props = str(_props_path(settings, node)).encode()
    return state != "Z" and b"kafka.Kafka" in cmdline and props in cmdline


def _wait_gone(settings: Settings, node: int, pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _is_broker(settings, node, pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _refuse_busy_ports(settings: Settings, nodes: list[int]) -> None:
    client_host = settings.local_node_address(1).rpartition(":")[0].strip("[]")
    for node in nodes:
        port = settings.kafka_node_port(node)
        for host, busy in ((client_host, port), ("127.0.0.1", port + 1)):
            with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
                if sock.connect_ex((host, busy)) == 0:
                    raise BrokerError(f"port {busy} is already in use by another process; set FLYWHEEL_KAFKA_PORT")


def _answers_api_versions(server: str, timeout: float = 2.0) -> bool:
    """True when the Kafka broker at host:port answers an ApiVersions request.

    A Kafka broker accepts connections early but processes requests only once it has joined the quorum and been
    unfenced, so an answer means it is ready. A bare socket keeps this poll cheap and free of client threads.
    """
    host, _, port = server.strip().rpartition(":")
    host = host.strip("[]")
    client_id = b"flywheel"
    # Request header v1 (api_key 18 = ApiVersions, version 0, correlation id, client id); v0 has no body.
    request = struct.pack(">hhih", 18, 0, 7, len(client_id)) + client_id
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            sock.sendall(struct.pack(">i", len(request)) + request)
            reply = sock.makefile("rb").read(10)  # length, correlation id, error code
    except (OSError, ValueError):
        return False
    if len(reply) < 10:
        return False
    _, correlation_id, error_code = struct.unpack(">iih", reply)
    return correlation_id == 7 and error_code == 0


# --- files ------------------------------------------------------------------------------------------------------


def _cluster_dir(settings: Settings) -> Path:
    return settings.kafka_dir if settings.kafka_nodes == 1 else settings.kafka_dir / f"cluster-{settings.kafka_nodes}"


def _node_dir(settings: Settings, node: int) -> Path:
    return _cluster_dir(settings) if settings.kafka_nodes == 1 else _cluster_dir(settings) / f"node-{node}"


def _props_path(settings: Settings, node: int) -> Path:
    return _node_dir(settings, node) / "server.properties"


def _pid_path(settings: Settings, node: int) -> Path:
    return _node_dir(settings, node) / "broker.pid"


def _scram_users_path(settings: Settings) -> Path:
    return _cluster_dir(settings) / "scram-users"  # names only: which SCRAM users the storage was formatted with


def _log_path(settings: Settings, node: int) -> Path:
    return _node_dir(settings, node) / "broker.log"


def _read_log(settings: Settings, node: int) -> str:
    try:
        return _log_path(settings, node).read_text(errors="replace")
    except FileNotFoundError:
        return "(no broker log)"


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])
