"""Adoption into a running mesh: `cotal up --restore` at a root whose manager already runs.

Host A cuts one seat; host B runs two seats of its own and adopts A's seat beside them. B's
seats keep their processes and answer throughout; the adopted seat keeps its uid and session
and answers its phrase. A name B already uses, and the same checkpoint a second time, refuse
before anything is claimed: B's journal, custody generations and seats are as they were.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Cli
from tests.gitrepo import committed_repo
from tests.helpers import refused, signer_key

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

PHRASE = "heron-adopted-31"


def cut_one(tmp_path: Path, name: str, phrase: str) -> tuple[Path, dict[str, Any], str]:
    """A host of its own that spawns one seat, cuts it, and hands back the checkpoint, the
    seat as spawned and the host's signing key."""
    host = Cli(tmp_path / f"host-{name}")
    host.root.mkdir()
    repo = committed_repo(host.root / "repo")
    host.run("up", "--detach")
    spawned = host.json(
        "spawn", name, "--agent", "scribe", "--cwd", str(repo),
        "--prompt", f"Remember the phrase {phrase}.",
    )  # fmt: skip
    cut = host.json("down", "--preserve-state")
    return Path(cut["checkpointDir"]), spawned, signer_key(host.root)


def snapshot(root: Path) -> dict[str, bytes]:
    """What a refused adoption must leave as it was: the journal, the custody generations,
    the seat records, and the trees (everything under .cotal but logs and the broker store)."""
    out: dict[str, bytes] = {}
    cotal = root / ".cotal"
    for p in sorted(cotal.rglob("*")):
        rel = p.relative_to(cotal).as_posix()
        if rel.startswith(("logs", "nats", "sessions")) or not p.is_file():
            continue
        if rel.endswith((".sock", ".lock")):
            continue
        out[rel] = p.read_bytes()
    return out


async def test_a_running_mesh_adopts_a_seat_and_its_own_seats_carry_on(
    cli: Cli, tmp_path: Path
) -> None:
    checkpoint, mover, key = cut_one(tmp_path, "mover", PHRASE)
    repo = committed_repo(cli.root / "work")
    cli.run("up", "--detach")
    cli.run("trust", "add", key, "--name", "host-mover")
    stay = [
        cli.json("spawn", n, "--agent", "scribe", "--cwd", str(repo), "--prompt", f"I am {n}.")
        for n in ("stay1", "stay2")
    ]
    try:
        pids = {r["name"]: r["pid"] for r in cli.ps()}
        out = cli.run("up", "--restore", str(checkpoint), "--json", timeout=120)
        result = json.loads(out.stdout)
        assert result["adopted"] is True and result["journal"] == "retired", result
        [seat] = result["seats"]
        assert (seat["name"], seat["sameUid"], seat["sameSession"]) == ("mover", True, True)
        assert seat["uidAfter"] == mover["lifecycleUid"]
        assert seat["sessionAfter"] == mover["sessionId"]
        rows = {r["name"]: r for r in cli.ps()}
        assert sorted(rows) == ["mover", "stay1", "stay2"]
        # The seats the mesh ran before are the same processes, untouched by the adoption.
        assert {n: rows[n]["pid"] for n in ("stay1", "stay2")} == {
            n: pids[n] for n in ("stay1", "stay2")
        }
        assert {r["state"] for r in rows.values()} == {"running"}
        reply = cli.json("send", "mover", "What was the phrase?", "--wait")
        assert reply["reply"] == f"The phrase is {PHRASE}.", reply
        for s in stay:
            answer = cli.json("send", s["name"], "who are you?", "--wait")
            assert answer["reply"] != "", answer
        status = cli.json("status")
        assert status["manager"]["state"] == "active", status

        # The same checkpoint again: the seat already runs here, so nothing is claimed.
        before = snapshot(cli.root)
        again = cli.run("up", "--restore", str(checkpoint), "--json", check=False, timeout=120)
        error = refused(again, "duplicate-principal")
        assert "already runs in this mesh" in error, error
        assert snapshot(cli.root) == before
        assert {r["name"]: r["pid"] for r in cli.ps()} == {
            n: rows[n]["pid"] for n in ("mover", "stay1", "stay2")
        }
    finally:
        cli.run("down", check=False)


async def test_a_name_taken_in_the_mesh_refuses_before_any_claim(cli: Cli, tmp_path: Path) -> None:
    checkpoint, taken, key = cut_one(tmp_path, "stay1", "not-this-one-5")
    repo = committed_repo(cli.root / "work")
    cli.run("up", "--detach")
    cli.run("trust", "add", key, "--name", "host-taken")
    own = cli.json("spawn", "stay1", "--agent", "scribe", "--cwd", str(repo))
    try:
        before = snapshot(cli.root)
        out = cli.run("up", "--restore", str(checkpoint), "--json", check=False, timeout=120)
        error = refused(out, "duplicate-name")
        assert f"uid {own['lifecycleUid']}" in error, error
        assert "nothing was claimed" in error, error
        assert snapshot(cli.root) == before
        # No custody generation was claimed here for the checkpoint's uid.
        claimed = [p for p in (cli.root / ".cotal").rglob("*") if taken["lifecycleUid"] in p.name]
        assert claimed == []
        [row] = cli.ps()
        assert (row["name"], row["pid"], row["state"]) == ("stay1", own["pid"], "running")
    finally:
        cli.run("down", check=False)
