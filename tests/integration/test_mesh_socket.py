"""The seat's mesh socket (docs/mesh.md, "The socket"), end to end with a real daemon, broker
and seats: a harness's own tool (here the jcode stand-in's, which calls
`connectors/meshclient.py` as Claude Code's MCP server and pi's extension do) reaches the mesh
from inside the seat as that seat; a process that is not the seat's is refused by name and
reaches nothing; the socket lives exactly as long as the seat's process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors import meshclient
from tests.conftest import REPO, Cli
from tests.helpers import ask, seat_events, wait_until

pytestmark = pytest.mark.anyio

STANDIN = REPO / "tests" / "fixtures" / "jcode_standin.py"
TOOL = "standin:tool "


@pytest.fixture
def jmesh(cli: Cli) -> Iterator[Cli]:
    (cli.root / "cotal.toml").write_text(f'[agents.jcode]\nbinary = "{STANDIN}"\n')
    cli.run("up", "--detach")
    yield cli
    cli.run("down", check=False)


def _tool(cli: Cli, seat: str, call: dict[str, Any]) -> dict[str, Any]:
    reply = ask(cli, seat, TOOL + json.dumps(call))
    assert reply.startswith("Tool result: "), reply
    answer: dict[str, Any] = json.loads(reply.removeprefix("Tool result: "))
    return answer


def _mesh_dir(cli: Cli, seat: str) -> Path:
    [row] = [r for r in cli.ps() if r["name"] == seat]
    return cli.root / ".cotal" / "seat-mesh" / f"{seat}-{row['lifecycleUid']}"


async def test_the_seats_tool_sends_as_the_seat_within_its_permission(jmesh: Cli) -> None:
    jmesh.json("spawn", "b")
    jmesh.json("spawn", "c")
    jmesh.json("spawn", "a", "--agent", "jcode", "--allow-send", "b")

    assert _tool(jmesh, "a", {"op": "seats"}) == {"status": "listed", "seats": ["b"]}
    sent = _tool(jmesh, "a", {"op": "send", "to": "b", "text": "remember the phrase copper-3"})
    assert (sent["status"], sent["to"]) == ("delivered", "b"), sent
    assert ask(jmesh, "b", "what was the phrase?") == "The phrase is copper-3, from a."

    denied = _tool(jmesh, "a", {"op": "send", "to": "c", "text": "remember the phrase tin-4"})
    assert denied == {
        "status": "refused",
        "code": "send-not-allowed",
        "message": "seat a may not send to c (it may send to: b)",
        "cure": "spawn a with `--allow-send c` if it should",
    }
    # A call that names its own sender is refused whole: the socket's peer is the sender.
    forged = _tool(jmesh, "a", {"op": "send", "to": "b", "text": "hi", "sender": "c"})
    assert (forged["status"], forged["code"]) == ("refused", "mesh-call-invalid"), forged
    assert ask(jmesh, "c", "what was the phrase?") == "I do not know the phrase."
    [logged] = seat_events(jmesh, "a", "mesh.sent")
    assert (logged["to"], logged["id"]) == ("b", sent["id"])


async def test_a_process_that_is_not_the_seats_is_refused_and_reaches_nothing(
    jmesh: Cli,
) -> None:
    jmesh.json("spawn", "b")
    jmesh.json("spawn", "a", "--agent", "jcode", "--allow-send", "b")
    directory = _mesh_dir(jmesh, "a")
    # A test root is deep in the temporary directory: the client takes the long-path route.
    assert len(str(directory / meshclient.SOCKET_NAME)) > meshclient.SUN_PATH_MAX
    # This test's own process: the operator's uid, but no process of seat a.
    with meshclient.connect(str(directory)) as sock:
        answer = meshclient.call(sock, {"op": "send", "to": "b", "text": "remember the phrase x"})
    assert answer["status"] == "refused" and answer["code"] == "mesh-peer-refused", answer
    assert answer["message"].startswith("seat a's mesh socket refused the connection: process ")
    [logged] = seat_events(jmesh, "a", "mesh.peer_refused")
    assert logged["seat"] == "a" and isinstance(logged["peer_pid"], int)
    assert ask(jmesh, "b", "what was the phrase?") == "I do not know the phrase."


async def test_the_socket_lives_as_long_as_the_seats_process(jmesh: Cli) -> None:
    jmesh.json("spawn", "a", "--agent", "jcode")
    sock_path = _mesh_dir(jmesh, "a") / meshclient.SOCKET_NAME
    assert sock_path.is_socket()
    assert oct(sock_path.stat().st_mode & 0o777) == "0o600"
    assert oct(sock_path.parent.stat().st_mode & 0o777) == "0o700"
    jmesh.json("stop", "a")
    await wait_until(lambda: not sock_path.parent.exists(), timeout=20)
    with pytest.raises(meshclient.MeshUnreachable, match="cannot reach the mesh socket"):
        meshclient.connect(str(sock_path.parent), timeout=2)
    jmesh.json("start", "a")
    await wait_until(sock_path.is_socket, timeout=20)
    assert _tool(jmesh, "a", {"op": "seats"}) == {"status": "listed", "seats": []}
