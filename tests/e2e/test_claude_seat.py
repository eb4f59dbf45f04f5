"""A real Claude Code seat under the real manager, offline against the fake Messages API.

Its own session is `exact`: the manager mints the id, a crash restart and a cut/resume reopen
exactly that id with its history. Forking another seat's session yields a new id that carries
the history and is reported as a fork.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from manager.workspace.journal import Journal
from manager.workspace.layout import Layout
from tests.conftest import AnthropicServer, Cli, SharedBroker
from tests.gitrepo import git, init_repo, write
from tests.harness import claude_installed
from tests.helpers import trusting, wait_until

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.claude,
    pytest.mark.usefixtures("isolated_home"),
    pytest.mark.skipif(
        not claude_installed(), reason="Claude Code is not installed under .tools/ (make harnesses)"
    ),
]
PHRASE = "juniper-ledger-41"
KEY_VAR = "FAKE_ANTHROPIC_KEY"
ENV = {KEY_VAR: "sk-ant-fake-e2e-key-0123456789"}


def configure(root: Path, server: AnthropicServer) -> None:
    (root / "cotal.toml").write_text(
        f'[agents.claude]\nbase_url = "{server.base_url}"\nmodel = "claude-fake-1"\n'
        f'api_key_env = "{KEY_VAR}"\n'
    )


async def test_claude_seat_survives_a_crash_and_a_fork_of_another_session_is_reported(
    cli: Cli, fake_anthropic: AnthropicServer
) -> None:
    configure(cli.root, fake_anthropic)
    cli.run("up", "--detach", env=ENV)
    row = cli.json("spawn", "c1", "--agent", "claude", "--prompt", f"Remember the phrase {PHRASE}.")
    assert row["continuity"] == "exact"
    # The permission mode the seat runs under is shown, and it is the documented default.
    assert row["permissionMode"] == "bypassPermissions"
    wide = cli.run("ps", "--wide").stdout.splitlines()
    column = wide[0].index(" MODE ") + 1
    assert wide[1][column:].split()[0] == "bypassPermissions"
    assert (
        cli.json("send", "c1", "What was the phrase?", "--wait")["reply"]
        == f"The phrase is {PHRASE}."
    )
    os.kill(row["pid"], signal.SIGKILL)

    def restarted() -> bool:
        rows = [r for r in cli.ps() if r["name"] == "c1"]
        return bool(rows) and rows[0]["restarts"] == 1 and rows[0]["state"] == "running"

    await wait_until(restarted, timeout=60, every=0.2)
    [again] = [r for r in cli.ps() if r["name"] == "c1"]
    assert again["sessionId"] == row["sessionId"] and again["pid"] != row["pid"]
    assert (
        cli.json("send", "c1", "What was the phrase again?", "--wait")["reply"]
        == f"The phrase is {PHRASE}."
    )
    # Another seat resuming c1's session is a fork: a new id that carries the history.
    fork = cli.json("spawn", "c2", "--agent", "claude", "--resume", row["sessionId"])
    assert fork["sessionId"] != row["sessionId"]
    assert (
        cli.json("send", "c2", "What was the phrase?", "--wait")["reply"]
        == f"The phrase is {PHRASE}."
    )
    # And the source seat's own session carries on, untouched by the fork.
    assert (
        cli.json("send", "c1", "What was the phrase?", "--wait")["reply"]
        == f"The phrase is {PHRASE}."
    )
    cli.run("down")


async def test_claude_seat_through_the_cut_and_the_resume(
    tmp_path: Path, cli: Cli, fake_anthropic: AnthropicServer, shared_broker: SharedBroker
) -> None:
    _committed(cli.root)
    configure(cli.root, fake_anthropic)
    b = ["--server", shared_broker.url, "--creds", shared_broker.creds]
    cli.run("up", "--detach", *b, env=ENV)
    row = cli.json(
        "spawn", "default", "--agent", "claude", "--prompt", f"Remember the phrase {PHRASE}."
    )
    cut = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    [seat] = cut["seats"]
    assert seat["continuity"] == "exact" and seat["sessionId"] == row["sessionId"]
    carried = tmp_path / "carried"
    shutil.copytree(cut["checkpointDir"], carried, symlinks=True)
    shutil.rmtree(cli.root)
    cli.root.mkdir()
    configure(cli.root, fake_anthropic)
    result = json.loads(
        cli.run("up", "--restore", str(carried), *b, *trusting(carried), "--json", env=ENV).stdout
    )
    [obs] = result["seats"]
    assert obs["continuity"] == "exact"
    assert obs["sessionBefore"] == obs["sessionAfter"] == row["sessionId"]
    assert obs["uidBefore"] == obs["uidAfter"] == row["lifecycleUid"]
    assert (
        cli.json("send", "default", "What was the phrase?", "--wait")["reply"]
        == f"The phrase is {PHRASE}."
    )
    # The key never lands in any file of the workspace, logs included.
    blob = b"".join(
        p.read_bytes() for p in cli.root.rglob("*") if p.is_file() and not p.is_symlink()
    )
    assert ENV[KEY_VAR].encode() not in blob
    cli.run("down")


# -- the launch's prompt and a cut right after the spawn --------------------------------------

SLOW_PHRASE = "kite-9"


def _committed(root: Path) -> None:
    init_repo(root)
    write(root / "README.md", "# claude\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")


def _spawned_with_a_slow_prompt(cli: Cli, server: AnthropicServer) -> dict[str, Any]:
    """A mesh with one Claude seat whose launch prompt streams its reply slowly (the fake API's
    `fake:slow`), returned as soon as the spawn is: the prompt's turn is still running."""
    _committed(cli.root)
    configure(cli.root, server)
    cli.run("up", "--detach", env=ENV)
    row: dict[str, Any] = cli.json(
        "spawn",
        "default",
        "--agent",
        "claude",
        "--prompt",
        f"Remember the phrase {SLOW_PHRASE}. fake:slow",
    )
    return row


