"""The mesh tool's MCP server (connectors/meshtool) as Claude Code runs it: a real
`python -I -m connectors.meshtool` process on pipes, answering JSON-RPC lines, forwarding each
tool call over a real mesh socket (the manager's own `MeshSocket`, bound in a tmp dir, with a
port that records the calls and answers what the test says).

The requests are the ones Claude Code 2.1.197 sends (captured from the real binary): an
`initialize` at protocol version 2025-11-25, `notifications/initialized`, `tools/list`, and
`tools/call` with a `_meta` of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process
from anyio.streams.buffered import BufferedByteReceiveStream

from connectors.base import LaunchOpts
from connectors.claude_code import MESH_TOOL_NAMES, ClaudeCodeConnector, ClaudeDriver
from connectors.interpreter import own_python
from connectors.meshclient import MESH_DIR_ENV, SUN_PATH_MAX
from connectors.meshtool import mcp
from manager.daemon.meshsocket import MeshSocket
from protocol import meshcall, names
from protocol.messages import DM_TEXT_MAX
from tests.harness import Pipe, placeholder_binary, seat_opts

pytestmark = pytest.mark.anyio

VERSION = "2025-11-25"
INIT = {
    "method": "initialize",
    "params": {
        "protocolVersion": VERSION,
        "capabilities": {"roots": {}, "elicitation": {}},
        "clientInfo": {"name": "claude-code", "version": "2.1.197"},
    },
    "jsonrpc": "2.0",
    "id": 0,
}
DELIVERED = {"status": "delivered", "id": "5d0c" * 8, "to": "b", "seq": 42}
REFUSED = {
    "status": "refused",
    "code": "send-not-allowed",
    "message": "seat a may not send to c (it may send to: b)",
    "cure": "spawn a with `--allow-send c` if it should",
}


def call(name: str, arguments: Any, rid: int = 2) -> dict[str, Any]:
    return {
        "method": "tools/call",
        "params": {
            "name": name,
            "arguments": arguments,
            "_meta": {"claudecode/toolUseId": "toolu_01", "progressToken": rid},
        },
        "jsonrpc": "2.0",
        "id": rid,
    }


def text_result(text: str, *, error: bool, rid: int = 2) -> dict[str, Any]:
    return {
        "jsonrpc": "2.0",
        "id": rid,
        "result": {"content": [{"type": "text", "text": text}], "isError": error},
    }


def rpc_error(rid: object, code: int, message: str) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": rid, "error": {"code": code, "message": message}}


class Manager:
    """The manager's end: what the port was handed, and what it answers next."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.answers: list[dict[str, Any]] = []

    async def __call__(self, line: bytes) -> bytes:
        self.calls.append(json.loads(line))
        return json.dumps(self.answers.pop(0) if self.answers else DELIVERED).encode()


class Tool:
    """The MCP server process, spoken to as Claude Code does."""

    def __init__(self, proc: Process) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc = proc
        self._stdin = proc.stdin
        self._out = BufferedByteReceiveStream(proc.stdout)

    async def send(self, message: Any) -> None:
        data = message if isinstance(message, bytes) else json.dumps(message).encode() + b"\n"
        await self._stdin.send(data)

    async def read(self) -> dict[str, Any]:
        with anyio.fail_after(30):
            line = await self._out.receive_until(b"\n", 1 << 24)
        # Every line on stdout is one JSON-RPC message, nothing else.
        decoded = json.loads(line)
        assert isinstance(decoded, dict) and decoded["jsonrpc"] == "2.0"
        return decoded

    async def ask(self, message: Any) -> dict[str, Any]:
        await self.send(message)
        return await self.read()

    async def ready(self) -> None:
        answer = await self.ask(INIT)
        assert answer["result"]["protocolVersion"] == VERSION
        await self.send({"method": "notifications/initialized", "jsonrpc": "2.0"})


@asynccontextmanager
async def serving(
    mesh_dir: Path, *, socket: bool = True
) -> AsyncIterator[tuple[Tool, Manager, Callable[[], bytes]]]:
    """The server started with `COTAL_MESH_DIR=mesh_dir`, the socket there served (unless
    `socket` is false) for processes descending from this test's; and a reader of its stderr
    once it has ended."""
    manager = Manager()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), MESH_DIR_ENV: str(mesh_dir)}
    async with anyio.create_task_group() as tg:
        if socket:
            mesh = MeshSocket("a", mesh_dir, manager)
            await tg.start(mesh.serve, os.getpid)
        proc = await anyio.open_process(
            own_python("connectors.meshtool"), env=env, stderr=subprocess.PIPE
        )
        err = bytearray()

        async def drain() -> None:
            assert proc.stderr is not None
            async for chunk in proc.stderr:
                err.extend(chunk)

        tg.start_soon(drain)
        try:
            yield Tool(proc), manager, lambda: bytes(err)
        finally:
            assert proc.stdin is not None
            await proc.stdin.aclose()
            with anyio.fail_after(10):
                assert await proc.wait() == 0
            tg.cancel_scope.cancel()


