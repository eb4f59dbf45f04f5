"""The scribe connector: launches and drives the built-in offline harness.

scribe keeps its own session store, reopens a session by id and forks one, so it declares every
capability and its continuity class is `exact`. The store lives under the workspace root by
default and is declared with a `workspace-root` anchor, so a cut captures it and a destination
host resolves it against its own root.
"""

from __future__ import annotations

import os
from pathlib import Path

import msgspec

from connectors.base import (
    ByteReceive,
    ByteSend,
    Capabilities,
    LaunchOpts,
    LaunchSpec,
    StoreDecl,
    TurnOutcome,
)
from connectors.interpreter import own_python
from connectors.jsonl_driver import (
    DriverEvent,
    JsonLinesDriver,
    Ready,
    Rejected,
    StateReported,
    TurnDelta,
    TurnEnded,
    TurnStarted,
)
from connectors.launchkit import base_env, check_prompt, refuse_resume_with_continuation
from connectors.scribe.harness import (
    LINE_CAP,
    DeltaOut,
    GetStateIn,
    PromptIn,
    ProtocolErrorOut,
    QuitIn,
    ReadyOut,
    StateOut,
    TurnEndOut,
    TurnStartOut,
    decode_outbound,
)
from protocol.codec import encode_json
from protocol.errors import DecodeError


class ScribeCodec:
    """scribe's wire format, as the generic JSON-lines driver sees it."""

    def encode_prompt(self, text: str, message_id: str, delivery: int = 1) -> bytes:
        # scribe's wire says it in a field: the text stays the message's own.
        return encode_json(PromptIn(id=message_id, text=text, delivery=delivery))

    def encode_get_state(self, request_id: str) -> bytes | None:
        return encode_json(GetStateIn(id=request_id))

    def encode_quit(self) -> bytes | None:
        return encode_json(QuitIn())

    def decode(self, line: bytes) -> DriverEvent | None:
        if len(line) > LINE_CAP:
            raise DecodeError("scribe event", f"{len(line)} bytes exceeds the {LINE_CAP}-byte cap")
        try:
            event = decode_outbound(line)
        except msgspec.DecodeError as exc:  # ValidationError is a DecodeError
            raise DecodeError("scribe event", str(exc)) from None
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
        return None


def store_path(opts: LaunchOpts, connector: str = "scribe") -> Path:
    configured = opts.config.get("store")
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

    def build_launch(self, opts: LaunchOpts) -> LaunchSpec:
        refuse_resume_with_continuation(self.name, opts)
        check_prompt(self.name, opts.prompt)
        store = store_path(opts, self.name)
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
        if opts.config.get("ignore_sigterm"):
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

    def make_driver(
        self, stdin: ByteSend, stdout: ByteReceive, spec: LaunchSpec
    ) -> JsonLinesDriver:
        return JsonLinesDriver(stdin, stdout, ScribeCodec())


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
