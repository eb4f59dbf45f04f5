"""`cotal takeover` (issue 39, item 4): another host runs a dead host's seat from its standing
checkpoint. Two roots on one standalone broker: `a` with `[failover] enabled, after_s = 3`,
`b` plain. Real managers, real scribe seats, real SIGKILLs of `a`'s whole process tree.

- While `a`'s manager renews its lease the takeover is refused (`holder-alive`) and the seat
  keeps its very process on `a`.
- Once `a`'s manager and seat are SIGKILLed and its lease has aged out, `cotal takeover` on `b`
  runs the seat there: same uid and session, one process carrying the uid, generation + 1, the
  phrase of its last finished turn remembered, and a message sent to it while its host was down
  answered there, once.
- A second takeover of the same seat (from the old holder) is refused: custody moved.
- A seat whose root ran without failover has nothing to take over from: refused by name.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from manager.workspace.layout import Layout
from tests.conftest import PI_CLI, REPO, Cli, SharedBroker, cotal_env, start_fake_server
from tests.e2e.test_move import committed_root
from tests.gitrepo import git, init_repo, write
from tests.helpers import (
    ask,
    processes_mentioning,
    refused,
    signer_key,
    wait_until,
)
from tests.netns import host_namespace
from tests.partition import relay_to

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

PHRASE = "kestrel-taken-39"
LATER = "merlin-queued-39"
SLOW = "harrier-inflight-39"


def _root(path: Path, b: SharedBroker, toml: str = "", url: str | None = None) -> Cli:
    committed_root(path)
    cli = Cli(path)
    if toml:
        (path / "cotal.toml").write_text(toml)
    cli.run("up", "--detach", "--server", url or b.url, "--creds", b.creds)
    return cli


def _seat_repo(cli: Cli, name: str) -> Path:
    repo = init_repo(cli.root / name)
    write(repo / "notes.txt", f"{name}\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", name)
    return repo


def _fleet_row(cli: Cli, name: str) -> dict[str, Any]:
    rows = json.loads(cli.run("ps", "--fleet", "--json").stdout)
    [row] = [r for r in rows if r["name"] == name]
    return dict(row)


def _received(cli: Cli, msg_id: str | None = None) -> list[dict[str, Any]]:
    """The manager's `delivery.received` lines for `keeper` (of one message id, if given)."""
    log = (cli.root / ".cotal" / "logs" / "manager.log").read_text().splitlines()
    return [
        e
        for e in map(json.loads, log)
        if e.get("event") == "delivery.received"
        and e.get("seat") == "keeper"
        and (msg_id is None or e.get("id") == msg_id)
    ]


@contextmanager
def _downed(*clis: Cli) -> Iterator[None]:
    """The hosts' managers are brought down when the test ends, however it ends."""
    try:
        yield
    finally:
        for cli in clis:
            if (cli.root / ".cotal" / "mesh.json").exists():
                cli.run("down", check=False)


def _kill_tree(cli: Cli) -> None:
    """The host dies: its manager and every seat process, SIGKILL, no goodbye."""
    manager = int(cli.json("status")["pid"])
    seats = [int(r["pid"]) for r in cli.ps() if r.get("pid")]
    for pid in [manager, *seats]:
        os.kill(pid, signal.SIGKILL)


