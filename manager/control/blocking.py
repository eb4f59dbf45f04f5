"""One request to the root's manager over a plain blocking socket: hello, the request, its reply.

For a command that asks its manager one thing and prints the answer (`ps`, `ps --fleet`,
`send`, `stop`, `inbox`, `metrics`, ...): those are what an operator and a script run most, and
an event loop costs each of them asyncio's import and a loop's start, about 30 ms of a 150 ms
command (docs/benchmarks.md, "Fleet"). The wire and every refusal are the async client's
(`manager/control/client.py`, whose refusal constructors this module calls), so the two cannot
say different things; a command that holds a session for several requests, or awaits other work
beside one, uses that client.
"""

from __future__ import annotations

import contextlib
import socket
import time
from pathlib import Path
from typing import TypeVar

from manager.control.client import (
    HELLO_WAIT_S,
    check_reply,
    closed_at_hello,
    connection_lost,
    hello_refused,
    timed_out,
    unreachable,
)
from manager.control.frames import FrameTooLarge
from protocol import control
from protocol.codec import encode_json

A = TypeVar("A")
R = TypeVar("R")

# The connect itself: a listening manager takes it at once, even with a backlog.
CONNECT_TIMEOUT_S = 5.0
REQUEST_ID = 1


class _Closed(Exception):
    """The manager closed the connection before a whole frame arrived."""


def _receive_exactly(sock: socket.socket, n: int, deadline: float) -> bytes:
    chunks: list[bytes] = []
    left = n
    while left:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        sock.settimeout(remaining)
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise _Closed
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _read_frame(sock: socket.socket, deadline: float) -> bytes:
    (n,) = control.LENGTH.unpack(_receive_exactly(sock, control.LENGTH.size, deadline))
    if n > control.FRAME_CAP:
        raise FrameTooLarge(n)
    return _receive_exactly(sock, n, deadline) if n else b""


def _send(sock: socket.socket, frame: bytes, deadline: float) -> None:
    sock.settimeout(max(deadline - time.monotonic(), 0.001))
    sock.sendall(frame)


def _hello(sock: socket.socket, token: str) -> None:
    deadline = time.monotonic() + HELLO_WAIT_S
    try:
        # A manager over its connection cap answers before reading and closes, so a refused
        # write is not yet a refusal: its frame may be waiting to be read.
        with contextlib.suppress(OSError):
            _send(sock, control.encode_frame({"op": "hello", "token": token}), deadline)
        reply = control.decode_reply(_read_frame(sock, deadline))
    except TimeoutError:
        raise timed_out("hello", HELLO_WAIT_S) from None
    except (_Closed, OSError):
        raise closed_at_hello() from None
    if not reply.ok:
        raise hello_refused(reply)


def request(
    socket_path: Path, token: str, op: control.Op[A, R], args: A, timeout: float = 60.0
) -> R:
    """Connect, say hello with `token`, make one request and return its decoded reply, in the
    words and refusals of `ControlClient.connect` and `ControlClient.request`."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            sock.connect(str(socket_path))
        except OSError as exc:
            raise unreachable(socket_path, exc) from None
        _hello(sock, token)
        payload = encode_json({"id": REQUEST_ID, "op": op.name, "args": args})
        deadline = time.monotonic() + timeout
        try:
            _send(sock, control.LENGTH.pack(len(payload)) + payload, deadline)
            body = _read_frame(sock, deadline)
        except TimeoutError:
            raise timed_out(op.name, timeout) from None
        except _Closed:
            raise connection_lost(op.name, "EndOfStream") from None
        except OSError as exc:
            raise connection_lost(op.name, type(exc).__name__) from None
        reply = control.decode_raw_reply(body)
        check_reply(op.name, REQUEST_ID, reply.id, reply.ok, reply.error)
        return control.decode_result(op, bytes(reply.result))
    finally:
        sock.close()
