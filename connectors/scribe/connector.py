"""The scribe connector: launches and drives the built-in offline harness.

scribe keeps its own session store, reopens a session by id and forks one, so it declares every
capability and its continuity class is `exact`. The store lives under the workspace root by
default and is declared with a `workspace-root` anchor, so a cut captures it and a destination
host resolves it against its own root.
"""

from __future__ import annotations

import functools
import os
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskStatus

from connectors.base import (
    ByteReceive,
    ByteSend,
    Capabilities,
    LaunchOpts,
    LaunchSpec,
    MeshPort,
    StoreDecl,
    TurnOutcome,
)
from connectors.doctorkit import HarnessCheck, Missing, Pins, probe
from connectors.interpreter import own_python
from connectors.jsonl_driver import (
    DriverEvent,
    HarnessEvent,
    JsonLinesDriver,
    Ready,
    Rejected,
    StateReported,
    TurnDelta,
    TurnEnded,
    TurnStarted,
)
from connectors.launchkit import (
    base_env,
    check_prompt,
    decode_config,
    refuse_resume_with_continuation,
)
from connectors.scribe.harness import (
    LINE_CAP,
    DeltaOut,
    GetStateIn,
    MeshOut,
    MeshResultIn,
    PromptIn,
    ProtocolErrorOut,
    QuitIn,
    ReadyOut,
    StateOut,
    TurnEndOut,
    TurnStartOut,
    decode_outbound,
)
from protocol import meshcall
from protocol.codec import encode_json
from protocol.errors import DecodeError, Refusal
from protocol.refusals import Code

# Calls a harness may have waiting for an answer at once; scribe waits for each, so only a
# hostile harness reaches this, and its surplus calls are answered refused, never run.
MESH_PENDING = 8
MESH_REFUSALS_KEPT = 64


class ScribeCodec:
    """scribe's wire format, as the generic JSON-lines driver sees it."""

    def encode_prompt(self, text: str, message_id: str, delivery: int = 1) -> bytes:
        # scribe's wire says it in a field: the text stays the message's own.
        return encode_json(PromptIn(id=message_id, text=text, delivery=delivery))

    def encode_get_state(self, request_id: str) -> bytes | None:
        return encode_json(GetStateIn(id=request_id))

    def encode_quit(self) -> bytes | None:
        return encode_json(QuitIn())

    @staticmethod
    def outbound(line: bytes) -> object:
        if len(line) > LINE_CAP:
            raise DecodeError("scribe event", f"{len(line)} bytes exceeds the {LINE_CAP}-byte cap")
        try:
            return decode_outbound(line)
        except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
            raise DecodeError("scribe event", str(exc)) from None

    def decode(self, line: bytes) -> DriverEvent | None:
        event = self.outbound(line)
        match event:
            case ReadyOut(session_id=session_id):
                return Ready(session_id)
            case TurnStartOut(id=message_id):
                return TurnStarted(message_id)
            case DeltaOut(id=message_id, text=text):
                return TurnDelta(message_id, text)
            case TurnEndOut(id=message_id, status=status, reply=reply, detail=detail):
                return TurnEnded(message_id, TurnOutcome(status, reply, detail))
            case StateOut(id=request_id, session_id=session_id):
                return StateReported(request_id, session_id)
            case ProtocolErrorOut(id=request_id, detail=detail):
                return Rejected(request_id, detail)
            case MeshOut():
                return HarnessEvent(event)
        return None


class ScribeConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """`[agents.scribe]`: the model a seat records (scribe calls no model, but the manager
    records it and the launch profile names it), the store directory (relative to the workspace
    root; default one per seat under `.cotal/sessions/scribe/`), and `ignore_sigterm`, a test
    aid: the harness ignores SIGTERM so a stop must escalate to SIGKILL. Anything else is
    refused."""

    model: str | None = None
    store: str | None = None
    ignore_sigterm: bool = False


def store_path(opts: LaunchOpts, config: ScribeConfig, connector: str = "scribe") -> Path:
    configured = config.store
    if configured:
        # A relative store is anchored at the workspace root, like every other seat path.
        return opts.workspace_root / Path(configured)
    return (
        opts.workspace_root
        / ".cotal"
        / "sessions"
        / connector
        / f"{opts.name}-{opts.lifecycle_uid}.store"
    )


def _relative_to_root(path: Path, root: Path) -> str | None:
    # Lexical, not resolved: the declaration must name the path the seat was given, and a
    # symlinked root on the source host means nothing on the destination.
    normalized = Path(os.path.normpath(path))
    try:
        return normalized.relative_to(os.path.normpath(root)).as_posix()
    except ValueError:
        return None