async def test_a_dead_hosts_seat_is_taken_over_from_its_standing_checkpoint(
    tmp_path: Path, shared_broker: SharedBroker
) -> None:
    b_ = shared_broker
    a = _root(tmp_path / "a", b_, "[failover]\nenabled = true\nafter_s = 3\n")
    b = _root(tmp_path / "b", b_)
    with _downed(a, b):
        repo = _seat_repo(a, "k")
        # History worth building on, so the next turn's standing checkpoint is incremental.
        noise = b"".join(hashlib.sha256(f"takeover-{i}".encode()).digest() for i in range(2048))
        write(repo / "history.bin", noise)
        git(repo, "add", "-A")
        git(repo, "commit", "-q", "-m", "history")
        keeper = a.json("spawn", "keeper", "--agent", "scribe", "--cwd", str(repo))
        uid = keeper["lifecycleUid"]
        assert ask(a, "keeper", f"Remember the phrase {PHRASE}.") == f"Noted: {PHRASE}."
        # The seat's last finished turn before the death: a commit it would have made.
        write(repo / "late.txt", "the last turn's work\n")
        git(repo, "add", "late.txt")
        git(repo, "commit", "-q", "-m", "late work")
        assert ask(a, "keeper", "What was the phrase?") == f"The phrase is {PHRASE}."
        b.run("trust", "add", signer_key(a.root), "--name", "host-a")
        b.json("spawn", "teller", "--agent", "scribe", "--allow-send", "keeper")

        # Its holder lives: refused, and the seat keeps its process.
        alive = b.run("takeover", "keeper", "--json", check=False)
        assert "still renews its lease" in refused(alive, "holder-alive")
        assert [r["pid"] for r in a.ps()] == [keeper["pid"]]

        held = _fleet_row(b, "keeper")
        # A turn in flight when the host dies: never acknowledged, so redelivered there, once.
        slow = a.json("send", "keeper", f"#slow:1500 Remember the phrase {SLOW}.")["id"]
        await wait_until(lambda: _received(a, slow) != [], timeout=30)
        _kill_tree(a)
        await wait_until(lambda: not _fleet_row(b, "keeper")["managerLive"], timeout=30)
        # Mail for it while its host is down waits in its inbox at the broker.
        told = ask(b, "teller", f"Tell keeper: Remember the phrase {LATER}.")
        assert told.startswith("Told keeper: queued; its host is unreachable since "), told

        taken = b.json("takeover", "keeper", "--from", held["instance"])
        [seat] = taken["seats"]
        assert (seat["name"], seat["lifecycleUid"], seat["fromInstance"]) == (
            "keeper",
            uid,
            held["instance"],
        )
        assert seat["generation"] == held["generation"] + 1
        # after_s = 3 is shorter than the lease's TTL: only the kill margin is left to wait.
        assert 1.0 <= seat["waitedS"] < 5.0, seat

        [row] = [r for r in b.ps() if r["name"] == "keeper"]
        assert (row["name"], row["lifecycleUid"], row["sessionId"]) == (
            "keeper",
            uid,
            keeper["sessionId"],
        )
        assert processes_mentioning(uid) == [row["pid"]]
        # Its tree as at its last finished turn: the incremental standing checkpoint's commit on
        # top of its base's history.
        there = Path(row["cwd"])
        assert there.is_relative_to(b.root)
        assert git(there, "log", "--format=%s").decode().split("\n")[:3] == [
            "late work",
            "history",
            "k",
        ]
        assert (there / "late.txt").read_text() == "the last turn's work\n"
        now = _fleet_row(b, "keeper")
        assert (now["instance"], now["generation"], now["state"]) == (
            b.json("status")["instanceId"],
            held["generation"] + 1,
            "running",
        ), now
        # The outage's message was answered there (the newer phrase wins), and only once.
        assert ask(b, "keeper", "What was the phrase?") == f"The phrase is {LATER}, from teller."
        # Acknowledged before the death (the first phrase): never delivered again. In flight:
        # redelivered once, as its second delivery.
        received = _received(b)
        assert [e["delivery"] for e in received if e["id"] == slow] == [2], received
        assert len(received) == 3, received

        # Taken already: the old holder is no longer whom custody names.
        again = b.run("takeover", "keeper", "--from", held["instance"], "--json", check=False)
        refused(again, "standing-stale")

        # The old host, back, never runs the seat again: its custody moved on.
        a.run("up", "--detach", "--server", b_.url, "--creds", b_.creds)
        await wait_until(lambda: processes_mentioning(uid) == [row["pid"]], timeout=30)
        # ... and forgets it, for its new holder runs it: nothing here could start it again.
        await wait_until(lambda: a.ps() == [], timeout=30)
        assert not list((a.root / ".cotal" / "sessions").rglob(f"*{uid}*"))
        assert not list((a.root / ".cotal" / "seats").glob(f"*{uid}*"))
        forgotten = [
            e
            for e in map(json.loads, (a.root / ".cotal/logs/manager.log").read_text().splitlines())
            if e.get("event") == "seat.forgotten"
        ]
        assert [(e["seat"], e["holder_now"]) for e in forgotten] == [("keeper", now["instance"])]
        assert ask(b, "keeper", "What was the phrase?") == f"The phrase is {LATER}, from teller."


