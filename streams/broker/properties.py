"""A local node's `server.properties`, rewritten on every start so changed settings (ports, paths) take effect.

Cluster: node k (ids 1..N) serves clients on kafka_port + 2(k-1) and the quorum on the port after; the quorum is
static (every node a voter). Topics get min(3, N) replicas and, with 3, min.insync.replicas 2: an acks=all write is
acknowledged once it is on two nodes, so any one node may die without losing it or stopping producers.

Security: the client listener binds `settings.listen_host` (127.0.0.1 by default), the controller listener always
127.0.0.1. With `security_protocol=SASL_PLAINTEXT` or `SASL_SSL` the client listener requires SASL (SCRAM-SHA-256/512,
or PLAIN), over TLS for SASL_SSL (tls), the controller listener PLAIN, and an authorizer allows only what the
roles' ACLs say (roles); the broker's own login (its super user) sits in the file, which is then mode 0600.
The password may hold any character, so values are escaped twice: for JAAS inside the value, for java.util.Properties
around it.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path

from core.settings import Settings
from streams.broker.files import BrokerError, node_dir, props_path
from streams.broker.tls import ensure_tls

SCRAM_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def server_properties(settings: Settings, node: int) -> dict[str, str | int]:
    port = settings.kafka_node_port(node)
    client = settings.security_protocol  # listener name = its security protocol (SSL alone is refused before)
    controller = "SASL_PLAINTEXT" if settings.uses_sasl else "PLAINTEXT"
    bind = _url_host(settings.listen_host)
    advertised = bind if settings.listen_host not in ("", "0.0.0.0", "::") else _url_host(socket.getfqdn())
    replicas, min_isr = settings.replication_factor, settings.min_insync_replicas
    # Edge listeners (chaos runs): the client listener's protocol and logins on ports of their own, advertised at the
    # port after, where a proxy the run controls forwards, so that one client can be cut off from every node.
    edges = [f"EDGE{j}" for j in range(settings.kafka_edge_listeners)]
    edge_ports = dict(zip(edges, (settings.kafka_edge_port(node, j) for j in range(len(edges))), strict=True))
    clients = [client, *edges]
    listeners = [f"{client}://{bind}:{port}", f"CONTROLLER://127.0.0.1:{port + 1}",
                 *(f"{edge}://127.0.0.1:{p}" for edge, p in edge_ports.items())]  # fmt: skip
    advertised_listeners = [f"{client}://{advertised}:{port}",
                            *(f"{edge}://127.0.0.1:{p + 1}" for edge, p in edge_ports.items())]  # fmt: skip
    protocols = [f"{client}:{client}", f"CONTROLLER:{controller}", *(f"{edge}:{client}" for edge in edges)]
    return {
        "process.roles": "broker,controller",
        "node.id": node,
        # Static quorum, every node a voter: storage is formatted without --standalone and ports may change
        # between starts.
        "controller.quorum.voters": ",".join(
            f"{voter}@127.0.0.1:{settings.kafka_node_port(voter) + 1}" for voter in settings.kafka_node_ids
        ),
        # The controller listener is for the quorum alone: plaintext, but on loopback whatever listen_host says.
        "listeners": ",".join(listeners),
        "advertised.listeners": ",".join(advertised_listeners),
        "listener.security.protocol.map": ",".join(protocols),
        "inter.broker.listener.name": client,
        "controller.listener.names": "CONTROLLER",
        **(_sasl_properties(settings, clients) if settings.uses_sasl else {}),
        **(_tls_properties(settings, clients) if settings.uses_ssl else {}),
        **(_authorizer_properties(settings) if has_roles(settings) else {}),
        "log.dirs": str(node_dir(settings, node) / "data"),
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


def write_server_properties(settings: Settings, node: int) -> Path:
    # Rewritten on every start so changed settings (port, paths) take effect; the data dir keeps the state.
    path = props_path(settings, node)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{key}={_properties_escape(str(value))}" for key, value in server_properties(settings, node).items()]
    text = "# Written by streams/broker/properties.py on each start; edits are overwritten.\n" + "\n".join(lines) + "\n"
    # 0600: with SASL the file holds the broker's login. fchmod too, for a file left by an older version.
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="ascii") as handle:  # _properties_escape leaves ASCII only
        os.fchmod(fd, 0o600)
        handle.write(text)
    return path


def refuse_unsupported_security(settings: Settings) -> None:
    if settings.security_protocol == "SSL":
        raise BrokerError(
            "the local broker serves PLAINTEXT, SASL_PLAINTEXT or SASL_SSL, not SSL alone (TLS without a login "
            "has no user to give roles to): set FLYWHEEL_SECURITY_PROTOCOL=SASL_SSL"
        )


def checked_username(user: str) -> str:
    # Plain names only: they go unquoted into --add-scram and into the PLAIN module's user_<name> option.
    if not user or not all(c.isalnum() or c in "._-@" for c in user):
        raise BrokerError(f"SASL username {user!r}: the local broker accepts letters, digits and ._-@ only")
    return user


def _sasl_properties(settings: Settings, listeners: list[str]) -> dict[str, str]:
    """SASL on the client listeners; the broker logs in to itself (inter-broker) as settings.sasl_username.

    The JAAS config is a password-type config: Kafka prints it as [hidden]. The file holding it is mode 0600.
    """
    user, password = checked_username(settings.sasl_username), settings.sasl_password.get_secret_value()
    login = f'username="{_jaas_quote(user)}" password="{_jaas_quote(password)}"'
    if settings.sasl_mechanism == "PLAIN":
        # PLAIN checks passwords against the user_<name> entries of the broker's own JAAS config.
        mechanisms = {"PLAIN": f"org.apache.kafka.common.security.plain.PlainLoginModule required {login} "
                               f'user_{user}="{_jaas_quote(password)}";'}  # fmt: skip
    else:
        # SCRAM checks against the credentials in the metadata log (written by streams.broker.storage).
        login_module = f"org.apache.kafka.common.security.scram.ScramLoginModule required {login};"
        mechanisms = dict.fromkeys(SCRAM_MECHANISMS, login_module)
    # The quorum's listener logs in too, with PLAIN (KRaft controllers cannot check SCRAM: its credentials live in
    # the metadata they serve). Without it, the controller port would answer as ANONYMOUS, which must then be a
    # super user, and any local process could administer the cluster through it.
    controller_login = (f"org.apache.kafka.common.security.plain.PlainLoginModule required {login} "
                        f'user_{user}="{_jaas_quote(password)}";')  # fmt: skip
    return {
        "sasl.enabled.mechanisms": ",".join(mechanisms),
        "sasl.mechanism.inter.broker.protocol": settings.sasl_mechanism,
        **{
            f"listener.name.{name.lower()}.{mechanism.lower()}.sasl.jaas.config": jaas
            for name in listeners
            for mechanism, jaas in mechanisms.items()
        },
        "sasl.mechanism.controller.protocol": "PLAIN",
        "listener.name.controller.sasl.enabled.mechanisms": "PLAIN",
        "listener.name.controller.plain.sasl.jaas.config": controller_login,
    }


def has_roles(settings: Settings) -> bool:
    """Roles (roles) are SCRAM users; with PLAIN the broker's JAAS file knows one user, and no authorizer."""
    return settings.uses_sasl and settings.sasl_mechanism in SCRAM_MECHANISMS


def _tls_properties(settings: Settings, listeners: list[str]) -> dict[str, str]:
    """TLS on the client listeners: the node's PEM keystore (tls), and the CA it trusts as a client of the
    other nodes (inter-broker traffic goes over the first listener, hostname checked)."""
    files = ensure_tls(settings)
    properties = {}
    for listener in listeners:
        prefix = f"listener.name.{listener.lower()}"
        properties |= {
            f"{prefix}.ssl.keystore.type": "PEM",
            f"{prefix}.ssl.keystore.location": str(files.keystore),
            f"{prefix}.ssl.truststore.type": "PEM",
            f"{prefix}.ssl.truststore.location": str(files.ca),
            f"{prefix}.ssl.endpoint.identification.algorithm": "https",
            f"{prefix}.ssl.enabled.protocols": "TLSv1.3,TLSv1.2",
        }
    return properties


def _authorizer_properties(settings: Settings) -> dict[str, str]:
    """Nothing is allowed unless an ACL allows it (streams.broker.roles writes them), except to the broker's own user,
    which the nodes, the quorum and the operator's tools log in as."""
    return {
        "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
        "super.users": f"User:{checked_username(settings.sasl_username)}",
        "allow.everyone.if.no.acl.found": "false",
    }


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
