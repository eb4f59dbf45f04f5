"""Standing checkpoints (issue 39, items 1 and 2) through a real manager, broker and seat.

A root with `[failover] enabled`: each clean turn of its seat ends with the seat captured alive
at the turn boundary, sealed and signed, and put into the broker's object store under one name
per seat lifecycle, superseding the one before; the turn's message is acknowledged only after
that put. A root without failover stores nothing.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest
from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError

from manager.checkpoint.reader import verify_integrity
from protocol import names
from protocol.standing import decode_standing_meta
from tests.conftest import Cli
from tests.gitrepo import git, init_repo, write
from tests.helpers import ask, broker, pid_alive, ps_row, signer_key, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

SPACE = "standing"


def _workspace(cli: Cli, failover: bool) -> Path:
    proj = init_repo(cli.root / "proj")
    write(proj / "README.md", "# standing\n")
    # History worth building on: a base bundle far larger than one later commit's.
    noise = b"".join(hashlib.sha256(f"standing-{i}".encode()).digest() for i in range(2048))
    write(proj / "history.bin", noise)
    git(proj, "add", "-A")
    git(proj, "commit", "-q", "-m", "first")
    if failover:
        (cli.root / "cotal.toml").write_text("[failover]\nenabled = true\n")
    cli.run("up", "--detach", "--space", SPACE)
    cli.json("spawn", "keeper", "--agent", "scribe", "--cwd", str(proj))
    return proj


async def _standing(js: JetStreamContext, seat: str, uid: str, into: Path) -> tuple[Path, str]:
    """The seat's standing checkpoint, fetched and unpacked; its directory and the digest the
    store recorded for it."""
    store = await js.object_store(names.standing_bucket(SPACE))
    got = await store.get(names.standing_object(seat, uid))
    assert got.data is not None and got.info.digest is not None
    into.mkdir()
    with tarfile.open(fileobj=io.BytesIO(got.data)) as tar:
        tar.extractall(into, filter="data")
    [attempt] = list(into.iterdir())
    return attempt, got.info.digest


def _log_order(cli: Cli, seat: str) -> list[str]:
    """`standing.stored` and `delivery.acked` of the seat, in the order the manager logged them."""
    lines = (cli.root / ".cotal" / "logs" / "manager.log").read_text().splitlines()
    wanted = {"standing.stored", "delivery.acked"}
    events = [json.loads(line) for line in lines if '"standing.stored"' in line or "acked" in line]
    return [e["event"] for e in events if e.get("event") in wanted and e.get("seat") == seat]


async def test_each_turn_end_stores_a_sealed_standing_checkpoint_before_the_ack(
    cli: Cli, tmp_path: Path
) -> None:
    proj = _workspace(cli, failover=True)
    uid = ps_row(cli, "keeper")["lifecycleUid"]

    write(proj / "notes.txt", "written before turn one\n")
    assert ask(cli, "keeper", "Remember the phrase osprey-39.") == "Noted: osprey-39."
    async with broker(cli.root) as js:
        first, first_digest = await _standing(js, "keeper", uid, tmp_path / "one")
        [record] = verify_integrity(first, trusted_keys=[signer_key(cli.root)])
        assert record.standing == "turn-boundary"
        assert record.lifecycle_uid == uid and record.name == "keeper"
        assert "?? notes.txt" in record.repository.status.replace("\x00", "\n")
        assert record.session.continuity == "exact"
        # The first capture carries the history whole: it is the base the next ones build on.
        assert record.repository.since is None and record.repository.bundle is not None

        write(proj / "notes.txt", "changed before turn two\n")
        write(proj / "more.txt", "committed before turn two\n")
        git(proj, "add", "more.txt")
        git(proj, "commit", "-q", "-m", "second")
        assert ask(cli, "keeper", "What was the phrase?") == "The phrase is osprey-39."
        second, second_digest = await _standing(js, "keeper", uid, tmp_path / "two")
        [again] = verify_integrity(second, trusted_keys=[signer_key(cli.root)])
        assert second.name != first.name and second_digest != first_digest
        assert again.standing == "turn-boundary"
        # Incremental on the first: only the new commit travels in its bundle.
        assert again.repository.since is not None
        assert again.repository.since.attempt_id == first.name
        # One head per lifecycle (the second put superseded the first) and the base it needs,
        # put before it, named in its description.
        store = await js.object_store(names.standing_bucket(SPACE))
        head, base = names.standing_object("keeper", uid), names.standing_base_object("keeper", uid)
        assert sorted(o.name for o in await store.list()) == sorted([head, base])
        assert decode_standing_meta((await store.get_info(head)).description or "").base == (
            first.name
        )
        based = decode_standing_meta((await store.get_info(base)).description or "")
        assert (based.attempt_id, based.base) == (first.name, None)

    # Kept here too, the base and the newest, private.
    here = cli.root / ".cotal" / "maintenance" / "v1" / "standing" / "keeper"
    assert sorted(p.name for p in here.iterdir()) == sorted([first.name, second.name, "base.json"])
    assert here.stat().st_mode & 0o777 == 0o700
    # Acknowledged means stored: each ack of the seat's turns follows that turn's put.
    order = _log_order(cli, "keeper")
    assert order == ["standing.stored", "delivery.acked"] * 2, order
    out = cli.run("events", "--json", "--seat", "keeper", "--since", "1h", "--until", "now")
    types = [json.loads(line)["type"] for line in out.stdout.splitlines()]
    assert types.count("checkpoint.standing") == 2, types
    assert "checkpoint.standing_failed" not in types, types


async def test_a_root_without_failover_stores_no_standing_checkpoint(cli: Cli) -> None:
    _workspace(cli, failover=False)
    assert ask(cli, "keeper", "Remember the phrase plover-39.") == "Noted: plover-39."
    async with broker(cli.root) as js:
        with pytest.raises(BucketNotFoundError):
            await js.object_store(names.standing_bucket(SPACE))
    assert not (cli.root / ".cotal" / "maintenance" / "v1" / "standing").exists()


@pytest.mark.killpoints
@pytest.mark.parametrize("point", ["standing.after-seal", "standing.after-put"])
async def test_a_manager_killed_during_a_standing_checkpoint_redelivers_the_turn_once(
    cli: Cli, tmp_path: Path, point: str
) -> None:
    """The manager SIGKILLed between the seal and the put, or between the put and the ack: the
    turn's message was never acknowledged, so the next manager runs it again (its second
    delivery), stores a standing checkpoint of it and acknowledges it; what the dead try left
    here is swept, and one object stays at the broker."""
    proj = init_repo(cli.root / "proj")
    write(proj / "README.md", "# standing\n")
    git(proj, "add", "-A")
    git(proj, "commit", "-q", "-m", "first")
    (cli.root / "cotal.toml").write_text("[failover]\nenabled = true\n")
    cli.run("up", "--detach", "--space", SPACE, env={"COTAL_FAILPOINT": point})
    cli.json("spawn", "keeper", "--agent", "scribe", "--cwd", str(proj))
    uid = ps_row(cli, "keeper")["lifecycleUid"]
    manager = int(cli.json("status")["pid"])
    sent = cli.json("send", "keeper", "Remember the phrase shrike-39.")["id"]
    await wait_until(lambda: not pid_alive(manager), timeout=60)
    cli.run("up", "--detach", "--space", SPACE)

    def acked() -> bool:
        return any(
            e["event"] == "delivery.acked" and e.get("id") == sent
            for e in map(
                json.loads,
                (cli.root / ".cotal/logs/manager.log").read_text().splitlines(),
            )
        )

    await wait_until(acked, timeout=90, every=0.2)
    log = [json.loads(x) for x in (cli.root / ".cotal/logs/manager.log").read_text().splitlines()]
    deliveries = [
        e["delivery"] for e in log if e["event"] == "delivery.received" and e.get("id") == sent
    ]
    assert deliveries == [1, 2], deliveries
    assert ask(cli, "keeper", "What was the phrase?") == "The phrase is shrike-39."
    async with broker(cli.root) as js:
        store = await js.object_store(names.standing_bucket(SPACE))
        assert names.standing_object("keeper", uid) in [o.name for o in await store.list()]
        got, _ = await _standing(js, "keeper", uid, tmp_path / "after")
        [record] = verify_integrity(got, trusted_keys=[signer_key(cli.root)])
        assert record.standing == "turn-boundary"
        built_on = decode_standing_meta(
            (await store.get_info(names.standing_object("keeper", uid))).description or ""
        ).base
    here = cli.root / ".cotal" / "maintenance" / "v1" / "standing" / "keeper"
    # The stored head, the base it builds on (the redelivered turn's full capture) and the base
    # record; nothing of the killed try is left.
    kept = {got.name, "base.json", *([built_on] if built_on else [])}
    assert sorted(p.name for p in here.iterdir()) == sorted(kept)