async def test_a_seat_without_failover_has_no_standing_checkpoint_to_take(
    tmp_path: Path, shared_broker: SharedBroker
) -> None:
    b_ = shared_broker
    a = _root(tmp_path / "a", b_)
    b = _root(tmp_path / "b", b_)
    with _downed(a, b):
        a.json("spawn", "plain", "--agent", "scribe", "--cwd", str(_seat_repo(a, "p")))
        assert ask(a, "plain", "Remember the phrase wren-39.") == "Noted: wren-39."
        _kill_tree(a)
        await wait_until(lambda: not _fleet_row(b, "plain")["managerLive"], timeout=30)
        out = b.run("takeover", "plain", "--json", check=False)
        assert "has no standing checkpoint at the broker" in refused(out, "no-standing-checkpoint")
        assert b.ps() == []


async def test_two_standbys_take_a_dead_hosts_seats_each_exactly_once(
    tmp_path: Path, shared_broker: SharedBroker
) -> None:
    """A host with four failover seats dies; two standbys see it. Each seat runs on exactly one
    of them afterwards, at generation + 1, answering from its own session; and an operator's
    takeover of a seat a standby took is refused."""
    b_ = shared_broker
    a = _root(tmp_path / "a", b_, "[failover]\nenabled = true\nafter_s = 2\n")
    standbys = [_root(tmp_path / name, b_, "[failover]\nstandby = true\n") for name in ("s1", "s2")]
    with _downed(a, *standbys):
        seats = {}
        for i in range(4):
            name = f"w{i}"
            seats[name] = a.json("spawn", name, "--agent", "scribe")
            assert ask(a, name, f"Remember the phrase p{i}-39.") == f"Noted: p{i}-39."
        for s in standbys:
            s.run("trust", "add", signer_key(a.root), "--name", "host-a")
        before = {name: _fleet_row(standbys[0], name) for name in seats}
        _kill_tree(a)

        def all_taken() -> bool:
            # A row appears while its seat is still starting (no session reported yet): wait
            # for every seat to run, not merely to be listed.
            rows = [r for s in standbys for r in s.ps()]
            return len(rows) == len(seats) and all(r["state"] == "running" for r in rows)

        await wait_until(all_taken, timeout=90, every=0.5)
        where = {r["name"]: (s, r) for s in standbys for r in s.ps()}
        assert sorted(where) == sorted(seats)
        for name, spawned in seats.items():
            holder, row = where[name]
            assert row["lifecycleUid"] == spawned["lifecycleUid"]
            assert row["sessionId"] == spawned["sessionId"]
            assert processes_mentioning(spawned["lifecycleUid"]) == [row["pid"]]
            now = _fleet_row(holder, name)
            assert now["generation"] == before[name]["generation"] + 1
            assert now["instance"] == holder.json("status")["instanceId"]
            phrase = f"p{name[1:]}-39"
            assert ask(holder, name, "What was the phrase?") == f"The phrase is {phrase}."
        # The operator is too late: the standby has it, and says so.
        holder, _ = where["w0"]
        other = standbys[1] if holder is standbys[0] else standbys[0]
        late = other.run("takeover", "w0", "--json", check=False)
        assert "still renews its lease" in refused(late, "holder-alive")


async def test_two_operators_taking_one_seat_at_once_make_one_holder(
    tmp_path: Path, shared_broker: SharedBroker
) -> None:
    """`cotal takeover` of one lost seat on two managers at the same moment: the custody claim's
    compare-and-set lets exactly one run it; the other is refused by name, claimed nothing,
    and can still take another seat over afterwards."""
    b_ = shared_broker
    a = _root(tmp_path / "a", b_, "[failover]\nenabled = true\nafter_s = 2\n")
    rivals = [_root(tmp_path / name, b_) for name in ("r1", "r2")]
    with _downed(a, *rivals):
        spawned = {n: a.json("spawn", n, "--agent", "scribe") for n in ("contested", "spare")}
        for n in spawned:
            assert ask(a, n, f"Remember the phrase {n}-39.") == f"Noted: {n}-39."
        for r in rivals:
            r.run("trust", "add", signer_key(a.root), "--name", "host-a")
        _kill_tree(a)
        await wait_until(lambda: not _fleet_row(rivals[0], "contested")["managerLive"], 30)

        outs: dict[int, Any] = {}

        async def take(i: int) -> None:
            outs[i] = await anyio.to_thread.run_sync(
                lambda: rivals[i].run("takeover", "contested", "--json", check=False)
            )

        async with anyio.create_task_group() as tg:
            for i in range(2):
                tg.start_soon(take, i)
        won = [i for i, out in outs.items() if out.returncode == 0]
        assert len(won) == 1, {i: (o.stdout, o.stderr) for i, o in outs.items()}
        loser = 1 - won[0]
        code = json.loads(outs[loser].stderr.strip().splitlines()[-1])["code"]
        assert code in ("custody-lost", "standing-stale", "generation-behind"), outs[loser].stderr
        uid = spawned["contested"]["lifecycleUid"]
        [pid] = [r["pid"] for r in rivals[won[0]].ps() if r["name"] == "contested"]
        assert processes_mentioning(uid) == [pid]
        assert [r["name"] for r in rivals[loser].ps()] == []
        # The loser withdrew cleanly: it takes the other lost seat.
        rivals[loser].json("takeover", "spare")
        assert ask(rivals[loser], "spare", "What was the phrase?") == "The phrase is spare-39."


