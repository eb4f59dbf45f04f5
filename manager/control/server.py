"""The authenticated control socket.

Three locks on one door: the socket is 0600 inside the 0700 `.cotal`, the peer's uid (from
SO_PEERCRED, set by the kernel at connect) must be ours, and the first frame must carry the
control token within 5 s, compared in constant time. A peer that fails any of them is closed
with no reply, so an unauthenticated caller learns nothing about the daemon.
"""

from __future__ import annotations

import hmac
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import structlog
from anyio.abc import SocketAttribute, SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream

from manager.broker.retry import TRANSIENT
from manager.control.frames import FrameTooLarge, read_frame, write_frame
from protocol import control
from protocol.errors import Refusal

log = structlog.get_logger("cotal.control")

Handler = Callable[[str, Any], Awaitable[Any]]


def peer_uid(stream: SocketStream) -> int:
    sock: socket.socket = stream.extra(SocketAttribute.raw_socket)
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", raw)
    return int(uid)


class ControlServer:
    def __init__(self, path: Path, token: str, handler: Handler) -> None:
        self.path = path
        self._token = token.encode()
        self._handler = handler

    async def serve(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        if self.path.is_socket():
            self.path.unlink()
        # The umask closes the window between bind() and chmod() in which the socket would
        # exist with default permissions.
        old = os.umask(0o177)
        try:
            listener = await anyio.create_unix_listener(self.path)
        finally:
            os.umask(old)
        os.chmod(self.path, 0o600)
        async with listener:
            task_status.started()
            await listener.serve(self._connection)

    async def _connection(self, stream: SocketStream) -> None:
        async with stream:
            try:
                uid = peer_uid(stream)
            except OSError:
                return
            if uid != os.geteuid():
                log.warning("control.refused", reason="peer uid mismatch", peer_uid=uid)
                return
            buffered = BufferedByteReceiveStream(stream)
            try:
                with anyio.fail_after(control.HELLO_TIMEOUT_S):
                    hello = control.decode_hello(await read_frame(buffered))
            except (
                TimeoutError,
                FrameTooLarge,
                Refusal,
                anyio.IncompleteRead,
                anyio.EndOfStream,
                anyio.BrokenResourceError,
                OSError,
            ):
                log.warning("control.refused", reason="no valid hello")
                return
            if not hmac.compare_digest(hello.token.encode(), self._token):
                log.warning("control.refused", reason="token mismatch")
                return
            await write_frame(stream, control.encode_frame(control.ok_reply(0, {"hello": "ok"})))
            await self._serve_requests(stream, buffered)

    async def _serve_requests(
        self, stream: SocketStream, buffered: BufferedByteReceiveStream
    ) -> None:
        while True:
            try:
                body = await read_frame(buffered)
            except FrameTooLarge as exc:
                log.warning("control.closed", reason="oversized frame", bytes=exc.args[0])
                return
            except (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                return
            reply = await self._dispatch(body)
            try:
                await write_frame(stream, control.encode_frame(reply))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                return

    async def _dispatch(self, body: bytes) -> control.Reply:
        request_id = 0
        try:
            request = control.decode_request(body)
            request_id = request.id
            args = control.decode_args(request)
            result = await self._handler(request.op, args)
            return control.ok_reply(request_id, result)
        except Refusal as exc:
            return control.error_reply(request_id, exc.code, exc.text)
        except TRANSIENT as exc:
            return control.error_reply(
                request_id,
                "broker-unavailable",
                f"the broker did not answer in time ({type(exc).__name__}); the broker or "
                "cluster may have lost quorum; retry once it is back",
            )
        except Exception as exc:  # a bug must not take the daemon down, but it must be seen
            log.exception("control.internal_error")
            return control.error_reply(
                request_id, "internal", f"internal error: {type(exc).__name__}: {exc}"
            )
