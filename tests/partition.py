"""A network partition between one host and the broker, on 127.0.0.1: a TCP relay the host
connects through. Open, it forwards both ways; `cut()` turns it into a black hole (it keeps
every connection and accepts new ones, but forwards nothing, as a link that drops every packet
would look to both ends until their own timeouts); `heal()` closes what it held, as a link that
comes back after the ends gave up does, and forwards again.

Threads, not the test's event loop: the tests' CLI calls block that loop, and a relay that
stopped while a command ran would be a partition nobody asked for.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

CHUNK = 65536


class Relay:
    def __init__(self, target_port: int, listen: str = "127.0.0.1") -> None:
        self.target = ("127.0.0.1", target_port)
        self._listener = socket.create_server((listen, 0))
        self.host = listen
        self.port: int = self._listener.getsockname()[1]
        self._open = threading.Event()
        self._open.set()
        self._lock = threading.Lock()
        self._held: list[socket.socket] = []
        self._closed = False
        self._threads: list[threading.Thread] = []
        self._spawn(self._accept)

    @property
    def url(self) -> str:
        return f"nats://{self.host}:{self.port}"

    def cut(self) -> None:
        self._open.clear()

    def heal(self) -> None:
        with self._lock:
            held, self._held = self._held, []
        for sock in held:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self._open.set()

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.heal()
        for thread in self._threads:
            thread.join(timeout=5)

    def _spawn(self, target: object, *args: object) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)  # type: ignore[arg-type]
        thread.start()
        self._threads.append(thread)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self._held.append(client)
            if not self._open.is_set():
                # Cut: held, never answered, until heal() closes it.
                continue
            try:
                upstream = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._held.append(upstream)
            self._spawn(self._pump, client, upstream)
            self._spawn(self._pump, upstream, client)

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        while True:
            try:
                data = src.recv(CHUNK)
            except OSError:
                return
            if not data:
                with contextlib.suppress(OSError):
                    dst.shutdown(socket.SHUT_WR)
                return
            if not self._open.is_set():
                # Dropped on the floor, as a partitioned link drops it.
                continue
            try:
                dst.sendall(data)
            except OSError:
                return


@contextmanager
def relay_to(port: int, listen: str = "127.0.0.1") -> Iterator[Relay]:
    relay = Relay(port, listen)
    try:
        yield relay
    finally:
        relay.close()
