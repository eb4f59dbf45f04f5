"""A real Codex seat calling the mesh through the tool cotal gives it (the MCP server named
`cotal`, the one Claude Code seats get; docs/mesh.md), under the real manager, broker and
sandbox, offline against the fake Responses API: `fake:tool NAME {JSON}` makes the fake model
call a tool, and its next reply is `Tool result: TEXT` with the output Codex handed back.

A send the seat may make reaches its recipient as that seat; one it may not is refused to the
model by name and reaches nobody.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from connectors.meshtool.mcp import TOOLS
from tests.conftest import Cli
from tests.e2e.test_codex_seat import ENV, _installed, configure
from tests.fixtures.fake_responses import ResponsesServer
from tests.helpers import ask, dm_messages, seat_events

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.codex,
    pytest.mark.usefixtures("isolated_home"),
    pytest.mark.skipif(not _installed(), reason="Codex is not installed under .tools/"),
]
PHRASE = "harbor-quill-73"
# Codex hands the model an MCP tool's text behind its own timing line (measured on 0.169.0).
RESULT = re.compile(r"Tool result: Wall time: [0-9.]+ seconds\nOutput:(.*)\Z", re.DOTALL)
# How Codex names an MCP server's tool to its model: server and tool joined by `__`.
TOOL = "mcp__cotal__{}"


@pytest.fixture
def codex_mesh(cli: Cli, fake_responses: ResponsesServer) -> Iterator[Cli]:
    # The seat's approval policy is Codex's most asking one: the tool must run because the
    # policy does not cover it, not because nothing is asked.
    configure(cli.root, fake_responses)
    with (cli.root / "cotal.toml").open("a") as toml:
        toml.write('approval_policy = "on-request"\n')
    cli.run("up", "--detach", env=ENV)
    yield cli
    cli.run("down", check=False)


def _tool(cli: Cli, seat: str, name: str, arguments: dict[str, Any]) -> str:
    """What the seat's model was handed back for one call of tool `name`."""
    prompt = f"fake:tool {TOOL.format(name)} {json.dumps(arguments)}"
    reply: str = cli.json("send", seat, prompt, "--wait", "--timeout", "90")["reply"]
    result = RESULT.match(reply)
    assert result is not None, reply
    return result.group(1)


async def test_a_codex_seat_sends_through_its_tool_and_a_send_it_may_not_make_reaches_nobody(
    codex_mesh: Cli, fake_responses: ResponsesServer
) -> None:
    cli = codex_mesh
    cli.json("spawn", "b")
    cli.json("spawn", "c")
    cli.json("spawn", "a", "--agent", "codex", "--allow-send", "b")

    assert json.loads(_tool(cli, "a", "seats", {})) == {"status": "listed", "seats": ["b"]}
    sent = json.loads(_tool(cli, "a", "send", {"to": "b", "text": f"remember the phrase {PHRASE}"}))
    assert sorted(sent) == ["id", "seq", "status", "to"]
    assert (sent["status"], sent["to"]) == ("delivered", "b")
    assert ask(cli, "b", "what was the phrase?") == f"The phrase is {PHRASE}, from a."
    [received] = [e for e in seat_events(cli, "b", "delivery.received") if e["sender"] == "a"]
    assert received["id"] == sent["id"]

    denied = _tool(cli, "a", "send", {"to": "c", "text": f"remember the phrase {PHRASE}"})
    assert denied == (
        "send-not-allowed: seat a may not send to c (it may send to: b) "
        "(spawn a with `--allow-send c` if it should)"
    )
    assert [body for body, _ in await dm_messages(cli, "c", "a")] == []
    assert ask(cli, "c", "what was the phrase?") == "I do not know the phrase."

    # The model was offered the four tools as one namespace, each with the arguments cotal's
    # schema requires (Codex keeps a subset of JSON Schema: patterns and bounds are dropped).
    offered = {
        inner["name"]: inner["parameters"].get("required", [])
        for request in fake_responses.responses()
        for t in request["body"].get("tools", [])
        if t.get("type") == "namespace" and t.get("name") == "mcp__cotal"
        for inner in t["tools"]
    }
    assert offered == {t["name"]: t["inputSchema"].get("required", []) for t in TOOLS}