@pytest.mark.killpoints
@pytest.mark.parametrize("point", ["resume.after-custody-claim", "resume.after-trees-restored"])
async def test_a_takeover_whose_manager_died_is_finished_by_a_rerun(
    tmp_path: Path, shared_broker: SharedBroker, point: str
) -> None:
    """The taking manager SIGKILLed past its custody claim: the same `cotal takeover` again, once
    its manager is back, finishes the takeover: the seat runs there once, in its session."""
    b_ = shared_broker
    a = _root(tmp_path / "a", b_, "[failover]\nenabled = true\nafter_s = 2\n")
    b = Cli(tmp_path / "b")
    with _downed(a, b):
        keeper = a.json("spawn", "keeper", "--agent", "scribe", "--cwd", str(_seat_repo(a, "k")))
        assert ask(a, "keeper", f"Remember the phrase {PHRASE}.") == f"Noted: {PHRASE}."
        # A second turn: its standing checkpoint builds on the first one's base.
        assert ask(a, "keeper", "What was the phrase?") == f"The phrase is {PHRASE}."
        init_repo(b.root)
        write(b.root / "README.md", "# b\n")
        git(b.root, "add", "-A")
        git(b.root, "commit", "-q", "-m", "first")
        server = ("--server", b_.url, "--creds", b_.creds)
        b.run("up", "--detach", *server, env={"COTAL_FAILPOINT": point})
        dying = int(b.json("status")["pid"])
        b.run("trust", "add", signer_key(a.root), "--name", "host-a")
        _kill_tree(a)
        await wait_until(lambda: not _fleet_row(b, "keeper")["managerLive"], timeout=30)
        died = b.run("takeover", "keeper", "--json", check=False)
        assert died.returncode != 0 and "Traceback" not in died.stderr, died.stderr
        # Its maintenance lock is reaped once its pid is gone; this machine's init reaps an
        # orphan's zombie late, and a zombie still owns its pid (manager/workspace/lock.py).
        await wait_until(lambda: not Path(f"/proc/{dying}").exists(), timeout=60, every=0.2)

        b.run("up", "--detach", *server)
        done = b.run("takeover", "keeper", "--json", check=False)
        assert done.returncode == 0, (done.stdout, done.stderr)
        await wait_until(
            lambda: [r["state"] for r in b.ps() if r["name"] == "keeper"] == ["running"], 30
        )
        [row] = [r for r in b.ps() if r["name"] == "keeper"]
        assert (row["lifecycleUid"], row["sessionId"]) == (
            keeper["lifecycleUid"],
            keeper["sessionId"],
        )
        assert processes_mentioning(keeper["lifecycleUid"]) == [row["pid"]]
        assert ask(b, "keeper", "What was the phrase?") == f"The phrase is {PHRASE}."
        # Nothing fetched is left behind: the standing checkpoint and the base it built on.
        incoming = Layout.at(b.root).incoming
        assert not incoming.exists() or list(incoming.iterdir()) == []


