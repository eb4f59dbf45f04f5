"""The Agent Client Protocol (ACP) driver: JSON-RPC 2.0 over a harness's stdio, one object per
line. One driver for every ACP harness; a harness's own module (OpenCode: `connectors/opencode.py`)
holds its launch, its store and its quirks, and hands this driver what it must know of them
(`AcpHarness`).

What the driver speaks (protocol version 1):

    cotal -> agent   initialize, session/new | session/load, session/prompt (requests)
                     session/cancel (a notification)
    agent -> cotal   session/update (notifications: the reply's chunks, tool calls, usage)
                     session/request_permission (a request, answered from the seat's policy)
                     fs/*, terminal/* (requests, refused: cotal offers neither capability)

`session/new` and `session/load` carry the seat's cwd and its MCP servers: the mesh tool, when
the manager serves the seat a mesh socket (`mesh_servers`), so no harness module configures it.
A turn is one `session/prompt`; its response is the turn boundary and names why the turn
stopped (`stopReason`). Why a codec here and not the `agent-client-protocol` SDK, and what was
measured, is in docs/design.md, "ACP harnesses, measured".
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import anyio
import msgspec

from connectors.base import ByteReceive, ByteSend, TurnOutcome, TurnUsage, token_count
from connectors.driverkit import JsonStdioDriver, Turn, unavailable_outcome
from connectors.interpreter import own_python
from connectors.launchkit import ProviderKey
from connectors.meshclient import MESH_DIR_ENV
from connectors.meshtool.mcp import SERVER_NAME as MESH_SERVER
from protocol.errors import Refusal
from protocol.refusals import Code

PROTOCOL_VERSION = 1
LINE_CAP = 64 * 1024 * 1024
# How long the driver waits for a new session to be on disk before it writes the pointer.
PERSIST_TIMEOUT_S = 10.0
PERSIST_POLL_S = 0.02
# JSON-RPC's own codes.
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602

# -- the wire -------------------------------------------------------------------------------------
#
# Strict where the protocol is fixed, tolerant where it grows. The envelope is JSON-RPC 2.0's and
# never changes, so it forbids unknown members and `jsonrpc` must be "2.0". The payloads are
# ACP's: the protocol is versioned by `protocolVersion` (checked at `initialize`) and, within a
# version, grows by optional fields and by `_meta`, which every ACP type may carry and agents do
# add (OpenCode sends `messageId`, `rawInput`, `rawOutput`, `configOptions`, `_meta`). A seat that
# refused every message carrying a field it does not act on would stop at the next minor
# release of its harness for nothing; so each payload struct declares exactly the fields the
# driver reads, each strictly typed, and ignores the rest. A field we read with the wrong type,
# or a stop reason outside the protocol's list, is still a decode error.


class RpcError(msgspec.Struct, frozen=True):
    code: int
    message: str
    data: Any = None


class Envelope(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One JSON-RPC 2.0 message: a request (`id` and `method`), a notification (`method`) or a
    response (`id` and `result` or `error`)."""

    jsonrpc: Literal["2.0"]
    id: int | str | None | msgspec.UnsetType = msgspec.UNSET
    method: str | msgspec.UnsetType = msgspec.UNSET
    params: Any = None
    result: Any = msgspec.UNSET
    error: RpcError | msgspec.UnsetType = msgspec.UNSET


class AgentCapabilities(msgspec.Struct, frozen=True):
    loadSession: bool = False


class InitializeResult(msgspec.Struct, frozen=True):
    protocolVersion: int
    agentCapabilities: AgentCapabilities = AgentCapabilities()


class NewSessionResult(msgspec.Struct, frozen=True):
    sessionId: str


class Usage(msgspec.Struct, frozen=True):
    """A prompt's token counts (the `usage` of a `session/prompt` result)."""

    inputTokens: int = 0
    outputTokens: int = 0
    totalTokens: int = 0
    thoughtTokens: int | None = None
    cachedReadTokens: int | None = None
    cachedWriteTokens: int | None = None


StopReason = Literal["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"]


class PromptResult(msgspec.Struct, frozen=True):
    stopReason: StopReason
    usage: Usage | None = None


class ContentBlock(msgspec.Struct, frozen=True):
    type: str
    text: str | None = None


