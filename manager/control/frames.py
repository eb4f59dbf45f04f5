"""Length-prefixed frames over an anyio byte stream, capped before allocation, and a nesting
check run before any frame reaches the JSON decoder (whose recursion would otherwise end in a
RecursionError rather than a refusal)."""

from __future__ import annotations

import re

from anyio.abc import ByteSendStream
from anyio.streams.buffered import BufferedByteReceiveStream

from protocol.control import FRAME_CAP, LENGTH, MAX_DEPTH


class FrameTooLarge(Exception):
    pass


class FrameTooDeep(Exception):
    """args: (depth reached, message naming the cap)."""


# A JSON string (whose brackets do not count) or one bracket.
_TOKENS = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]')


async def read_frame(stream: BufferedByteReceiveStream, cap: int = FRAME_CAP) -> bytes:
    (n,) = LENGTH.unpack(await stream.receive_exactly(LENGTH.size))
    if n > cap:
        raise FrameTooLarge(n)
    return await stream.receive_exactly(n) if n else b""


def check_depth(body: bytes, limit: int = MAX_DEPTH) -> bytes:
    """`body`, once no array or object in it nests deeper than `limit`."""
    if body.count(b"[") + body.count(b"{") <= limit:
        return body
    depth = 0
    for match in _TOKENS.finditer(body):
        token = match.group()
        if token in (b"[", b"{"):
            depth += 1
            if depth > limit:
                raise FrameTooDeep(
                    depth, f"frame nests arrays or objects deeper than {limit} levels"
                )
        elif token in (b"]", b"}"):
            depth -= 1
    return body


async def write_frame(stream: ByteSendStream, frame: bytes) -> None:
    await stream.send(frame)
