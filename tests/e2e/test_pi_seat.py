"""A real pi seat under the real manager, offline against the fake OpenAI-compatible server."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import pytest

from tests.conftest import PI_CLI, Cli, FakeServer, SharedBroker
from tests.gitrepo import git, init_repo, write
from tests.helpers import trusting, wait_until

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.pi,
    pytest.mark.usefixtures("isolated_home"),
    pytest.mark.skipif(
        not PI_CLI.is_file(), reason="pi is not installed under .tools/pi (make harnesses)"
    ),
]
PHRASE = "juniper-ledger-41"


def configure(root: Path, server: FakeServer) -> None:
    (root / "cotal.toml").write_text(
        f'[agents.pi]\nbase_url = "{server.base_url}"\nmodel = "fake-model"\n'
    )


def pointer(root: Path, name: str, uid: str) -> dict[str, object]:
    return json.loads((root / ".cotal/sessions/pi" / f"{name}-{uid}.json").read_text())


async def test_pi_seat_answers_survives_a_crash_and_a_fresh_seat_does_not_know(
    cli: Cli, fake_openai: FakeServer
) -> None:
    configure(cli.root, fake_openai)
    cli.run("up", "--detach")
    row = cli.json("spawn", "p1", "--agent", "pi", "--prompt", f"Remember the phrase {PHRASE}.")
    assert row["continuity"] == "exact"
    assert pointer(cli.root, "p1", row["lifecycleUid"]) == {
        "version": 1,
        "sessionId": row["sessionId"],
        "status": "running",
    }
    assert (
        cli.json("send", "p1", "What was the phrase?", "--wait")["reply"]
        == f"The phrase is {PHRASE}."
    )
    os.kill(row["pid"], signal.SIGKILL)

    def restarted() -> bool:
        rows = [r for r in cli.ps() if r["name"] == "p1"]
        return bool(rows) and rows[0]["restarts"] == 1 and rows[0]["state"] == "running"

    await wait_until(restarted, timeout=60, every=0.2)
    [again] = [r for r in cli.ps() if r["name"] == "p1"]
    assert again["sessionId"] == row["sessionId"] and again["pid"] != row["pid"]
    before = len(fake_openai.requests())
    assert (
        cli.json("send", "p1", "What was the phrase again?", "--wait")["reply"]
        == f"The phrase is {PHRASE}."
    )
    # The relaunched pi sent the earlier turns as history: it reopened the same session file.
    last = fake_openai.requests()[before:][-1]
    assert any(PHRASE in t for t in fake_openai.user_texts(last)[:-1])
    fresh = cli.json("spawn", "p2", "--agent", "pi")
    assert fresh["sessionId"] != row["sessionId"]
    assert (
        cli.json("send", "p2", "What was the phrase?", "--wait")["reply"]
        == "I do not know the phrase."
    )
    cli.run("down")


async def test_pi_seat_through_the_cut_and_the_resume(
    tmp_path: Path, cli: Cli, fake_openai: FakeServer, shared_broker: SharedBroker
) -> None:
    init_repo(cli.root)
    write(cli.root / "README.md", "# pi\n")
    git(cli.root, "add", "-A")
    git(cli.root, "commit", "-q", "-m", "first")
    configure(cli.root, fake_openai)
    cli.run("up", "--detach", "--server", shared_broker.url, "--creds", shared_broker.creds)
    row = cli.json(
        "spawn", "default", "--agent", "pi", "--prompt", f"Remember the phrase {PHRASE}."
    )
    cut = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    [seat] = cut["seats"]
    assert seat["continuity"] == "exact" and seat["sessionId"] == row["sessionId"]
    copy = tmp_path / "carried"
    shutil.copytree(cut["checkpointDir"], copy, symlinks=True)
    shutil.rmtree(cli.root)
    cli.root.mkdir()
    # Host B holds the same operator configuration (a checkpoint never carries settings).
    configure(cli.root, fake_openai)
    result = json.loads(
        cli.run(
            "up",
            "--restore",
            str(copy),
            "--server",
            shared_broker.url,
            "--creds",
            shared_broker.creds,
            *trusting(copy),
            "--json",
        ).stdout
    )
    [obs] = result["seats"]
    assert obs["sessionBefore"] == obs["sessionAfter"] == row["sessionId"]
    assert obs["uidBefore"] == obs["uidAfter"] == row["lifecycleUid"]
    assert (
        cli.json("send", "default", "What was the phrase?", "--wait")["reply"]
        == f"The phrase is {PHRASE}."
    )
    cli.run("down")
