"""The local S3-compatible object store: S3Proxy (Maven Central `org.gaul:s3proxy`, its jar-with-dependencies) with
its filesystem backend, on loopback, with a credential, started and stopped like the Kafka nodes (detached; found
again through its pid file).

Why 4.x: S3Proxy before 4.0 ignored or only emulated `If-None-Match: *` on PUT, so two writers of one Delta table
could each write version N and one commit would silently vanish; 4.x publishes an object with a hard link and
answers 412 to the second. `up` probes exactly that (two conditional PUTs to one fresh key: the second must get 412)
and refuses to run otherwise (through `core.object_store.Files`, the same library and options as every write).
Under `settings.objectstore_dir`: `s3proxy-<version>.jar`, `s3proxy.properties`, `credential` (made at the first
start, mode 0600), `s3proxy.log`, `s3proxy.pid`, `data/` (one directory per bucket).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pydantic import SecretStr

from core.object_store import Files, ObjectStoreError, PreconditionFailed, S3Config, split_uri
from core.processes import file_lock, runs_service, service_pid, spawn_detached, wait_until
from core.settings import Settings


def up(settings: Settings, timeout: float = 60.0) -> int:
    """Start the local S3Proxy unless it runs, wait until it answers, create the data dir's bucket, probe its
    conditional puts. Returns its pid. ObjectStoreError (with the log's tail) when it cannot."""
    pid = running_pid(settings)
    started_here = pid is None
    if started_here:
        jar = ensure_jar(settings)
        props = write_properties(settings)
        if _port_busy(settings.s3_port):
            raise ObjectStoreError(
                f"port {settings.s3_port} is already in use by another process; set FLYWHEEL_S3_PORT"
            )
        java = shutil.which("java")
        if java is None:
            raise ObjectStoreError("java is not on PATH: S3Proxy needs Java 17+")
        # Like the broker: serial GC and C1 only, a small heap: it shares 2 cores with everything else.
        cmd = [java, "-Xms32m", "-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
               "-XX:+ExitOnOutOfMemoryError", "-jar", str(jar), "--properties", str(props)]  # fmt: skip
        pid = spawn_detached(cmd, log_path(settings))
        pid_path(settings).write_text(f"{pid}\n")
    try:
        if started_here:
            wait_until(lambda: _answers(settings) or not is_s3proxy(settings, pid), timeout, 0.2, "S3Proxy to answer")
            if not is_s3proxy(settings, pid):
                raise ObjectStoreError(f"S3Proxy exited at start; {log_path(settings)} ends with:\n{_tail(settings)}")
        if settings.data_is_remote:
            create_bucket(settings, split_uri(str(settings.data_dir))[0])
        create_bucket(settings, PROBE_BUCKET)
        probe_conditional_put(local_config(settings), PROBE_BUCKET)
    except (TimeoutError, ObjectStoreError):
        if started_here:
            down(settings)  # nothing half-started, or unsafe, is left running
        raise
    return pid


@contextmanager
def running_objectstore(settings: Settings) -> Iterator[Settings]:
    """`settings` with the object store reachable for the block: the local S3Proxy started (and stopped after, if
    started here) when the data dir is s3:// and no endpoint is configured, its endpoint and credential filled in so
    child processes get them; `settings` unchanged otherwise."""
    if not settings.uses_local_objectstore:
        yield settings
        return
    started_here = running_pid(settings) is None
    up(settings)
    access, secret = local_credential(settings)
    update = {"s3_endpoint": settings.local_s3_endpoint, "s3_access_key": access, "s3_secret_key": SecretStr(secret)}
    try:
        yield settings.model_copy(update=update)
    finally:
        if started_here:
            down(settings)


def down(settings: Settings, timeout: float = 20.0) -> bool:
    """Stop the local S3Proxy (SIGTERM, SIGKILL after `timeout`); False when it was not running. Its data stays."""
    pid = running_pid(settings)
    if pid is not None:
        os.kill(pid, signal.SIGTERM)
        try:
            wait_until(lambda: not is_s3proxy(settings, pid), timeout, 0.1, "S3Proxy to exit")
        except TimeoutError:
            os.kill(pid, signal.SIGKILL)
            wait_until(lambda: not is_s3proxy(settings, pid), 10.0, 0.1, "S3Proxy to exit after SIGKILL")
    pid_path(settings).unlink(missing_ok=True)
    return pid is not None


def status(settings: Settings) -> dict:
    pid = running_pid(settings)
    return {"running": pid is not None, "pid": pid, "endpoint": settings.local_s3_endpoint,
            "data": str(data_path(settings)), "data_dir": str(settings.data_dir)}  # fmt: skip


PROBE_BUCKET = "flywheel-probe"


def probe_conditional_put(config: S3Config, bucket: str = PROBE_BUCKET) -> None:
    """Two conditional creates (`If-None-Match: *`) of one fresh key in `bucket` (which must exist): the first must
    succeed and the second get 412, or concurrent Delta commits are not safe on this store (ObjectStoreError)."""
    files = Files(lambda: config)
    key = f"s3://{bucket}/probe/{uuid.uuid4().hex}"
    files.write(key, b"first", if_absent=True)
    try:
        files.write(key, b"second", if_absent=True)
        refused = False
    except PreconditionFailed:
        refused = True
    # A probe object left behind is harmless; a failed removal (S3Proxy 2.x has no DeleteObjects, which obstore's
    # delete uses) must not hide the verdict.
    with contextlib.suppress(ObjectStoreError):
        files.delete(key)
    if refused:
        return
    raise ObjectStoreError(
        f"the object store at {config.endpoint} overwrote an object despite If-None-Match: * (no 412): two "
        "writers of one Delta table could both commit the same version. Multi-writer mode refused; use S3Proxy 4.x."
    )


def create_bucket(settings: Settings, bucket: str) -> None:
    """Create `bucket` on the local S3Proxy unless it exists. Its filesystem backend keeps a bucket as a directory
    of its data dir, so this is that directory (an object store library has no bucket calls: buckets are an
    operator's business on any other store)."""
    (data_path(settings) / bucket).mkdir(parents=True, exist_ok=True)


def local_config(settings: Settings) -> S3Config:
    """Endpoint and credential of this home's S3Proxy, whatever store `settings` is configured for."""
    access, secret = local_credential(settings)
    return S3Config(settings.local_s3_endpoint, access, secret, settings.s3_region)


def ensure_jar(settings: Settings) -> Path:
    """S3Proxy's jar-with-dependencies, fetched with Maven once per version."""
    version = settings.s3proxy_version
    jar = settings.objectstore_dir / f"s3proxy-{version}.jar"
    if jar.exists():
        return jar
    jar.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(jar.parent / f"{jar.name}.lock"):  # parallel test sessions share the cache: one fetches
        if jar.exists():
            return jar
        mvn = shutil.which("mvn")
        if mvn is None:
            raise ObjectStoreError("Maven (mvn) is not on PATH: it is needed once to fetch S3Proxy")
        fetch_dir = jar.parent / f"fetch-{version}"
        done = subprocess.run(
            [mvn, "-B", "-q", "org.apache.maven.plugins:maven-dependency-plugin:3.8.1:copy",
             f"-Dartifact=org.gaul:s3proxy:{version}:jar:jar-with-dependencies", f"-DoutputDirectory={fetch_dir}"],
            capture_output=True, text=True,
        )  # fmt: skip
        fetched = fetch_dir / f"s3proxy-{version}-jar-with-dependencies.jar"
        if done.returncode != 0 or not fetched.exists():
            raise ObjectStoreError(f"fetching S3Proxy {version} failed:\n{(done.stdout + done.stderr)[-3000:]}")
        fetched.replace(jar)  # atomic: a half-fetched jar never has the final name
        shutil.rmtree(fetch_dir, ignore_errors=True)
    return jar


def local_credential(settings: Settings) -> tuple[str, str]:
    """(access key, secret key) of the local S3Proxy: made at its first start, kept in `credential` (0600), which
    Settings.s3_config reads when no credential is configured."""
    path = settings.local_s3_credential_path
    path.parent.mkdir(parents=True, exist_ok=True)
    with file_lock(path.parent / "credential.lock"):
        if not path.exists():
            tmp = path.with_suffix(".tmp")
            tmp.write_text(f"flywheel\n{secrets.token_urlsafe(24)}\n")
            tmp.chmod(0o600)
            tmp.replace(path)
    access, secret = path.read_text().split()
    return access, secret


def write_properties(settings: Settings) -> Path:
    access, secret = local_credential(settings)
    data_path(settings).mkdir(parents=True, exist_ok=True)
    props = settings.objectstore_dir / "s3proxy.properties"
    props.write_text(
        f"s3proxy.endpoint={settings.local_s3_endpoint}\n"
        "s3proxy.authorization=aws-v2-or-v4\n"
        f"s3proxy.identity={access}\n"
        f"s3proxy.credential={secret}\n"
        "jclouds.provider=filesystem\n"
        f"jclouds.filesystem.basedir={data_path(settings)}\n"
    )
    props.chmod(0o600)  # it holds the secret
    return props


def data_path(settings: Settings) -> Path:
    return settings.objectstore_dir / "data"


def pid_path(settings: Settings) -> Path:
    return settings.objectstore_dir / "s3proxy.pid"


def log_path(settings: Settings) -> Path:
    return settings.objectstore_dir / "s3proxy.log"


def running_pid(settings: Settings) -> int | None:
    return service_pid(pid_path(settings), *_markers(settings))


def is_s3proxy(settings: Settings, pid: int) -> bool:
    """True while `pid` runs this home's S3Proxy (not a reused pid, not an unreaped zombie)."""
    return runs_service(pid, *_markers(settings))


def _markers(settings: Settings) -> tuple[bytes, bytes]:
    return b"s3proxy", str(settings.objectstore_dir / "s3proxy.properties").encode()


def _answers(settings: Settings) -> bool:
    """True once the server answers HTTP at all (an unsigned request, straight to loopback: its 403 is an answer),
    False while nothing listens or the connection drops."""
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with direct.open(settings.local_s3_endpoint, timeout=2.0):
            return True
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False


def _port_busy(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _tail(settings: Settings, lines: int = 30) -> str:
    try:
        return "\n".join(log_path(settings).read_text(errors="replace").splitlines()[-lines:])
    except FileNotFoundError:
        return "(no log)"
