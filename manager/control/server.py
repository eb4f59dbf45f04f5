"""The authenticated control socket.

Four locks on one door: the socket is 0600 inside the 0700 `.cotal`, the peer's uid (from
SO_PEERCRED, set by the kernel at connect) must be ours, the peer must not be a seat's process
of any cotal root (it must not carry the seat mark, `no_new_privs`, which every seat's process
of every root runs under and none can clear; nor be, descend from or share the session or
mount namespace of one of this daemon's own seats), and the first frame must carry the control
token within 5 s, compared in constant time. A peer that fails any of them is closed with no
reply, so an unauthenticated caller learns nothing about the daemon. The seat checks stand even
where the seat's isolation already hides the socket: a seat that got hold of the token and a
way to the socket still holds no authority.

A daemon that itself runs under `no_new_privs` (started from a shell, a container or a unit
that sets it) cannot tell a seat from its operator by the mark, whose every process then
carries it: it says so once at start (`control.seat_mark_unusable`) and refuses only its own
seats.

What a connection may cost is bounded so that no caller can take the seats down with the
daemon: at most `control.MAX_CONNECTIONS` at once (more are closed as they arrive), at most
`control.MAX_UNAUTHENTICATED` that have not said hello (the oldest is dropped for a newcomer,
so a flood of idle connections cannot lock the operator out), an accept loop that rides out
descriptor exhaustion, and frames capped in size and in nesting depth before they are decoded.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import os
import socket
import struct
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any

import anyio
import msgspec
import structlog
from anyio.abc import SocketAttribute, SocketListener, SocketStream, TaskGroup
from anyio.streams.buffered import BufferedByteReceiveStream

from connectors.sandbox import carries_seat_mark
from manager.broker.retry import TRANSIENT
from manager.control.frames import FrameTooDeep, FrameTooLarge, check_depth, read_frame, write_frame
from protocol import control
from protocol.errors import Refusal
from protocol.refusals import Code

log = structlog.get_logger("cotal.control")

Handler = Callable[[str, Any], Awaitable[Any]]
# The pids of the seats' own processes (each the leader of its session and process group).
SeatPids = Callable[[], Collection[int]]

# How long the accept loop rests when the process is out of descriptors before trying again.
ACCEPT_BACKOFF_S = 0.1
# After dropping a connection to free its descriptor: long enough for its task to close it.
ACCEPT_YIELD_S = 0.001
# A shed connection's one frame: a fresh socket takes it at once, so this only bounds a stuck one.
SHED_WRITE_S = 0.05
# Trouble of one kind that recurs within this gap is one burst, logged once.
BURST_GAP_S = 5.0
_EXHAUSTED = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
# Reads of a peer's seat mark tried while the daemon is out of descriptors, before refusing it.
MARK_TRIES = 20
# Bounds the ancestry walk; a real process tree is far shallower.
_MAX_ANCESTRY = 256


def peer_cred(stream: SocketStream) -> tuple[int, int]:
    """(pid, uid) of the peer, as the kernel recorded them at connect."""
    sock: socket.socket = stream.extra(SocketAttribute.raw_socket)
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _gid = struct.unpack("3i", raw)
    return int(pid), int(uid)


def peer_uid(stream: SocketStream) -> int:
    return peer_cred(stream)[1]


def parent_pid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name may hold spaces and parentheses; the fields after its last ')' do not.
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return int(fields[1])
    except (IndexError, ValueError):
        return None


def _mount_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def seat_ancestor(pid: int, seats: Collection[int]) -> str | None:
    """Why `pid` belongs to a seat's process tree, or None when it does not.

    Three tests, each cheap: an ancestor (or the peer) is a seat's process; the peer's session
    is a seat's (every seat leads its own session, and a harness's children stay in it unless
    they call setsid); the peer shares a seat's private mount namespace (which a process
    without CAP_SYS_ADMIN cannot leave, even after setsid and a double fork)."""
    if not seats or pid <= 0:
        return None
    seat_set = set(seats)
    current: int | None = pid
    for _ in range(_MAX_ANCESTRY):
        if current is None or current <= 1:
            break
        if current in seat_set:
            return f"descends from seat process {current}"
        current = parent_pid(current)
    try:
        sid = os.getsid(pid)
    except OSError:
        sid = None
    if sid is not None and sid in seat_set:
        return f"in the session of seat process {sid}"
    own = _mount_ns(os.getpid())
    peer = _mount_ns(pid)
    if peer is not None and peer != own:
        for seat in seat_set:
            if _mount_ns(seat) == peer:
                return f"in the mount namespace of seat process {seat}"
    return None


def seat_mark(pid: int) -> str | None:
    """Why `pid` is taken for a seat of some cotal root by its mark, or None when it is not.
    A peer whose status cannot be read (gone, its pid reused meanwhile) is refused too; this
    daemon out of descriptors to read it with is the caller's OSError."""
    try:
        marked = carries_seat_mark(pid)
    except OSError as exc:
        if exc.errno in _EXHAUSTED:
            raise
        return f"its /proc/{pid}/status is unreadable ({exc.strerror or exc})"
    return "carries the seat mark (NoNewPrivs: 1)" if marked else None


