"""Real Claude Code seats calling the mesh through the tool cotal gives them (an MCP server
named `cotal`, docs/mesh.md), under the real manager, broker and sandbox, offline against the
fake Messages API: `fake:tool NAME {JSON}` makes the fake model call a tool, and its next reply
is `Tool result: TEXT` with the result Claude Code handed back.

A send the seat may make reaches its recipient as that seat; one it may not is refused to the
model by name and reaches nobody.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from connectors.meshtool.mcp import TOOLS
from tests.conftest import AnthropicServer, Cli
from tests.harness import claude_installed
from tests.helpers import ask, dm_messages, seat_events

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.claude,
    pytest.mark.usefixtures("isolated_home"),
    pytest.mark.skipif(
        not claude_installed(), reason="Claude Code is not installed under .tools/ (make harnesses)"
    ),
]
PHRASE = "marble-lantern-58"
KEY_VAR = "FAKE_ANTHROPIC_KEY"
ENV = {KEY_VAR: "sk-ant-fake-e2e-key-0123456789"}
RESULT = "Tool result: "


@pytest.fixture
def claude_mesh(cli: Cli, fake_anthropic: AnthropicServer) -> Iterator[Cli]:
    # The seat's permission mode is Claude Code's most asking one short of plan: the tool must
    # run because the launch allows it by name, not because nothing is checked.
    (cli.root / "cotal.toml").write_text(
        f'[agents.claude]\nbase_url = "{fake_anthropic.base_url}"\nmodel = "claude-fake-1"\n'
        f'api_key_env = "{KEY_VAR}"\npermission_mode = "default"\n'
    )
    cli.run("up", "--detach", env=ENV)
    yield cli
    cli.run("down", check=False)


def _tool(cli: Cli, seat: str, name: str, arguments: dict[str, Any]) -> str:
    """What the seat's model was handed back for one call of tool `name`."""
    prompt = f"fake:tool mcp__cotal__{name} {json.dumps(arguments)}"
    reply: str = cli.json("send", seat, prompt, "--wait", "--timeout", "90")["reply"]
    assert reply.startswith(RESULT), reply
    return reply.removeprefix(RESULT)


async def test_a_claude_seat_sends_to_a_seat_through_its_tool(
    claude_mesh: Cli, fake_anthropic: AnthropicServer
) -> None:
    cli = claude_mesh
    cli.json("spawn", "b")
    cli.json("spawn", "a", "--agent", "claude", "--allow-send", "b")

    assert json.loads(_tool(cli, "a", "seats", {})) == {"status": "listed", "seats": ["b"]}
    sent = json.loads(_tool(cli, "a", "send", {"to": "b", "text": f"remember the phrase {PHRASE}"}))
    assert sorted(sent) == ["id", "seq", "status", "to"]
    assert (sent["status"], sent["to"]) == ("delivered", "b")

    assert ask(cli, "b", "what was the phrase?") == f"The phrase is {PHRASE}, from a."
    [received] = [e for e in seat_events(cli, "b", "delivery.received") if e["sender"] == "a"]
    assert received["id"] == sent["id"]
    [logged] = seat_events(cli, "a", "mesh.sent")
    assert (logged["to"], logged["id"]) == ("b", sent["id"])

    # The model was offered the four tools under Claude Code's names, with cotal's schemas.
    offered = {
        t["name"]: t["input_schema"]
        for request in fake_anthropic.messages()
        for t in request["body"].get("tools", [])
        if t["name"].startswith("mcp__cotal__")
    }
    assert offered == {f"mcp__cotal__{t['name']}": t["inputSchema"] for t in TOOLS}


async def test_a_send_the_seat_may_not_make_is_refused_to_its_model_and_reaches_nobody(
    claude_mesh: Cli,
) -> None:
    cli = claude_mesh
    cli.json("spawn", "b")
    cli.json("spawn", "a")
    cli.json("spawn", "c", "--agent", "claude", "--allow-send", "a")

    denied = _tool(cli, "c", "send", {"to": "b", "text": f"remember the phrase {PHRASE}"})
    assert denied == (
        "send-not-allowed: seat c may not send to b (it may send to: a) "
        "(spawn c with `--allow-send b` if it should)"
    )
    # A call the tool's own schema refuses never reaches the manager.
    forged = _tool(cli, "c", "send", {"to": "a", "text": "hi", "sender": "b"})
    assert forged == (
        "mesh-call-invalid: send takes no argument sender (its arguments: to, text) (call it "
        "again with the arguments its schema names)"
    )

    assert [body for body, _ in await dm_messages(cli, "b", "c")] == []
    assert [body for body, _ in await dm_messages(cli, "a", "c")] == []
    assert ask(cli, "b", "what was the phrase?") == "I do not know the phrase."
    assert [e["sender"] for e in seat_events(cli, "b", "delivery.received")] == ["operator"]
    [logged] = seat_events(cli, "c", "mesh.send_refused")
    assert (logged["seat"], logged["code"]) == ("c", "send-not-allowed")
