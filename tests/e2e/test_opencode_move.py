"""A real OpenCode seat (`opencode acp`, connectors/opencode.py) under two live managers on one
standalone broker, offline against the fake OpenAI-compatible server (a real process logging
every request): the seat sends through its mesh tool (cotal's MCP server, given to the agent
over ACP as the session's `mcpServers`; docs/mesh.md), a send it may not make is refused to
its model by name and reaches nobody; a write outside the seat's tree is refused by the seat's
policy (its message dead-lettered, saying why); and `cotal move` takes the seat to the other
host, where the same session under the same uid still knows what it was told and still sends.
Before that move, one to the same host while its cotal.toml binds OpenCode to a program of
another version is refused `harness-version` at the move's probe, before anything is fenced:
the seat runs on at the source untouched (issue 41).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from connectors.meshtool.mcp import TOOLS
from tests.conftest import Cli, FakeServer, SharedBroker
from tests.e2e.test_move import committed_root
from tests.e2e.test_move_probe import NOTHING_FENCED, move
from tests.e2e.test_opencode_seat import (
    ENV,
    _installed,
    another_version,
    bind_binary,
    configure,
    model_requests,
    version_refusal,
)
from tests.helpers import (
    ask,
    dm_messages,
    processes_mentioning,
    ps_row,
    refused,
    seat_events,
    signer_key,
    wait_until,
)

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.opencode,
    pytest.mark.usefixtures("isolated_home"),
    pytest.mark.skipif(not _installed(), reason="OpenCode is not installed under .tools/"),
]
PHRASE = "heron-relay-52"
TOOL_RESULT = "Tool result: "


def _tool(cli: Cli, seat: str, name: str, arguments: dict[str, Any]) -> str:
    """What the seat's model was handed back for one call of the mesh tool `name` (OpenCode
    names an MCP server's tool `<server>_<tool>`)."""
    prompt = f"fake:tool cotal_{name} {json.dumps(arguments)}"
    reply = ask(cli, seat, prompt)
    assert reply.startswith(TOOL_RESULT), reply
    return reply.removeprefix(TOOL_RESULT)


def _ancestry(pid: int) -> list[int] | None:
    """`pid` and its parents up to init; None when it exited while being read."""
    chain = []
    while pid > 1:
        chain.append(pid)
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return None
        pid = int(stat.rsplit(")", 1)[1].split()[1])
    return chain


def untouched_at_the_source(a: Cli, b: Cli, row: dict[str, Any]) -> None:
    """test_move_probe's `never_stopped`, from the seat's row just before the move was asked
    rather than from its spawn (a seat may have been relaunched before: this OpenCode one was):
    the very row, process and session at A, every process that names the seat's uid that
    process or a child of it (the harness's own, its mesh tool among them), no cut journaled,
    nothing pre-copied, nothing of it at B."""
    assert ps_row(a, row["name"]) == row
    found = processes_mentioning(row["lifecycleUid"])
    assert row["pid"] in found, found
    chains = [(pid, _ancestry(pid)) for pid in found]
    assert [pid for pid, chain in chains if chain is not None and row["pid"] not in chain] == []
    assert a.json("status")["state"] == "active"
    assert not (a.root / ".cotal/maintenance/v1/journal.json").exists()
    store = a.root / ".cotal/maintenance/v1/precopy"
    assert not store.exists() or list(store.iterdir()) == []
    assert row["name"] not in {r["name"] for r in b.ps()}


def move_refused_for_version(
    a: Cli, b: Cli, to_b: str, name: str, agent: str, tmp_path: Path
) -> None:
    """`cotal move` of seat `name` from A to B while B's cotal.toml binds `agent` to a program
    of another version: refused `harness-version` at B's probe, nothing fenced, the seat
    running at A as it was just before. The binding is then removed."""
    seat = ps_row(a, name)
    toml = b.root / "cotal.toml"
    other = another_version(tmp_path / f"{agent}-other")
    kept = bind_binary(toml, agent, other)
    message = refused(move(a, to_b, name), "harness-version")
    assert message == (
        f"destination {to_b}: "
        + version_refusal(agent, name, other, where=f"destination {to_b}", ran="runs")
        + f"move to a manager that has it; {NOTHING_FENCED}; see the destination's message; "
        "nothing was moved"
    ), message
    untouched_at_the_source(a, b, seat)
    toml.write_text(kept)


