"""Typed configuration shared by every process, overridable through FLYWHEEL_* environment variables.

One settings object per process; nothing reads os.environ directly elsewhere.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.object_store import Files, Location, ObjectStoreError, S3Config, is_remote, join

EVAL_SEED = 1_000_000  # held-out evaluation seeds start here: training, demonstrations and search stay below

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
TIER2_TASKS: tuple[str, ...] = (
    "click-button-sequence",
    "click-checkboxes",
    "click-tab",
    "click-option",
    "click-collapsible",
    "click-widget",
    "enter-text",
    "enter-password",
    "login-user",
    "use-autocomplete",
    "grid-coordinate",
    "navigate-tree",
    "choose-list",
    "enter-date",
    "search-engine",
    "email-inbox",
)
VERSION = r"^[0-9]+(\.[0-9]+){1,3}$"  # a release number, e.g. 4.1.1 (it becomes a Maven coordinate)
SUITE_TASKS: tuple[str, ...] = TIER1_TASKS + TIER2_TASKS  # docs/tasks.md: the only tasks demonstrated
# Met in deployment, never demonstrated: the fleet learns them from its own verified episodes alone (no expert, no
# teacher, no label, no target box from the DOM; docs/tasks.md).
NEW_TASKS: tuple[str, ...] = (
    "unicode-test", "click-scroll-list", "enter-text-dynamic", "click-menu", "count-sides", "click-pie",
    "social-media", "odd-or-even",
)  # fmt: skip
TASK_ALIASES: dict[str, tuple[str, ...]] = {"tier1": TIER1_TASKS, "tier2": TIER2_TASKS, "suite": SUITE_TASKS,
                                            "new": NEW_TASKS}  # fmt: skip


def parse_tasks(value: str) -> tuple[str, ...]:
    """'tier1' | 'tier2' | 'suite' | 'new' | comma-separated task ids (aliases may be mixed in) -> task ids in order."""
    tasks: list[str] = []
    for part in (p.strip() for p in value.split(",")):
        for task in TASK_ALIASES.get(part, (part,) if part else ()):
            if task not in tasks:
                tasks.append(task)
    return tuple(tasks)


class Settings(BaseSettings):
    # hide_input_in_errors: a validation error must not echo the input, which may hold the SASL password.
    # populate_by_name: Settings(s3_access_key=...) in code, the FLYWHEEL_/AWS_ variables from the environment.
    model_config = SettingsConfigDict(
        env_prefix="FLYWHEEL_", extra="ignore", hide_input_in_errors=True, populate_by_name=True
    )

    home: Path = Field(
        Path.home() / ".cache" / "flywheel", description="Where the Kafka jars, broker data and run state live."
    )
    bootstrap_servers: str = Field(
        "", description="External Kafka to use; empty means the local broker started by `flywheel kafka up`."
    )
    kafka_port: int = Field(
        19092,
        ge=1,
        le=65000,
        description="Client port of local node 1; node k listens on kafka_port + 2(k-1), its controller on +1.",
    )
    kafka_nodes: int = Field(
        1, ge=1, description="Nodes of the local cluster, each broker+controller; 3 or more: replication 3, min ISR 2."
    )
    kafka_edge_listeners: int = Field(
        0,
        ge=0,
        le=8,
        description="Extra client listeners per local node, one for each edge client a chaos run can cut off from the "
        "brokers: listener j of node k binds kafka_edge_port(k, j) and is advertised at the port after it, where the "
        "run's proxy listens (flywheel.chaos.proxy).",
    )
    kafka_version: str = Field(
        "4.1.1", pattern=VERSION, description="Apache Kafka release resolved from Maven Central."
    )
    kafka_heap: str = Field(
        "384m",
        pattern=r"^[1-9][0-9]*[kmgKMG]$",
        description="Broker JVM heap: small on purpose, the box has 2 cores and is shared.",
    )
    data_dir: str = Field(
        "flywheel-data",
        description="Root of the Delta tables and the artifact store: a local directory, or s3://bucket/prefix on "
        "the object store at s3_endpoint (empty: the local S3Proxy, `flywheel objectstore up`).",
    )
    s3_endpoint: str = Field(
        "", description="S3-compatible endpoint (http://host:port) of an s3:// data_dir; empty: the local S3Proxy."
    )
    s3_port: int = Field(19400, ge=1, le=65535, description="Port of the local S3Proxy (loopback only).")
    s3_access_key: str = Field(
        "", validation_alias=AliasChoices("FLYWHEEL_S3_ACCESS_KEY", "AWS_ACCESS_KEY_ID"),
        description="Access key; empty: the local S3Proxy's, made at its first start.",
    )  # fmt: skip
    s3_secret_key: SecretStr = Field(
        SecretStr(""), validation_alias=AliasChoices("FLYWHEEL_S3_SECRET_KEY", "AWS_SECRET_ACCESS_KEY"),
        description="Secret key; never printed. Empty: the local S3Proxy's, made at its first start.",
    )  # fmt: skip
    s3_region: str = Field(
        "us-east-1", min_length=1, validation_alias=AliasChoices("FLYWHEEL_S3_REGION", "AWS_REGION"),
        description="Region the requests are signed for.",
    )  # fmt: skip
    s3proxy_version: str = Field(
        "4.1.0", pattern=VERSION,
        description="S3Proxy release resolved from Maven Central (4.x: real If-None-Match on PUT, which concurrent "
        "Delta commits rely on).",
    )  # fmt: skip
    topic_partitions: int = Field(4, ge=1, le=10_000, description="Partitions of the steps and episodes topics.")
    topic_retention_ms: int = Field(
        7 * 24 * 3600 * 1000, ge=-1, description="Retention of the event topics (-1: forever)."
    )
    topic_prefix: str = Field(
        "flywheel",
        pattern=r"^[A-Za-z0-9._-]{1,100}$",
        description="Prefix of every topic name, so several flywheels can share a cluster.",
    )
    metrics_host: str = Field("127.0.0.1", description="Interface the /metrics endpoints bind to.")
    listen_host: str = Field(
        "127.0.0.1", description="Interface the local broker's client listener binds to (its controller: loopback)."
    )
    # Kafka security, one set for every client (kafka-python, faust/aiokafka) and for the local broker.
    security_protocol: Literal["PLAINTEXT", "SASL_PLAINTEXT", "SASL_SSL", "SSL"] = Field(
        "PLAINTEXT", description="Kafka security protocol of the clients (and of the local broker's client listener)."
    )
    sasl_mechanism: Literal["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"] = Field(
        "SCRAM-SHA-256", description="SASL mechanism when security_protocol is SASL_*."
    )
    sasl_username: str = Field("", description="SASL user (the local broker creates it when it formats its storage).")
    sasl_password: SecretStr = Field(SecretStr(""), description="SASL password; never printed (shown as '**********').")
    ssl_cafile: Path | None = Field(None, description="CA bundle (PEM) of the brokers' certificates (SSL/SASL_SSL).")
    ssl_certfile: Path | None = Field(None, description="Client certificate (PEM) for mutual TLS; optional.")
    ssl_keyfile: Path | None = Field(None, description="Private key (PEM) of ssl_certfile; optional.")

    # The deployment's rollout policy, read alike by every client (its channel), the learner (where a version goes)
    # and the canary controller: one value for all of them, so it is the environment's, not a process's flag.
    canary_fraction: float = Field(
        0.0, ge=0.0, le=1.0, description="Share of the fleet that runs new versions first (0: no canary stage)."
    )
    require_signed_models: bool = Field(True, description="Clients refuse models not signed by a trusted key.")
    max_model_bytes: int = Field(
        512 * 1024 * 1024,
        gt=0,
        description="A model artifact (and its inflated members) over this many bytes is "
        "refused before it is read whole: a bundle is a few MB.",
    )

    @field_validator("data_dir", mode="before")
    @classmethod
    def _location_as_text(cls, value: object) -> object:
        return str(value) if isinstance(value, Path) else value  # a local Path given in code

    @field_validator("data_dir")
    @classmethod
    def _location_names_a_place(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must name a directory or an s3://bucket/prefix")
        if "://" in value and not (value.startswith("s3://") and value[len("s3://") :].split("/")[0]):
            raise ValueError("a URI must be s3://bucket[/prefix]")
        return value

    @field_validator("s3_endpoint")
    @classmethod
    def _endpoint_is_http(cls, value: str) -> str:
        if value and not (value.startswith(("http://", "https://")) and len(value.split("://", 1)[1]) > 0):
            raise ValueError("must be http(s)://host:port, or empty for the local S3Proxy")
        return value.rstrip("/")

    @model_validator(mode="after")
    def _sasl_needs_credentials(self) -> Settings:
        if self.uses_sasl and not (self.sasl_username and self.sasl_password.get_secret_value()):
            raise ValueError(
                f"security_protocol {self.security_protocol} needs FLYWHEEL_SASL_USERNAME and FLYWHEEL_SASL_PASSWORD"
            )
        return self

    @property
    def keys_dir(self) -> Path:
        """The learner's signing key; `trusted/` holds the public keys clients accept."""
        return self.home / "keys"

    @property
    def kafka_dir(self) -> Path:
        return self.home / "kafka"

    @property
    def uses_sasl(self) -> bool:
        return self.security_protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    @property
    def uses_ssl(self) -> bool:
        return self.security_protocol in ("SSL", "SASL_SSL")

    @property
    def kafka_node_ids(self) -> range:
        """Kafka node ids of the local cluster: 1..kafka_nodes (what describe_topics names as leaders)."""
        return range(1, self.kafka_nodes + 1)

    def kafka_node_port(self, node: int) -> int:
        """Client port of local node `node` (1-based); its controller listens on the next port."""
        return self.kafka_port + 2 * (node - 1)

    def kafka_edge_port(self, node: int, listener: int) -> int:
        """Port node `node` binds for edge listener `listener` (0-based), after every node's client and controller
        ports; it is advertised at the next port, the proxy's."""
        return self.kafka_port + 2 * self.kafka_nodes + 2 * (listener * self.kafka_nodes + node - 1)

    def edge_bootstrap(self, listener: int) -> str:
        """Bootstrap servers of edge listener `listener`: every node's proxy port."""
        return ",".join(f"127.0.0.1:{self.kafka_edge_port(node, listener) + 1}" for node in self.kafka_node_ids)

    def local_node_address(self, node: int) -> str:
        # A wildcard listen_host (0.0.0.0, ::) also listens on loopback, the address local processes use.
        host = "127.0.0.1" if self.listen_host in ("", "0.0.0.0", "::") else self.listen_host
        port = self.kafka_node_port(node)
        return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

    @property
    def local_bootstrap(self) -> str:
        # Every node: a client reaches the cluster while any one of them is up.
        return ",".join(self.local_node_address(node) for node in self.kafka_node_ids)

    @property
    def replication_factor(self) -> int:
        """Replicas of the topics on the local cluster, faust's own topics included (1 node by default)."""
        return min(3, self.kafka_nodes)

    @property
    def min_insync_replicas(self) -> int:
        """With 3 replicas an acks=all write is on 2 before it is acknowledged, so one node may fail."""
        return 2 if self.replication_factor >= 3 else 1

    @property
    def bootstrap(self) -> str:
        return self.bootstrap_servers or self.local_bootstrap

    @property
    def uses_external_kafka(self) -> bool:
        return bool(self.bootstrap_servers)

    @property
    def data_is_remote(self) -> bool:
        """The data directory is on an object store (s3://...)."""
        return is_remote(self.data_dir)

    @property
    def tables_dir(self) -> Location:
        return join(self.data_dir, "tables")

    @property
    def artifacts_dir(self) -> Location:
        return join(self.data_dir, "artifacts")

    @property
    def pins_dir(self) -> Location:
        """Table versions running learners read (lake/pins.py): Delta maintenance keeps their files."""
        return join(self.data_dir, "learner", "pins")

    @property
    def learner_dir(self) -> Path:
        """The learner's own working files (checkpoints, its daemon's state): beside the tables on a local data
        dir, under home when the tables are on the object store (only pins and models are shared)."""
        return self.home / "learner" if self.data_is_remote else Path(self.data_dir) / "learner"

    @property
    def objectstore_dir(self) -> Path:
        """The local S3Proxy's jar, configuration, credential, log and data (its filesystem backend)."""
        return self.home / "objectstore"

    @property
    def local_s3_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.s3_port}"

    @property
    def local_s3_credential_path(self) -> Path:
        """`access secret` of the local S3Proxy, made at its first start (lake.s3proxy)."""
        return self.objectstore_dir / "credential"

    @property
    def s3_config(self) -> S3Config:
        """Endpoint and credential of the object store: the configured ones, else (no endpoint set) the local
        S3Proxy's, whatever AWS_* variables the environment holds for other stores."""
        access, secret = self.s3_access_key, self.s3_secret_key.get_secret_value()
        if not (self.s3_endpoint and access and secret):
            try:
                access, secret = _local_credential(self.local_s3_credential_path)
            except FileNotFoundError:
                raise ObjectStoreError(
                    "no object store credential: set FLYWHEEL_S3_ACCESS_KEY and FLYWHEEL_S3_SECRET_KEY (or AWS_*), "
                    "or start the local one first (`flywheel objectstore up`)"
                ) from None
        return S3Config(self.s3_endpoint or self.local_s3_endpoint, access, secret, self.s3_region)

    def files(self) -> Files:
        """Files over local paths and the object store's URIs (its credential looked up at the first remote call)."""
        return Files(lambda: self.s3_config)

    def storage_options(self, location: Location) -> dict[str, str] | None:
        """What delta-rs and polars need to reach `location`: the object store's options, None on local disk."""
        return self.s3_config.delta_options() if is_remote(location) else None

    @property
    def uses_local_objectstore(self) -> bool:
        """An s3:// data directory with no endpoint configured: the project's own S3Proxy serves it."""
        return self.data_is_remote and not self.s3_endpoint


