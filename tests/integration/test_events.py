"""`cotal events` (issue 40, item 1): a real daemon's lifecycle events, published on a real
broker as they happen and read back with `--since ... --until now`.

One mesh runs a seat through its life: spawned and started, a turn, a stop and a start, a dead
letter, a cut of that seat alone and its resume in place; the events of that seat are then
exactly those, in order, each under this manager's instance id. `--seat` filters; a second
root sharing the broker sees the first root's events with `--fleet` and not without."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from protocol.instant import now_iso
from tests.conftest import Cli, SharedBroker, cotal_env
from tests.gitrepo import committed_repo, git, init_repo, write
from tests.helpers import ask, ps_row, refused, wait_until

pytestmark = pytest.mark.anyio


def events(cli: Cli, since: str, *more: str) -> list[dict[str, Any]]:
    out = cli.run("events", "--json", "--since", since, "--until", "now", *more, timeout=60)
    return [json.loads(line) for line in out.stdout.splitlines()]


def types_of(cli: Cli, since: str, seat: str) -> list[str]:
    return [e["type"] for e in events(cli, since, "--seat", seat)]


async def settled(cli: Cli, since: str, seat: str, count: int) -> list[str]:
    """The seat's event types once `count` of them are at the broker: an event is published a
    moment after it happens, by the manager's own task."""
    await wait_until(lambda: len(types_of(cli, since, seat)) >= count, timeout=30, every=0.2)
    return types_of(cli, since, seat)


LIFE = [
    "seat.spawned",
    # Its writer fence set up under its custody (generation 0).
    "custody.claimed",
    "seat.started",
    # A turn.
    "turn.started",
    "turn.ended",
    # A refused op that names the seat (a second `cotal spawn alice`).
    "refusal",
    # `cotal stop`, `cotal start`.
    "seat.stopped",
    "seat.restarted",
    "seat.started",
    # A turn failed at the delivery cap: its message set aside, the harness relaunched.
    "turn.started",
    "turn.ended",
    "deadletter.added",
    "seat.exited",
    "seat.restarted",
    "seat.started",
]
CUT = [
    # The cut of this seat alone: stopped, sealed, out of the table; the resume adopts it.
    "seat.stopped",
    "cut.sealed",
    "seat.removed",
    "seat.spawned",
    # Under the next writer generation.
    "custody.claimed",
    "seat.started",
]


@pytest.mark.usefixtures("isolated_home")
async def test_a_seats_life_is_its_events_in_order(cli: Cli) -> None:
    shared = committed_repo(cli.root / "shared")
    # A cap of one: a message whose first delivery fails is a dead letter at once.
    (cli.root / "cotal.toml").write_text("[delivery]\nmax_deliveries = 1\n")
    start = now_iso()
    cli.run("up", "--detach")
    try:
        for name in ("alice", "bob"):
            cli.json("spawn", name, "--agent", "scribe", "--cwd", str(shared))
        instance = ps_row(cli, "alice")["instanceId"]
        assert ask(cli, "alice", "remember the phrase x-1") == "Noted: x-1."
        refused(
            cli.run("spawn", "alice", "--agent", "scribe", "--json", check=False), "duplicate-name"
        )
        cli.run("stop", "alice")
        cli.run("start", "alice")
        cli.json("send", "alice", "#error-until:1 remember the phrase x-2")
        assert await settled(cli, start, "alice", len(LIFE)) == LIFE
        assert ps_row(cli, "alice")["deadLetters"] == 1

        cut = cli.json("down", "--preserve-state", "--seat", "alice")
        assert (cut["partial"], cut["sealed"]) == (True, True), cut
        restored = cli.json("up", "--restore", cut["checkpointDir"])
        assert restored["adopted"] is True, restored
        assert await settled(cli, start, "alice", len(LIFE + CUT)) == LIFE + CUT

        every = events(cli, start)
        mine = [e for e in every if e["seat"] == "alice"]
        assert {e["instance"] for e in every} == {instance}
        uids = [e["uid"] for e in mine]
        assert uids == [ps_row(cli, "alice")["lifecycleUid"]] * len(uids)
        ended = [e["detail"] for e in mine if e["type"] == "turn.ended"]
        assert [d["outcome"] for d in ended] == ["ok", "failed"]
        assert all(set(d) == {"durationS", "outcome"} and d["durationS"] >= 0 for d in ended)
        [refused_event] = [e for e in mine if e["type"] == "refusal"]
        assert refused_event["detail"] == {"op": "spawn", "code": "duplicate-name"}
        claims = [e["detail"] for e in mine if e["type"] == "custody.claimed"]
        assert claims == [{"generation": 0}, {"generation": 1}]
        [sealed] = [e for e in mine if e["type"] == "cut.sealed"]
        assert sealed["detail"] == {"attemptId": cut["attemptId"]}
        # `--seat` filters: bob's are his alone.
        assert types_of(cli, start, "bob") == ["seat.spawned", "custody.claimed", "seat.started"]
        # The readable form: one line an event, the time, the instance, the seat, the type.
        lines = cli.run("events", "--since", start, "--until", "now", "--seat", "bob").stdout
        first, claimed, started = lines.splitlines()
        assert first.split()[1:] == [instance[:8], "bob", "seat.spawned"]
        assert claimed.split()[1:] == [instance[:8], "bob", "custody.claimed", "generation=0"]
        assert started.split()[1:] == [instance[:8], "bob", "seat.started"]
        # Removed, bob's custody is given up, and said so.
        cli.run("rm", "bob")
        assert await settled(cli, start, "bob", 6) == [
            "seat.spawned",
            "custody.claimed",
            "seat.started",
            "seat.stopped",
            "seat.removed",
            "custody.released",
        ]
        # A malformed --since is refused by name.
        message = refused(
            cli.run("events", "--since", "yesterday", "--json", check=False), "bad-args"
        )
        assert message.startswith("--since: 'yesterday' is neither an instant")
    finally:
        cli.run("down", check=False)


