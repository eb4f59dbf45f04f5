"""A control-socket client for the CLI: connect, hello, then request/reply."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import anyio
from anyio.abc import SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream

from manager.control.frames import read_frame, write_frame
from protocol import control
from protocol.codec import encode_json
from protocol.errors import Refusal


class ControlError(Refusal):
    pass


class ControlClient:
    def __init__(self, stream: SocketStream) -> None:
        self._stream = stream
        self._buffered = BufferedByteReceiveStream(stream)
        self._ids = itertools.count(1)

    @classmethod
    async def connect(cls, socket_path: Path, token: str, *, timeout: float = 5.0) -> ControlClient:
        try:
            with anyio.fail_after(timeout):
                stream = await anyio.connect_unix(socket_path)
        except (OSError, TimeoutError) as exc:
            raise Refusal(
                "daemon-unreachable",
                f"no manager answers at {socket_path} ({getattr(exc, 'strerror', None) or type(exc).__name__})",
                "start it with `cotal up --detach`",
            ) from None
        client = cls(stream)
        try:
            with anyio.fail_after(timeout):
                await write_frame(stream, control.encode_frame({"op": "hello", "token": token}))
                reply = control.decode_reply(await read_frame(client._buffered))
        except (
            TimeoutError,
            anyio.IncompleteRead,
            anyio.EndOfStream,
            anyio.BrokenResourceError,
            OSError,
        ):
            await stream.aclose()
            raise Refusal(
                "auth-refused",
                "the manager closed the connection at hello",
                "check that .cotal/auth/control.token belongs to this daemon",
            ) from None
        if not reply.ok:
            await stream.aclose()
            raise Refusal(
                "auth-refused", "the manager refused hello", "check .cotal/auth/control.token"
            )
        return client

    async def call(
        self, op: str, args: dict[str, Any] | None = None, *, timeout: float = 60.0
    ) -> Any:
        request_id = next(self._ids)
        payload = encode_json({"id": request_id, "op": op, "args": args or {}})
        frame = control.LENGTH.pack(len(payload)) + payload
        try:
            with anyio.fail_after(timeout):
                await write_frame(self._stream, frame)
                reply = control.decode_reply(await read_frame(self._buffered))
        except TimeoutError:
            raise Refusal(
                "timeout",
                f"{op} got no reply within {timeout:.0f}s",
                "the daemon may still be working: check `cotal ps`",
            ) from None
        except (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError) as exc:
            raise Refusal(
                "connection-lost",
                f"{op}: the manager closed the connection ({type(exc).__name__})",
                "check `.cotal/logs/manager.log`",
            ) from None
        if reply.id != request_id:
            raise Refusal(
                "protocol",
                f"{op}: reply id {reply.id} does not match request {request_id}",
                "report this",
            )
        if not reply.ok:
            err = reply.error
            raise ControlError(err.code if err else "error", err.message if err else "refused")
        return reply.result

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def __aenter__(self) -> ControlClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