@lru_cache(maxsize=4)
def _local_credential(path: Path) -> tuple[str, str]:
    """The local S3Proxy's `access secret`, read once per process: written once at its first start, then every
    table operation of a process without a configured credential asks for it. (A missing file is not cached.)"""
    access, secret = path.read_text().split()
    return access, secret


# Variables that once tuned a process and are now its command's flags: still set, they would be ignored in silence
# (a worker's maintenance quietly off), so a process that finds one refuses to start and names its flag.
REMOVED_VARIABLES: dict[str, str] = {
    "FLYWHEEL_MAX_SCREENSHOT_BYTES": "flywheel process --max-screenshot-bytes",
    "FLYWHEEL_DEDUP_WINDOW_S": "flywheel process --dedup-window-s",
    "FLYWHEEL_ABANDON_AFTER_S": "flywheel process --abandon-after-s",
    "FLYWHEEL_MAINTENANCE_INTERVAL_S": "flywheel process --maintenance-interval-s",
    "FLYWHEEL_EDGE_SPOOL_MAX_BYTES": "flywheel edge --spool-max-bytes",
    "FLYWHEEL_CANARY_MIN_EPISODES": "flywheel canary --min-episodes",
    "FLYWHEEL_CANARY_MARGIN": "flywheel canary --margin",
}