class ScribeConnector:
    name = "scribe"
    capabilities = Capabilities(
        supports_resume=True,
        supports_session_continuation=True,
        supports_fresh_start=True,
        supports_prompt=True,
    )

    config_type = ScribeConfig

    @staticmethod
    def builtin_version() -> str:
        """Built in: the version cotal itself declares for scribe (its own), which is also the
        one session format it was measured against (`connectors.base.measured_versions`)."""
        return _cotal_version()

    def build_launch(self, opts: LaunchOpts) -> LaunchSpec:
        refuse_resume_with_continuation(self.name, opts)
        check_prompt(self.name, opts.prompt)
        config = decode_config(self.name, opts.config, ScribeConfig)
        store = store_path(opts, config, self.name)
        argv = [
            # Isolated: the seat's cwd, which the seat writes, must not stand in for cotal.
            *own_python("connectors.scribe"),
            "--store",
            str(store),
            "--pointer",
            str(opts.session_pointer_path),
        ]
        if opts.continue_session:
            argv += ["--session-id", opts.continue_session]
        if opts.resume:
            argv += ["--fork", opts.resume]
        if opts.prompt is not None:
            argv += ["--prompt", opts.prompt]
        if config.ignore_sigterm:
            argv.append("--ignore-sigterm")
        env = base_env(opts)
        relpath = _relative_to_root(store, opts.workspace_root)
        return LaunchSpec(
            argv=argv,
            env=env,
            cwd=opts.cwd,
            session_pointer_path=opts.session_pointer_path,
            session_store=(StoreDecl("workspace-root", relpath),) if relpath else (),
            expected_session_id=opts.continue_session,
        )

    def make_driver(self, stdin: ByteSend, stdout: ByteReceive, spec: LaunchSpec) -> ScribeDriver:
        return ScribeDriver(stdin, stdout, ScribeCodec())

    def doctor(self, config: Mapping[str, Any], pins: Pins) -> HarnessCheck:
        """Built in: the program is this interpreter running the package's own module, isolated
        as a launch runs it, so the probe finds cotal where a seat will."""
        decode_config(self.name, config, ScribeConfig)
        program = own_python("connectors.scribe")
        check = HarnessCheck(installed=True, path=" ".join(program), version=self.builtin_version())
        check.usable, detail = probe([*program, "--help"], {"PATH": os.environ.get("PATH", "")})
        if not check.usable:
            check.missing.append(
                Missing(f"scribe does not start: {detail}", "reinstall cotal (`pip install .`)")
            )
        return check


@functools.cache
def _cotal_version() -> str:
    try:
        from importlib.metadata import version

        return f"cotal {version('cotal')}"
    except Exception:
        return "built-in"


class ScribeDriver(JsonLinesDriver):
    """The JSON-lines driver, and the seat's mesh calls: each `mesh` line scribe writes is
    handed to the manager's port for this seat, one at a time and in order, and the answer is
    written back as `mesh_result`. The port, not the line, knows who is calling."""

    carries_mesh = True

    def __init__(self, stdin: ByteSend, stdout: ByteReceive, codec: ScribeCodec) -> None:
        super().__init__(stdin, stdout, codec)
        self.mesh_port: MeshPort | None = None
        self._calls, self._pending = anyio.create_memory_object_stream[tuple[str, bytes]](
            MESH_PENDING
        )
        self._overflow: deque[str] = deque(maxlen=MESH_REFUSALS_KEPT)
        self._overflowed = anyio.Event()

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._serve_calls)
            try:
                await super().run(task_status=task_status)
            finally:
                tg.cancel_scope.cancel()

    def on_harness_event(self, value: object) -> None:
        if isinstance(value, MeshOut):
            self._enqueue(value.id, bytes(value.call))
            return
        super().on_harness_event(value)

    def _enqueue(self, call_id: str, call: bytes) -> None:
        try:
            self._calls.send_nowait((call_id, call))
        except anyio.WouldBlock:
            if len(self._overflow) == self._overflow.maxlen:
                self.protocol_errors.append(f"mesh call {call_id[:64]} dropped: too many waiting")
                return
            self._overflow.append(call_id)
            self._overflowed.set()

    async def _serve_calls(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self._refuse_overflow)
            async for call_id, call in self._pending:
                await self._answer(call_id, await self._result(call))

    async def _result(self, call: bytes) -> bytes:
        port = self.mesh_port
        if port is None:
            return meshcall.encode_result(
                meshcall.refused(
                    Refusal(
                        Code.MESH_CALL_INVALID,
                        "this seat has no mesh port: the manager did not attach one",
                        "spawn the seat under a cotal manager",
                    )
                )
            )
        return await port(call)

    async def _refuse_overflow(self) -> None:
        busy = meshcall.encode_result(
            meshcall.refused(
                Refusal(
                    Code.MESH_CALL_INVALID,
                    f"more than {MESH_PENDING} mesh calls were waiting for an answer",
                    "wait for each call's answer before the next",
                )
            )
        )
        while True:
            await self._overflowed.wait()
            self._overflowed = anyio.Event()
            while self._overflow:
                await self._answer(self._overflow.popleft(), busy)

    async def _answer(self, call_id: str, result: bytes) -> None:
        await self.send_line(encode_json(MeshResultIn(id=call_id, result=msgspec.Raw(result))))


class ScribeForkConnector(ScribeConnector):
    """The built-in scribe as a harness that can only resume by forking: it declares resume
    (a new session carrying the old one's history) and no continuation, so its class is `fork`.
    It runs the fork path of a resume offline, as `scribe` runs the exact one."""

    name = "scribe-fork"
    capabilities = Capabilities(
        supports_resume=True,
        supports_fresh_start=True,
        supports_prompt=True,
    )