@pytest.fixture
def mesh_dir(tmp_path: Path) -> Path:
    return tmp_path / "mesh" / "a-0123"


def test_the_bounds_are_the_protocols() -> None:
    assert mcp.TEXT_MAX == DM_TEXT_MAX
    assert mcp.CALL_CAP == meshcall.CALL_CAP
    assert mcp.HISTORY_MAX == meshcall.MAX_HISTORY_READ
    assert mcp.NAME_PATTERN == f"^{names.SEAT_NAME.body}$"
    history = meshcall.HistoryCall(channel="c")
    assert mcp.HISTORY_DEFAULT == history.limit


async def test_the_handshake_the_listing_and_the_unknown(mesh_dir: Path) -> None:
    async with serving(mesh_dir) as (tool, manager, _err):
        assert await tool.ask(INIT) == {
            "jsonrpc": "2.0",
            "id": 0,
            "result": {
                "protocolVersion": VERSION,
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "cotal", "version": mcp.SERVER_VERSION},
                "instructions": mcp.INSTRUCTIONS,
            },
        }
        # A notification is never answered: the next line is the ping's.
        await tool.send({"method": "notifications/initialized", "jsonrpc": "2.0"})
        await tool.send({"method": "notifications/whatever", "jsonrpc": "2.0"})
        assert await tool.ask({"jsonrpc": "2.0", "id": "p", "method": "ping"}) == {
            "jsonrpc": "2.0",
            "id": "p",
            "result": {},
        }
        # A version it does not know is answered with its newest.
        older = {**INIT, "id": 9, "params": {**INIT["params"], "protocolVersion": "2099-01-01"}}
        assert (await tool.ask(older))["result"]["protocolVersion"] == "2025-11-25"
        listing = await tool.ask({"method": "tools/list", "jsonrpc": "2.0", "id": 1})
        tools = {t["name"]: t["inputSchema"] for t in listing["result"]["tools"]}
        assert list(tools) == ["send", "post", "history", "seats"]
        name = {"type": "string", "pattern": "^[A-Za-z0-9_]{1,64}$"}
        text = {"type": "string", "maxLength": DM_TEXT_MAX}

        def bare(schema: dict[str, Any]) -> dict[str, Any]:
            props = {
                k: {f: v for f, v in p.items() if f != "description"}
                for k, p in schema["properties"].items()
            }
            return {**schema, "properties": props}

        assert bare(tools["send"]) == {
            "type": "object",
            "properties": {"to": name, "text": text},
            "required": ["to", "text"],
            "additionalProperties": False,
        }
        assert bare(tools["post"]) == {
            "type": "object",
            "properties": {"channel": name, "text": text},
            "required": ["channel", "text"],
            "additionalProperties": False,
        }
        assert bare(tools["history"]) == {
            "type": "object",
            "properties": {
                "channel": name,
                "limit": {"type": "integer", "minimum": 1, "maximum": 1000, "default": 20},
            },
            "required": ["channel"],
            "additionalProperties": False,
        }
        assert tools["seats"] == {"type": "object", "properties": {}, "additionalProperties": False}
        assert await tool.ask({"jsonrpc": "2.0", "id": 3, "method": "resources/list"}) == (
            rpc_error(3, -32601, 'method "resources/list" is not served')
        )
        assert manager.calls == []


