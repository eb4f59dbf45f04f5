"""Real pi seats calling cotal's mesh tools (connectors/meshtool/pi_extension.ts) under the real
manager, offline against the fake OpenAI-compatible server: the model's `send` tool call
reaches the manager through the seat's mesh socket, is delivered as the seat, and a send the
seat may not make comes back to the model as the refusal, reaching nobody."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PI_CLI, Cli, FakeServer
from tests.helpers import ask, dm_messages, seat_events

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.pi,
    pytest.mark.usefixtures("isolated_home"),
    pytest.mark.skipif(
        not PI_CLI.is_file(), reason="pi is not installed under .tools/pi (make harnesses)"
    ),
]
PHRASE = "cobalt-lantern-58"
TOOL_RESULT = "Tool result: "


def configure(root: Path, server: FakeServer) -> None:
    (root / "cotal.toml").write_text(
        f'[agents.pi]\nbase_url = "{server.base_url}"\nmodel = "fake-model"\n'
    )


def tool_call(name: str, args: dict[str, Any]) -> str:
    """The prompt that makes the fake model call the tool `name` with `args`."""
    return f"fake:tool {name} {json.dumps(args)}"


async def test_a_pi_seat_sends_through_its_tool_and_b_names_a(
    cli: Cli, fake_openai: FakeServer
) -> None:
    configure(cli.root, fake_openai)
    cli.run("up", "--detach")
    cli.json("spawn", "b", "--agent", "scribe")
    assert cli.json("spawn", "a", "--agent", "pi", "--allow-send", "b")["allowSend"] == ["b"]

    reply = ask(cli, "a", tool_call("send", {"to": "b", "text": f"remember the phrase {PHRASE}"}))
    assert reply.startswith(TOOL_RESULT), reply
    result = json.loads(reply.removeprefix(TOOL_RESULT))
    assert result["status"] == "delivered" and result["to"] == "b"
    assert isinstance(result["id"], str) and isinstance(result["seq"], int)
    # The tool result the model was handed is the manager's answer line, as it came.
    tool_messages = [
        m for r in fake_openai.requests() for m in r["messages"] if m.get("role") == "tool"
    ]
    assert [json.loads(m["content"]) for m in tool_messages] == [result]

    # b's inbox hands out one message at a time, so the question runs after a's message.
    assert ask(cli, "b", "what was the phrase?") == f"The phrase is {PHRASE}, from a."
    [body] = [body for body, _ in await dm_messages(cli, "b", "a")]
    assert body["id"] == result["id"] and body["sender"] == "local.a"
    assert body["text"] == f"remember the phrase {PHRASE}"
    received = {(e["sender"], e["id"]) for e in seat_events(cli, "b", "delivery.received")}
    assert ("a", result["id"]) in received
    [sent] = seat_events(cli, "a", "mesh.sent")
    assert (sent["to"], sent["id"]) == ("b", result["id"])
    cli.run("down")


async def test_a_pi_seat_send_outside_its_permission_is_refused_to_the_model(
    cli: Cli, fake_openai: FakeServer
) -> None:
    configure(cli.root, fake_openai)
    cli.run("up", "--detach")
    cli.json("spawn", "a", "--agent", "scribe")
    cli.json("spawn", "b", "--agent", "scribe")
    cli.json("spawn", "c", "--agent", "pi", "--allow-send", "a")

    reply = ask(cli, "c", tool_call("send", {"to": "b", "text": "remember the phrase stolen-9"}))
    # The refusal reached the model as an error result, `code: message (cure)`.
    assert reply.startswith(f"{TOOL_RESULT}send-not-allowed: seat c may not send to b"), reply
    assert reply.endswith(")")
    [tool_message] = [
        m for r in fake_openai.requests() for m in r["messages"] if m.get("role") == "tool"
    ]
    assert TOOL_RESULT + tool_message["content"] == reply

    assert [body for body, _ in await dm_messages(cli, "b", "c")] == []
    assert ask(cli, "b", "what was the phrase?") == "I do not know the phrase."
    assert all(e["sender"] != "c" for e in seat_events(cli, "b", "delivery.received"))
    [logged] = seat_events(cli, "c", "mesh.send_refused")
    assert logged["code"] == "send-not-allowed" and "may not send to b" in logged["error"]
    cli.run("down")
