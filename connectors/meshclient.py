"""A seat-side client of the seat's mesh socket (docs/mesh.md, "The socket").

A harness's own tool (the MCP server Claude Code starts, pi's extension) reaches the manager on
the socket the manager serves for that seat alone, in the directory the launch names in
`COTAL_MESH_DIR`. Standard library only: this runs inside the seat's sandbox as `python -I`.

A socket path has room for 107 bytes; a root deep in a temporary directory gives a longer one,
so such a path is reached through a descriptor of its directory (`/proc/self/fd/N/mesh.sock`).
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

MESH_DIR_ENV = "COTAL_MESH_DIR"
SOCKET_NAME = "mesh.sock"
# sun_path holds 108 bytes with its terminating NUL.
SUN_PATH_MAX = 107
# A call is at most a send's text and its envelope; an answer at most a history of posts.
CALL_CAP = 192 * 1024
ANSWER_CAP = 16 * 1024 * 1024


class MeshUnreachable(Exception):
    """The seat's mesh socket cannot be reached or did not answer; the message says why."""


def _directory(directory: str | None) -> str:
    found = directory if directory is not None else os.environ.get(MESH_DIR_ENV)
    if not found:
        raise MeshUnreachable(
            f"{MESH_DIR_ENV} is not set: this process is not a seat of a cotal manager"
        )
    return found


def connect(directory: str | None = None, timeout: float = 30.0) -> socket.socket:
    """A connection to the seat's mesh socket, in `directory` or `$COTAL_MESH_DIR`."""
    where = _directory(directory)
    path = os.path.join(where, SOCKET_NAME)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    sock.settimeout(timeout)
    try:
        if len(os.fsencode(path)) <= SUN_PATH_MAX:
            sock.connect(path)
        else:
            fd = os.open(where, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                sock.connect(f"/proc/self/fd/{fd}/{SOCKET_NAME}")
            finally:
                os.close(fd)
    except OSError as exc:
        sock.close()
        raise MeshUnreachable(
            f"cannot reach the mesh socket {path}: {exc.strerror or exc}; the manager serves "
            "it only while this seat runs"
        ) from None
    return sock


def _read_line(sock: socket.socket) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            raise MeshUnreachable("the manager closed the mesh socket before it answered")
        newline = chunk.find(b"\n")
        if newline >= 0:
            # One call in flight at a time: nothing follows the answer's newline.
            chunks.append(chunk[:newline])
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > ANSWER_CAP:
            raise MeshUnreachable(f"the manager's answer exceeds {ANSWER_CAP} bytes")


def call(sock: socket.socket, request: dict[str, Any]) -> dict[str, Any]:
    """Send one mesh call and return the manager's answer (a `MeshResult` as JSON)."""
    line = json.dumps(request, ensure_ascii=True, separators=(",", ":")).encode()
    if len(line) > CALL_CAP:
        raise MeshUnreachable(f"the call is {len(line)} bytes, more than {CALL_CAP}")
    try:
        sock.sendall(line + b"\n")
        raw = _read_line(sock)
    except TimeoutError:
        raise MeshUnreachable("the manager did not answer the mesh call in time") from None
    except OSError as exc:
        raise MeshUnreachable(f"the mesh socket failed: {exc.strerror or exc}") from None
    try:
        answer = json.loads(raw)
    except ValueError:
        raise MeshUnreachable("the manager's answer is not JSON") from None
    if not isinstance(answer, dict):
        raise MeshUnreachable("the manager's answer is not a JSON object")
    return answer