def committed_root(root: Path) -> Path:
    init_repo(root)
    write(root / "README.md", "# events\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    return root


async def next_event(lines: BufferedByteReceiveStream) -> dict[str, Any]:
    with anyio.fail_after(30):
        event: dict[str, Any] = json.loads(await lines.receive_until(b"\n", 65536))
        return event


async def test_the_fleet_sees_every_managers_events_and_a_follower_sees_them_live(
    tmp_path: Path, shared_broker: SharedBroker
) -> None:
    a, b = Cli(committed_root(tmp_path / "a")), Cli(committed_root(tmp_path / "b"))
    start = now_iso()
    try:
        for cli, host in ((a, "host-a"), (b, "host-b")):
            cli.run(
                "up", "--detach", "--server", shared_broker.url, "--creds", shared_broker.creds,
                env={"COTAL_HOST_LABEL": host},
            )  # fmt: skip
        at_a = a.json("spawn", "early", "--agent", "scribe")
        # B's own events are its own; with --fleet they are every manager's, A's with its host.
        assert events(b, start, "--seat", "early") == []
        seen = events(b, start, "--fleet", "--seat", "early")
        assert [(e["type"], e["instance"], e["host"]) for e in seen] == [
            ("seat.spawned", at_a["instanceId"], "host-a"),
            ("custody.claimed", at_a["instanceId"], "host-a"),
            ("seat.started", at_a["instanceId"], "host-a"),
        ]
        # Following: what the broker kept from --since, then each event as it happens.
        argv = [sys.executable, "-m", "manager.cli", "events", "--json", "--fleet"]
        argv += ["--since", start, "--root", str(b.root)]
        async with await anyio.open_process(argv, env=cotal_env(), cwd=b.root) as proc:
            assert proc.stdout is not None
            lines = BufferedByteReceiveStream(proc.stdout)
            assert [(await next_event(lines))["seat"] for _ in range(3)] == ["early"] * 3
            late = a.json("spawn", "late", "--agent", "scribe")
            got = [await next_event(lines) for _ in range(3)]
            assert [(e["seat"], e["type"], e["uid"]) for e in got] == [
                ("late", "seat.spawned", late["lifecycleUid"]),
                ("late", "custody.claimed", late["lifecycleUid"]),
                ("late", "seat.started", late["lifecycleUid"]),
            ]
            proc.terminate()
    finally:
        for cli in (a, b):
            if (cli.root / ".cotal" / "mesh.json").exists():
                cli.run("down", check=False)