def _carried_transcript(checkpoint: Path, session_id: str) -> bytes:
    """The bytes the checkpoint carries for the session's transcript, found by its recorded
    path in the seat's store."""
    record = json.loads((checkpoint / "default" / "checkpoint.json").read_text())
    [entry] = [
        e for e in record["session"]["store"] if e["relpath"].endswith(f"/{session_id}.jsonl")
    ]
    assert "/projects/" in entry["relpath"]
    return (checkpoint / "default" / entry["file"]["file"]).read_bytes()


async def test_a_cut_right_after_the_spawn_waits_for_the_launch_prompt_and_carries_it(
    tmp_path: Path, cli: Cli, fake_anthropic: AnthropicServer
) -> None:
    # The launch's prompt is sent by the driver, not through the inbox: a cut that did not
    # wait for it sealed a session without it and carried no message that would bring it back.
    row = _spawned_with_a_slow_prompt(cli, fake_anthropic)
    cut = json.loads(cli.run("down", "--preserve-state", "--json", timeout=180).stdout)
    assert cut["journal"] == "ready" and cut["failures"] == [] and cut["midTurn"] == []
    transcript = _carried_transcript(Path(cut["checkpointDir"]), row["sessionId"])
    assert f"Remember the phrase {SLOW_PHRASE}.".encode() in transcript
    assert f"Noted: {SLOW_PHRASE}.".encode() in transcript

    carried = tmp_path / "carried"
    shutil.copytree(cut["checkpointDir"], carried, symlinks=True)
    shutil.rmtree(cli.root)
    cli.root.mkdir()
    configure(cli.root, fake_anthropic)
    cli.run("up", "--restore", str(carried), *trusting(carried), env=ENV)
    assert (
        cli.json("send", "default", "What was the phrase?", "--wait")["reply"]
        == f"The phrase is {SLOW_PHRASE}."
    )
    cli.run("down")


async def test_a_launch_prompt_past_the_drain_timeout_is_named_mid_turn(
    cli: Cli, fake_anthropic: AnthropicServer
) -> None:
    _spawned_with_a_slow_prompt(cli, fake_anthropic)
    out = cli.run("down", "--preserve-state", "--drain-timeout", "1", timeout=180)
    # What an operator reads: this prompt, unlike an inbox message, will not come back.
    assert (
        "  default was cut mid-turn in its launch prompt, which is not in its inbox and so is "
        "not redelivered after the resume: send it again\n"
    ) in out.stdout
    record = Journal(Layout.at(cli.root)).load()
    assert record is not None and record.state == "ready"
