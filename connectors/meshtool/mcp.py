"""A stdio MCP server (JSON-RPC 2.0, one message per LF-terminated line) whose four tools are
the seat's mesh calls, forwarded one `tools/call` at a time over the seat's mesh socket.

It is the only program on the seat's side of the socket that Claude Code starts for cotal, so it
is strict and small: standard library and `connectors.meshclient` only (it runs `python -I`
inside the seat's sandbox), every line capped, every malformed message answered with a JSON-RPC
error and never a crash, and nothing but protocol on stdout (fd 1 is moved aside at start, so a
stray print lands on stderr, which Claude Code keeps as the server's log).

The tools' arguments are checked here against the very schemas `tools/list` shows, so a model
that gets one wrong is told what and how to fix it in the tool's result (an `isError` result it
can read, as MCP asks for input errors); the manager checks the call again
(`protocol.meshcall.decode_call`), and it alone decides what a call may do.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from typing import IO, Any, cast

from connectors import meshclient

SERVER_NAME = "cotal"
SERVER_VERSION = "1"
# Newest first; an unknown version the client asks for is answered with the first (MCP
# lifecycle: the server answers a version it supports, the client decides whether to go on).
PROTOCOL_VERSIONS = ("2025-11-25", "2025-06-18", "2025-03-26", "2024-11-05")

# protocol.meshcall's bounds, restated because this module may import nothing of cotal but
# meshclient (tests/unit/test_meshtool_mcp.py holds them equal).
TEXT_MAX = 128 * 1024  # protocol.messages.DM_TEXT_MAX, in characters
CALL_CAP = TEXT_MAX + 4096  # protocol.meshcall.CALL_CAP, in bytes of the call's JSON
HISTORY_MAX = 1000  # protocol.meshcall.MAX_HISTORY_READ
HISTORY_DEFAULT = 20
NAME_PATTERN = r"^[A-Za-z0-9_]{1,64}$"  # protocol.names.SEAT_NAME, in JSON Schema's dialect
_NAME_RE = re.compile(r"[A-Za-z0-9_]{1,64}")

# One incoming line at most: a full-size text escaped by the client (up to 6 bytes a character
# for control characters) plus the envelope. Past it the line is skipped whole and refused.
LINE_CAP = 6 * TEXT_MAX + 64 * 1024
# How much of a value a refusal quotes back.
QUOTE_MAX = 80

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603

INSTRUCTIONS = (
    "These tools talk to the other seats (agents) of this cotal space, as this seat: `seats` "
    "lists who this seat may message, `send` messages one of them, `post` posts to a channel, "
    "`history` reads a channel's recent posts. A seat's reply to your message does not come "
    "back here; ask it to `send` you one."
)

_SEAT = {
    "type": "string",
    "pattern": NAME_PATTERN,
    "description": "A seat's name: letters, digits and _, up to 64.",
}
_CHANNEL = {
    "type": "string",
    "pattern": NAME_PATTERN,
    "description": "A channel's name, without `#`: letters, digits and _, up to 64.",
}
_TEXT = {"type": "string", "maxLength": TEXT_MAX, "description": "The text, up to 128 KiB."}

TOOLS: list[dict[str, Any]] = [
    {
        "name": "send",
        "title": "Send to a seat",
        "description": (
            "Send a direct message to another seat of this cotal space, as this seat. The "
            "recipient gets `text` as a turn of its own, under a first line naming this seat. "
            "Only seats this seat was allowed to send to can be reached (see `seats`). Its "
            "reply does not come back to you: ask it to send you one."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {"to": _SEAT, "text": _TEXT},
            "required": ["to", "text"],
            "additionalProperties": False,
        },
        "annotations": {"readOnlyHint": False, "destructiveHint": False, "openWorldHint": False},
    },
    {
        "name": "post",
        "title": "Post to a channel",
        "description": (
            "Post `text` to a channel of this cotal space, as this seat (only a channel this "
            "seat was allowed to post to). Every seat subscribed to it gets the post as a turn."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {"channel": _CHANNEL, "text": _TEXT},
            "required": ["channel", "text"],
            "additionalProperties": False,
        },
        "annotations": {"readOnlyHint": False, "destructiveHint": False, "openWorldHint": False},
    },
    {
        "name": "history",
        "title": "Read a channel",
        "description": (
            "The most recent posts of a channel, oldest first, each with its sender (a channel "
            "this seat is subscribed to or may post to)."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "channel": _CHANNEL,
                "limit": {
                    "type": "integer",
                    "minimum": 1,
                    "maximum": HISTORY_MAX,
                    "default": HISTORY_DEFAULT,
                    "description": f"How many posts, 1 to {HISTORY_MAX} (default "
                    f"{HISTORY_DEFAULT}).",
                },
            },
            "required": ["channel"],
            "additionalProperties": False,
        },
        "annotations": {"readOnlyHint": True, "openWorldHint": False},
    },
    {
        "name": "seats",
        "title": "List seats",
        "description": "The seats of this cotal space this seat may send to, sorted.",
        "inputSchema": {"type": "object", "properties": {}, "additionalProperties": False},
        "annotations": {"readOnlyHint": True, "openWorldHint": False},
    },
]
_BY_NAME = {tool["name"]: tool for tool in TOOLS}


def _rpc_error_object(number: int, message: str) -> dict[str, object]:
    # A JSON-RPC error number is no refusal code; spelled apart from the refusal catalogue's
    # scan, which takes any {"code": ...} for one.
    error: dict[str, object] = {"message": message}
    error["code"] = number
    return error


class RpcError(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _quote(value: object) -> str:
    text = json.dumps(value, ensure_ascii=False)
    return text if len(text) <= QUOTE_MAX else text[: QUOTE_MAX - 3] + "..."


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "an array" if isinstance(value, list) else "an object"


def check_arguments(tool: str, schema: Mapping[str, Any], args: Mapping[str, Any]) -> str | None:
    """What is wrong with `args` under one of this module's input schemas, or None. Only the
    keywords those schemas use are understood."""
    properties: Mapping[str, Mapping[str, Any]] = schema["properties"]
    unknown = sorted(k for k in args if k not in properties)
    if unknown:
        allowed = ", ".join(properties) or "none"
        return f"{tool} takes no argument {', '.join(unknown)} (its arguments: {allowed})"
    for key in schema.get("required", ()):
        if key not in args:
            return f"{tool} needs the argument {key}"
    for key, value in args.items():
        rule = properties[key]
        if rule["type"] == "string":
            if not isinstance(value, str):
                return f"{tool}: {key} must be a string, not {_kind(value)}"
            try:
                value.encode()
            except UnicodeEncodeError:
                return f"{tool}: {key} holds a lone surrogate (\\ud800-\\udfff), which is not text"
            if "maxLength" in rule and len(value) > rule["maxLength"]:
                return (
                    f"{tool}: {key} is {len(value)} characters, over the {rule['maxLength']} "
                    "allowed"
                )
            if "pattern" in rule and not _NAME_RE.fullmatch(value):
                return (
                    f"{tool}: {key} {_quote(value)} is not a name (letters, digits and _, up to 64)"
                )
        elif rule["type"] == "integer":
            if isinstance(value, bool) or not isinstance(value, int):
                return f"{tool}: {key} must be an integer, not {_kind(value)}"
            if not rule["minimum"] <= value <= rule["maximum"]:
                return f"{tool}: {key} is {value}, outside {rule['minimum']} to {rule['maximum']}"
    return None


def _tool_result(text: str, *, error: bool) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": text}], "isError": error}


def render(result: Mapping[str, Any]) -> dict[str, Any]:
    """The tool result for one mesh answer: a refusal is an error result `code: message (cure)`,
    any other answer its JSON line as the manager wrote it."""
    if result.get("status") == "refused":
        text = f"{result.get('code')}: {result.get('message')}"
        if result.get("cure"):
            text += f" ({result['cure']})"
        return _tool_result(text, error=True)
    return _tool_result(json.dumps(result, ensure_ascii=False, separators=(",", ":")), error=False)


class NotSent(Exception):
    """The call never left: the socket could not be reached."""


class AnswerLost(Exception):
    """The call was sent, or may have been, and its answer did not come back."""


MeshCaller = Callable[[dict[str, object]], Mapping[str, Any]]


def mesh_call(call: dict[str, object]) -> Mapping[str, Any]:
    """One call on a connection of its own. A connection cut mid-call is never retried: the
    manager may have run the call, and a retry would be another send (the manager numbers each
    call of a turn), so the model is told instead."""
    try:
        sock = meshclient.connect()
    except meshclient.MeshUnreachable as exc:
        raise NotSent(str(exc)) from None
    with sock:
        try:
            return meshclient.call(sock, call)
        except meshclient.MeshUnreachable as exc:
            raise AnswerLost(str(exc)) from None


class Server:
    def __init__(self, out: IO[bytes], err: IO[str], caller: MeshCaller = mesh_call) -> None:
        self._out = out
        self._err = err
        self._caller = caller

    def log(self, text: str) -> None:
        print(f"cotal meshtool: {text}", file=self._err, flush=True)

    def write(self, message: Mapping[str, Any]) -> None:
        # ASCII-only JSON: no raw newline or U+2028 can split the line on the client's side.
        self._out.write(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        self._out.flush()

    def rpc_error(self, request_id: object, number: int, message: str) -> None:
        self.write(
            {"jsonrpc": "2.0", "id": request_id, "error": _rpc_error_object(number, message)}
        )

    # -- one line -------------------------------------------------------------------------------

    def handle_line(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            message = json.loads(line)
        except (ValueError, RecursionError) as exc:
            self.rpc_error(None, PARSE_ERROR, f"the line is not JSON: {exc}")
            return
        if isinstance(message, list):
            self.rpc_error(
                None, INVALID_REQUEST, "batches are not accepted; send one message a line"
            )
            return
        if not isinstance(message, dict):
            self.rpc_error(
                None, INVALID_REQUEST, f"a message is a JSON object, not {_kind(message)}"
            )
            return
        has_id = "id" in message
        request_id = message.get("id")
        if has_id and (isinstance(request_id, bool) or not isinstance(request_id, str | int)):
            self.rpc_error(None, INVALID_REQUEST, "id must be a string or an integer")
            return
        try:
            result = self.dispatch(message, has_id)
        except RpcError as exc:
            if has_id:
                self.rpc_error(request_id, exc.code, exc.message)
            else:
                self.log(f"notification refused: {exc.message}")
            return
        except Exception as exc:  # noqa: BLE001 - the server must outlive any one request
            self.log(f"internal error: {exc!r}")
            if has_id:
                self.rpc_error(request_id, INTERNAL_ERROR, f"internal error: {type(exc).__name__}")
            return
        if has_id and result is not None:
            self.write({"jsonrpc": "2.0", "id": request_id, "result": result})

    def dispatch(self, message: dict[str, Any], has_id: bool) -> dict[str, Any] | None:
        if message.get("jsonrpc") != "2.0":
            raise RpcError(INVALID_REQUEST, 'jsonrpc must be "2.0"')
        method = message.get("method")
        if method is None and ("result" in message or "error" in message):
            # An answer to a request of ours; this server sends none, so nothing waits for it.
            return None
        unknown = sorted(set(message) - {"jsonrpc", "id", "method", "params"})
        if unknown:
            raise RpcError(INVALID_REQUEST, f"unknown member {', '.join(unknown)}")
        if not isinstance(method, str):
            raise RpcError(INVALID_REQUEST, "method must be a string")
        params = message.get("params", {})
        if not isinstance(params, dict):
            raise RpcError(INVALID_PARAMS, "params must be an object")
        if not has_id:
            # Notifications (`notifications/initialized`, `notifications/cancelled`, ...) need no
            # answer and change nothing here: a call in flight has already been sent.
            return None
        if method == "initialize":
            return self.initialize(params)
        if method == "ping":
            return {}
        if method == "tools/list":
            return {"tools": TOOLS}
        if method == "tools/call":
            return self.call_tool(params)
        raise RpcError(METHOD_NOT_FOUND, f"method {_quote(method)} is not served")

    def initialize(self, params: Mapping[str, Any]) -> dict[str, Any]:
        asked = params.get("protocolVersion")
        if not isinstance(asked, str):
            raise RpcError(INVALID_PARAMS, "initialize needs params.protocolVersion, a string")
        version = asked if asked in PROTOCOL_VERSIONS else PROTOCOL_VERSIONS[0]
        return {
            "protocolVersion": version,
            "capabilities": {"tools": {}},
            "serverInfo": {"name": SERVER_NAME, "version": SERVER_VERSION},
            "instructions": INSTRUCTIONS,
        }

    def call_tool(self, params: Mapping[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(params) - {"name", "arguments", "_meta"})
        if unknown:
            raise RpcError(INVALID_PARAMS, f"tools/call takes no param {', '.join(unknown)}")
        name = params.get("name")
        if not isinstance(name, str):
            raise RpcError(INVALID_PARAMS, "tools/call needs params.name, a string")
        tool = _BY_NAME.get(name)
        if tool is None:
            raise RpcError(
                INVALID_PARAMS, f"no tool {_quote(name)}; the tools are {', '.join(_BY_NAME)}"
            )
        args = params.get("arguments", {})
        if not isinstance(args, dict):
            raise RpcError(INVALID_PARAMS, "tools/call params.arguments must be an object")
        problem = check_arguments(name, tool["inputSchema"], args)
        if problem is not None:
            return _tool_result(
                f"mesh-call-invalid: {problem} (call it again with the arguments its schema names)",
                error=True,
            )
        call: dict[str, object] = {"op": name, **args}
        size = len(json.dumps(call, ensure_ascii=False, separators=(",", ":")).encode())
        if size > CALL_CAP:
            return _tool_result(
                f"mesh-call-invalid: the call is {size} bytes, over the {CALL_CAP}-byte cap "
                "(send a shorter text)",
                error=True,
            )
        try:
            result = self._caller(call)
        except NotSent as exc:
            self.log(f"{name}: not sent: {exc}")
            return _tool_result(
                f"mesh-unavailable: {exc} (nothing was sent; try again within a turn cotal "
                "delivered, or tell the operator)",
                error=True,
            )
        except AnswerLost as exc:
            self.log(f"{name}: answer lost: {exc}")
            return _tool_result(
                f"mesh-unavailable: {exc} (the call may have been made: before sending again, "
                "check whether it was)",
                error=True,
            )
        except Exception as exc:  # noqa: BLE001 - the model is told, the server goes on
            self.log(f"{name}: the mesh call failed: {exc!r}")
            return _tool_result(
                f"mesh-unavailable: the call failed ({type(exc).__name__}; the server's log says "
                "more); it may have been made: check before sending again",
                error=True,
            )
        if not isinstance(result, Mapping) or not isinstance(result.get("status"), str):
            self.log(f"{name}: the manager's answer is not a mesh result")
            return _tool_result(
                "mesh-reply-invalid: the manager's answer is not a mesh result (tell the operator)",
                error=True,
            )
        self.log(f"{name}: {result['status']}")
        return render(result)

    # -- the stream -----------------------------------------------------------------------------

    def serve(self, stream: IO[bytes]) -> None:
        """Answer each line of `stream` in order, until its end."""
        while True:
            line = stream.readline(LINE_CAP + 1)
            if not line:
                return
            if len(line) > LINE_CAP:
                # Skip the rest of the line unread into memory, then refuse it whole.
                while line and not line.endswith(b"\n"):
                    line = stream.readline(LINE_CAP)
                self.rpc_error(None, INVALID_REQUEST, f"a line over {LINE_CAP} bytes is not read")
                continue
            self.handle_line(line)


def main() -> int:
    # The protocol gets its own copy of fd 1; fd 1 itself becomes stderr, so nothing printed by
    # accident (here or in anything imported) can break a line of the protocol.
    out = os.fdopen(os.dup(1), "wb")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    server = Server(out, sys.stderr)
    try:
        server.serve(cast(IO[bytes], sys.stdin.buffer))
    except (BrokenPipeError, KeyboardInterrupt):
        return 0
    return 0
