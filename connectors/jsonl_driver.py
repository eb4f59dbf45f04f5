"""A driver for harnesses that speak JSON lines over stdio.

Replies are routed by request id, so a late reply to an abandoned request is dropped rather
than taken for the next one (docs/design.md, "The harness connectors, in detail").
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import anyio
from anyio.abc import TaskStatus

from connectors.base import ByteReceive, ByteSend, TurnOutcome
from connectors.driverkit import OVERSIZE as OVERSIZE
from connectors.driverkit import LineSender, LineSplitter, Oversize, ReaderState, Waiters
from protocol.errors import DecodeError, Refusal
from protocol.refusals import Code

LINE_CAP = 1024 * 1024
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


@dataclass(frozen=True)
class HarnessEvent:
    """A line the codec recognised that is none of the events above: something the harness
    asks of its driver besides turns and state (scribe's mesh calls). The driver routes it to
    nothing of its own; it hands `value`, as the codec decoded it, to `on_harness_event`."""

    value: object


DriverEvent = Ready | TurnStarted | TurnDelta | TurnEnded | StateReported | Rejected | HarnessEvent


class LineCodec(Protocol):
    """One harness's wire format. Encoders return a line without its newline."""

    def encode_prompt(self, text: str, message_id: str, delivery: int = 1) -> bytes:
        """`delivery` is how many times the message has now been delivered: each wire says it
        its own way (a field, or the notice in the text)."""
        ...

    def encode_get_state(self, request_id: str) -> bytes | None:
        """None when the harness has no state query; the driver then reports `Ready`'s id."""
        ...

    def encode_quit(self) -> bytes | None: ...

    def decode(self, line: bytes) -> DriverEvent | None:
        """The event a line carries, None for a line the driver need not act on; raises
        `DecodeError` for a malformed line."""
        ...


class DriverError(Refusal):
    """`harness-gone`: the reader is not running; `harness-error`: the harness said no."""


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
        self._stdout = stdout
        self._codec = codec
        self._line_cap = line_cap
        self._splitter = LineSplitter(line_cap)
        self._on_event = on_event
        self._turn_lock = anyio.Lock()
        # A state query may be sent while a prompt is being written; the sender keeps lines whole.
        # It lets an OSError of the write through, as this driver always has.
        self._out = LineSender(stdin, gone=(anyio.BrokenResourceError, anyio.ClosedResourceError))
        self._turns: Waiters[DriverEvent] = Waiters()
        self._states: Waiters[DriverEvent] = Waiters()
        self._settled = anyio.Event()
        self._session_id: str | None = None
        self._reader = ReaderState()
        self.protocol_errors: deque[str] = deque(maxlen=PROTOCOL_ERRORS_KEPT)

    def launch_prompt_running(self) -> bool:
        """A JSON-lines harness takes its launch prompt in argv, or not at all (jcode's driver
        sends its own and says so)."""
        return False

    async def launch_prompt_settled(self) -> None:
        return None

    @property
    def session_id(self) -> str | None:
        """The last session id the harness reported (ready line or state reply)."""
        return self._session_id

    @property
    def running(self) -> bool:
        return self._reader.running

    # -- the reader --------------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Pump stdout until it ends. Start it once, in the caller's task group."""
        self._reader.start("JsonLinesDriver.run()")
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
        self._reader.stop(detail)
        self._turns.resolve_all(None)
        self._states.resolve_all(None)
        self._settled.set()

    def _consume(self, lines: list[bytes | Oversize]) -> None:
        for line in lines:
            if isinstance(line, Oversize):
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
                self._turns.resolve(message_id, event)
            case StateReported(id=request_id, session_id=session_id):
                if session_id is not None:
                    self._session_id = session_id
                self._states.resolve(request_id, event)
            case Rejected(id=request_id, detail=detail):
                self.protocol_errors.append(f"harness refused a line: {detail}")
                if request_id is not None:
                    self._turns.resolve(request_id, event)
                    self._states.resolve(request_id, event)
            case HarnessEvent(value=value):
                self.on_harness_event(value)
            case _:
                pass

    # -- the hook for what is not a turn -----------------------------------------------------

    def on_harness_event(self, value: object) -> None:
        """A `HarnessEvent`'s value, in the reader's task and in line order. A driver that takes
        such events (`ScribeDriver`'s mesh calls) overrides this; it must not block the reader,
        so one with work to do hands the value to a task of its own. Here the event is a
        protocol error: said, never dropped unsaid."""
        self.protocol_errors.append(
            f"the harness sent a {type(value).__name__} this driver does not take"
        )

    async def send_line(self, line: bytes) -> bool:
        """Write one line (without its newline) to the harness, kept whole beside the prompts and
        state queries the driver writes; False once the harness's stdin is closed."""
        return await self._out.send(line)

    # -- requests ----------------------------------------------------------------------------

    async def wait_ready(self, timeout: float) -> str:
        """The session id from the harness's ready line; DriverError if it exited first."""
        with anyio.fail_after(timeout):
            await self._settled.wait()
        if self._session_id is None:
            raise DriverError(
                Code.DRIVER_STOPPED,
                f"the harness never reported ready ({self._reader.detail})",
                "read the seat's log for why it exited",
            )
        return self._session_id

    async def prompt(self, text: str, *, message_id: str, delivery: int = 1) -> TurnOutcome:
        """Deliver one prompt (delivery `delivery` of its message) and wait for its terminal turn
        event.

        Never raises for a dead harness: a turn whose end was not seen is `unknown`, which the
        caller must not acknowledge. Bound the wait with a cancel scope around the call.
        """
        async with self._turn_lock:
            if not self._reader.running:
                return TurnOutcome("unknown", detail=f"not delivered: {self._reader.detail}")
            with self._turns.expect(message_id) as waiter:
                if not await self._out.send(self._codec.encode_prompt(text, message_id, delivery)):
                    return TurnOutcome(
                        "unknown", detail="harness stdin closed before the prompt was delivered"
                    )
                await waiter.done.wait()
        match waiter.value:
            case TurnEnded(outcome=outcome):
                return outcome
            case Rejected(detail=detail):
                return TurnOutcome("error", detail=f"harness refused the prompt: {detail}")
            case _:
                return TurnOutcome("unknown", detail=self._reader.detail)

    async def get_state(self) -> str | None:
        """The session id the live harness reports now; DriverError once it has stopped."""
        self._require_running()
        request_id = f"state-{uuid.uuid4().hex}"
        line = self._codec.encode_get_state(request_id)
        if line is None:
            return self._session_id
        with self._states.expect(request_id) as waiter:
            if not await self._out.send(line):
                raise DriverError(
                    Code.DRIVER_STOPPED, "harness stdin is closed", "restart the seat"
                )
            await waiter.done.wait()
        match waiter.value:
            case StateReported(session_id=session_id):
                return session_id
            case Rejected(detail=detail):
                raise DriverError(
                    Code.HARNESS_REFUSED, f"harness refused the state query: {detail}"
                )
            case _:
                raise DriverError(
                    Code.DRIVER_STOPPED,
                    f"the harness stopped before answering the state query ({self._reader.detail})",
                    "read the seat's log for why it exited",
                )

    async def quit(self) -> bool:
        """Ask the harness to end its session, then close its stdin; False if it had no quit."""
        line = self._codec.encode_quit()
        sent = line is not None and await self._out.send(line)
        await self.aclose()
        return sent

    async def aclose(self) -> None:
        """Close the harness's stdin (EOF). The reader ends on its own when stdout does."""
        await self._out.aclose()

    def _require_running(self) -> None:
        if not self._reader.running:
            raise DriverError(
                Code.DRIVER_STOPPED,
                f"the harness driver is not reading ({self._reader.detail})",
                "start driver.run() in the seat's task group, or restart the seat",
            )
