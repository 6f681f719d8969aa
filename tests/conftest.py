"""Shared fixtures: one real Kafka broker per test session, isolated from any flywheel already on the machine."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from flywheel.settings import Settings
from streams import broker

# Jars are fetched once per machine, whatever home a test session uses (same place as the default home's).
SHARED_HOME = Path.home() / ".cache" / "flywheel"


def isolated_broker_settings(home: Path, prefix: str, **overrides) -> Settings:
    """Settings of a local broker of a test's own: own home (jars shared), free ports, unique topic prefix."""
    if shutil.which("java") is None:
        pytest.fail("java is not installed: the Kafka broker needs Java 17+ (ops/setup.sh installs it)")
    settings = Settings(
        home=home,
        data_dir=home / "data",
        kafka_port=_free_port_pair(),
        topic_prefix=f"{prefix}-{uuid.uuid4().hex[:8]}",
        bootstrap_servers="",
        **overrides,
    )
    _link_shared_jars(settings)
    return settings


@pytest.fixture(scope="session")
def kafka_settings(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """Settings of a broker started for this session: own home, free ports, unique topic prefix.

    FLYWHEEL_* variables point at it while the session runs, so processes started by tests use it too.
    """
    settings = isolated_broker_settings(tmp_path_factory.mktemp("flywheel-home"), "test")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("FLYWHEEL_HOME", str(settings.home))
        env.setenv("FLYWHEEL_DATA_DIR", str(settings.data_dir))
        env.setenv("FLYWHEEL_KAFKA_PORT", str(settings.kafka_port))
        env.setenv("FLYWHEEL_TOPIC_PREFIX", settings.topic_prefix)
        # Subprocesses see an "external" cluster: they use this broker and never start or stop their own.
        env.setenv("FLYWHEEL_BOOTSTRAP_SERVERS", settings.local_bootstrap)
        with broker.running_broker(settings):
            yield settings


DEMO_ARGS = ("--turns", "2", "--clients", "1", "--tasks", "click-test,click-button", "--episodes-per-task", "4",
             "--sft-steps", "15", "--finetune-steps", "5")  # fmt: skip


@pytest.fixture(scope="session")
def demo_run(kafka_settings, tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    """One short `flywheel demo` (2 turns, with its Prometheus), shared by the CLI smoke test and the
    observability tests so the suite runs it once: (out dir, finished process)."""
    out = tmp_path_factory.mktemp("demo") / "demo"
    result = subprocess.run([sys.executable, "-m", "flywheel.cli", "demo", *DEMO_ARGS, "--out", str(out)],
                            capture_output=True, text=True, timeout=900)  # fmt: skip
    return out, result


def _link_shared_jars(settings: Settings) -> None:
    """Make the session home's libs dir a link to the machine-wide jar cache, filling that cache if needed."""
    shared = Settings(home=SHARED_HOME, kafka_version=settings.kafka_version)
    if shutil.which("mvn") is None and not (shared.kafka_dir / f"libs-{settings.kafka_version}").exists():
        pytest.fail("Maven is not installed and the Kafka jars are not cached (ops/setup.sh installs it)")
    libs = broker.ensure_jars(shared)
    settings.kafka_dir.mkdir(parents=True, exist_ok=True)
    (settings.kafka_dir / libs.name).symlink_to(libs, target_is_directory=True)


def _free_port_pair() -> int:
    """A port p such that p and p + 1 are both free: the broker's client and controller listeners."""
    for _ in range(50):
        port = _bind_probe(0)
        if port < 65535 and _bind_probe(port + 1):
            return port
    raise RuntimeError("no two adjacent free ports found on 127.0.0.1")


def _bind_probe(port: int) -> int:
    """Bind 127.0.0.1:port (0: any) and release it; return the port bound, or 0 when it is taken."""
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return 0
        return sock.getsockname()[1]
