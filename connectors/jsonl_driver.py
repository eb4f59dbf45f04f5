"""A driver for harnesses that speak JSON lines over stdio.

Theory of operation. The driver owns no task: the caller runs `run()` (the reader) in the seat's
task group, preferably with `await tg.start(driver.run)`. The reader splits stdout into lines
(each capped; an oversize line is skipped and recorded, never fatal), asks the harness's
`LineCodec` what each line means, and wakes the request waiting for that id. Requests write one
line to stdin and wait on their own event, so a harness reply is routed by id and a late reply
to an abandoned request is dropped, not mistaken for the next one.

When stdout ends (the harness exited) or the reader is cancelled, every waiter is woken: a turn
in flight ends `unknown` (never acknowledged, so it is redelivered), a state query raises
`DriverError`. Wire formats live in codecs; this module knows only the events below.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol

import anyio
from anyio.abc import TaskStatus

from connectors.base import ByteReceive, ByteSend, TurnOutcome
from protocol.errors import DecodeError, Refusal

LINE_CAP = 1024 * 1024
# A harness that stops reading its stdin must not wedge a cancelled sender forever.
SEND_TIMEOUT_S = 10.0
PROTOCOL_ERRORS_KEPT = 32


@dataclass(frozen=True)
class Ready:
    session_id: str


@dataclass(frozen=True)
class TurnStarted:
    id: str


@dataclass(frozen=True)
class TurnDelta:
    id: str
    text: str


@dataclass(frozen=True)
class TurnEnded:
    id: str
    outcome: TurnOutcome


@dataclass(frozen=True)
class StateReported:
    id: str
    session_id: str | None


@dataclass(frozen=True)
class Rejected:
    """The harness refused a line we sent; `id` names the request when the harness could tell."""

    id: str | None
    detail: str


DriverEvent = Ready | TurnStarted | TurnDelta | TurnEnded | StateReported | Rejected


class LineCodec(Protocol):
    """One harness's wire format. Encoders return a line without its newline."""

    def encode_prompt(self, text: str, message_id: str) -> bytes: ...

    def encode_get_state(self, request_id: str) -> bytes | None:
        """None when the harness has no state query; the driver then reports `Ready`'s id."""
        ...

    def encode_quit(self) -> bytes | None: ...

    def decode(self, line: bytes) -> DriverEvent | None:
        """The event a line carries, None for a line the driver need not act on; raises
        `DecodeError` for a malformed line."""
        ...


class DriverError(Refusal):
    """`driver-stopped`: the reader is not running; `harness-refused`: the harness said no."""


class _Oversize:
    pass


OVERSIZE = _Oversize()


class LineSplitter:
    """Sans-I/O line framing with a per-line cap: feed bytes, take complete lines out."""

    def __init__(self, cap: int = LINE_CAP) -> None:
        self._cap = cap
        self._buf = bytearray()
        self._scanned = 0
        self._discarding = False

    def feed(self, data: bytes) -> list[bytes | _Oversize]:
        out: list[bytes | _Oversize] = []
        self._buf += data
        while (newline := self._buf.find(b"\n", self._scanned)) >= 0:
            line = bytes(self._buf[:newline])
            del self._buf[: newline + 1]
            self._scanned = 0
            if self._discarding:
                self._discarding = False
            elif len(line) > self._cap:
                out.append(OVERSIZE)
            else:
                out.append(line)
        self._scanned = len(self._buf)
        if len(self._buf) > self._cap:
            # Keep memory bounded: the rest of this line is dropped as it arrives.
            if not self._discarding:
                out.append(OVERSIZE)
                self._discarding = True
            self._buf.clear()
            self._scanned = 0
        return out

    def finish(self) -> list[bytes | _Oversize]:
        """The unterminated tail at end of stream, if any, as a last line."""
        tail, discarding = bytes(self._buf), self._discarding
        self._buf.clear()
        self._scanned, self._discarding = 0, False
        return [tail] if tail and not discarding else []


class _Waiter:
    def __init__(self) -> None:
        self.done = anyio.Event()
        self.event: DriverEvent | None = None

    def resolve(self, event: DriverEvent | None) -> None:
        if not self.done.is_set():
            self.event = event
            self.done.set()


