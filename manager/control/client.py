"""A control-socket client for the CLI: connect, hello, then request/reply.

The daemon answers one request at a time per connection, in order, so a client never has two
requests outstanding on one connection: a caller that must ask something while a long call is
in flight opens a second connection for it (`ControlSession.side_channel`).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import anyio
from anyio.abc import SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream

from manager.control.frames import read_frame, write_frame
from protocol import control
from protocol.codec import encode_json
from protocol.errors import Refusal
from protocol.refusals import Code

A = TypeVar("A")
R = TypeVar("R")

# How long a client waits for the answer to its hello. The manager answers as soon as it reads
# one, but it reads connections in the order they arrived: one draining a flood of idle
# connections on a host whose cores are both busy took more than five seconds to reach the
# operator's (tests/integration/test_control_limits.py), and the operator is better served
# waiting than told the manager closed the door.
HELLO_WAIT_S = 20.0


class ControlError(Refusal):
    pass


class ControlClient:
    def __init__(self, stream: SocketStream) -> None:
        self._stream = stream
        self._buffered = BufferedByteReceiveStream(stream)
        self._ids = itertools.count(1)

    @classmethod
    async def connect(
        cls,
        socket_path: Path,
        token: str,
        *,
        timeout: float = 5.0,
        hello_within: float = HELLO_WAIT_S,
    ) -> ControlClient:
        try:
            with anyio.fail_after(timeout):
                stream = await anyio.connect_unix(socket_path)
        except (OSError, TimeoutError) as exc:
            raise unreachable(socket_path, exc) from None
        client = cls(stream)
        try:
            with anyio.fail_after(hello_within):
                # A manager over its connection cap answers before reading and closes, so a
                # refused write is not yet a refusal: its frame may be waiting to be read.
                with contextlib.suppress(anyio.BrokenResourceError, OSError):
                    await write_frame(stream, control.encode_frame({"op": "hello", "token": token}))
                reply = control.decode_reply(await read_frame(client._buffered))
        except TimeoutError:
            await stream.aclose()
            raise timed_out("hello", hello_within) from None
        except (
            anyio.IncompleteRead,
            anyio.EndOfStream,
            anyio.BrokenResourceError,
            OSError,
        ):
            await stream.aclose()
            raise closed_at_hello() from None
        if not reply.ok:
            await stream.aclose()
            raise hello_refused(reply)
        return client

    async def call(
        self, op: str, args: dict[str, Any] | None = None, *, timeout: float = 60.0
    ) -> Any:
        """The raw form, for tests that speak the wire itself: `args` as JSON, the result as
        decoded JSON (dicts and lists). Cotal's own callers use `request`."""
        request_id, body = await self._exchange(op, args or {}, timeout)
        reply = control.decode_reply(body)
        check_reply(op, request_id, reply.id, reply.ok, reply.error)
        return reply.result

    async def request(self, op: control.Op[A, R], args: A, *, timeout: float = 60.0) -> R:
        """The typed form: `args` is the op's argument record, the result its reply record,
        decoded strictly (`decode_result`), so a reply of the wrong shape is refused here."""
        request_id, body = await self._exchange(op.name, args, timeout)
        reply = control.decode_raw_reply(body)
        check_reply(op.name, request_id, reply.id, reply.ok, reply.error)
        return control.decode_result(op, bytes(reply.result))

    async def _exchange(self, op: str, args: object, timeout: float) -> tuple[int, bytes]:
        """Send one request and read its reply frame; the request's id and the frame."""
        request_id = next(self._ids)
        payload = encode_json({"id": request_id, "op": op, "args": args})
        frame = control.LENGTH.pack(len(payload)) + payload
        try:
            with anyio.fail_after(timeout):
                await write_frame(self._stream, frame)
                return request_id, await read_frame(self._buffered)
        except TimeoutError:
            raise timed_out(op, timeout) from None
        except (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError) as exc:
            raise connection_lost(op, type(exc).__name__) from None

    async def aclose(self) -> None:
        await self._stream.aclose()

    async def __aenter__(self) -> ControlClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()


# -- what the blocking client (manager/control/blocking.py) says in the same words ----------


def unreachable(socket_path: Path, exc: BaseException) -> Refusal:
    return Refusal(
        Code.DAEMON_UNREACHABLE,
        f"no manager answers at {socket_path} "
        f"({getattr(exc, 'strerror', None) or type(exc).__name__})",
        "start it with `cotal up --detach`",
    )


