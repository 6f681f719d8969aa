"""When a Kafka broker serves requests, not merely accepts connections. The probe works on any host:port, an
external cluster's too; the wait is for local nodes just started, and gives up on one that died at once rather than
at the timeout."""

from __future__ import annotations

import socket
import ssl
import struct
import time

from core.settings import Settings
from streams.broker.nodes import is_broker
from streams.kafka_clients import ssl_context


def await_ready(settings: Settings, pids: dict[int, int], timeout: float) -> tuple[int, str] | None:
    """Wait until every local node in `pids` (node id -> pid) answers. None once all do; else, as soon as one has
    died or `timeout` seconds have passed, (a node that did not get ready, what went wrong)."""
    deadline, tls = time.monotonic() + timeout, ssl_context(settings)
    waiting = dict(pids)
    while waiting:
        waiting = {n: pid for n, pid in waiting.items()
                   if not answers_api_versions(settings.local_node_address(n), tls=tls)}  # fmt: skip
        dead = [n for n, pid in waiting.items() if not is_broker(settings, n, pid)]
        if dead or (waiting and time.monotonic() > deadline):
            node = (dead or list(waiting))[0]
            return node, "exited during startup" if dead else f"was not ready after {timeout:.0f}s"
        if waiting:
            time.sleep(0.25)
    return None


def answers_api_versions(server: str, timeout: float = 2.0, tls: ssl.SSLContext | None = None) -> bool:
    """True when the Kafka broker at host:port answers an ApiVersions request (over TLS with `tls`: a SASL_SSL
    listener; SASL itself comes after ApiVersions, so no login is needed).

    A Kafka broker accepts connections early but processes requests only once it has joined the quorum and been
    unfenced, so an answer means it is ready. A bare socket keeps this poll cheap and free of client threads.
    """
    host, _, port = server.strip().rpartition(":")
    host = host.strip("[]")
    client_id = b"flywheel"
    # Request header v1 (api_key 18 = ApiVersions, version 0, correlation id, client id); v0 has no body.
    request = struct.pack(">hhih", 18, 0, 7, len(client_id)) + client_id
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as raw:
            sock = tls.wrap_socket(raw, server_hostname=host) if tls is not None else raw
            sock.sendall(struct.pack(">i", len(request)) + request)
            reply = sock.makefile("rb").read(10)  # length, correlation id, error code
    except (OSError, ValueError):
        return False
    if len(reply) < 10:
        return False
    _, correlation_id, error_code = struct.unpack(">iih", reply)
    return correlation_id == 7 and error_code == 0