async def test_an_opencode_seat_sends_through_its_tool_then_moves_to_another_live_host(
    tmp_path: Path, shared_broker: SharedBroker, fake_openai: FakeServer
) -> None:
    hosts = []
    for name in ("a", "b"):
        cli = Cli(committed_root(tmp_path / name), env=dict(ENV))
        configure(cli.root, fake_openai)
        with (cli.root / "cotal.toml").open("a") as toml:
            toml.write("[delivery]\nmax_deliveries = 1\n")
        cli.run("up", "--detach", "--server", shared_broker.url, "--creds", shared_broker.creds)
        hosts.append(cli)
    a, b = hosts
    try:
        a.json("spawn", "peer", "--agent", "scribe")
        a.json("spawn", "other", "--agent", "scribe")
        seat = a.json(
            "spawn", "oc", "--agent", "opencode", "--allow-send", "peer", "--prompt", "Hello.",
        )  # fmt: skip
        assert seat["continuity"] == "exact"

        # The mesh tool: the manager answers as for every other seat.
        assert json.loads(_tool(a, "oc", "seats", {})) == {"status": "listed", "seats": ["peer"]}
        sent = json.loads(_tool(a, "oc", "send", {"to": "peer", "text": "remember the phrase x-1"}))
        assert (sent["status"], sent["to"]) == ("delivered", "peer")
        assert ask(a, "peer", "what was the phrase?") == "The phrase is x-1, from oc."
        [received] = [e for e in seat_events(a, "peer", "delivery.received") if e["sender"] == "oc"]
        assert received["id"] == sent["id"]
        denied = _tool(a, "oc", "send", {"to": "other", "text": "remember the phrase x-2"})
        assert denied.startswith("send-not-allowed: seat oc may not send to other"), denied
        assert [body for body, _ in await dm_messages(a, "other", "oc")] == []
        # The model was offered cotal's four tools, each with the arguments its schema requires.
        offered = {
            t["function"]["name"]: t["function"]["parameters"].get("required", [])
            for r in fake_openai.requests()
            for t in r.get("tools", [])
            if t["function"]["name"].startswith("cotal_")
        }
        assert offered == {
            f"cotal_{t['name']}": t["inputSchema"].get("required", []) for t in TOOLS
        }

        # A write outside the seat's tree: OpenCode asks, the seat's policy refuses, the turn
        # ends `error` and (one delivery here) the message is a dead letter saying why.
        outside = tmp_path / "escape.txt"
        write = {"filePath": str(outside), "content": "x\n"}
        sent = a.json("send", "oc", f"fake:tool write {json.dumps(write)}")
        await wait_until(lambda: ps_row(a, "oc")["deadLetters"] == 1, timeout=60, every=0.2)
        [letter] = a.json("inbox", "oc")["letters"]
        assert letter["messageId"] == sent["id"], letter
        [dead] = seat_events(a, "oc", "delivery.dead_lettered")
        # OpenCode asks for the directory first (`external_directory`, kind `other`).
        assert dead["reason"] == (
            "error: the seat's policy refused the agent's tool call: other outside the seat's "
            f"tree ({outside})"
        ), dead
        assert not outside.exists()
        a.run("inbox", "oc", "--drop", str(letter["id"]))

        # The fake model answers with the latest phrase a user turn told: this one.
        assert ask(a, "oc", f"Remember the phrase {PHRASE}.") == f"Noted: {PHRASE}."

        # The move: the same uid and session at B, one process carrying it, and the provider is
        # sent the turns the seat had at A.
        b.run("trust", "add", signer_key(a.root), "--name", "host-a")
        to_b = b.json("status")["instanceId"]
        # Where OpenCode is another version, B's probe refuses before A fences anything; without
        # that binding, the same seat moves.
        move_refused_for_version(a, b, to_b, "oc", "opencode", tmp_path)
        moved = a.json("move", "oc", "--to", to_b)
        [carried] = moved["seats"]
        assert (carried["lifecycleUid"], carried["session"]) == (
            seat["lifecycleUid"],
            seat["sessionId"],
        )
        [row] = [r for r in b.ps() if r["name"] == "oc"]
        assert row["pid"] in processes_mentioning(seat["lifecycleUid"])
        before = len(model_requests(fake_openai))
        assert ask(b, "oc", "What was the phrase?") == f"The phrase is {PHRASE}."
        first = model_requests(fake_openai)[before]
        assert fake_openai.user_texts(first)[0] == "Hello."
        assert [r["name"] for r in a.ps()] == ["other", "peer"]
        # The reloaded session has B's mesh socket: the seat still sends, to its peer at A.
        sent = json.loads(_tool(b, "oc", "send", {"to": "peer", "text": "remember the phrase x-3"}))
        assert (sent["status"], sent["to"]) == ("delivered", "peer")
        assert ask(a, "peer", "what was the phrase?") == "The phrase is x-3, from oc."
    finally:
        for cli in (a, b):
            if (cli.root / ".cotal" / "mesh.json").exists():
                cli.run("down", check=False)