async def test_each_tool_is_one_mesh_call_and_its_answer(mesh_dir: Path) -> None:
    async with serving(mesh_dir) as (tool, manager, err):
        await tool.ready()
        sent = await tool.ask(call("send", {"to": "b", "text": "remember the phrase x-1"}))
        assert sent == text_result(json.dumps(DELIVERED, separators=(",", ":")), error=False)
        manager.answers.append(REFUSED)
        assert await tool.ask(call("send", {"to": "c", "text": "hi"}, rid=3)) == text_result(
            "send-not-allowed: seat a may not send to c (it may send to: b) "
            "(spawn a with `--allow-send c` if it should)",
            error=True,
            rid=3,
        )
        listed = {"status": "listed", "seats": ["b", "c"]}
        manager.answers.append(listed)
        assert await tool.ask(call("seats", {}, rid=4)) == text_result(
            '{"status":"listed","seats":["b","c"]}', error=False, rid=4
        )
        posted = {"status": "posted", "id": "9e1f" * 8, "channel": "plan", "seq": 7}
        manager.answers.append(posted)
        assert (await tool.ask(call("post", {"channel": "plan", "text": "é"}, rid=5)))["result"][
            "content"
        ][0]["text"] == json.dumps(posted, separators=(",", ":"))
        history = {
            "status": "history",
            "channel": "plan",
            "posts": [{"seq": 7, "sender": "a", "text": "é\n", "sentAt": "2026-01-01T00:00:00Z"}],
        }
        manager.answers.append(history)
        answer = await tool.ask(call("history", {"channel": "plan", "limit": 1000}, rid=6))
        assert json.loads(answer["result"]["content"][0]["text"]) == history
        # Arguments absent are an empty object.
        await tool.send(
            {"method": "tools/call", "params": {"name": "seats"}, "jsonrpc": "2.0", "id": 7}
        )
        assert (await tool.read())["result"]["isError"] is False
        assert manager.calls == [
            {"op": "send", "to": "b", "text": "remember the phrase x-1"},
            {"op": "send", "to": "c", "text": "hi"},
            {"op": "seats"},
            {"op": "post", "channel": "plan", "text": "é"},
            {"op": "history", "channel": "plan", "limit": 1000},
            {"op": "seats"},
        ]
    # Its log names each call's op and outcome, never a text.
    log = err().decode()
    assert "cotal meshtool: send: delivered" in log and "send: refused" in log
    assert "remember the phrase" not in log


