"""`cotal move` refused at its probe, before the source fences or stops anything, for each reason
the destination's admission or launch would otherwise give only after the cut: the launch
profile (at the destination, and at the source itself), the harness missing at the destination
or installed there at another version, and too little free disk for what the seat ships.

Each case runs two real managers on one real broker with real seat processes, and proves the
seat was never touched: the same process runs at the source, in the same session, no cut was
journaled and nothing was pre-copied, and the destination holds no seat of it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import PI_CLI, Cli, FakeServer
from tests.e2e.test_move import seat_repo, two_roots  # noqa: F401  (the fixture)
from tests.gitrepo import write
from tests.helpers import processes_mentioning, refused, signer_key

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

NOTHING_FENCED = "nothing was fenced"


def never_stopped(a: Cli, b: Cli, seat: dict[str, Any]) -> None:
    """The seat runs at A exactly as it did before the move was asked: its very process, its
    session; A journaled no cut and shipped no history; B holds nothing of it."""
    rows = {r["name"]: r for r in a.ps()}
    row = rows[seat["name"]]
    assert (row["state"], row["pid"], row["sessionId"], row["restarts"]) == (
        "running",
        seat["pid"],
        seat["sessionId"],
        0,
    )
    assert processes_mentioning(seat["lifecycleUid"]) == [seat["pid"]]
    assert a.json("status")["state"] == "active"
    assert not (a.root / ".cotal/maintenance/v1/journal.json").exists()
    store = a.root / ".cotal/maintenance/v1/precopy"
    assert not store.exists() or list(store.iterdir()) == []
    assert seat["name"] not in {r["name"] for r in b.ps()}


def move(a: Cli, to: str, name: str) -> Any:
    return a.run("move", name, "--to", to, "--json", check=False, timeout=120)


async def test_a_profile_that_differs_refuses_at_the_probe(two_roots: tuple[Cli, Cli]) -> None:  # noqa: F811
    a, b = two_roots
    seat = a.json("spawn", "mover", "--agent", "scribe", "--cwd", str(seat_repo(a, "mover")))
    to_b = b.json("status")["instanceId"]
    b.run("trust", "add", signer_key(a.root), "--name", "host-a")

    # B's launch profile for scribe names another model: its identity gate would refuse the
    # checkpoint after the cut, so its probe refuses before it.
    write(b.root / "cotal.toml", '[agents.scribe]\nmodel = "other"\n')
    message = refused(move(a, to_b, "mover"), "profile-drift")
    assert f"destination {to_b}'s launch profile for scribe has revision" in message
    assert "make the destination's cotal.toml [agents.scribe] match the source's" in message
    assert message.endswith(NOTHING_FENCED + "; see the destination's message; nothing was moved")
    never_stopped(a, b, seat)

    # A's own cotal.toml changed since the seat was spawned: its cut would refuse, so the move
    # refuses before it asks B anything.
    (b.root / "cotal.toml").unlink()
    write(a.root / "cotal.toml", '[agents.scribe]\nmodel = "edited"\n')
    message = refused(move(a, to_b, "mover"), "profile-drift")
    assert message.startswith("seat mover: this root's launch profile for scribe is now revision")
    assert "so its cut would refuse" in message
    never_stopped(a, b, seat)

    # Both back as they were: the same seat moves.
    (a.root / "cotal.toml").unlink()
    moved = a.json("move", "mover", "--to", to_b)
    assert [s["lifecycleUid"] for s in moved["seats"]] == [seat["lifecycleUid"]]


async def test_too_little_free_disk_at_the_destination_refuses_at_the_probe(
    two_roots: tuple[Cli, Cli],  # noqa: F811
) -> None:
    """A real shortage, no test hook: the seat's tree holds an untracked sparse file longer
    than B's disk has room for (the cut would carry it whole), so the estimate the probe
    sends is more than B's free space."""
    a, b = two_roots
    repo = seat_repo(a, "mover")
    seat = a.json("spawn", "mover", "--agent", "scribe", "--cwd", str(repo))
    to_b = b.json("status")["instanceId"]
    b.run("trust", "add", signer_key(a.root), "--name", "host-a")
    huge = repo / "huge.bin"
    with huge.open("wb") as f:
        f.truncate(shutil.disk_usage(b.root).free + (1 << 30))
    try:
        message = refused(move(a, to_b, "mover"), "no-space")
    finally:
        huge.unlink()
    assert f"destination {to_b} has " in message and " bytes free in " in message
    assert "free space in the destination's root, or move fewer seats" in message
    assert NOTHING_FENCED in message
    never_stopped(a, b, seat)


def pi_config(server: FakeServer, extra: str = "") -> str:
    return f'[agents.pi]\nbase_url = "{server.base_url}"\nmodel = "fake-model"\n{extra}'


@pytest.mark.pi
@pytest.mark.skipif(
    not PI_CLI.is_file(), reason="pi is not installed under .tools/pi (make harnesses)"
)
async def test_a_harness_missing_or_at_another_version_refuses_at_the_probe(
    two_roots: tuple[Cli, Cli],  # noqa: F811
    fake_openai: FakeServer,
    tmp_path: Path,
) -> None:
    """A real pi seat at A (the pinned pi); B's own binding of pi's program, a host binding that
    is not part of the profile: first a path with nothing there, then a program that says it
    is another version. B's `cotal doctor` check refuses each before A fences anything."""
    a, b = two_roots
    write(a.root / "cotal.toml", pi_config(fake_openai))
    seat = a.json("spawn", "coder", "--agent", "pi", "--cwd", str(seat_repo(a, "coder")))
    to_b = b.json("status")["instanceId"]
    b.run("trust", "add", signer_key(a.root), "--name", "host-a")

    write(b.root / "cotal.toml", pi_config(fake_openai, 'binary = "/nonexistent/pi"\n'))
    message = refused(move(a, to_b, "coder"), "agent-unavailable")
    assert f"seat coder: destination {to_b} cannot run pi: " in message
    assert "agents.pi.binary /nonexistent/pi does not exist" in message
    assert NOTHING_FENCED in message
    never_stopped(a, b, seat)

    other = tmp_path / "pi-other"
    other.write_text("#!/bin/sh\necho 0.0.9\n")
    other.chmod(0o755)
    write(b.root / "cotal.toml", pi_config(fake_openai, f'binary = "{other}"\n'))
    message = refused(move(a, to_b, "coder"), "harness-version")
    assert f"seat coder: destination {to_b} has pi 0.0.9 ({other}), the seat runs " in message
    assert "install pi " in message and NOTHING_FENCED in message
    never_stopped(a, b, seat)