class JsonLinesDriver:
    def __init__(
        self,
        stdin: ByteSend,
        stdout: ByteReceive,
        codec: LineCodec,
        *,
        line_cap: int = LINE_CAP,
        on_event: Callable[[DriverEvent], None] | None = None,
    ) -> None:
        self._stdin = stdin
        self._stdout = stdout
        self._codec = codec
        self._line_cap = line_cap
        self._splitter = LineSplitter(line_cap)
        self._on_event = on_event
        self._turn_lock = anyio.Lock()
        # A state query may be sent while a prompt is being written; lines must not interleave.
        self._send_lock = anyio.Lock()
        self._turns: dict[str, _Waiter] = {}
        self._states: dict[str, _Waiter] = {}
        self._settled = anyio.Event()
        self._session_id: str | None = None
        self._reader: Literal["idle", "running", "stopped"] = "idle"
        self._stop_detail = "the driver's reader was never started"
        self._stdin_closed = False
        self.protocol_errors: deque[str] = deque(maxlen=PROTOCOL_ERRORS_KEPT)

    @property
    def session_id(self) -> str | None:
        """The last session id the harness reported (ready line or state reply)."""
        return self._session_id

    @property
    def running(self) -> bool:
        return self._reader == "running"

    # -- the reader --------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Pump stdout until it ends. Start it once, in the caller's task group."""
        if self._reader != "idle":
            raise RuntimeError("JsonLinesDriver.run() may be started only once")
        self._reader = "running"
        detail = "the driver's reader stopped (cancelled or failed) mid-turn"
        task_status.started()
        try:
            while True:
                try:
                    chunk = await self._stdout.receive()
                except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
                    self._consume(self._splitter.finish())
                    detail = "harness exited mid-turn"
                    return
                self._consume(self._splitter.feed(chunk))
        finally:
            self._stop(detail)

    def _stop(self, detail: str) -> None:
        self._reader = "stopped"
        self._stop_detail = detail
        for waiter in (*self._turns.values(), *self._states.values()):
            waiter.resolve(None)
        self._settled.set()

    def _consume(self, lines: list[bytes | _Oversize]) -> None:
        for line in lines:
            if isinstance(line, _Oversize):
                self.protocol_errors.append(f"harness line exceeds the {self._line_cap}-byte cap")
            elif line.strip():
                self._handle(line)

    def _handle(self, line: bytes) -> None:
        try:
            event = self._codec.decode(line)
        except DecodeError as exc:
            self.protocol_errors.append(exc.message)
            return
        if event is None:
            return
        self._route(event)
        if self._on_event is not None:
            self._on_event(event)

    def _route(self, event: DriverEvent) -> None:
        match event:
            case Ready(session_id=session_id):
                self._session_id = session_id
                self._settled.set()
            case TurnEnded(id=message_id):
                self._wake(self._turns, message_id, event)
            case StateReported(id=request_id, session_id=session_id):
                if session_id is not None:
                    self._session_id = session_id
                self._wake(self._states, request_id, event)
            case Rejected(id=request_id, detail=detail):
                self.protocol_errors.append(f"harness refused a line: {detail}")
                if request_id is not None:
                    self._wake(self._turns, request_id, event)
                    self._wake(self._states, request_id, event)
            case _:
                pass

    @staticmethod
    def _wake(waiters: dict[str, _Waiter], key: str, event: DriverEvent) -> None:
        waiter = waiters.get(key)
        if waiter is not None:
            waiter.resolve(event)

    # -- requests ----------------------------------------------------------------------------

    async def wait_ready(self, timeout: float) -> str:
        """The session id from the harness's ready line; DriverError if it exited first."""
        with anyio.fail_after(timeout):
            await self._settled.wait()
        if self._session_id is None:
            raise DriverError(
                "driver-stopped",
                f"the harness never reported ready ({self._stop_detail})",
                "read the seat's log for why it exited",
            )
        return self._session_id

    async def prompt(self, text: str, *, message_id: str) -> TurnOutcome:
        """Deliver one prompt and wait for its terminal turn event.

        Never raises for a dead harness: a turn whose end was not seen is `unknown`, which the
        caller must not acknowledge. Bound the wait with a cancel scope around the call.
        """
        async with self._turn_lock:
            if self._reader != "running":
                return TurnOutcome("unknown", detail=f"not delivered: {self._stop_detail}")
            waiter = _Waiter()
            self._turns[message_id] = waiter
            try:
                if not await self._send(self._codec.encode_prompt(text, message_id)):
                    return TurnOutcome("unknown", detail="harness stdin closed before the prompt was delivered")
                await waiter.done.wait()
            finally:
                if self._turns.get(message_id) is waiter:
                    del self._turns[message_id]
        match waiter.event:
            case TurnEnded(outcome=outcome):
                return outcome
            case Rejected(detail=detail):
                return TurnOutcome("error", detail=f"harness refused the prompt: {detail}")
            case _:
                return TurnOutcome("unknown", detail=self._stop_detail)

    async def get_state(self) -> str | None:
        """The session id the live harness reports now; DriverError once it has stopped."""
        self._require_running()
        request_id = f"state-{uuid.uuid4().hex}"
        line = self._codec.encode_get_state(request_id)
        if line is None:
            return self._session_id
        waiter = _Waiter()
        self._states[request_id] = waiter
        try:
            if not await self._send(line):
                raise DriverError("driver-stopped", "harness stdin is closed", "restart the seat")
            await waiter.done.wait()
        finally:
            self._states.pop(request_id, None)
        match waiter.event:
            case StateReported(session_id=session_id):
                return session_id
            case Rejected(detail=detail):
                raise DriverError("harness-refused", f"harness refused the state query: {detail}")
            case _:
                raise DriverError(
                    "driver-stopped",
                    f"the harness stopped before answering the state query ({self._stop_detail})",
                    "read the seat's log for why it exited",
                )

    async def quit(self) -> bool:
        """Ask the harness to end its session, then close its stdin; False if it had no quit."""
        line = self._codec.encode_quit()
        sent = line is not None and await self._send(line)
        await self.aclose()
        return sent

    async def aclose(self) -> None:
        """Close the harness's stdin (EOF). The reader ends on its own when stdout does."""
        if self._stdin_closed:
            return
        self._stdin_closed = True
        with anyio.CancelScope(shield=True):
            try:
                await self._stdin.aclose()
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                pass

    def _require_running(self) -> None:
        if self._reader != "running":
            raise DriverError(
                "driver-stopped",
                f"the harness driver is not reading ({self._stop_detail})",
                "start driver.run() in the seat's task group, or restart the seat",
            )

    async def _send(self, line: bytes) -> bool:
        if self._stdin_closed:
            return False
        async with self._send_lock:
            # Shielded so a caller's deadline cannot cut a line in half, which would corrupt
            # every later line; bounded so a harness that stopped reading cannot wedge us.
            with anyio.CancelScope(shield=True) as scope:
                scope.deadline = anyio.current_time() + SEND_TIMEOUT_S
                try:
                    await self._stdin.send(line + b"\n")
                    return True
                except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                    return False
            await self.aclose()
            return False
