"""A TCP forwarder a chaos run holds between one edge client and one broker node, so that it can cut the client off.

The broker advertises the client's own listener at the proxy's port (core.settings.kafka_edge_port), so every
connection the client makes, bootstrap or not, passes here. `cut()` is a real network cut as the client sees it:
each open connection reset (SO_LINGER 0: an RST, not a polite FIN), new ones refused until `restore()`.
"""

from __future__ import annotations

import socket
import struct
import threading


class Proxy:
    def __init__(self, front_port: int, back_port: int, host: str = "127.0.0.1"):
        self.front, self.back, self.host = front_port, back_port, host
        self._listener: socket.socket | None = None
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        self.connections = 0  # accepted since start: a test's proof that traffic went through here

    @property
    def is_cut(self) -> bool:
        return self._listener is None

    def start(self) -> Proxy:
        if self._listener is not None:  # restoring a proxy that is not cut leaves it as it is
            return self
        listener = socket.create_server((self.host, self.front), reuse_port=False)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), name=f"proxy-{self.front}", daemon=True).start()
        return self

    restore = start

    def cut(self) -> None:
        """Refuse new connections and reset every open one."""
        with self._lock:
            listener, self._listener = self._listener, None
            sockets, self._open = self._open, set()
        if listener is not None:
            _close(listener)
        # Every socket set to linger 0 before any is closed: closing one wakes its pump, which closes its peer, and a
        # pump may be closing one on its own right now; either way setsockopt meets a closed socket (EBADF).
        for sock in sockets:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        for sock in sockets:
            _close(sock)

    close = cut

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # closed by cut()
                return
            try:
                upstream = socket.create_connection((self.host, self.back), timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)  # the node is down: the client sees what it would see without a proxy
                continue
            with self._lock:
                if self._listener is not listener:  # cut while connecting
                    _close(client)
                    _close(upstream)
                    return
                self._open |= {client, upstream}
                self.connections += 1
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                sink.sendall(data)
        except OSError:
            pass
        finally:  # one side gone: the other goes too, as one connection
            with self._lock:
                self._open -= {source, sink}
            _close(source)
            _close(sink)


def _close(sock: socket.socket) -> None:
    # shutdown first: close() alone does not wake a thread blocked in accept() or recv() on the socket (Linux).
    # SHUT_RD sends nothing, so a socket set to linger 0 still goes with an RST.
    for step in (lambda: sock.shutdown(socket.SHUT_RD), sock.close):
        try:
            step()
        except OSError:
            pass