def mark_usable() -> bool:
    """Whether this process can tell seats by their mark: only if it does not carry it."""
    try:
        return not carries_seat_mark("self")
    except OSError:
        return False


def _exhausted(exc: BaseException) -> bool:
    cause = exc.__cause__ if exc.__cause__ is not None else exc
    return isinstance(cause, OSError) and cause.errno in _EXHAUSTED


class ControlServer:
    def __init__(
        self,
        path: Path,
        token: str,
        handler: Handler,
        *,
        seat_pids: SeatPids | None = None,
        refuse_marked: bool | None = None,
        max_connections: int = control.MAX_CONNECTIONS,
        max_unauthenticated: int = control.MAX_UNAUTHENTICATED,
    ) -> None:
        self.path = path
        self._token = token.encode()
        self._handler = handler
        self._seat_pids = seat_pids
        # By default the mark is checked wherever it can tell seats apart (`mark_usable`).
        self.refuse_marked = mark_usable() if refuse_marked is None else refuse_marked
        self._max_connections = max_connections
        self._max_unauthenticated = max_unauthenticated
        self._open = 0
        # Connections that have not said hello yet, oldest first.
        self._pending: OrderedDict[int, anyio.CancelScope] = OrderedDict()
        self._next_id = 0
        # When each kind of trouble was last seen, so it is logged once per burst.
        self._last_seen: dict[str, float] = {}
        # Requests between their decode and the end of their reply's write.
        self._answering = 0
        self._answered = anyio.Event()
        self._answered.set()

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
        if not self.refuse_marked:
            log.warning(
                "control.seat_mark_unusable",
                consequence="this manager runs under no_new_privs, so it cannot tell another "
                "root's seat from its operator by the seat mark; it refuses only its own seats",
                cure="start the manager where no_new_privs is not set (see docs/operations.md, "
                "The control socket)",
            )
        async with listener, anyio.create_task_group() as tg:
            task_status.started()
            await self._accept_loop(listener, tg)

    async def _accept_loop(self, listener: SocketListener, tg: TaskGroup) -> None:
        while True:
            try:
                stream = await listener.accept()
            except anyio.BrokenResourceError as exc:
                # Out of descriptors (or a peer gone before accept): the seats and the
                # connections already open are worth more than this one. The oldest callers
                # that have not said hello give their descriptors back, so whoever waits in
                # the backlog (the operator, say) still gets in; with none to drop, rest.
                if self._burst_starts("exhausted"):
                    log.warning(
                        "control.accept_failed",
                        reason="descriptors exhausted" if _exhausted(exc) else "accept error",
                        error=str(exc.__cause__ or exc),
                        open=self._open,
                    )
                # Half of them at once: a backlog of a thousand must drain within the 5 s a
                # real client waits for its hello, one descriptor per accept is too slow.
                dropped = [self._drop_oldest_pending() for _ in range(len(self._pending) // 2 + 1)]
                await anyio.sleep(ACCEPT_YIELD_S if any(dropped) else ACCEPT_BACKOFF_S)
                continue
            if self._open >= self._max_connections:
                if self._burst_starts("shed"):
                    log.warning("control.refused", reason="too many connections", limit=self._open)
                await self._shed(stream)
                continue
            self._open += 1
            tg.start_soon(self._tracked, stream)

    async def _shed(self, stream: SocketStream) -> None:
        """Close a connection over the cap with a frame saying so, so its client is not told
        its token was wrong. A fresh socket's send buffer takes the frame at once; a peer that
        is not reading costs nothing more than the bound below."""
        busy = control.error_reply(
            0,
            Code.CONTROL_BUSY,
            f"the manager serves at most {self._max_connections} connections at once and all "
            "are in use; retry when one closes",
        )
        with anyio.move_on_after(SHED_WRITE_S):
            with contextlib.suppress(anyio.BrokenResourceError, OSError):
                await write_frame(stream, control.encode_frame(busy))
        with anyio.CancelScope(shield=True):
            await stream.aclose()

    async def _tracked(self, stream: SocketStream) -> None:
        conn_id = self._next_id
        self._next_id += 1
        scope = anyio.CancelScope()
        self._pending[conn_id] = scope
        while len(self._pending) > self._max_unauthenticated:
            self._drop_oldest_pending()
        try:
            with scope:
                await self._connection(stream, conn_id)
        finally:
            self._pending.pop(conn_id, None)
            self._open -= 1
            with anyio.CancelScope(shield=True):
                await stream.aclose()

    def _burst_starts(self, kind: str) -> bool:
        """True for the first of a run of events no more than `BURST_GAP_S` apart."""
        now = anyio.current_time()
        last = self._last_seen.get(kind)
        self._last_seen[kind] = now
        return last is None or now - last > BURST_GAP_S

    def _drop_oldest_pending(self) -> bool:
        if not self._pending:
            return False
        oldest_id, oldest = next(iter(self._pending.items()))
        del self._pending[oldest_id]
        oldest.cancel()
        return True

    async def _seat_mark(self, pid: int) -> str | None:
        """`seat_mark`, riding out descriptor exhaustion as the accept loop does: the oldest
        connections that have not said hello give theirs back (this one, if it is the oldest),
        so a flood cannot make the daemon refuse its operator, nor admit an unread peer."""
        for _ in range(MARK_TRIES):
            try:
                return seat_mark(pid)
            except OSError:
                self._drop_oldest_pending()
                await anyio.sleep(ACCEPT_YIELD_S)
        return f"its /proc/{pid}/status is unreadable (out of descriptors)"

    async def _connection(self, stream: SocketStream, conn_id: int) -> None:
        try:
            pid, uid = peer_cred(stream)
        except OSError:
            return
        if uid != os.geteuid():
            log.warning("control.refused", reason="peer uid mismatch", peer_uid=uid)
            return
        if self.refuse_marked:
            why = await self._seat_mark(pid)
            if why is not None:
                log.warning("control.refused", reason="seat-process", peer_pid=pid, detail=why)
                return
        if self._seat_pids is not None:
            why = seat_ancestor(pid, self._seat_pids())
            if why is not None:
                log.warning("control.refused", reason="seat-process", peer_pid=pid, detail=why)
                return
        buffered = BufferedByteReceiveStream(stream)
        try:
            with anyio.fail_after(control.HELLO_TIMEOUT_S):
                hello = control.decode_hello(check_depth(await read_frame(buffered)))
        except (
            TimeoutError,
            FrameTooLarge,
            FrameTooDeep,
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
        self._pending.pop(conn_id, None)
        try:
            await write_frame(stream, control.encode_frame(control.ok_reply(0, {"hello": "ok"})))
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
            # The client went away after its hello (a coordinator killed, a status probe that
            # gave up): that connection's end, never the daemon's.
            return
        await self._serve_requests(stream, buffered)

    async def _serve_requests(
        self, stream: SocketStream, buffered: BufferedByteReceiveStream
    ) -> None:
        while True:
            try:
                body = check_depth(await read_frame(buffered))
            except FrameTooLarge as exc:
                log.warning("control.closed", reason="oversized frame", bytes=exc.args[0])
                return
            except FrameTooDeep as exc:
                # Refused by name before the decoder sees it, then closed: a peer that sends
                # this is not a client cotal wrote.
                log.warning("control.closed", reason="frame nested too deep", depth=exc.args[0])
                reply = control.error_reply(0, Code.FRAME_TOO_DEEP, str(exc.args[1]))
                with anyio.move_on_after(1.0):
                    try:
                        await write_frame(stream, control.encode_frame(reply))
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                        pass
                return
            except (anyio.IncompleteRead, anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                return
            if self._answering == 0:
                self._answered = anyio.Event()
            self._answering += 1
            try:
                reply = await self._dispatch(body)
                try:
                    await write_frame(stream, control.encode_frame(reply))
                except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                    return
            finally:
                self._answering -= 1
                if self._answering == 0:
                    self._answered.set()

    async def replies_written(self) -> None:
        """Return once every request taken so far has had its reply written to its socket, so
        a daemon exiting after `shutdown` does not close the socket under that op's reply."""
        while self._answering:
            await self._answered.wait()

    async def _dispatch(self, body: bytes) -> control.Reply:
        request_id = 0
        try:
            request = control.decode_request(body)
            request_id = request.id
            args = control.decode_args(request)
            check_strings(request.op, args)
            result = await self._handler(request.op, args)
            return control.ok_reply(request_id, result)
        except Refusal as exc:
            return control.error_reply(request_id, exc.code, exc.text)
        except TRANSIENT as exc:
            return control.error_reply(
                request_id,
                Code.BROKER_UNAVAILABLE,
                f"the broker did not answer in time ({type(exc).__name__}); the broker or "
                "cluster may have lost quorum; retry once it is back",
            )
        except Exception as exc:  # a bug must not take the daemon down, but it must be seen
            log.exception("control.internal_error")
            return control.error_reply(
                request_id, Code.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"
            )


def check_strings(op: str, args: Any) -> None:
    """Refuse, by the field's name, a string argument the OS could not take (a NUL byte) or one
    longer than any path or name may be. Free text (`text`, `prompt`) is bounded by the op's
    frame cap alone."""
    if not isinstance(args, msgspec.Struct):
        return
    for field in msgspec.structs.fields(args):
        value = getattr(args, field.name)
        values = value if isinstance(value, list) else [value]
        for item in values:
            if not isinstance(item, str):
                continue
            name = field.encode_name
            if "\0" in item:
                raise Refusal(
                    f"bad-{field.name.replace('_', '-')}",
                    f"{op}: argument {name!r} holds a NUL byte",
                    f"pass {name} without NUL bytes",
                )
            if field.name not in control.FREE_TEXT_ARGS and len(item) > control.ARG_STRING_CAP:
                raise Refusal(
                    f"bad-{field.name.replace('_', '-')}",
                    f"{op}: argument {name!r} is {len(item)} characters, over the "
                    f"{control.ARG_STRING_CAP}-character cap",
                    f"pass a shorter {name}",
                )
