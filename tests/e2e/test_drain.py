"""`cotal drain` empties a host (issue 40, item 5): every seat moved, N at a time, to the manager
with the most free seats; one the destination refuses at its probe is named with why and stays
running, untouched, while the rest go on; spawns are refused while the drain runs; `--cancel`
stops it before its next wave. Two real managers on one real broker, real scribe seats."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import pytest

from tests.conftest import REPO, Cli, cotal_env
from tests.e2e.test_move import seat_repo, two_roots  # noqa: F401  (the fixture)
from tests.helpers import ask, ps_row, refused, signer_key, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

SEATS = ["s1", "s2", "s3", "s4", "s5"]


async def test_a_drain_moves_every_seat_in_waves_and_names_the_one_refused(
    two_roots: tuple[Cli, Cli],  # noqa: F811
) -> None:
    a, b = two_roots
    rows = {
        name: a.json(
            "spawn", name, "--agent", "scribe", "--cwd", str(seat_repo(a, name)),
            "--prompt", f"Remember the phrase drained-{name}.",
        )
        for name in SEATS
    }  # fmt: skip
    # B already runs a seat named s3: its probe refuses that one, and only that one.
    b.json("spawn", "s3", "--agent", "scribe")
    b.run("trust", "add", signer_key(a.root), "--name", "host-a")
    to_b = b.json("status")["instanceId"]
    for name in SEATS:
        await wait_until(lambda n=name: ps_row(a, n)["state"] == "running", timeout=30)

    out = a.run("drain", "--fleet", "--max-parallel", "2", "--json", check=False, timeout=300)
    assert out.returncode == 2, (out.stdout, out.stderr)
    result = json.loads(out.stdout)
    # Waves: s1+s2; s3+s4 refused, so each alone: s3 (refused), s4; then s5.
    assert result["waves"] == 5 and result["cancelled"] is False and result["left"] == []
    assert [(m["name"], m["to"], m["midTurn"]) for m in result["moved"]] == [
        (n, to_b, False) for n in ("s1", "s2", "s4", "s5")
    ]
    [why] = result["refused"]
    assert (why["name"], why["code"]) == ("s3", "duplicate-name")
    assert "seat name 's3' is taken at destination" in why["message"]
    assert "wave 3: s3 -> " + to_b in out.stderr

    # s3 never stopped here: its very process runs on; every other seat runs at B, and answers.
    here = {r["name"]: r for r in a.ps()}
    assert list(here) == ["s3"] and here["s3"]["pid"] == rows["s3"]["pid"]
    there = {r["name"]: r for r in b.ps()}
    for name in ("s1", "s2", "s4", "s5"):
        assert there[name]["lifecycleUid"] == rows[name]["lifecycleUid"]
        assert ask(b, name, "what was the phrase?") == f"The phrase is drained-{name}."
    # The drain's marker is gone with it: spawns are taken again.
    assert not (a.root / ".cotal" / "drain.json").exists()
    assert a.json("spawn", "late", "--agent", "scribe")["name"] == "late"


async def test_spawns_are_refused_while_a_drain_runs_and_cancel_stops_it(
    two_roots: tuple[Cli, Cli],  # noqa: F811
    tmp_path: Path,
) -> None:
    a, b = two_roots
    for name in SEATS[:3]:
        a.json("spawn", name, "--agent", "scribe", "--cwd", str(seat_repo(a, name)))
    b.run("trust", "add", signer_key(a.root), "--name", "host-a")
    to_b = b.json("status")["instanceId"]
    # Nothing to cancel yet.
    assert a.json("drain", "--cancel") == {"cancelled": False}

    # One seat a wave; the first wave's seat is mid-turn for a while, so the drain is caught
    # between waves.
    a.json("send", "s1", "#slow:4000 remember the phrase slow-one")
    out_file, err_file = tmp_path / "drain.out", tmp_path / "drain.err"
    argv = [sys.executable, "-m", "manager.cli", "drain", "--to", to_b, "--max-parallel", "1"]
    with out_file.open("wb") as out, err_file.open("wb") as err:
        drain = await anyio.open_process(
            [*argv, "--json", "--root", str(a.root)],
            stdout=out, stderr=err, env=cotal_env(), cwd=REPO,
        )  # fmt: skip
    async with drain:
        marker = a.root / ".cotal" / "drain.json"
        journal = a.root / ".cotal" / "maintenance" / "v1" / "journal.json"
        # The first wave's cut has begun (its journal is written): the drain is past the check
        # it makes before that wave, and waits on s1's turn.
        await wait_until(lambda: marker.exists() and journal.exists(), timeout=30)
        spawned = a.run("spawn", "during", "--agent", "scribe", "--json", check=False)
        assert "is being drained" in refused(spawned, "draining")
        assert a.json("drain", "--cancel") == {"cancelled": True}
        with anyio.fail_after(300):
            await drain.wait()
    stdout, stderr = out_file.read_text(), err_file.read_text()
    assert drain.returncode == 2, (stdout, stderr)
    result = json.loads(stdout)
    assert result["cancelled"] is True and result["refused"] == []
    assert [m["name"] for m in result["moved"]] == ["s1"]
    assert result["left"] == ["s2", "s3"]
    assert sorted(r["name"] for r in a.ps()) == ["s2", "s3"]
    assert not marker.exists()