def removed_variables_set() -> list[str]:
    """One line per removed variable this process's environment still sets, naming the flag that replaced it."""
    return [f"{name}: no longer read; use `{flag}`" for name, flag in REMOVED_VARIABLES.items() if name in os.environ]


@lru_cache(maxsize=1)
def get_settings() -> Settings:
    return Settings()


def describe_settings_error(error: ValidationError) -> str:
    """One line per wrong setting, naming the environment variable that holds it (never its value: it may be a
    secret), e.g. 'FLYWHEEL_KAFKA_PORT: Input should be less than or equal to 65000'."""
    prefix, lines = Settings.model_config["env_prefix"], []
    aliased = {
        alias: aliases.choices
        for field in Settings.model_fields.values()
        if (aliases := field.validation_alias) is not None
        for alias in aliases.choices
    }  # a field read under aliases is reported by the alias: name them all
    for item in error.errors():
        name = str(item["loc"][0]) if item["loc"] else ""
        if name in aliased:
            variable = " or ".join(aliased[name])
        else:
            variable = f"{prefix}{name.upper()}" if name else "settings"
        lines.append(f"{variable}: {item['msg']}")
    return "\n".join(lines)


def settings_env(settings: Settings) -> dict[str, str]:
    """FLYWHEEL_* variables under which a child process's Settings() equals `settings`.

    Secrets in clear: the dict is for a child's environment, never for a log. Fields that are None are left out
    (no variable spells None), so the child inherits whatever the parent's environment says for those.
    """
    prefix = settings.model_config["env_prefix"]
    env = {}
    for name, value in settings.model_dump(mode="json").items():  # mode="json" masks secrets: read them again
        secret = getattr(settings, name)
        value = secret.get_secret_value() if isinstance(secret, SecretStr) else value
        if value is not None:
            env[f"{prefix}{name.upper()}"] = value if isinstance(value, str) else json.dumps(value)
    return env
