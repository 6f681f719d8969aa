"""Typed configuration shared by every process, overridable through FLYWHEEL_* environment variables.

One settings object per process; nothing reads os.environ directly elsewhere.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

TIER1_TASKS: tuple[str, ...] = (
    "click-test",
    "click-test-2",
    "click-button",
    "click-link",
    "click-dialog",
    "click-color",
    "focus-text",
    "identify-shape",
)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FLYWHEEL_", extra="ignore")

    home: Path = Field(
        Path.home() / ".cache" / "flywheel", description="Where the Kafka jars, broker data and run state live."
    )
    bootstrap_servers: str = Field(
        "", description="External Kafka to use; empty means the local broker started by `flywheel kafka up`."
    )
    kafka_port: int = Field(19092, description="Client port of the local broker (controller uses kafka_port + 1).")
    kafka_version: str = Field("4.1.1", description="Apache Kafka release resolved from Maven Central.")
    kafka_heap: str = Field("384m", description="Broker JVM heap: small on purpose, the box has 2 cores and is shared.")
    data_dir: Path = Field(Path("flywheel-data"), description="Root of the Delta tables and the artifact store.")
    topic_partitions: int = Field(4, description="Partitions of the steps and episodes topics.")
    topic_retention_ms: int = Field(7 * 24 * 3600 * 1000, description="Retention of the event topics (-1: forever).")
    topic_prefix: str = Field(
        "flywheel", description="Prefix of every topic name, so several flywheels can share a cluster."
    )
    max_screenshot_bytes: int = Field(512 * 1024, description="A step with a larger screenshot is dead-lettered.")
    metrics_host: str = Field("127.0.0.1", description="Interface the /metrics endpoints bind to.")

    require_signed_models: bool = Field(True, description="Clients refuse models not signed by a trusted key.")

    @property
    def keys_dir(self) -> Path:
        """The learner's signing key; `trusted/` holds the public keys clients accept."""
        return self.home / "keys"

    @property
    def kafka_dir(self) -> Path:
        return self.home / "kafka"

    @property
    def local_bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    @property
    def bootstrap(self) -> str:
        return self.bootstrap_servers or self.local_bootstrap

    @property
    def uses_external_kafka(self) -> bool:
        return bool(self.bootstrap_servers)

    @property
    def tables_dir(self) -> Path:
        return self.data_dir / "tables"

    @property
    def artifacts_dir(self) -> Path:
        return self.data_dir / "artifacts"


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()
