"""The chaos proxy (flywheel/chaos/proxy.py) on its own: an echo server behind it, many busy connections, cut and
restored over and over. A cut that raised half-way once left a client cut off for good (docs/history/chaos.md)."""

from __future__ import annotations

import socket
import threading

import pytest

from core.processes import free_ports
from flywheel.chaos.proxy import Proxy


@pytest.fixture
def echo_port():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve(conn: socket.socket) -> None:
        with conn:
            try:
                while data := conn.recv(65536):
                    conn.sendall(data)
            except OSError:
                pass

    def accept() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            threading.Thread(target=serve, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield port
    server.shutdown(socket.SHUT_RDWR)
    server.close()


def echo(port: int, payload: bytes = b"ping") -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(payload)
        return conn.recv(len(payload))


def test_a_cut_resets_busy_connections_refuses_new_ones_and_a_restore_brings_them_back(echo_port):
    front = free_ports(1)
    proxy = Proxy(front, echo_port).start()
    try:
        for round_ in range(25):
            busy = [socket.create_connection(("127.0.0.1", front), timeout=5) for _ in range(8)]
            stop = threading.Event()

            def chatter(conn: socket.socket, stop: threading.Event = stop) -> None:  # traffic while the cut lands
                try:
                    while not stop.is_set():
                        conn.sendall(b"x" * 4096)
                        conn.recv(65536)
                except OSError:
                    pass

            threads = [threading.Thread(target=chatter, args=(c,), daemon=True) for c in busy]
            for t in threads:
                t.start()
            proxy.cut()  # raised EBADF when a pump closed a socket the cut had yet to set to linger 0
            stop.set()
            for t in threads:
                t.join(timeout=5)
            for conn in busy:
                with pytest.raises(OSError):  # reset (or timed out on a reset peer): the connection is gone
                    for _ in range(3):
                        conn.sendall(b"y" * 65536)
                        if not conn.recv(65536):
                            raise ConnectionResetError("closed")
                conn.close()
            assert proxy.is_cut
            with pytest.raises(ConnectionRefusedError):
                echo(front)
            proxy.restore()
            proxy.restore()  # a second restore (an undo after a half-done cut) is harmless
            assert echo(front, b"round %d" % round_) == b"round %d" % round_
        assert proxy.connections >= 25  # at least every round's echo went through it
    finally:
        proxy.close()
