"""A real Gemini CLI seat (`gemini --acp`, connectors/gemini.py) under two live managers on one
standalone broker, offline against the fake Gemini API (a real process logging every request):
the seat sends through its mesh tool (cotal's MCP server, named in the seat's settings as a
trusted server; docs/design.md, "Gemini CLI continuity"), a send it may not make is refused to
its model by name and reaches nobody, and `cotal move` takes the seat to the other host, where
the same session under the same uid still knows what it was told. Before that move, one to
the same host while its cotal.toml binds Gemini CLI to a program of another version is refused
`harness-version` at the move's probe, before anything is fenced: the seat runs on at the
source untouched (issue 41).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors.meshtool.mcp import TOOLS
from tests.conftest import Cli, SharedBroker
from tests.e2e.test_gemini_seat import ENV, _installed, configure, gemini_server
from tests.e2e.test_move import committed_root
from tests.e2e.test_opencode_move import move_refused_for_version
from tests.fixtures.fake_gemini import GeminiServer
from tests.helpers import ask, dm_messages, processes_mentioning, seat_events, signer_key

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.gemini,
    pytest.mark.usefixtures("isolated_home"),
    pytest.mark.skipif(not _installed(), reason="Gemini CLI is not installed under .tools/"),
]
PHRASE = "curlew-relay-64"
TOOL_RESULT = "Tool result: "
UNTRUSTED = re.compile(r"<untrusted_context>\n(.*)\n</untrusted_context>", re.DOTALL)


@pytest.fixture
def fake_gemini(tmp_path: Path) -> Iterator[GeminiServer]:
    yield from gemini_server(tmp_path)


def _tool(cli: Cli, seat: str, name: str, arguments: dict[str, Any]) -> str:
    """What the seat's model was handed back for one call of the mesh tool `name`: Gemini CLI
    names an MCP server's tool `mcp_<server>_<tool>`, and hands back its text as `output`,
    fenced as `<untrusted_context>` (measured on 0.61.0), or a failure as `error`."""
    reply = ask(cli, seat, f"fake:tool mcp_cotal_{name} {json.dumps(arguments)}")
    assert reply.startswith(TOOL_RESULT), reply
    response = json.loads(reply.removeprefix(TOOL_RESULT))
    if "error" in response:
        return str(response["error"])
    fenced = UNTRUSTED.fullmatch(response.get("output", ""))
    assert fenced is not None, response
    return fenced.group(1)


async def test_a_gemini_seat_sends_through_its_tool_then_moves_to_another_live_host(
    tmp_path: Path, shared_broker: SharedBroker, fake_gemini: GeminiServer
) -> None:
    hosts = []
    for name in ("a", "b"):
        cli = Cli(committed_root(tmp_path / name), env=dict(ENV))
        configure(cli.root, fake_gemini)
        cli.run("up", "--detach", "--server", shared_broker.url, "--creds", shared_broker.creds)
        hosts.append(cli)
    a, b = hosts
    try:
        a.json("spawn", "peer", "--agent", "scribe")
        a.json("spawn", "other", "--agent", "scribe")
        seat = a.json(
            "spawn", "gm", "--agent", "gemini", "--allow-send", "peer", "--prompt", "Hello.",
        )  # fmt: skip
        assert seat["continuity"] == "exact"

        # The mesh tool: the manager answers as for every other seat.
        assert json.loads(_tool(a, "gm", "seats", {})) == {"status": "listed", "seats": ["peer"]}
        sent = json.loads(_tool(a, "gm", "send", {"to": "peer", "text": "remember the phrase x-1"}))
        assert (sent["status"], sent["to"]) == ("delivered", "peer")
        assert ask(a, "peer", "what was the phrase?") == "The phrase is x-1, from gm."
        [received] = [e for e in seat_events(a, "peer", "delivery.received") if e["sender"] == "gm"]
        assert received["id"] == sent["id"]
        denied = _tool(a, "gm", "send", {"to": "other", "text": "remember the phrase x-2"})
        assert "send-not-allowed: seat gm may not send to other" in denied, denied
        assert [body for body, _ in await dm_messages(a, "other", "gm")] == []
        # The model was offered cotal's four tools, each with the arguments its schema requires.
        offered = {
            f["name"]: f.get("parametersJsonSchema", f.get("parameters", {})).get("required", [])
            for r in fake_gemini.requests()
            for t in r.get("tools", [])
            for f in t.get("functionDeclarations", [])
            if f["name"].startswith("mcp_cotal_")
        }
        assert offered == {
            f"mcp_cotal_{t['name']}": t["inputSchema"].get("required", []) for t in TOOLS
        }

        # The fake model answers with the latest phrase a user turn told: this one.
        assert ask(a, "gm", f"Remember the phrase {PHRASE}.") == f"Noted: {PHRASE}."

        # The move: the same uid and session at B, one process carrying it, and the provider is
        # sent the turns the seat had at A.
        b.run("trust", "add", signer_key(a.root), "--name", "host-a")
        to_b = b.json("status")["instanceId"]
        # Where Gemini CLI is another version, B's probe refuses before A fences anything;
        # without that binding, the same seat moves.
        move_refused_for_version(a, b, to_b, "gm", "gemini", tmp_path)
        moved = a.json("move", "gm", "--to", to_b)
        [carried] = moved["seats"]
        assert (carried["lifecycleUid"], carried["session"]) == (
            seat["lifecycleUid"],
            seat["sessionId"],
        )
        [row] = [r for r in b.ps() if r["name"] == "gm"]
        assert row["pid"] in processes_mentioning(seat["lifecycleUid"])
        before = len(fake_gemini.requests())
        assert ask(b, "gm", "What was the phrase?") == f"The phrase is {PHRASE}."
        first = fake_gemini.requests()[before]
        assert GeminiServer.turns(first)[0] == ("user", "Hello.")
        assert [r["name"] for r in a.ps()] == ["other", "peer"]
        # The reloaded session has B's mesh socket: the seat still sends, to its peer at A.
        sent = json.loads(_tool(b, "gm", "send", {"to": "peer", "text": "remember the phrase x-3"}))
        assert (sent["status"], sent["to"]) == ("delivered", "peer")
        assert ask(a, "peer", "what was the phrase?") == "The phrase is x-3, from gm."
    finally:
        for cli in (a, b):
            if (cli.root / ".cotal" / "mesh.json").exists():
                cli.run("down", check=False)
