"""Length-prefixed frames over an anyio byte stream, capped before allocation."""

from __future__ import annotations

from anyio.abc import ByteSendStream
from anyio.streams.buffered import BufferedByteReceiveStream

from protocol.control import FRAME_CAP, LENGTH


class FrameTooLarge(Exception):
    pass


async def read_frame(stream: BufferedByteReceiveStream, cap: int = FRAME_CAP) -> bytes:
    (n,) = LENGTH.unpack(await stream.receive_exactly(LENGTH.size))
    if n > cap:
        raise FrameTooLarge(n)
    return await stream.receive_exactly(n) if n else b""


async def write_frame(stream: ByteSendStream, frame: bytes) -> None:
    await stream.send(frame)