async def test_a_frozen_host_taken_over_kills_its_seat_when_it_wakes(
    tmp_path: Path, shared_broker: SharedBroker
) -> None:
    """Host A's manager and seat stopped (SIGSTOP) far longer than `after_s`: a standby takes
    the seat over meanwhile. Resumed (SIGCONT), A's manager sees the gap at once, kills its copy
    and never runs it again: within `after_s` of waking only the standby's process carries
    the uid, and A keeps nothing of it running."""
    b_ = shared_broker
    a = _root(tmp_path / "a", b_, "[failover]\nenabled = true\nafter_s = 2\n")
    s = _root(tmp_path / "s", b_, "[failover]\nstandby = true\n")
    with _downed(a, s):
        keeper = a.json("spawn", "keeper", "--agent", "scribe", "--cwd", str(_seat_repo(a, "k")))
        uid = keeper["lifecycleUid"]
        assert ask(a, "keeper", f"Remember the phrase {PHRASE}.") == f"Noted: {PHRASE}."
        s.run("trust", "add", signer_key(a.root), "--name", "host-a")
        frozen = [int(a.json("status")["pid"]), int(keeper["pid"])]
        for pid in frozen:
            os.kill(pid, signal.SIGSTOP)
        try:
            await wait_until(
                lambda: [r["state"] for r in s.ps() if r["name"] == "keeper"] == ["running"],
                timeout=90,
                every=0.5,
            )
        finally:
            for pid in frozen:
                os.kill(pid, signal.SIGCONT)
        woke = time.monotonic()
        [taken] = [r for r in s.ps() if r["name"] == "keeper"]
        await wait_until(lambda: processes_mentioning(uid) == [taken["pid"]], timeout=2.0 + 3.0)
        assert time.monotonic() - woke < 2.0 + 3.0
        assert [r["state"] for r in a.ps() if r["name"] == "keeper"] in (
            [],
            ["stopped"],
            ["evicted"],
            ["failed"],
        ), a.ps()
        assert ask(s, "keeper", "What was the phrase?") == f"The phrase is {PHRASE}."
        # A never runs it again.
        await anyio.lowlevel.checkpoint()
        assert processes_mentioning(uid) == [taken["pid"]]


def _logged(cli: Cli, event: str, seat: str) -> list[str]:
    """When the root's manager logged `event` for `seat`, in order (ISO instants, one clock)."""
    log = (cli.root / ".cotal" / "logs" / "manager.log").read_text().splitlines()
    return [
        e["timestamp"]
        for e in map(json.loads, log)
        if e.get("event") == event and e.get("seat") == seat
    ]


async def test_a_partitioned_host_kills_its_seat_before_the_standby_runs_it(
    tmp_path: Path, shared_broker: SharedBroker
) -> None:
    """Host A reaches the broker through a link that is then cut (tests/partition.py): A keeps
    running but hears nothing. Its manager kills its failover seat `after_s` after its last
    renewal; the standby, which still reaches the broker, claims the seat only after that kill.
    Once the link heals, A reconnects, finds the custody moved, and runs nothing."""
    b_ = shared_broker
    with relay_to(int(b_.url.rsplit(":", 1)[1])) as link:
        a = _root(tmp_path / "a", b_, "[failover]\nenabled = true\nafter_s = 3\n", url=link.url)
        s = _root(tmp_path / "s", b_, "[failover]\nstandby = true\n")
        with _downed(a, s):
            keeper = a.json(
                "spawn", "keeper", "--agent", "scribe", "--cwd", str(_seat_repo(a, "k"))
            )
            uid = keeper["lifecycleUid"]
            assert ask(a, "keeper", f"Remember the phrase {PHRASE}.") == f"Noted: {PHRASE}."
            s.run("trust", "add", signer_key(a.root), "--name", "host-a")

            link.cut()
            await wait_until(
                lambda: [r["state"] for r in s.ps() if r["name"] == "keeper"] == ["running"],
                timeout=90,
                every=0.5,
            )
            [killed] = _logged(a, "failover.seat_killed", "keeper")
            [claimed] = _logged(s, "custody.claimed", "keeper")
            assert killed < claimed, (killed, claimed)
            [row] = [r for r in s.ps() if r["name"] == "keeper"]
            assert processes_mentioning(uid) == [row["pid"]]
            assert ask(s, "keeper", "What was the phrase?") == f"The phrase is {PHRASE}."

            link.heal()

            def settled() -> bool:
                # Reconnected, A learns the custody moved: its fence's lift re-reads it
                # (`failover.custody_lost`) or its custody watch fires first (`custody.evicted`).
                return any(
                    _logged(a, event, "keeper")
                    for event in ("failover.custody_lost", "custody.evicted")
                )

            await wait_until(settled, timeout=60)
            states = [r["state"] for r in a.ps() if r["name"] == "keeper"]
            assert states in ([], ["stopped"], ["evicted"]), states
            assert processes_mentioning(uid) == [row["pid"]]


