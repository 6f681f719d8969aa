"""Least privilege on the local cluster: each process logs in as its role and may do what that role needs, nothing
more. The broker's own user (settings.sasl_username) is the one super user: the nodes, the stack and operators'
tools (topics, ACLs, replay, dlq) log in as it.

    edge     writes steps; reads model versions                       (a client in the field: the least trusted)
    worker   reads steps, writes episodes and dead letters, reads episodes and model versions (curation, lag);
             its faust app's own topics and consumer group
    learner  writes and reads model versions; writes rollout decisions (canary promotion)

Every role may describe the topics it uses (metadata, offsets). Nothing else: no topic creation or deletion, no
other topic, no ACL or config change. The roles are SCRAM users the stack creates (salted, through the admin API)
with random passwords kept in `<kafka dir>/roles.json` (0600); ACLs are literal, on each run's own topic names.
"""

from __future__ import annotations

import json
import os
import secrets
from pathlib import Path

from kafka.admin import (
    ACL,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ResourcePattern,
    ResourceType,
)
from kafka.admin._users import UserScramCredentialUpsertion
from pydantic import SecretStr

from core.settings import Settings
from streams.broker.properties import SCRAM_MECHANISMS, has_roles
from streams.kafka_clients import make_admin
from streams.topics import topics_for

ROLES = ("edge", "worker", "learner")
FAUST_APP = "flywheel-processors"  # processors.faust_app.make_app's app id, after the topic prefix

READ, WRITE, DESCRIBE = ACLOperation.READ, ACLOperation.WRITE, ACLOperation.DESCRIBE


class RoleError(RuntimeError):
    """The cluster refused to create a role's credential or ACLs."""


def uses_roles(settings: Settings) -> bool:
    """Roles apply to the local cluster with SCRAM logins (an external cluster's ACLs are its operators')."""
    return has_roles(settings) and not settings.uses_external_kafka


def role_user(settings: Settings, role: str) -> str:
    return f"{settings.sasl_username}-{role}"


def role_settings(settings: Settings, role: str) -> Settings:
    """`settings` as a process of `role` logs in (unchanged where roles do not apply)."""
    if not uses_roles(settings):
        return settings
    password = _passwords(settings)[role]
    return settings.model_copy(
        update={"sasl_username": role_user(settings, role), "sasl_password": SecretStr(password)}
    )


def grants(settings: Settings) -> dict[str, list[tuple[ResourceType, str, ACLResourcePatternType, ACLOperation]]]:
    """Role -> what it is allowed: (resource type, name, literal or prefixed, operation)."""
    t = topics_for(settings)
    app = f"{settings.topic_prefix}-{FAUST_APP}"
    literal, prefixed, topic, group = (ACLResourcePatternType.LITERAL, ACLResourcePatternType.PREFIXED,
                                       ResourceType.TOPIC, ResourceType.GROUP)  # fmt: skip

    def on(name: str, *operations: ACLOperation) -> list:
        return [(topic, name, literal, op) for op in (DESCRIBE, *operations)]

    return {
        "edge": on(t.steps.name, WRITE) + on(t.model_versions.name, READ),
        "worker": on(t.steps.name, READ) + on(t.episodes.name, READ, WRITE) + on(t.dead_letters.name, WRITE)
        + on(t.model_versions.name, READ) + on(t.rollout_decisions.name)
        # faust's own: its changelog and leader topics (it creates them) and its consumer group, all named by app id
        + [(topic, app, prefixed, ACLOperation.ALL), (group, app, prefixed, ACLOperation.ALL)],
        "learner": on(t.model_versions.name, READ, WRITE) + on(t.rollout_decisions.name, WRITE),
    }  # fmt: skip


def grant_roles(settings: Settings) -> None:
    """Create (or refresh) each role's SCRAM credential and its ACLs for the topics of `settings` (a run's own).
    Idempotent: run by the stack after the topics exist, as the super user."""
    if not uses_roles(settings):
        return
    passwords = _passwords(settings)
    admin = make_admin(settings, "flywheel-roles", bootstrap_timeout_ms=10_000, request_timeout_ms=30_000)
    try:
        for mechanism in SCRAM_MECHANISMS:  # both, so a role may log in either way; one user once per request
            upserts = [UserScramCredentialUpsertion(role_user(settings, role), mechanism, passwords[role])
                       for role in ROLES]  # fmt: skip
            refused = {user: error for user, error in admin.alter_user_scram_credentials(upserts).items() if error}
            if refused:
                raise RoleError(f"creating the roles' {mechanism} credentials failed: {refused}")
        acls = [
            ACL(f"User:{role_user(settings, role)}", "*", operation, ACLPermissionType.ALLOW,
                ResourcePattern(resource, name, pattern))
            for role, allowed in grants(settings).items()
            for resource, name, pattern, operation in allowed
        ]  # fmt: skip
        result = admin.create_acls(acls)
        if result["failed"]:
            raise RoleError(f"creating ACLs failed: {result['failed'][:3]}")
    finally:
        admin.close()


def _passwords(settings: Settings) -> dict[str, str]:
    """Each role's password, made once per cluster directory (0600), like the cluster's own id."""
    path = settings.kafka_dir / "roles.json"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        _write_private(path, json.dumps({role: secrets.token_urlsafe(24) for role in ROLES}))
    return json.loads(path.read_text())


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(text)
