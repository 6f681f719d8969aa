"""A local node's storage, formatted once before its first start: every node with the cluster's one id (the quorum
accepts no other) and, with SCRAM, the user written into the metadata log, salted, so the password is on no
command line. SCRAM users are made only by the format, so a storage formatted without the user is refused."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import uuid
from pathlib import Path

from pydantic import SecretStr

from core.settings import Settings
from streams.broker.files import BrokerError, cluster_dir, node_dir, scram_users_path, tail
from streams.broker.jars import java_command
from streams.broker.properties import SCRAM_MECHANISMS, checked_username

SCRAM_ITERATIONS = 8192


def ensure_storage(settings: Settings, libs: Path, props: Path, node: int) -> None:
    """Format the node's storage unless done before; a storage formatted before must know the SCRAM user."""
    if not (node_dir(settings, node) / "data" / "meta.properties").exists():
        _format_storage(settings, libs, props, node)
    elif _uses_scram(settings):
        _refuse_unknown_scram_user(settings)


def _uses_scram(settings: Settings) -> bool:
    return settings.uses_sasl and settings.sasl_mechanism in SCRAM_MECHANISMS


def _format_storage(settings: Settings, libs: Path, props: Path, node: int) -> None:
    cluster_id = _cluster_id(settings)
    cmd = java_command(settings, libs) + ["kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(props)]
    scram = _uses_scram(settings)
    if scram:
        for mechanism in SCRAM_MECHANISMS:  # both, so clients may pick either
            cmd += ["--add-scram", _scram_credential(mechanism, settings.sasl_username, settings.sasl_password)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=node_dir(settings, node))
    if done.returncode != 0:
        raise BrokerError(f"formatting Kafka storage failed:\n{tail(done.stdout + done.stderr)}")
    if scram:
        scram_users_path(settings).write_text(f"{settings.sasl_username}\n")


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
        f'{mechanism}=[name={checked_username(user)},iterations={SCRAM_ITERATIONS},salt="{b64(salt).decode()}",'
        f'saltedpassword="{b64(salted).decode()}"]'
    )


def _refuse_unknown_scram_user(settings: Settings) -> None:
    """SCRAM users are created only when the storage is formatted: an older storage may not know this one."""
    path = scram_users_path(settings)
    users = path.read_text().split() if path.exists() else []
    if settings.sasl_username not in users:
        raise BrokerError(
            f"the broker storage in {cluster_dir(settings)} was formatted without SCRAM user "
            f"{settings.sasl_username!r}; remove that directory (its topics are lost) to format it again with SCRAM"
        )


def _cluster_id(settings: Settings) -> str:
    """The cluster's id, made on the first format: every node's storage must carry the same one."""
    path = cluster_dir(settings) / "cluster.id"
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
