"""`cotal ps --fleet` (issue 24, item 6): two managers on one real standalone broker, a scribe
seat on each; the roster from either root lists both seats where they run, and a seat cut at
one root as its custody record then says it is (held; in transit once packed to be carried
away). Real broker, real daemons, real seats, real git."""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from manager.broker import fleet
from manager.cli.fleet import run_fleet
from protocol.errors import Refusal
from tests.conftest import Cli, SharedBroker
from tests.gitrepo import git, init_repo, write
from tests.helpers import broker_at, wait_gone

pytestmark = pytest.mark.usefixtures("isolated_home")


def fleet_of(cli: Cli, *, as_json: bool = True) -> Any:
    proc = cli.run("ps", "--fleet", *(["--json"] if as_json else []), timeout=60)
    if not as_json:
        return proc.stdout
    [line] = proc.stdout.splitlines()
    return json.loads(line)


def committed_root(root: Path) -> Path:
    init_repo(root)
    write(root / "README.md", "# fleet\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    return root


@pytest.fixture
def two_roots(tmp_path: Path, shared_broker: SharedBroker) -> Iterator[tuple[Cli, Cli]]:
    a, b = Cli(committed_root(tmp_path / "a")), Cli(committed_root(tmp_path / "b"))
    for cli, host in ((a, "host-a"), (b, "host-b")):
        cli.run(
            "up",
            "--detach",
            "--server",
            shared_broker.url,
            "--creds",
            shared_broker.creds,
            env={"COTAL_HOST_LABEL": host},
        )
    yield a, b
    for cli in (a, b):
        if (cli.root / ".cotal" / "mesh.json").exists():
            cli.run("down", check=False)


def fleet_row(
    name: str, uid: str, instance: str, host: str | None, state: str, **over: Any
) -> dict[str, Any]:
    row: dict[str, Any] = {
        "name": name,
        "lifecycleUid": uid,
        "instance": instance,
        "host": host,
        "state": state,
        "generation": 0,
        "attemptId": None,
        "presenceInstance": instance if state == "running" else None,
        "managerLive": host is not None,
        "errors": [],
    }
    return {**row, **over}


@pytest.mark.anyio
async def test_fleet_shows_every_managers_seats_and_a_cut_seat_as_its_custody_says(
    tmp_path: Path, shared_broker: SharedBroker, two_roots: tuple[Cli, Cli]
) -> None:
    a, b = two_roots
    alpha = a.json("spawn", "alpha", "--agent", "scribe")
    beta = b.json("spawn", "beta", "--agent", "scribe")
    ia, ib = alpha["instanceId"], beta["instanceId"]
    assert ia != ib
    both = [
        fleet_row("alpha", alpha["lifecycleUid"], ia, "host-a", "running"),
        fleet_row("beta", beta["lifecycleUid"], ib, "host-b", "running"),
    ]
    assert fleet_of(a) == both
    assert fleet_of(b) == both
    table = fleet_of(b, as_json=False)
    assert [line.split() for line in table.splitlines()] == [
        ["NAME", "INSTANCE", "HOST", "STATE", "GEN"],
        ["alpha", ia, "host-a", "running", "0"],
        ["beta", ib, "host-b", "running", "0"],
    ]

    # A cut of root A on the shared broker: its seat stops, its manager goes, custody stays.
    cut = json.loads(a.run("down", "--preserve-state", "--json").stdout)
    assert [s["name"] for s in cut["seats"]] == ["alpha"]
    await wait_gone([alpha["pid"]])
    # The cut leaves custody exactly as it was (holder A, generation 0, no attempt named): the
    # record says held, not in transit. Once A's presence and lease have run out (TTLs 6 s and
    # 10 s) the row is that and nothing else.
    held = fleet_row("alpha", alpha["lifecycleUid"], ia, None, "held")
    running_beta = both[1]
    async with broker_at(shared_broker.url, shared_broker.creds) as js:
        with anyio.fail_after(30):
            while (rows := await fleet.roster(js, "main"))[0] != fleet.FleetRow(
                name="alpha",
                lifecycle_uid=alpha["lifecycleUid"],
                instance=ia,
                host=None,
                state="held",
                generation=0,
                attempt_id=None,
                presence_instance=None,
                manager_live=False,
            ):
                # While the lease lives on, the seat is already not running and still held.
                assert (rows[0].state, rows[0].instance) in (("running", ia), ("held", ia))
                await anyio.sleep(0.5)
    assert fleet_of(b) == [held, running_beta]

    # Packed to be carried away, the seat is in transit: the hand-off record names it at the
    # generation its custody holds.
    packed = tmp_path / "alpha.tar"
    a.run(
        "checkpoint",
        "pack",
        cut["checkpointDir"],
        "-o",
        str(packed),
        "--server",
        shared_broker.url,
        "--creds",
        shared_broker.creds,
    )
    assert fleet_of(b) == [{**held, "state": "in transit"}, running_beta]
    # And a root whose mesh is gone has no broker to ask.
    with pytest.raises(Refusal) as refused:
        run_fleet(argparse.Namespace(root=str(a.root), json=True))
    assert refused.value.code == "not-up"
    assert refused.value.message == (
        f"no mesh is up in {a.root} (no .cotal/mesh.json), so there is no broker to ask"
    )


def test_a_root_with_no_mesh_refuses_by_name(tmp_path: Path) -> None:
    with pytest.raises(Refusal) as refused:
        run_fleet(argparse.Namespace(root=str(tmp_path), json=False))
    assert refused.value.code == "not-up"
    assert "cotal up --server URL --creds FILE" in refused.value.cure
