"""The local broker's software: Kafka's jars from Maven Central (no distribution to install; Maven resolves
`ops/kafka/pom.xml` once per version into `kafka_dir/libs-<version>/`) and the JVM command line that runs a class
from them, the broker or its StorageTool, sized for a small shared machine."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from core.processes import file_lock
from core.settings import Settings
from streams.broker.files import BrokerError, tail

OPS_DIR = Path(__file__).resolve().parents[2] / "ops" / "kafka"
POM = OPS_DIR / "pom.xml"
LOG4J2_CONFIG = OPS_DIR / "log4j2.properties"


def ensure_jars(settings: Settings) -> Path:
    """Return the directory holding the broker's jars, resolving them with Maven only when not done before."""
    libs = settings.kafka_dir / f"libs-{settings.kafka_version}"
    stamp = libs / ".complete"  # written last: a copy interrupted half-way has no stamp and is redone
    if stamp.exists():
        return libs
    libs.parent.mkdir(parents=True, exist_ok=True)
    # Several processes (parallel test sessions) may share one jar cache: only one of them runs Maven.
    with file_lock(libs.parent / f"{libs.name}.lock"):
        if not stamp.exists():
            shutil.rmtree(libs, ignore_errors=True)
            _copy_dependencies(settings.kafka_version, libs)
            stamp.write_text(f"org.apache.kafka:kafka_2.13:{settings.kafka_version}\n")
    return libs


def share_jars(settings: Settings, shared: Settings) -> Path:
    """Give `settings` (a home of a test's or a benchmark's own) the jars of `shared`'s home, fetched there once per
    machine, through a link instead of a copy."""
    libs = ensure_jars(shared.model_copy(update={"kafka_version": settings.kafka_version}))
    link = settings.kafka_dir / libs.name
    if not link.exists():
        settings.kafka_dir.mkdir(parents=True, exist_ok=True)
        link.symlink_to(libs, target_is_directory=True)
    return link


def java_command(settings: Settings, libs: Path) -> list[str]:
    """`java` and its options, with the jars in `libs` on the class path; the main class and its arguments follow."""
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
        raise BrokerError(f"fetching Kafka {version} jars failed:\n{tail(done.stdout + done.stderr)}")
