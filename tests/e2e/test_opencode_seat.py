"""A real OpenCode seat (`opencode acp`, connectors/opencode.py) under the real manager, offline
against the fake OpenAI-compatible server (a real process logging every request).

One seat's life, in one test so the harness starts as few times as it must: a turn; a tool
call that writes in the seat's tree (the seat's policy allows it over ACP) and a command that
reaches for the root's `.cotal` (the sandbox hides it); a `kill -9` in the middle of a turn,
whose message the relaunched seat is handed again in the same session; a cut, and `up
--restore` on a root at another path with its own HOME and broker: the same session id under
the same uid, the provider sent the earlier turns, the session's recorded directory the new
one, a decoy OpenCode store in the destination's HOME never read; a fresh seat there knows
nothing. `cotal doctor` there reports the harness, installed, ready and used.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from connectors.harnesses import load_pins
from connectors.opencode import pinned_program
from protocol.errors import Refusal
from tests.ckpt import manager_answers, snapshot
from tests.conftest import Cli, FakeServer
from tests.e2e.test_move import committed_root
from tests.helpers import ask, refused, signer_key, wait_until


def _installed() -> bool:
    try:
        pinned_program()
        return True
    except Refusal:
        return False


pytestmark = [
    pytest.mark.anyio,
    pytest.mark.opencode,
    pytest.mark.skipif(not _installed(), reason="OpenCode is not installed under .tools/"),
]
PHRASE = "osprey-ledger-41"
SLOW_PHRASE = "kestrel-twice-9"
KEY_VAR = "FAKE_OPENAI_KEY"
ENV = {KEY_VAR: "sk-fake-opencode-e2e-key-0123456789"}
DECOY = "decoy-session-77"
TOOL_RESULT = "Tool result: "


def configure(root: Path, server: FakeServer) -> None:
    # OpenCode and Gemini CLI start in five to seven seconds on an idle host, several times
    # that when the suite's other workers hold both cores: readiness gets the longest window.
    (root / "cotal.toml").write_text(
        "[launch]\nready_timeout_s = 120\n"
        f'[agents.opencode]\nbase_url = "{server.base_url}"\nmodel = "fake-model"\n'
        f'api_key_env = "{KEY_VAR}"\n'
    )


def model_requests(server: FakeServer) -> list[dict[str, Any]]:
    """The agent's own requests to the model: OpenCode also asks it for each session's title,
    a request with no tools."""
    return [r for r in server.requests() if "tools" in r]


def plant_decoy(home: Path) -> list[Path]:
    """Where an unconfined OpenCode would look in HOME (its XDG defaults, and the Claude Code
    files it reads unless told not to), each naming a phrase the seat was never told."""
    planted = {
        ".local/share/opencode/opencode.db": f"not a database: remember the phrase {DECOY}\n",
        ".config/opencode/AGENTS.md": f"Remember the phrase {DECOY}.\n",
        ".config/opencode/opencode.json": json.dumps({"instructions": [f"phrase {DECOY}"]}),
        ".claude/CLAUDE.md": f"Remember the phrase {DECOY}.\n",
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


def session_directory(root: Path, session_id: str) -> str:
    [db] = (root / ".cotal/sessions/opencode").glob("*.home/opencode/opencode.db")
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        [(directory,)] = conn.execute("SELECT directory FROM session WHERE id = ?", (session_id,))
    finally:
        conn.close()
    return str(directory)


OTHER_VERSION = "0.0.9"


def another_version(path: Path) -> Path:
    """A program that says it is another version of the harness: the connector's check runs
    `<binary> --version` and takes its first line."""
    path.write_text(f"#!/bin/sh\necho {OTHER_VERSION}\n")
    path.chmod(0o755)
    return path


def bind_binary(toml: Path, agent: str, binary: Path) -> str:
    """Bind `agents.<agent>.binary` in `toml` (a host binding, not part of the launch profile);
    the text it had, to put back."""
    kept = toml.read_text()
    table = f"[agents.{agent}]\n"
    assert table in kept, kept
    toml.write_text(kept.replace(table, f'{table}binary = "{binary}"\n', 1))
    return kept


def version_refusal(agent: str, seat: str, other: Path, *, where: str, ran: str) -> str:
    """The refusal `admit.harness_refusal` words for `seat`, whose harness ran the pinned
    version, where `agent` is `other` at OTHER_VERSION, up to the place that differs between
    a move's probe and a restore's admission (where else to take the seat, and what was not
    done)."""
    pinned = load_pins()[agent].version
    return (
        f"seat {seat}: {where} has {agent} {OTHER_VERSION} ({other}), the seat {ran} {pinned} "
        f"at the source; this build's {agent} connector resumes sessions of {agent} {pinned} "
        f"only; install {agent} {pinned} at the destination (`cotal tools install`, or "
        f"agents.{agent}.binary in its cotal.toml), or "
    )


def untouched(root: Path) -> dict[str, tuple[object, ...]]:
    """What a refused restore leaves as it was (`tests.ckpt.snapshot`): a root with no broker of
    its own starts one before the gates and, refused, removes what it made (its credentials in
    `.cotal/auth` among them), which moves that directory's mtime and nothing else."""
    out = snapshot(root)
    if ".cotal/auth" in out:
        out[".cotal/auth"] = out[".cotal/auth"][:3]
    return out