async def test_bad_arguments_are_refused_before_any_call(mesh_dir: Path) -> None:
    async with serving(mesh_dir) as (tool, manager, _err):
        await tool.ready()
        cure = " (call it again with the arguments its schema names)"
        cases: list[tuple[str, Any, str]] = [
            ("send", {"to": "b", "text": "x", "sender": "c"}, "send takes no argument sender"),
            ("send", {"text": "x"}, "send needs the argument to"),
            ("send", {"to": "b/c", "text": "x"}, 'send: to "b/c" is not a name'),
            ("send", {"to": "b", "text": 5}, "send: text must be a string, not a number"),
            (
                "send",
                {"to": "b", "text": "x" * (DM_TEXT_MAX + 1)},
                f"send: text is {DM_TEXT_MAX + 1} characters, over the {DM_TEXT_MAX} allowed",
            ),
            ("history", {"channel": "c", "limit": 0}, "history: limit is 0, outside 1 to 1000"),
            ("history", {"channel": "c", "limit": True}, "history: limit must be an integer"),
            ("history", {"channel": "c", "limit": 2.5}, "history: limit must be an integer"),
            ("seats", {"all": True}, "seats takes no argument all (its arguments: none)"),
            (
                "post",
                {"channel": "c", "text": "\ud800"},
                "post: text holds a lone surrogate (\\ud800-\\udfff), which is not text",
            ),
        ]
        for i, (name, args, why) in enumerate(cases):
            answer = await tool.ask(call(name, args, rid=i))
            assert answer["result"]["isError"] is True, (name, args)
            message = answer["result"]["content"][0]["text"]
            assert message.startswith(f"mesh-call-invalid: {why}") and message.endswith(cure)
        # A text within the character bound but past the call's byte cap (4 bytes a character).
        wide = "\U0001f600" * (DM_TEXT_MAX // 2)
        answer = await tool.ask(call("send", {"to": "b", "text": wide}, rid=20))
        call_json = {"op": "send", "to": "b", "text": wide}
        size = len(json.dumps(call_json, ensure_ascii=False, separators=(",", ":")).encode())
        assert answer == text_result(
            f"mesh-call-invalid: the call is {size} bytes, over the {meshcall.CALL_CAP}-byte "
            "cap (send a shorter text)",
            error=True,
            rid=20,
        )
        assert manager.calls == []


async def test_malformed_messages_get_errors_and_the_server_goes_on(mesh_dir: Path) -> None:
    async with serving(mesh_dir) as (tool, manager, _err):
        await tool.ready()
        answer = await tool.ask(b"{not json\n")
        assert answer["id"] is None and answer["error"]["code"] == -32700
        assert await tool.ask(b"[1, 2]\n") == rpc_error(
            None, -32600, "batches are not accepted; send one message a line"
        )
        assert await tool.ask(b'"ping"\n') == rpc_error(
            None, -32600, "a message is a JSON object, not a string"
        )
        assert await tool.ask({"jsonrpc": "2.0", "id": True, "method": "ping"}) == rpc_error(
            None, -32600, "id must be a string or an integer"
        )
        assert await tool.ask({"jsonrpc": "1.0", "id": 1, "method": "ping"}) == rpc_error(
            1, -32600, 'jsonrpc must be "2.0"'
        )
        assert await tool.ask({"jsonrpc": "2.0", "id": 1, "method": 7}) == rpc_error(
            1, -32600, "method must be a string"
        )
        assert await tool.ask(
            {"jsonrpc": "2.0", "id": 1, "method": "ping", "sender": "c"}
        ) == rpc_error(1, -32600, "unknown member sender")
        assert await tool.ask(
            {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": [1]}
        ) == rpc_error(1, -32602, "params must be an object")
        assert await tool.ask({"jsonrpc": "2.0", "id": 1, "method": "initialize"}) == rpc_error(
            1, -32602, "initialize needs params.protocolVersion, a string"
        )
        assert await tool.ask(call("rm", {})) == rpc_error(
            2, -32602, 'no tool "rm"; the tools are send, post, history, seats'
        )
        assert await tool.ask(call("send", "to b")) == rpc_error(
            2, -32602, "tools/call params.arguments must be an object"
        )
        bad = {
            "jsonrpc": "2.0",
            "id": 5,
            "method": "tools/call",
            "params": {"name": "seats", "x": 1},
        }
        assert await tool.ask(bad) == rpc_error(5, -32602, "tools/call takes no param x")
        # A line past the cap is skipped whole, unparsed, and refused; the next is read.
        await tool.send(b'{"jsonrpc":"2.0","id":8,"method":"ping","pad":"' + b"x" * mcp.LINE_CAP)
        await tool.send(b'"}\n')
        assert await tool.read() == rpc_error(
            None, -32600, f"a line over {mcp.LINE_CAP} bytes is not read"
        )
        # Blank lines are nothing; an answer to a request of ours (there are none) is dropped.
        await tool.send(b"\n  \n")
        await tool.send({"jsonrpc": "2.0", "id": 99, "result": {}})
        assert await tool.ask({"jsonrpc": "2.0", "id": 9, "method": "ping"}) == {
            "jsonrpc": "2.0",
            "id": 9,
            "result": {},
        }
        assert manager.calls == []


async def test_a_socket_path_past_the_address_limit(tmp_path: Path) -> None:
    deep = tmp_path.joinpath(*["d" * 20] * 6, "a-0123")
    assert len(os.fsencode(str(deep / "mesh.sock"))) > SUN_PATH_MAX + 1
    async with serving(deep) as (tool, manager, _err):
        await tool.ready()
        answer = await tool.ask(call("send", {"to": "b", "text": "far"}))
        assert answer == text_result(json.dumps(DELIVERED, separators=(",", ":")), error=False)
        assert manager.calls == [{"op": "send", "to": "b", "text": "far"}]


async def test_no_socket_is_an_error_result_saying_nothing_was_sent(mesh_dir: Path) -> None:
    mesh_dir.mkdir(parents=True)
    async with serving(mesh_dir, socket=False) as (tool, _manager, _err):
        await tool.ready()
        answer = await tool.ask(call("send", {"to": "b", "text": "x"}))
        assert answer["result"]["isError"] is True
        text = answer["result"]["content"][0]["text"]
        assert text.startswith(
            f"mesh-unavailable: cannot reach the mesh socket {mesh_dir}/mesh.sock"
        )
        assert text.endswith(
            "(nothing was sent; try again within a turn cotal delivered, or tell the operator)"
        )


async def test_an_answer_lost_says_the_call_may_have_been_made(mesh_dir: Path) -> None:
    class Hangup(Manager):
        async def __call__(self, line: bytes) -> bytes:
            self.calls.append(json.loads(line))
            raise anyio.BrokenResourceError

    manager = Hangup()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), MESH_DIR_ENV: str(mesh_dir)}
    async with anyio.create_task_group() as tg:
        await tg.start(MeshSocket("a", mesh_dir, manager).serve, os.getpid)
        async with await anyio.open_process(
            own_python("connectors.meshtool"), env=env, stderr=subprocess.DEVNULL
        ) as proc:
            tool = Tool(proc)
            await tool.ready()
            answer = await tool.ask(call("send", {"to": "b", "text": "x"}))
            assert answer == text_result(
                "mesh-unavailable: the manager closed the mesh socket before it answered (the "
                "call may have been made: before sending again, check whether it was)",
                error=True,
            )
            assert manager.calls == [{"op": "send", "to": "b", "text": "x"}]
            assert proc.stdin is not None
            await proc.stdin.aclose()
        tg.cancel_scope.cancel()


