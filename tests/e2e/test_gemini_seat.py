"""A real Gemini CLI seat (`gemini --acp`, connectors/gemini.py) under the real manager, offline
against the fake Gemini API (tests/fixtures/fake_gemini.py, a real process logging every
request).

One seat's life, in one test so the harness starts as few times as it must: a turn; a tool call
that writes in the seat's tree (the seat's policy allows it over ACP) and a command that reaches
for the root's `.cotal` (the sandbox hides it); a send to another seat through the mesh tool;
a `kill -9` in the middle of a turn, in the minute the session was created (the load that
follows is the one that would overwrite the session's chat file), whose message the
relaunched seat is handed again in the same session; a cut, and `up --restore` on a root at
another path with its own HOME and broker: the same session id under the same uid, the
provider sent the earlier turns, a decoy Gemini store in the destination's HOME never read; a
fresh seat there knows nothing. `cotal doctor` reports the harness on both roots. Before that
restore, one at the same root whose cotal.toml binds Gemini CLI to a program of another
version is refused `harness-version` at the identity gate, before any claim (issue 41).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from connectors.gemini import pinned_program
from protocol.errors import Refusal
from tests.conftest import REPO, Cli, start_fake_server
from tests.e2e.test_move import committed_root
from tests.e2e.test_opencode_seat import restore_refused_for_version
from tests.fixtures.fake_gemini import GeminiServer
from tests.helpers import ask, ps_row, seat_events, signer_key, wait_until


def _installed() -> bool:
    try:
        pinned_program()
        return True
    except Refusal:
        return False


pytestmark = [
    pytest.mark.anyio,
    pytest.mark.gemini,
    pytest.mark.skipif(not _installed(), reason="Gemini CLI is not installed under .tools/"),
]
PHRASE = "heron-lantern-41"
SLOW_PHRASE = "plover-twice-8"
MESH_PHRASE = "wren-relay-5"
KEY_VAR = "FAKE_GEMINI_KEY"
ENV = {KEY_VAR: "fake-gemini-e2e-key-0123456789"}
DECOY = "decoy-session-53"
TOOL_RESULT = "Tool result: "


def gemini_server(tmp_path: Path) -> Iterator[GeminiServer]:
    """The fake Gemini API as a process of its own, for a fixture to yield from."""
    yield from start_fake_server(
        REPO / "tests" / "fixtures" / "fake_gemini.py",
        tmp_path / "gemini-requests.jsonl",
        GeminiServer,
    )


@pytest.fixture
def fake_gemini(tmp_path: Path) -> Iterator[GeminiServer]:
    yield from gemini_server(tmp_path)


def configure(root: Path, server: GeminiServer) -> None:
    # OpenCode and Gemini CLI start in five to seven seconds on an idle host, several times
    # that when the suite's other workers hold both cores: readiness gets the longest window.
    (root / "cotal.toml").write_text(
        "[launch]\nready_timeout_s = 120\n"
        f'[agents.gemini]\nbase_url = "{server.base_url}"\nmodel = "fake-gemini"\n'
        f'api_key_env = "{KEY_VAR}"\n'
    )


def plant_decoy(home: Path) -> list[Path]:
    """Where an unconfined Gemini CLI would look in HOME (its `~/.gemini`: settings, memory and
    a chat of the project at any path), each naming a phrase the seat was never told."""
    chat = {"sessionId": "0" * 8 + "-0000-0000-0000-" + "0" * 12, "projectHash": "x"}
    planted = {
        ".gemini/settings.json": json.dumps({"model": {"name": f"decoy-{DECOY}"}}),
        ".gemini/GEMINI.md": f"Remember the phrase {DECOY}.\n",
        ".gemini/tmp/ws2/chats/session-2026-01-01T00-00-00000000.jsonl": json.dumps(chat)
        + "\n"
        + json.dumps({"id": "1", "type": "user", "content": f"remember the phrase {DECOY}"}),
    }
    out = []
    for rel, text in planted.items():
        path = home / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        out.append(path)
    return out


def listing(top: Path) -> list[tuple[str, int, int]]:
    return sorted(
        (str(p.relative_to(top)), p.stat().st_size, p.stat().st_mtime_ns)
        for p in top.rglob("*")
        if p.is_file()
    )


def doctor_finds_it(cli: Cli) -> bool:
    rows = [json.loads(line) for line in cli.run("doctor", "--json").stdout.splitlines()]
    [row] = [r for r in rows if r["name"] == "gemini"]
    assert (row["version"], row["continuity"], row["missing"]) == ("0.61.0", "exact", []), row
    return bool(row["ready"] and row["used"])


def chat_names(root: Path) -> list[str]:
    return sorted(
        p.name for p in (root / ".cotal/sessions/gemini").glob("*.home/.gemini/tmp/*/chats/*")
    )


async def test_a_gemini_seat_through_a_tool_a_send_a_kill_a_cut_and_a_resume_at_another_path(
    tmp_path: Path, fake_gemini: GeminiServer
) -> None:
    home_a, home_b = tmp_path / "homeA", tmp_path / "homeB"
    home_a.mkdir()
    decoys = plant_decoy(home_b)
    before = listing(home_b)
    a = Cli(committed_root(tmp_path / "hostA" / "ws"), env={**ENV, "HOME": str(home_a)})
    dest = Cli(tmp_path / "hostB" / "work" / "ws2", env={**ENV, "HOME": str(home_b)})
    configure(a.root, fake_gemini)
    a.run("up", "--detach")
    a.json("spawn", "b")
    row = a.json(
        "spawn",
        "gm",
        "--agent",
        "gemini",
        "--allow-send",
        "b",
        "--prompt",
        f"Remember the phrase {PHRASE}.",
    )
    assert row["continuity"] == "exact" and row["permissionMode"] == "workspace-write"
    assert ask(a, "gm", "What was the phrase?") == f"The phrase is {PHRASE}."
    # What the delivered turn used, as Gemini CLI reported it (the fake's 120 in, 8 out a
    # call; the launch prompt's turn is no delivery and is not in the seat's ledger).
    used = ps_row(a, "gm")
    assert (used.get("tokensIn"), used.get("tokensOut")) == (120, 8), used

    # A tool call in the seat's tree: Gemini CLI asks, the seat's policy allows, the file is there.
    target = a.root / "notes" / "out.txt"
    write = {"file_path": str(target), "content": "written by the seat\n"}
    reply = ask(a, "gm", f"fake:tool write_file {json.dumps(write)}")
    assert reply.startswith(TOOL_RESULT), reply
    assert target.read_text() == "written by the seat\n"
    # A command is allowed too, and runs under the seat's sandbox: the root's `.cotal` (its
    # control token) is hidden from it.
    token = a.root / ".cotal" / "auth" / "control.token"
    assert token.is_file()
    shell = {"command": f"cat {token}; echo rc=$?"}
    reply = ask(a, "gm", f"fake:tool run_shell_command {json.dumps(shell)}")
    assert "rc=1" in reply and token.read_text().strip() not in reply, reply

    # The mesh tool: Gemini CLI names it `mcp_cotal_send`; the send reaches b as from gm.
    send = {"to": "b", "text": f"remember the phrase {MESH_PHRASE}"}
    reply = ask(a, "gm", f"fake:tool mcp_cotal_send {json.dumps(send)}")
    assert reply.startswith(TOOL_RESULT) and '\\"delivered\\"' in reply, reply
    assert ask(a, "b", "what was the phrase?") == f"The phrase is {MESH_PHRASE}, from gm."
    assert [e for e in seat_events(a, "b", "delivery.received") if e["sender"] == "gm"]

    # kill -9 in the middle of a turn: the model holds its answer, the harness dies, the
    # manager relaunches it into the same session and hands it the message again.
    slow = f"Remember the phrase {SLOW_PHRASE}. fake:hold-first:120000"
    a.json("send", "gm", slow)
    held = len(fake_gemini.requests())
    await wait_until(
        lambda: any(SLOW_PHRASE in fake_gemini.user_texts(r)[-1] for r in fake_gemini.requests()),
        timeout=60,
    )
    os.kill(row["pid"], signal.SIGKILL)

    def relaunched() -> bool:
        rows = [r for r in a.ps() if r["name"] == "gm"]
        return bool(rows) and rows[0]["restarts"] == 1 and rows[0]["state"] == "running"

    await wait_until(relaunched, timeout=150, every=0.2)
    [again] = [r for r in a.ps() if r["name"] == "gm"]
    assert again["sessionId"] == row["sessionId"] and again["pid"] != row["pid"]
    # In order: the redelivered message is answered before this question is asked.
    assert ask(a, "gm", "What was the phrase?") == f"The phrase is {SLOW_PHRASE}."
    asked = [
        r for r in fake_gemini.requests()[held - 1 :]
        if SLOW_PHRASE in fake_gemini.user_texts(r)[-1]
    ]  # fmt: skip
    assert len(asked) == 2, asked
    # The session's chat file carries no minute in its name, so no start writes over it.
    short = row["sessionId"][:8]
    assert f"session-cotal-{short}.jsonl" in chat_names(a.root), chat_names(a.root)
    assert doctor_finds_it(a)

    # The cut, carried to a root at another path with its own HOME and its own broker.
    cut = json.loads(a.run("down", "--preserve-state", "--json").stdout)
    [seat] = [s for s in cut["seats"] if s["name"] == "gm"]
    assert seat["continuity"] == "exact" and seat["sessionId"] == row["sessionId"]
    key = signer_key(a.root)
    carried = tmp_path / "carried" / Path(cut["checkpointDir"]).name
    shutil.copytree(cut["checkpointDir"], carried, symlinks=True)
    shutil.rmtree(a.root)
    dest.root.mkdir(parents=True)
    dest.run("trust", "add", key, "--name", "host-a")
    configure(dest.root, fake_gemini)
    # Where Gemini CLI is another version, the restore is refused by name before any claim;
    # without that binding, the same checkpoint restores.
    restore_refused_for_version(dest, carried, "gemini", "gm")
    result = json.loads(dest.run("up", "--restore", str(carried), "--json").stdout)
    [obs] = [s for s in result["seats"] if s["name"] == "gm"]
    assert obs["continuity"] == "exact", obs
    assert obs["sessionBefore"] == obs["sessionAfter"] == row["sessionId"]
    assert obs["uidBefore"] == obs["uidAfter"] == row["lifecycleUid"]

    seen = len(fake_gemini.requests())
    assert ask(dest, "gm", "What was the phrase again?") == f"The phrase is {SLOW_PHRASE}."
    [last] = fake_gemini.requests()[seen:]
    users = fake_gemini.user_texts(last)
    assert PHRASE in users[0] and users[-1] == "What was the phrase again?"
    # Gemini CLI tells its model where it works (its `<session_context>`, made anew at the
    # load, the recorded one left out): here, not the old path.
    context = last["contents"][0]["parts"][0]["text"]
    assert context.startswith("<session_context>") and str(dest.root) in context, context
    assert str(tmp_path / "hostA") not in context

    # A fresh Gemini CLI seat on the destination knows nothing of it, nor of the decoy.
    dest.json("spawn", "fresh", "--agent", "gemini")
    assert ask(dest, "fresh", "What was the phrase?") == "I do not know the phrase."
    assert not any(DECOY in json.dumps(r) for r in fake_gemini.requests())
    assert listing(home_b) == before and all(p.is_file() for p in decoys)
    # The key never lands in any file of the workspace, logs and the seats' stores included.
    blob = b"".join(
        p.read_bytes() for p in dest.root.rglob("*") if p.is_file() and not p.is_symlink()
    )
    assert ENV[KEY_VAR].encode() not in blob
    assert doctor_finds_it(dest)
    dest.run("down")