def restore_refused_for_version(cli: Cli, carried: Path, agent: str, seat: str) -> None:
    """`cotal up --restore` of `carried` at `cli`'s root, whose cotal.toml binds `agent` to a
    program of another version, refused `harness-version` at the identity gate by name: exit
    2, nothing admitted or claimed, no manager, the root byte for byte as it was. The binding
    is then removed."""
    toml = cli.root / "cotal.toml"
    other = another_version(carried.parent / f"{agent}-other")
    kept = bind_binary(toml, agent, other)
    before = untouched(cli.root)
    proc = cli.run("up", "--restore", str(carried), "--json", check=False)
    message = refused(proc, "harness-version")
    assert message == (
        "admission refused at the identity gate: "
        + version_refusal(agent, seat, other, where="this host", ran="ran")
        + "resume it on a host that has it; nothing was claimed"
    ), message
    assert proc.stdout == "", proc.stdout
    assert "admitted:" not in proc.stderr and "claiming custody" not in proc.stderr
    assert untouched(cli.root) == before
    assert not manager_answers(cli.root)
    toml.write_text(kept)


def doctor_row(cli: Cli) -> dict[str, Any]:
    """`cotal doctor`'s row for OpenCode on this root."""
    rows = [json.loads(line) for line in cli.run("doctor", "--json").stdout.splitlines()]
    [row] = [r for r in rows if r["name"] == "opencode"]
    return dict(row)