async def test_a_stray_print_goes_to_stderr(mesh_dir: Path) -> None:
    """Whatever prints while the server runs (here a patched handler) writes to stderr: stdout
    carries the protocol alone."""
    noisy = (
        "import sys\n"
        "from connectors.meshtool import mcp\n"
        "real = mcp.Server.initialize\n"
        "def initialize(self, params):\n"
        "    print('stray inside')\n"
        "    return real(self, params)\n"
        "mcp.Server.initialize = initialize\n"
        "sys.exit(mcp.main())\n"
    )
    python_flags = own_python("connectors.meshtool")[:-2]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), MESH_DIR_ENV: str(mesh_dir)}
    async with await anyio.open_process(
        [*python_flags, "-c", noisy], env=env, stderr=subprocess.PIPE
    ) as proc:
        tool = Tool(proc)
        assert (await tool.ask(INIT))["result"]["serverInfo"]["name"] == "cotal"
        assert proc.stdin is not None and proc.stderr is not None
        await proc.stdin.aclose()
        err = b"".join([chunk async for chunk in proc.stderr])
        assert await proc.wait() == 0
    assert err == b"stray inside\n"


# -- the connector's side -----------------------------------------------------------------------


def launch_opts(binary: Path, root: Path, **kw: Any) -> LaunchOpts:
    config = {
        "base_url": "http://127.0.0.1:9",
        "api_key_env": "COTAL_UNIT_MESH_KEY",
        "binary": str(binary),
    }
    return seat_opts(root, "claude", "a", config=config, **kw)


@pytest.mark.usefixtures("isolated_home")
def test_claude_is_given_the_server_and_its_tools_when_the_seat_has_a_mesh(
    tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COTAL_UNIT_MESH_KEY", "sk-ant-unit-0123456789")
    mesh_dir = root / ".cotal" / "seat-mesh" / "a-0123"
    binary = placeholder_binary(tmp_path, "claude")
    spec = ClaudeCodeConnector().build_launch(launch_opts(binary, root, mesh_dir=mesh_dir))
    [config] = [a.removeprefix("--mcp-config=") for a in spec.argv if a.startswith("--mcp-config=")]
    python, *args = own_python("connectors.meshtool")
    assert json.loads(config) == {
        "mcpServers": {
            "cotal": {
                "type": "stdio",
                "command": python,
                "args": args,
                "env": {MESH_DIR_ENV: str(mesh_dir)},
            }
        }
    }
    assert MESH_TOOL_NAMES == (
        "mcp__cotal__send",
        "mcp__cotal__post",
        "mcp__cotal__history",
        "mcp__cotal__seats",
    )
    assert f"--allowedTools={','.join(MESH_TOOL_NAMES)}" in spec.argv
    assert "--strict-mcp-config" in spec.argv and spec.env[MESH_DIR_ENV] == str(mesh_dir)
    # A launch without a mesh (a connector's own run) names no server and allows no tool.
    bare = ClaudeCodeConnector().build_launch(launch_opts(binary, root))
    assert not [a for a in bare.argv if a.startswith(("--mcp-config", "--allowedTools"))]


async def test_the_driver_notes_a_mesh_server_claude_could_not_start(tmp_path: Path) -> None:
    stdin, stdout = Pipe(), Pipe()
    driver = ClaudeDriver(stdin, stdout, config_dir=None)
    init = {"type": "system", "subtype": "init", "session_id": "s", "mcp_servers": []}
    for servers in (
        [{"name": "cotal", "status": "connected"}],
        [{"name": "other", "status": "failed"}],
    ):
        await driver._handle(json.dumps({**init, "mcp_servers": servers}).encode())
    assert driver.protocol_errors == []
    await driver._handle(
        json.dumps({**init, "mcp_servers": [{"name": "cotal", "status": "failed"}]}).encode()
    )
    assert driver.protocol_errors == [
        "claude's mesh tool server 'cotal' is 'failed': the seat cannot send"
    ]
