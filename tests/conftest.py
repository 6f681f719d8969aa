"""Shared fixtures: one real Kafka broker per test session (and a 3-node cluster for the modules that ask for one),
isolated from any flywheel already on the machine; and the tiers: every test is marked by what it starts.

Markers come from the fixtures a test uses (`FIXTURE_MARKERS`: kafka, s3, demo, browser) and from how long it
took in the last recorded full run on this box (`slow`: `SLOW_S` or more in tests/durations.json, written by
`./flywheel.sh test --record-durations`). `./flywheel.sh test --fast` runs what is none of those.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from core.processes import free_ports
from core.settings import Settings, get_settings
from flywheel.run.stack import LocalStack, local_stack
from lake import s3proxy
from streams.broker.jars import share_jars

FIXTURE_MARKERS = {
    "kafka_stack": "kafka", "kafka_settings": "kafka", "stack": "kafka", "kafka_cluster": "kafka",
    "cluster_stack": "kafka", "object_store": "s3", "s3_settings": "s3", "demo_run": "demo", "env": "browser",
}  # fmt: skip
SLOW_S = 5.0
DURATIONS = Path(__file__).with_name("durations.json")


def pytest_addoption(parser: pytest.Parser) -> None:
    what = f"write each test's setup + call seconds to {DURATIONS.name} (what `slow` is judged by)"
    parser.addoption("--record-durations", action="store_true", help=what)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    recorded = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
    for item in items:
        for marker in sorted({FIXTURE_MARKERS[f] for f in item.fixturenames if f in FIXTURE_MARKERS}):
            item.add_marker(marker)
        if recorded.get(item.nodeid, 0.0) >= SLOW_S:
            item.add_marker("slow")


_durations: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when in ("setup", "call"):
        _durations[report.nodeid] = _durations.get(report.nodeid, 0.0) + report.duration


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if session.config.getoption("--record-durations") and _durations:
        # Merged into what is there, so recording a part of the suite keeps the rest's figures.
        recorded = json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}
        recorded.update({k: round(v, 2) for k, v in _durations.items()})
        DURATIONS.write_text(json.dumps(dict(sorted(recorded.items())), indent=0) + "\n")


# Jars are fetched once per machine, whatever home a test session uses (same place as the default home's).
SHARED_HOME = Path.home() / ".cache" / "flywheel"


def isolated_broker_settings(home: Path, prefix: str, **overrides) -> Settings:
    """Settings of a local broker of a test's own: own home (jars shared), free ports, unique topic prefix."""
    if shutil.which("java") is None:
        pytest.fail("java is not installed: the Kafka broker needs Java 17+ (ops/setup.sh installs it)")
    settings = Settings(
        home=home,
        data_dir=home / "data",
        # Each node: client and controller port, and two more per edge listener (its own, its proxy's).
        kafka_port=free_ports(2 * overrides.get("kafka_nodes", 1) * (1 + overrides.get("kafka_edge_listeners", 0))),
        topic_prefix=f"{prefix}-{uuid.uuid4().hex[:8]}",
        bootstrap_servers="",
        **overrides,
    )
    _link_shared_jars(settings)
    return settings


@pytest.fixture(scope="session")
def kafka_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """A broker started for this session (own home, free ports, unique topic prefix), no worker.

    Its FLYWHEEL_* variables are set while the session runs, so processes started by tests use it too. They see it
    as an external cluster: they never start or stop a broker of their own.
    """
    settings = isolated_broker_settings(tmp_path_factory.mktemp("flywheel-home"), "test")
    with local_stack(settings, settings.home / "logs", worker=False) as stack, pytest.MonkeyPatch.context() as env:
        for name, value in stack.env.items():
            env.setenv(name, value)
        yield stack


@pytest.fixture(scope="session")
def kafka_settings(kafka_stack: LocalStack) -> Settings:
    """The session broker's settings (local, so tests may stop and start it)."""
    return kafka_stack.settings


@pytest.fixture
def stack(kafka_settings: Settings, tmp_path: Path) -> Iterator[LocalStack]:
    """A run of this test alone on the session broker: own topics, own tables under tmp_path/data, logs under
    tmp_path/logs. No worker until the test starts one (stack.start_worker()); all its children stop after it."""
    with _test_run(kafka_settings, tmp_path) as run:
        yield run


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    """A 3-node cluster (replication 3, min ISR 2) for the module that asks for it: own home and ports, no worker.

    Module-scoped, so the rest of the suite keeps its one fast single-node broker and pays for no idle JVMs.
    """
    settings = isolated_broker_settings(tmp_path_factory.mktemp("flywheel-cluster"), "cluster", kafka_nodes=3)
    with local_stack(settings, settings.home / "logs", worker=False) as cluster:
        yield cluster


@pytest.fixture
def cluster_stack(kafka_cluster: LocalStack, tmp_path: Path) -> Iterator[LocalStack]:
    """What `stack` is, on the 3-node cluster. Nodes the test stops are started again after it."""
    with _test_run(kafka_cluster.settings, tmp_path) as run:
        yield run


@contextmanager
def _test_run(settings: Settings, tmp_path: Path) -> Iterator[LocalStack]:
    with local_stack(settings, tmp_path / "logs", run="test", data_dir=tmp_path / "data", worker=False) as run:
        yield run


@pytest.fixture(scope="session")
def object_store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Settings]:
    """A real S3Proxy for this session (own home and data, a free port; the jar shared machine-wide), its endpoint
    and credential in FLYWHEEL_S3_* while the session runs. Yields settings whose data_dir is a fresh s3:// prefix."""
    home = tmp_path_factory.mktemp("objectstore-home")
    settings = Settings(home=home, s3_port=free_ports(1), data_dir=f"s3://flywheel-test/{uuid.uuid4().hex[:8]}")
    link_shared_s3proxy(settings)
    s3proxy.up(settings)
    access, secret = s3proxy.local_credential(settings)
    credential = {"s3_endpoint": settings.local_s3_endpoint, "s3_access_key": access, "s3_secret_key": secret}
    try:
        with pytest.MonkeyPatch.context() as env:
            for name, value in credential.items():
                env.setenv(f"FLYWHEEL_{name.upper()}", value)
            get_settings.cache_clear()
            yield Settings(home=home, s3_port=settings.s3_port, data_dir=settings.data_dir)
    finally:
        get_settings.cache_clear()
        s3proxy.down(settings)


def link_shared_s3proxy(settings: Settings) -> None:
    """Make the S3Proxy jar of `settings.home` a link to the machine-wide one, fetching that once if needed."""
    jar = s3proxy.ensure_jar(Settings(home=SHARED_HOME, s3proxy_version=settings.s3proxy_version))
    settings.objectstore_dir.mkdir(parents=True, exist_ok=True)
    link = settings.objectstore_dir / jar.name
    if not link.exists():
        link.symlink_to(jar)


def free_port() -> int:
    return free_ports(1)


@pytest.fixture
def s3_settings(object_store: Settings) -> Settings:
    """Settings of one test's own s3:// data dir on the session's object store."""
    return object_store.model_copy(update={"data_dir": f"s3://flywheel-test/{uuid.uuid4().hex[:12]}"})


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
    share_jars(settings, shared)