def closed_at_hello() -> Refusal:
    from connectors.sandbox import carries_seat_mark

    if carries_seat_mark("self"):
        return Refusal(
            Code.AUTH_REFUSED,
            "the manager closed the connection at hello: this process runs under "
            "no_new_privs (NoNewPrivs: 1 in /proc/self/status), the mark of a cotal "
            "seat, which a manager started without it refuses",
            "run cotal from a shell without no_new_privs (not from a seat, a container "
            "or unit that sets it); see docs/operations.md, The control socket",
        )
    return Refusal(
        Code.AUTH_REFUSED,
        "the manager closed the connection at hello",
        "check that .cotal/auth/control.token belongs to this daemon",
    )


def hello_refused(reply: control.Reply) -> Refusal:
    if reply.error is not None and reply.error.code == Code.CONTROL_BUSY:
        return Refusal(
            Code.CONTROL_BUSY,
            reply.error.message,
            "close idle clients of this root (another cotal command or script holding "
            "connections open) and run the command again",
        )
    return Refusal(
        Code.AUTH_REFUSED, "the manager refused hello", "check .cotal/auth/control.token"
    )


def timed_out(op: str, timeout: float) -> Refusal:
    return Refusal(
        Code.TIMEOUT,
        f"{op} got no reply within {timeout:.0f}s",
        "the daemon may still be working: check `cotal ps`",
    )


def connection_lost(op: str, how: str) -> Refusal:
    return Refusal(
        Code.CONNECTION_LOST,
        f"{op}: the manager closed the connection ({how})",
        "check `.cotal/logs/manager.log`",
    )


def check_reply(
    op: str, request_id: int, reply_id: int, ok: bool, err: control.ErrorBody | None
) -> None:
    if reply_id != request_id:
        raise Refusal(
            Code.PROTOCOL,
            f"{op}: reply id {reply_id} does not match request {request_id}",
            "report this",
        )
    if not ok:
        raise ControlError(err.code if err else Code.ERROR, err.message if err else "refused")


# A reply that never came, a closed connection or a reply out of order leaves the connection
# in an unknown place in the request/reply sequence: it is never used again.
_BROKEN = frozenset({Code.TIMEOUT, Code.CONNECTION_LOST, Code.PROTOCOL})


class ControlSession:
    """A coordinator's one control session: connected at its first use, reused for every op.

    The token is read at each connect, because a resume writes a fresh one when it starts its
    own manager. A session whose connection broke connects again at the next op; the op that
    failed is never retried, since the daemon may have acted on it.
    """

    def __init__(self, socket_path: Path, token: Callable[[], str]) -> None:
        self._socket = socket_path
        self._token = token
        self._client: ControlClient | None = None
        self.connects = 0

    @property
    def connected(self) -> bool:
        return self._client is not None

    async def _connect(self, *, timeout: float = 5.0) -> ControlClient:
        if self._client is None:
            self._client = await ControlClient.connect(self._socket, self._token(), timeout=timeout)
            self.connects += 1
        return self._client

    async def status(self) -> control.StatusReply | None:
        """The daemon's status, or None when no daemon answers here (or none was ever started:
        no token). A daemon that accepts the connection but does not answer is an error."""
        if self._client is None:
            if not self._socket.exists():
                return None
            try:
                await self._connect(timeout=2.0)
            except Refusal:
                return None
        return await self.request(control.STATUS, control.NoArgs(), timeout=5.0)

    @asynccontextmanager
    async def _connected(self) -> AsyncIterator[ControlClient]:
        """The session's client; a connection that broke under a call is forgotten, so the
        next call opens a new one (the daemon's own refusals leave it open)."""
        client = await self._connect()
        try:
            yield client
        except ControlError:
            raise
        except Refusal as exc:
            if exc.code in _BROKEN:
                await self.forget()
            raise

    async def request(self, op: control.Op[A, R], args: A, *, timeout: float = 60.0) -> R:
        async with self._connected() as client:
            return await client.request(op, args, timeout=timeout)

    async def forget(self) -> None:
        """Drop the connection: the daemon went away (shutdown, restart) or it broke."""
        client, self._client = self._client, None
        if client is not None:
            with anyio.CancelScope(shield=True):
                await client.aclose()

    @asynccontextmanager
    async def side_channel(self) -> AsyncIterator[ControlClient]:
        """A second connection for as long as a long call holds the first one."""
        client = await ControlClient.connect(self._socket, self._token())
        self.connects += 1
        async with client:
            yield client

    async def aclose(self) -> None:
        await self.forget()

    async def __aenter__(self) -> ControlSession:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
