"""A real Apache Kafka broker (KRaft, one combined broker+controller node on 127.0.0.1), run from Maven Central jars.

Everything lives under `settings.kafka_dir`: `libs-<version>/` (the jars), `server.properties`, `data/`,
`broker.log` (the JVM's stdout/stderr) and `broker.pid`. The broker outlives the Python process that started
it; `down` stops it again.

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
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kafka import KafkaAdminClient
from pydantic import SecretStr

from core.settings import Settings
from streams.kafka_clients import make_admin
from streams.topics import topics_for

OPS_DIR = Path(__file__).resolve().parents[1] / "ops" / "kafka"
POM = OPS_DIR / "pom.xml"
LOG4J2_CONFIG = OPS_DIR / "log4j2.properties"
TOPIC_ALREADY_EXISTS = 36  # Kafka protocol error code: another client created the topic first
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


def up(settings: Settings, timeout: float = 90.0) -> int:
    """Start the local broker unless it already runs, wait until it serves requests, create missing topics.

    Returns the broker's pid. Raises BrokerError, with the tail of the broker log, if it dies or is not ready
    within `timeout` seconds (it is then stopped, so nothing half-started is left behind).
    """
    pid = _running_pid(settings)
    if pid is None:
        _refuse_unsupported_security(settings)
        _refuse_busy_ports(settings)
        pid = _start(settings)
    _await_ready(settings, pid, timeout)  # at once when it already runs
    ensure_topics(settings)
    return pid


def _start(settings: Settings) -> int:
    libs = ensure_jars(settings)
    props = _write_server_properties(settings)
    if not (settings.kafka_dir / "data" / "meta.properties").exists():
        _format_storage(settings, libs, props)
    elif settings.uses_sasl and settings.sasl_mechanism in SCRAM_MECHANISMS:
        _refuse_unknown_scram_user(settings)
    pid = _spawn_detached(_java(settings, libs) + ["kafka.Kafka", str(props)], _log_path(settings))
    _pid_path(settings).write_text(f"{pid}\n")
    return pid


def down(settings: Settings, timeout: float = 30.0) -> None:
    """Stop the local broker (SIGTERM, then SIGKILL after `timeout` seconds). Does nothing when it is not running."""
    pid = _running_pid(settings)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)  # Kafka's shutdown hook closes the logs cleanly: next start skips recovery
        if not _wait_gone(settings, pid, timeout):
            os.kill(pid, signal.SIGKILL)
            _wait_gone(settings, pid, 10.0)
    _pid_path(settings).unlink(missing_ok=True)


def status(settings: Settings) -> dict:
    """Describe the broker: running, pid (local broker only), bootstrap, topics (None when unreachable)."""
    pid = None if settings.uses_external_kafka else _running_pid(settings)
    topics = None
    if any(_answers_api_versions(server) for server in settings.bootstrap.split(",")):
        with _admin(settings) as admin:
            topics = sorted(admin.list_topics())
    return {
        "running": pid is not None or topics is not None,
        "pid": pid,
        "bootstrap": settings.bootstrap,
        "topics": topics,
    }


@contextmanager
def running_broker(settings: Settings) -> Iterator[Settings]:
    """Have a broker with the flywheel's topics for the duration of the block; stop it after only if we started it."""
    if settings.uses_external_kafka:
        ensure_topics(settings)
        yield settings
        return
    started_here = _running_pid(settings) is None
    up(settings)
    try:
        yield settings
    finally:
        if started_here:
            down(settings)


# --- topics -----------------------------------------------------------------------------------------------------


def ensure_topics(settings: Settings) -> list[str]:
    """Create every flywheel topic that is missing (on `settings.bootstrap`) and return the names created."""
    specs = topics_for(settings).all()
    with _admin(settings) as admin:
        existing = set(admin.list_topics())
        missing = [spec for spec in specs if spec.name not in existing]
        if missing:
            # replication_factor -1: the cluster's default.replication.factor, so external clusters get theirs.
            wanted = {
                s.name: {"num_partitions": s.partitions, "replication_factor": -1, "configs": s.config} for s in missing
            }
            result = admin.create_topics(wanted, raise_errors=False)
            failed = [t for t in result["topics"] if t["error_code"] not in (0, TOPIC_ALREADY_EXISTS)]
            if failed:
                raise BrokerError(f"creating topics failed: {failed}")
        # CreateTopics returns before the new partitions have leaders; producers right after would stall.
        admin.wait_for_topics([spec.name for spec in specs], timeout_ms=30_000)
    return [spec.name for spec in missing]


@contextmanager
def _admin(settings: Settings) -> Iterator[KafkaAdminClient]:
    admin = make_admin(settings, "flywheel-broker-ctl", bootstrap_timeout_ms=10_000, request_timeout_ms=30_000)
    try:
        yield admin
    finally:
        admin.close()


# --- broker configuration ---------------------------------------------------------------------------------------