class SessionUpdate(msgspec.Struct, frozen=True):
    sessionUpdate: str
    # A ContentBlock for the message chunks; other updates carry other shapes here.
    content: Any = None
    messageId: str | None = None


class SessionNotification(msgspec.Struct, frozen=True):
    sessionId: str
    update: SessionUpdate


class Location(msgspec.Struct, frozen=True):
    path: str
    line: int | None = None


class ToolCall(msgspec.Struct, frozen=True):
    toolCallId: str
    kind: str | None = None
    title: str | None = None
    locations: list[Location] | None = None


OptionKind = Literal["allow_once", "allow_always", "reject_once", "reject_always"]


class PermissionOption(msgspec.Struct, frozen=True):
    optionId: str
    kind: OptionKind
    name: str = ""


class PermissionRequest(msgspec.Struct, frozen=True):
    sessionId: str
    toolCall: ToolCall
    options: list[PermissionOption]


class MessageKind:
    REQUEST = "request"
    NOTIFICATION = "notification"
    RESPONSE = "response"


def decode_message(line: bytes) -> Envelope:
    """One line as a JSON-RPC 2.0 message; `msgspec.DecodeError` (a ValidationError included)
    for anything else."""
    msg = msgspec.json.decode(line, type=Envelope)
    has_method = msg.method is not msgspec.UNSET
    has_id = msg.id is not msgspec.UNSET
    answered = msg.result is not msgspec.UNSET or msg.error is not msgspec.UNSET
    if has_method and answered:
        raise msgspec.ValidationError("a message cannot be both a request and a response")
    if not has_method and not (has_id and answered):
        raise msgspec.ValidationError("a response needs an id and a result or an error")
    if msg.result is not msgspec.UNSET and msg.error is not msgspec.UNSET:
        raise msgspec.ValidationError("a response carries a result or an error, not both")
    return msg


def kind_of(msg: Envelope) -> str:
    if msg.method is msgspec.UNSET:
        return MessageKind.RESPONSE
    return MessageKind.NOTIFICATION if msg.id is msgspec.UNSET else MessageKind.REQUEST


def request(rid: int | str, method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "method": method, "params": dict(params)}