@pytest.mark.pi
@pytest.mark.skipif(not PI_CLI.is_file(), reason="pi is not installed (make harnesses)")
async def test_a_host_in_its_own_network_namespace_cut_off_never_writes_after_the_standby(
    tmp_path: Path, shared_broker: SharedBroker
) -> None:
    """Host A is a network namespace (tests/netns.py): its manager and its real pi seat reach
    the broker and the fake model only over one veth link, and the link then goes down at
    A's far end. The model server logs the address of every request: no request from A's
    namespace comes after the standby's first, A's manager killed its seat before the standby
    claimed it, and once the link is back A runs nothing and asks the model nothing."""
    broker_port = int(shared_broker.url.rsplit(":", 1)[1])
    with (
        host_namespace() as ns,
        relay_to(broker_port, listen=ns.outer) as link,
        contextlib.contextmanager(start_fake_server)(
            REPO / "tests" / "fixtures" / "fake_openai.py",
            tmp_path / "openai-requests.jsonl",
            host=ns.outer,
        ) as model,
    ):
        pi = f'[agents.pi]\nbase_url = "{model.base_url}"\nmodel = "fake-model"\n'
        a_root = tmp_path / "a"
        init_repo(a_root)
        write(a_root / "README.md", "# takeover\n")
        git(a_root, "add", "-A")
        git(a_root, "commit", "-q", "-m", "first")
        (a_root / "cotal.toml").write_text("[failover]\nenabled = true\nafter_s = 3\n" + pi)
        a = Cli(a_root)
        # A's manager starts inside the namespace; its seats are its children, so they are too.
        up = ns.run(
            [sys.executable, "-m", "manager.cli", "up", "--detach", "--root", str(a_root)]
            + ["--server", link.url, "--creds", shared_broker.creds],
            env=cotal_env(),
            cwd=a_root,
        )
        assert up.returncode == 0, up.stderr
        s = _root(tmp_path / "s", shared_broker, "[failover]\nstandby = true\n" + pi)
        with _downed(a, s):
            seat = a.json(
                "spawn", "h", "--agent", "pi", "--cwd", str(_seat_repo(a, "h")),
                "--prompt", f"Remember the phrase {PHRASE}.",
            )  # fmt: skip
            assert ask(a, "h", "What was the phrase?") == f"The phrase is {PHRASE}."
            assert set(model.peers()) == {ns.inner}, model.peers()
            s.run("trust", "add", signer_key(a.root), "--name", "host-a")
            asked_by_a = len(model.peers())

            ns.cut()
            await wait_until(
                lambda: [r["state"] for r in s.ps() if r["name"] == "h"] == ["running"],
                timeout=120,
                every=0.5,
            )
            [killed] = _logged(a, "failover.seat_killed", "h")
            [claimed] = _logged(s, "custody.claimed", "h")
            assert killed < claimed, (killed, claimed)
            [row] = [r for r in s.ps() if r["name"] == "h"]
            assert (row["lifecycleUid"], row["sessionId"]) == (
                seat["lifecycleUid"],
                seat["sessionId"],
            )
            assert ask(s, "h", "What was the phrase again?") == f"The phrase is {PHRASE}."
            peers = model.peers()
            assert peers[:asked_by_a] == [ns.inner] * asked_by_a
            assert set(peers[asked_by_a:]) == {ns.outer}, peers

            ns.heal()
            await wait_until(
                lambda: any(
                    _logged(a, event, "h") for event in ("failover.custody_lost", "custody.evicted")
                ),
                timeout=60,
            )
            assert [r["state"] for r in a.ps() if r["name"] == "h"] in (
                [],
                ["stopped"],
                ["evicted"],
            )
            assert row["pid"] in processes_mentioning(seat["lifecycleUid"])
            # A's manager runs on; nothing of A's seat does (its processes name A's tree).
            assert processes_mentioning(f"{a.root}/") == []
            assert model.peers().count(ns.inner) == asked_by_a
