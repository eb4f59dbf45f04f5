"""A seat's mesh socket: how a harness's own tool reaches the seat's mesh port (docs/mesh.md,
"The socket").

A JSON-lines harness calls the mesh on its stdio. Claude Code and pi own their stdio, so their
tool (an MCP server Claude Code starts, pi's extension) calls on a Unix socket the manager
serves for one incarnation of one seat, in a directory of its own under `.cotal` that the
launch names (`COTAL_MESH_DIR`), so the sandbox binds it into that seat's file tree and no
other's. The manager then takes the sender from the peer, never from the call: a connection
is served only when the kernel's record of its peer (SO_PEERCRED, taken at connect) is a
process of this seat, by its ancestry, its session or its private mount namespace; anything
else gets one refusal and is closed. Each call answered is passed to the seat's port, as a
call on its stdio is.

Wire: one call per line (`protocol.meshcall`), one `MeshResult` per line back, in order.
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Callable
from pathlib import Path

import anyio
import structlog
from anyio.abc import SocketListener, SocketStream, TaskStatus
from anyio.streams.buffered import BufferedByteReceiveStream

from connectors.base import MeshPort
from connectors.meshclient import SOCKET_NAME
from manager.control.server import peer_cred, seat_ancestor
from manager.workspace.private import ensure_private_dir
from protocol import meshcall
from protocol.errors import Refusal
from protocol.refusals import Code

log = structlog.get_logger("cotal.mesh")

# A harness's tool may hold a connection per tool call; more at once is not a tool.
MAX_CONNECTIONS = 8
LINE_CAP = meshcall.CALL_CAP + 1
# A refusal to a stranger is one small frame and the wait for it to hang up; a peer that does
# neither is not waited on longer.
REFUSE_WRITE_S = 1.0


def bind(directory: Path) -> socket.socket:
    """The listening socket `<directory>/mesh.sock`, made anew (a dead manager's is replaced).
    Bound through a descriptor of the directory, so any length of path fits a socket address."""
    ensure_private_dir(directory.parent)
    ensure_private_dir(directory)
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        through_fd = f"/proc/self/fd/{fd}/{SOCKET_NAME}"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(SOCKET_NAME, dir_fd=fd)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            sock.bind(through_fd)
            os.chmod(through_fd, 0o600)
            sock.listen(MAX_CONNECTIONS)
        except BaseException:
            sock.close()
            raise
    finally:
        os.close(fd)
    return sock


def remove(directory: Path) -> None:
    """The socket and its directory, once the incarnation is over."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        (directory / SOCKET_NAME).unlink()
    with contextlib.suppress(OSError):
        directory.rmdir()


class MeshSocket:
    """The socket of one incarnation, serving its seat's port to its seat's processes."""

    def __init__(self, seat: str, directory: Path, port: MeshPort) -> None:
        self.seat = seat
        self.directory = directory
        self.port = port
        self._sock: socket.socket | None = bind(directory)
        self._open = 0

    async def serve(
        self,
        seat_pid: Callable[[], int | None],
        *,
        task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        """Serve until cancelled; the socket file goes with it. `seat_pid` names the seat's
        process once it runs (a peer before then is nobody's)."""
        sock, self._sock = self._sock, None
        assert sock is not None, "a mesh socket is served once"
        listener = await SocketListener.from_socket(sock)
        try:
            async with listener, anyio.create_task_group() as tg:
                task_status.started()
                while True:
                    stream = await listener.accept()
                    if self._open >= MAX_CONNECTIONS:
                        # Beside the accepts, so a flood of them never holds the next one up.
                        tg.start_soon(self._turn_away, stream, "too many connections at once")
                        continue
                    self._open += 1
                    tg.start_soon(self._connection, stream, seat_pid)
        finally:
            remove(self.directory)

    def close(self) -> None:
        """Give up a socket that was never served (its launch failed first)."""
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
            remove(self.directory)

    async def _connection(self, stream: SocketStream, seat_pid: Callable[[], int | None]) -> None:
        try:
            async with stream:
                pid, uid = peer_cred(stream)
                seat = seat_pid()
                why = (
                    seat_ancestor(pid, [seat]) if seat is not None and uid == os.getuid() else None
                )
                if why is None:
                    log.warning("mesh.peer_refused", seat=self.seat, peer_pid=pid, peer_uid=uid)
                    await self._turn_away(stream, f"process {pid} is not a process of this seat")
                    return
                buffered = BufferedByteReceiveStream(stream)
                while True:
                    try:
                        line = await buffered.receive_until(b"\n", LINE_CAP)
                    except anyio.DelimiterNotFound:
                        oversize = Refusal(
                            Code.MESH_CALL_INVALID,
                            f"the mesh call was refused: longer than {meshcall.CALL_CAP} bytes",
                            "send a shorter text",
                        )
                        await stream.send(
                            meshcall.encode_result(meshcall.refused(oversize)) + b"\n"
                        )
                        return
                    except (anyio.IncompleteRead, anyio.EndOfStream):
                        return
                    await stream.send(await self.port(line) + b"\n")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            return
        finally:
            self._open -= 1

    async def _turn_away(self, stream: SocketStream, why: str) -> None:
        refusal = Refusal(
            Code.MESH_PEER_REFUSED,
            f"seat {self.seat}'s mesh socket refused the connection: {why}",
            "call the mesh from within the seat, through its harness's tool",
        )
        with anyio.move_on_after(REFUSE_WRITE_S):
            with contextlib.suppress(anyio.BrokenResourceError, anyio.EndOfStream, OSError):
                await stream.send(meshcall.encode_result(meshcall.refused(refusal)) + b"\n")
                # Closed at once, the peer's call would meet a broken pipe instead of this
                # answer: what it writes is read and dropped until it hangs up, briefly.
                taken = 0
                while taken < LINE_CAP:
                    taken += len(await stream.receive())
        await stream.aclose()