def notification(method: str, params: Mapping[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "method": method, "params": dict(params)}


def response(rid: int | str | None, result: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "result": result}


def error_response(rid: int | str | None, number: int, message: str) -> dict[str, Any]:
    """A JSON-RPC error response. Its error number is no refusal code, so it is spelled apart
    from the refusal catalogue's scan, which takes any `{"code": ...}` for one."""
    error: dict[str, Any] = {"message": message}
    error["code"] = number
    return {"jsonrpc": "2.0", "id": rid, "error": error}


def mesh_server(mesh_dir: Path) -> dict[str, Any]:
    """The seat's mesh tool as an ACP `McpServer` (stdio): cotal's own MCP server
    (connectors/meshtool), the one every other seat is given, which the agent starts as its
    child inside the seat's sandbox and which reaches the manager through the seat's mesh
    socket. Its environment is named in full (ACP's `env` is what the server gets), so the
    server finds the socket whatever the agent hands its children."""
    python, *args = own_python("connectors.meshtool")
    return {
        "name": MESH_SERVER,
        "command": python,
        "args": args,
        "env": [{"name": MESH_DIR_ENV, "value": str(mesh_dir)}],
    }


def mesh_servers(env: Mapping[str, str]) -> tuple[dict[str, Any], ...]:
    """The MCP servers a seat launched with `env` is given: the mesh tool when the manager
    serves it a mesh socket (`connectors.launchkit.base_env` names it), else none."""
    mesh_dir = env.get(MESH_DIR_ENV)
    return (mesh_server(Path(mesh_dir)),) if mesh_dir else ()


# -- the seat's policy for the agent's tools -------------------------------------------------------

PolicyMode = Literal["workspace-write", "read-only"]
POLICY_MODES: tuple[PolicyMode, ...] = ("workspace-write", "read-only")
DEFAULT_POLICY: PolicyMode = "workspace-write"


def policy_mode(agent: str, value: str | None) -> PolicyMode:
    """`agents.<agent>.permission` as a seat policy, `workspace-write` when unset."""
    value = DEFAULT_POLICY if value is None else value
    for mode in POLICY_MODES:
        if value == mode:
            return mode
    raise Refusal(
        Code.BAD_LAUNCH,
        f"{agent} connector: permission {value!r} is not a seat policy",
        f"set agents.{agent}.permission to one of {', '.join(POLICY_MODES)}, or unset it for "
        f"{DEFAULT_POLICY}",
    )


# The file beside an ACP seat's settings where its launch records the model and the tools'
# policy, so the driver built for the spawned process applies exactly those.
LAUNCH_RECORD = "cotal-launch.json"


@dataclass(frozen=True)
class EndpointLaunch:
    """What an ACP connector's config decides for one launch: the model endpoint, the model,
    the tools' policy, the provider key (read at every spawn), a configured executable, and
    the variables passed through to the seat."""

    base_url: str
    model: str
    permission: PolicyMode
    key: ProviderKey
    binary: str | None
    passthrough: tuple[str, ...]


def launch_record(directory: Path | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """The model and the tools' policy the launch recorded in `directory`, and the record as
    written (for a connector's own members); a record that cannot be read leaves the
    strictest policy and nothing else."""
    out: dict[str, Any] = {"permission": "read-only"}
    if directory is None:
        return out, {}
    try:
        written = json.loads((directory / LAUNCH_RECORD).read_bytes())
    except (OSError, ValueError):
        return out, {}
    if not isinstance(written, dict):
        return out, {}
    if isinstance(written.get("model"), str):
        out["model"] = written["model"]
    if written.get("permission") in POLICY_MODES:
        out["permission"] = written["permission"]
    return out, written


# ACP's tool kinds, by what a call of each may do.
READ_KINDS = frozenset({"read", "search", "think"})
WRITE_KINDS = frozenset({"edit", "delete", "move"})


@dataclass(frozen=True)
class PermissionPolicy:
    """What the seat's tools may do, the ACP face of the seat's sandbox (as Codex's
    `sandbox_mode`): reads inside the seat's tree; in `workspace-write` also edits inside it and
    commands (which run under the seat's isolation, whose Landlock rules let them write only the
    seat's tree and its temp directories). A fetch, an unknown kind, or any path outside the
    tree is refused. Paths are judged lexically; the kernel's rules are the fence, this is the
    seat's manners, answered at once since a seat has nobody to ask."""

    mode: PolicyMode
    tree: Path

    def inside(self, path: str) -> bool:
        p = Path(os.path.normpath(self.tree / path))  # an absolute `path` replaces the tree
        return p == self.tree or p.is_relative_to(self.tree)

    def decide(self, call: ToolCall) -> tuple[bool, str]:
        """Whether to allow `call`, and why, in words for the seat's log."""
        kind = call.kind or "other"
        paths = [loc.path for loc in call.locations or ()]
        outside = [p for p in paths if not self.inside(p)]
        if outside:
            return False, f"{kind} outside the seat's tree ({outside[0]})"
        if kind in READ_KINDS:
            return True, f"{kind} inside the seat's tree"
        if kind in WRITE_KINDS:
            if self.mode != "workspace-write":
                return False, f"{kind} refused by the {self.mode} policy"
            if not paths:
                return False, f"{kind} names no path"
            return True, f"{kind} inside the seat's tree"
        if kind == "execute":
            if self.mode != "workspace-write":
                return False, f"execute refused by the {self.mode} policy"
            return True, "execute under the seat's isolation"
        return False, f"tool kind {kind!r} is not allowed to a seat"

    def answer(self, req: PermissionRequest) -> tuple[dict[str, Any], str]:
        """The `session/request_permission` result for `req`, and why. An allowed call is
        allowed once (never `allow_always`: each call is judged by itself)."""
        allowed, why = self.decide(req.toolCall)
        wanted: tuple[OptionKind, ...] = (
            ("allow_once",) if allowed else ("reject_once", "reject_always")
        )
        for want in wanted:
            for option in req.options:
                if option.kind == want:
                    return {"outcome": {"outcome": "selected", "optionId": option.optionId}}, why
        return {"outcome": {"outcome": "cancelled"}}, f"{why}; no option to say so"


# -- what the driver knows of its harness ----------------------------------------------------------


@dataclass(frozen=True)
class AcpHarness:
    """One ACP harness as its driver needs it, from the harness's module.

    `session_id` checks an id the agent names before it is recorded; `reopenable` says whether
    the harness's store holds the session (so the pointer names only a session a new process
    can `session/load`); `input_includes_cache` says whether the agent's `inputTokens` counts
    the cached input too (measured per harness); `model` is the model the seat runs."""

    name: str
    session_id: Callable[[str], bool]
    reopenable: Callable[[str], bool]
    input_includes_cache: bool = False
    model: str | None = None


def turn_usage(usage: Usage | None, harness: AcpHarness) -> TurnUsage | None:
    if usage is None:
        return None
    cached = token_count(usage.cachedReadTokens)
    uncached = token_count(usage.inputTokens)
    if harness.input_includes_cache:
        uncached = max(0, uncached - cached)
    return TurnUsage(
        input_tokens=uncached,
        output_tokens=token_count(usage.outputTokens),
        cache_read_tokens=cached,
        cache_write_tokens=token_count(usage.cachedWriteTokens),
        model=harness.model,
    )


def judge_prompt(reply: Envelope, text: str, harness: AcpHarness) -> TurnOutcome:
    """The outcome of one `session/prompt` from its response: only `end_turn` with a reply is
    `ok`; a JSON-RPC error is `error` (or `provider-unavailable` when it says so); `cancelled`
    is `aborted`; a turn the agent stopped short (`max_tokens`, `max_turn_requests`, `refusal`)
    is `error`, so the message is retried and, in the end, dead-lettered."""
    if not isinstance(reply.error, msgspec.UnsetType):
        return unavailable_outcome(
            TurnOutcome("error", detail=reply.error.message or f"error {reply.error.code}")
        )
    try:
        result = msgspec.convert(reply.result, PromptResult)
    except msgspec.ValidationError as exc:
        return TurnOutcome("unknown", detail=f"{harness.name} answered the prompt with {exc}")
    usage = turn_usage(result.usage, harness)
    if result.stopReason == "end_turn":
        if not text.strip():
            return TurnOutcome("unknown", detail="the model produced no output", usage=usage)
        return TurnOutcome("ok", reply=text, usage=usage)
    if result.stopReason == "cancelled":
        return TurnOutcome("aborted", detail="turn cancelled", usage=usage)
    return TurnOutcome(
        "error", reply=text, detail=f"the agent stopped the turn: {result.stopReason}", usage=usage
    )


# -- the driver -----------------------------------------------------------------------------------


class _Turn(Turn):
    def __init__(self) -> None:
        super().__init__()
        # The agent's message chunks of this turn, by message id, in the order they began.
        self.messages: dict[str, list[str]] = {}
        self.cancelled = False
        # Why the seat's policy refused each tool call of this turn.
        self.refused: list[str] = []

    def reply(self) -> str:
        """The text of the turn's last agent message (a tool turn's earlier messages are steps)."""
        if not self.messages:
            return ""
        return "".join(list(self.messages.values())[-1])


class AcpDriver(JsonStdioDriver[_Turn]):
    """A seat's ACP agent: requests carry our ids and their responses are routed by them; a
    turn ends with its `session/prompt` response. The agent's requests are answered at once:
    permissions from the seat's policy, everything else refused."""

    who = "acp"

    def __init__(
        self,
        stdin: ByteSend,
        stdout: ByteReceive,
        *,
        harness: AcpHarness,
        policy: PermissionPolicy,
        cwd: Path,
        pointer_path: Path | None = None,
        expected_session_id: str | None = None,
        initial_prompt: str | None = None,
        mcp_servers: tuple[dict[str, Any], ...] = (),
        line_cap: int = LINE_CAP,
    ) -> None:
        super().__init__(
            stdin,
            stdout,
            pointer_path=pointer_path,
            expected_session_id=expected_session_id,
            initial_prompt=initial_prompt,
            line_cap=line_cap,
        )
        self.harness = harness
        self.policy = policy
        self._cwd = cwd
        self._mcp_servers = mcp_servers
        self._refusal: Refusal | None = None
        self.agent_capabilities: AgentCapabilities | None = None
        # Each permission the agent asked for and how it was answered: (kind, allowed, why).
        self.permissions: list[tuple[str, bool, str]] = []

    # -- reader ---------------------------------------------------------------------------------

    async def _handle(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            msg = decode_message(line)
        except msgspec.DecodeError as exc:
            self._note(f"{self.who} wrote a line that is not a JSON-RPC 2.0 message ({exc})")
            return
        kind = kind_of(msg)
        if kind == MessageKind.RESPONSE:
            self._pending.resolve(str(msg.id), {"envelope": msg})
        elif kind == MessageKind.REQUEST:
            await self._answer(msg)
        elif msg.method == "session/update":
            self._update(msg.params)

    def _update(self, params: Any) -> None:
        turn = self._turn
        if turn is None:
            # A `session/load` replays the session's history as updates: nothing to collect.
            return
        try:
            note = msgspec.convert(params, SessionNotification)
        except msgspec.ValidationError as exc:
            self._note(f"{self.who} sent a session/update we cannot read ({exc})")
            return
        if note.sessionId != self.session_id:
            return
        update = note.update
        if update.sessionUpdate == "agent_message_chunk":
            try:
                block = msgspec.convert(update.content, ContentBlock)
            except msgspec.ValidationError:
                return
            if block.type == "text" and block.text:
                turn.messages.setdefault(update.messageId or "", []).append(block.text)

    async def _answer(self, msg: Envelope) -> None:
        rid = msg.id if not isinstance(msg.id, msgspec.UnsetType) else None
        if msg.method == "session/request_permission":
            try:
                req = msgspec.convert(msg.params, PermissionRequest)
            except msgspec.ValidationError as exc:
                await self._send(error_response(rid, INVALID_PARAMS, f"invalid params: {exc}"))
                return
            result, why = self.policy.answer(req)
            allowed = result["outcome"].get("optionId") in {
                o.optionId for o in req.options if o.kind.startswith("allow")
            }
            self.permissions = [
                *self.permissions[-63:],
                (req.toolCall.kind or "other", allowed, why),
            ]
            if not allowed and self._turn is not None:
                self._turn.refused.append(why)
            await self._send(response(rid, result))
        else:
            # cotal offers no client file system and no terminal (initialize says so): the
            # agent's own tools do their work, under the seat's isolation.
            await self._send(
                error_response(rid, METHOD_NOT_FOUND, f"cotal does not serve {msg.method!r}")
            )

    # -- commands -------------------------------------------------------------------------------

    async def _call(self, method: str, params: Mapping[str, Any]) -> Envelope:
        reply = await self._request(
            method.replace("/", "-"), lambda rid: request(rid, method, params)
        )
        if reply is None:
            raise self._gone(f"call {method}")
        envelope: Envelope = reply["envelope"]
        if not isinstance(envelope.error, msgspec.UnsetType):
            raise Refusal(
                Code.HARNESS_ERROR,
                f"{self.who} connector: {self.who} refused {method}: {envelope.error.message}",
                "read the seat's log",
            )
        return envelope

    async def _result(self, method: str, params: Mapping[str, Any], shape: type[Any]) -> Any:
        envelope = await self._call(method, params)
        try:
            return msgspec.convert(envelope.result, shape)
        except msgspec.ValidationError as exc:
            raise Refusal(
                Code.HARNESS_ERROR,
                f"{self.who} connector: {self.who} answered {method} with {exc}",
                "run the pinned version (`cotal tools install`)",
            ) from None

    async def _open_session(self) -> str:
        init: InitializeResult = await self._result(
            "initialize",
            {
                "protocolVersion": PROTOCOL_VERSION,
                "clientCapabilities": {
                    "fs": {"readTextFile": False, "writeTextFile": False},
                    "terminal": False,
                },
                "clientInfo": {"name": "cotal", "version": "1"},
            },
            InitializeResult,
        )
        if init.protocolVersion != PROTOCOL_VERSION:
            raise Refusal(
                Code.HARNESS_ERROR,
                f"{self.who} connector: {self.who} speaks ACP version {init.protocolVersion}, "
                f"cotal speaks {PROTOCOL_VERSION}",
                "run the pinned version (`cotal tools install`)",
            )
        self.agent_capabilities = init.agentCapabilities
        # The MCP servers go with `session/load` too: an agent starts them per session, and a
        # reloaded session's are this launch's (its mesh socket's path is this incarnation's).
        # The cwd is given so a session loaded at another path works there.
        params = {"cwd": str(self._cwd), "mcpServers": list(self._mcp_servers)}
        if self._expected is not None:
            if not init.agentCapabilities.loadSession:
                raise Refusal(
                    Code.HARNESS_ERROR,
                    f"{self.who} connector: {self.who} cannot load session {self._expected} "
                    "(initialize answered loadSession: false)",
                    "run the pinned version (`cotal tools install`)",
                )
            await self._call("session/load", {"sessionId": self._expected, **params})
            session_id = self._expected
        else:
            new: NewSessionResult = await self._result("session/new", params, NewSessionResult)
            session_id = new.sessionId
        if not self.harness.session_id(session_id):
            raise Refusal(
                Code.HARNESS_ERROR,
                f"{self.who} connector: {self.who} opened no session id we can record "
                f"({session_id!r})",
                "run the pinned version (`cotal tools install`)",
            )
        self.session_id = session_id
        return session_id

    async def _learn_session(self) -> None:
        try:
            session_id = await self._open_session()
            with anyio.move_on_after(PERSIST_TIMEOUT_S):
                while True:
                    if await anyio.to_thread.run_sync(self.harness.reopenable, session_id):
                        break
                    await anyio.sleep(PERSIST_POLL_S)
            if await anyio.to_thread.run_sync(self.harness.reopenable, session_id):
                await self._write_pointer("running")
            else:
                self._refusal = Refusal(
                    Code.HARNESS_ERROR,
                    f"{self.who} connector: {self.who} did not store session {session_id} "
                    f"within {PERSIST_TIMEOUT_S:.0f}s",
                    "read the seat's log",
                )
        except Refusal as exc:
            self._refusal = exc
            self._note(exc.text)
        finally:
            self.state_known.set()

    async def get_state(self) -> str | None:
        """The session id once the agent opened it and stored it, else None."""
        if self._refusal is not None:
            raise self._refusal
        if not self._reader.running:
            raise self._gone(f"query {self.who}'s state")
        return self.session_id if self._written is not None else None

    # -- turns ----------------------------------------------------------------------------------

    async def _turn_locked(self, text: str, message_id: str) -> TurnOutcome:
        if not self._reader.running:
            return TurnOutcome("unknown", detail=f"not delivered: {self._reader.detail}")
        await self.state_known.wait()
        if self.session_id is None or self._written is None:
            why = self._refusal.text if self._refusal is not None else "no session is open"
            return TurnOutcome("unknown", detail=f"not delivered: {why}")
        turn = _Turn()
        self._turn = turn
        params = {"sessionId": self.session_id, "prompt": [{"type": "text", "text": text}]}
        try:
            reply = await self._request(
                "session-prompt", lambda rid: request(rid, "session/prompt", params)
            )
        except anyio.get_cancelled_exc_class():
            # The caller gave up on the turn: the agent stops it too, so the next prompt is
            # never interleaved with this one's tail. Its late response is dropped by id.
            with anyio.CancelScope(shield=True):
                await self.cancel()
            raise
        finally:
            self._turn = None
        if reply is None:
            return TurnOutcome(
                "unknown", detail=f"turn {message_id} did not end: {self._reader.detail}"
            )
        outcome = judge_prompt(reply["envelope"], turn.reply(), self.harness)
        if outcome.status == "unknown" and turn.refused and not outcome.reply:
            # An agent that stops at a refused tool call (OpenCode does) ended the turn cleanly
            # and said nothing: the message asked for what the seat may not do, which counts
            # against it as a failed turn does, rather than coming back as if never seen.
            return TurnOutcome(
                "error",
                detail=f"the seat's policy refused the agent's tool call: {turn.refused[0]}",
                usage=outcome.usage,
            )
        return outcome

    async def cancel(self) -> bool:
        """Ask the agent to stop the turn in flight (`session/cancel`); its `session/prompt`
        then answers `cancelled`, which ends the turn `aborted`."""
        turn = self._turn
        if self.session_id is None:
            return False
        if turn is not None:
            turn.cancelled = True
        return await self._send(notification("session/cancel", {"sessionId": self.session_id}))

    async def interrupt(self) -> bool:
        """The name Codex's driver gives the same act."""
        return self._turn is not None and await self.cancel()