async def test_an_opencode_seat_through_a_tool_a_kill_a_cut_and_a_resume_at_another_path(
    tmp_path: Path, fake_openai: FakeServer
) -> None:
    home_a, home_b = tmp_path / "homeA", tmp_path / "homeB"
    home_a.mkdir()
    decoys = plant_decoy(home_b)
    before = listing(home_b)
    a = Cli(committed_root(tmp_path / "hostA" / "ws"), env={**ENV, "HOME": str(home_a)})
    dest = Cli(tmp_path / "hostB" / "work" / "ws2", env={**ENV, "HOME": str(home_b)})
    configure(a.root, fake_openai)
    a.run("up", "--detach")
    row = a.json("spawn", "oc", "--agent", "opencode", "--prompt", f"Remember the phrase {PHRASE}.")
    assert row["continuity"] == "exact" and row["permissionMode"] == "workspace-write"
    assert ask(a, "oc", "What was the phrase?") == f"The phrase is {PHRASE}."

    # A tool call in the seat's tree: OpenCode asks, the seat's policy allows, the file is there.
    target = a.root / "notes" / "out.txt"
    write = {"filePath": str(target), "content": "written by the seat\n"}
    reply = ask(a, "oc", f"fake:tool write {json.dumps(write)}")
    assert reply.startswith(TOOL_RESULT), reply
    assert target.read_text() == "written by the seat\n"
    # A command is allowed too, and runs under the seat's sandbox: the root's `.cotal` (its
    # control token) is hidden from it.
    token = a.root / ".cotal" / "auth" / "control.token"
    assert token.is_file()
    bash = {"command": f"cat {token}; echo rc=$?", "description": "read the token"}
    reply = ask(a, "oc", f"fake:tool bash {json.dumps(bash)}")
    assert "rc=1" in reply and token.read_text().strip() not in reply, reply

    # kill -9 in the middle of a turn: the model holds its answer, the harness dies, the
    # manager relaunches it into the same session and hands it the message again.
    slow = f"Remember the phrase {SLOW_PHRASE}. fake:hold-first:120000"
    a.json("send", "oc", slow)
    await wait_until(
        lambda: any(
            SLOW_PHRASE in fake_openai.user_texts(r)[-1] for r in model_requests(fake_openai)
        ),
        timeout=60,
    )
    os.kill(row["pid"], signal.SIGKILL)

    def relaunched() -> bool:
        rows = [r for r in a.ps() if r["name"] == "oc"]
        return bool(rows) and rows[0]["restarts"] == 1 and rows[0]["state"] == "running"

    await wait_until(relaunched, timeout=150, every=0.2)
    [again] = [r for r in a.ps() if r["name"] == "oc"]
    assert again["sessionId"] == row["sessionId"] and again["pid"] != row["pid"]
    # In order: the redelivered message is answered before this question is asked.
    assert ask(a, "oc", "What was the phrase?") == f"The phrase is {SLOW_PHRASE}."
    # Asked twice (the killed turn, then its redelivery), never a third time.
    asked = [r for r in model_requests(fake_openai) if SLOW_PHRASE in fake_openai.user_texts(r)[-1]]
    assert len(asked) == 2, asked

    # The cut, carried to a root at another path with its own HOME and its own broker.
    cut = json.loads(a.run("down", "--preserve-state", "--json").stdout)
    [seat] = cut["seats"]
    assert seat["continuity"] == "exact" and seat["sessionId"] == row["sessionId"]
    key = signer_key(a.root)
    carried = tmp_path / "carried" / Path(cut["checkpointDir"]).name
    shutil.copytree(cut["checkpointDir"], carried, symlinks=True)
    shutil.rmtree(a.root)
    dest.root.mkdir(parents=True)
    dest.run("trust", "add", key, "--name", "host-a")
    configure(dest.root, fake_openai)
    # Where OpenCode is another version, the restore is refused by name before any claim;
    # without that binding, the same checkpoint restores.
    restore_refused_for_version(dest, carried, "opencode", "oc")
    result = json.loads(dest.run("up", "--restore", str(carried), "--json").stdout)
    [obs] = result["seats"]
    assert obs["continuity"] == "exact", obs
    assert obs["sessionBefore"] == obs["sessionAfter"] == row["sessionId"]
    assert obs["uidBefore"] == obs["uidAfter"] == row["lifecycleUid"]
    # OpenCode works in the directory its session records: the restore pointed it here.
    assert session_directory(dest.root, row["sessionId"]) == str(dest.root)

    seen = len(model_requests(fake_openai))
    assert ask(dest, "oc", "What was the phrase again?") == f"The phrase is {SLOW_PHRASE}."
    [last] = model_requests(fake_openai)[seen:]
    users = fake_openai.user_texts(last)
    assert users[0] == f"Remember the phrase {PHRASE}."
    assert users[-1] == "What was the phrase again?"
    assert str(dest.root) in json.dumps(last["messages"][0])

    # A fresh OpenCode seat on the destination knows nothing of it, nor of the decoy.
    dest.json("spawn", "fresh", "--agent", "opencode")
    assert ask(dest, "fresh", "What was the phrase?") == "I do not know the phrase."
    assert not any(DECOY in json.dumps(r) for r in fake_openai.requests())
    assert listing(home_b) == before and all(p.is_file() for p in decoys)
    # The key never lands in any file of the workspace, logs and the seats' stores included.
    blob = b"".join(
        p.read_bytes() for p in dest.root.rglob("*") if p.is_file() and not p.is_symlink()
    )
    assert ENV[KEY_VAR].encode() not in blob
    row = doctor_row(dest)
    assert (row["version"], row["continuity"], row["missing"]) == ("1.18.33", "exact", []), row
    assert row["ready"] and row["used"], row
    dest.run("down")