def _server_properties(settings: Settings) -> dict[str, str | int]:
    port = settings.kafka_port
    client = "SASL_PLAINTEXT" if settings.uses_sasl else "PLAINTEXT"  # listener name = its security protocol
    bind = _url_host(settings.listen_host)
    advertised = bind if settings.listen_host not in ("", "0.0.0.0", "::") else _url_host(socket.getfqdn())
    return {
        "process.roles": "broker,controller",
        "node.id": 1,
        # Static quorum: storage is formatted without --standalone and the port may change between starts.
        "controller.quorum.voters": f"1@127.0.0.1:{port + 1}",
        # The controller listener is for this node alone: plaintext, but on loopback whatever listen_host says.
        "listeners": f"{client}://{bind}:{port},CONTROLLER://127.0.0.1:{port + 1}",
        "advertised.listeners": f"{client}://{advertised}:{port}",
        "listener.security.protocol.map": f"{client}:{client},CONTROLLER:PLAINTEXT",
        "inter.broker.listener.name": client,
        "controller.listener.names": "CONTROLLER",
        **(_sasl_properties(settings, client) if settings.uses_sasl else {}),
        "log.dirs": str(settings.kafka_dir / "data"),
        # One node: internal topics cannot have more than one replica. Their default 50 partitions each only
        # cost startup time and file handles here.
        "offsets.topic.replication.factor": 1,
        "offsets.topic.num.partitions": 4,
        "transaction.state.log.replication.factor": 1,
        "transaction.state.log.min.isr": 1,
        "transaction.state.log.num.partitions": 4,
        "share.coordinator.state.topic.replication.factor": 1,
        "share.coordinator.state.topic.min.isr": 1,
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


def _write_server_properties(settings: Settings) -> Path:
    # Rewritten on every start so changed settings (port, paths) take effect; the data dir keeps the state.
    settings.kafka_dir.mkdir(parents=True, exist_ok=True)
    path = settings.kafka_dir / "server.properties"
    lines = [f"{key}={_properties_escape(str(value))}" for key, value in _server_properties(settings).items()]
    text = "# Written by streams/broker.py on each start; edits are overwritten.\n" + "\n".join(lines) + "\n"
    # 0600: with SASL the file holds the broker's login. fchmod too, for a file left by an older version.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as handle:  # _properties_escape leaves ASCII only
        os.fchmod(fd, 0o600)
        handle.write(text)
    return path


def _format_storage(settings: Settings, libs: Path, props: Path) -> None:
    cmd = _java(settings, libs) + ["kafka.tools.StorageTool", "format", "-t", _cluster_id(), "-c", str(props)]
    scram = settings.uses_sasl and settings.sasl_mechanism in SCRAM_MECHANISMS
    if scram:
        for mechanism in SCRAM_MECHANISMS:  # both, so clients may pick either
            cmd += ["--add-scram", _scram_credential(mechanism, settings.sasl_username, settings.sasl_password)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=settings.kafka_dir)
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
            f"the broker storage in {settings.kafka_dir / 'data'} was formatted without SCRAM user "
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


def _cluster_id() -> str:
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


def _await_ready(settings: Settings, pid: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not _answers_api_versions(settings.local_bootstrap):
        if not _is_broker(settings, pid):
            _pid_path(settings).unlink(missing_ok=True)
            raise BrokerError(
                f"Kafka broker exited during startup; {_log_path(settings)} ends with:\n{_tail(_read_log(settings))}"
            )
        if time.monotonic() > deadline:
            log_tail = _tail(_read_log(settings))
            down(settings)
            raise BrokerError(f"Kafka broker not ready after {timeout:.0f}s (stopped it); log ends with:\n{log_tail}")
        time.sleep(0.25)


def _running_pid(settings: Settings) -> int | None:
    try:
        pid = int(_pid_path(settings).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None
    return pid if _is_broker(settings, pid) else None


def _is_broker(settings: Settings, pid: int) -> bool:
    """True while pid runs this home's broker; a reused pid or a dead, unreaped broker does not count."""
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
    props = str(settings.kafka_dir / "server.properties").encode()
    return state != "Z" and b"kafka.Kafka" in cmdline and props in cmdline


def _wait_gone(settings: Settings, pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _is_broker(settings, pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _refuse_busy_ports(settings: Settings) -> None:
    client_host = settings.local_bootstrap.rpartition(":")[0].strip("[]")
    for host, port in ((client_host, settings.kafka_port), ("127.0.0.1", settings.kafka_port + 1)):
        with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as sock:
            if sock.connect_ex((host, port)) == 0:
                raise BrokerError(f"port {port} is already in use by another process; set FLYWHEEL_KAFKA_PORT")


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


def _pid_path(settings: Settings) -> Path:
    return settings.kafka_dir / "broker.pid"


def _scram_users_path(settings: Settings) -> Path:
    return settings.kafka_dir / "scram-users"  # names only: which SCRAM users the storage was formatted with


def _log_path(settings: Settings) -> Path:
    return settings.kafka_dir / "broker.log"


def _read_log(settings: Settings) -> str:
    try:
        return _log_path(settings).read_text(errors="replace")
    except FileNotFoundError:
        return "(no broker log)"


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])
