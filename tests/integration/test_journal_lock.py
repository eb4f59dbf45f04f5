"""Maintenance state on disk: journal, resume document, lock and writer generation, with real
files and real competing processes."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from manager.workspace.generation import (
    claim_successor,
    current_generation,
    generation_dir,
    withdraw_claim,
)
from manager.workspace.journal import (
    Journal,
    read_resume_document,
    resume_path,
    write_resume_document,
)
from manager.workspace.layout import Layout
from manager.workspace.lock import LockRecord, MaintenanceLock, boot_id, process_start_time
from protocol.codec import encode_json
from protocol.errors import Refusal
from protocol.inventory import INVENTORY_V2, Inventory, parse_resume_args
from protocol.maintenance import Degraded, IllegalTransition

REPO = Path(__file__).resolve().parents[2]
UID = "a" * 26
INSTANCE = "b" * 26
DIGEST = "0" * 64


def make_inventory(attempt: str = "cut-1", model: str = "m-1") -> Inventory:
    doc: dict[str, Any] = {
        "version": INVENTORY_V2,
        "space": "main",
        "attemptId": attempt,
        "instanceId": INSTANCE,
        "createdAt": "2025-01-01T00:00:01Z",
        "agents": [
            {
                "name": "w",
                "space": "main",
                "identity": {"mode": "open", "lifecycleUid": UID, "owner": "local"},
                "launch": {
                    "connector": "scribe",
                    "cwd": "/srv/repo",
                    "model": model,
                    "unresolvedLaunchOptionKeys": [],
                    "profileSha256": DIGEST,
                    "sessionStores": [],
                },
                "dependencies": [],
                "generation": 0,
                "startedAt": "2025-01-01T00:00:00Z",
            }
        ],
    }
    return parse_resume_args(attempt, json.dumps(doc).encode())


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    return Layout.at(tmp_path)


# -- resume document ------------------------------------------------------------------------------


def test_resume_document_round_trip(layout: Layout) -> None:
    inv = make_inventory()
    desc = write_resume_document(layout, inv)
    path = resume_path(layout)
    assert (desc.file, desc.bytes, desc.version) == (
        "resume.json",
        path.stat().st_size,
        INVENTORY_V2,
    )
    assert path.stat().st_mode & 0o777 == 0o600
    assert layout.maintenance.stat().st_mode & 0o777 == 0o700
    assert read_resume_document(layout, desc) == inv


def test_resume_document_tampered_byte_refused(layout: Layout) -> None:
    desc = write_resume_document(layout, make_inventory())
    path = resume_path(layout)
    data = bytearray(path.read_bytes())
    i = data.index(b"m-1")
    data[i : i + 3] = b"m-2"  # same size, different content
    path.write_bytes(bytes(data))
    with pytest.raises(Refusal, match="hashes to") as info:
        read_resume_document(layout, desc)
    assert info.value.code == "resume-mismatch"
    path.write_bytes(bytes(data) + b" ")
    with pytest.raises(Refusal, match="larger than"):
        read_resume_document(layout, desc)


def test_resume_document_mode_0644_refused(layout: Layout) -> None:
    desc = write_resume_document(layout, make_inventory())
    os.chmod(resume_path(layout), 0o644)
    with pytest.raises(Refusal, match="0644") as info:
        read_resume_document(layout, desc)
    assert "chmod 600" in info.value.cure
    os.chmod(resume_path(layout), 0o400)  # private but not what we write: refused too
    with pytest.raises(Refusal, match="0400"):
        read_resume_document(layout, desc)


def test_resume_document_symlink_refused(layout: Layout, tmp_path: Path) -> None:
    desc = write_resume_document(layout, make_inventory())
    path = resume_path(layout)
    real = tmp_path / "elsewhere.json"
    os.rename(path, real)
    os.symlink(real, path)
    with pytest.raises(Refusal, match="symlink"):
        read_resume_document(layout, desc)


def test_resume_document_missing_refused(layout: Layout) -> None:
    desc = write_resume_document(layout, make_inventory())
    resume_path(layout).unlink()
    with pytest.raises(Refusal, match="does not exist"):
        read_resume_document(layout, desc)


def test_journal_pins_its_resume_document(layout: Layout) -> None:
    desc = write_resume_document(layout, make_inventory())
    Journal(layout).advance("cut-1", "cut-intent", resume=desc)
    assert write_resume_document(layout, make_inventory()) == desc  # a byte-identical retry
    with pytest.raises(Refusal, match="names a different resume document"):
        write_resume_document(layout, make_inventory(model="m-9"))
    assert read_resume_document(layout, desc).agents[0].launch.model == "m-1"


# -- journal --------------------------------------------------------------------------------------


def run_cut_and_resume(journal: Journal, desc: Any) -> list[int]:
    revisions = [
        journal.advance("cut-1", "cut-intent", resume=desc).revision,
        journal.advance("cut-1", "cut-committed").revision,
        journal.advance(
            "cut-1", "ready", checkpoint_dir="/r/.cotal/maintenance/v1/checkpoints/cut-1"
        ).revision,
        journal.advance("resume-1", "resume-intent").revision,
        journal.advance("resume-1", "resume-active").revision,
        journal.advance("resume-1", "resume-committed", durable_commit_token="c" * 64).revision,
        journal.advance("resume-1", "retired").revision,
    ]
    return revisions


def test_journal_revisions_monotonic_and_persisted(layout: Layout) -> None:
    desc = write_resume_document(layout, make_inventory())
    journal = Journal(layout)
    assert journal.load() is None
    assert run_cut_and_resume(journal, desc) == [1, 2, 3, 4, 5, 6, 7]
    record = Journal(layout).load()  # a fresh reader sees what was fsync'd
    assert record is not None
    assert (record.state, record.revision, record.attempt_id, record.kind) == (
        "retired",
        7,
        "resume-1",
        "resume",
    )
    assert record.checkpoint_dir == "/r/.cotal/maintenance/v1/checkpoints/cut-1"
    assert journal.path.stat().st_mode & 0o777 == 0o600
    journal.discard("resume-1")
    assert journal.load() is None
    assert resume_path(layout).exists()  # evidence for a rollback stays


def test_rerun_after_crash_continues(layout: Layout) -> None:
    desc = write_resume_document(layout, make_inventory())
    Journal(layout).advance("cut-1", "cut-intent", resume=desc)
    Journal(layout).advance("cut-1", "cut-committed")
    # The coordinator crashed after recording the commit and runs the same step again.
    again = Journal(layout).advance("cut-1", "cut-committed")
    assert (again.state, again.revision) == ("cut-committed", 2)
    assert Journal(layout).advance("cut-1", "ready").revision == 3


def test_temp_file_left_behind_is_ignored(layout: Layout) -> None:
    desc = write_resume_document(layout, make_inventory())
    journal = Journal(layout)
    journal.advance("cut-1", "cut-intent", resume=desc)
    # What a crash between create and rename of an atomic write leaves: a torn temp file.
    leftover = layout.maintenance / ".journal.json.0123456789ab.tmp"
    leftover.write_bytes(b'{"version":1,"revis')
    record = journal.load()
    assert record is not None and record.state == "cut-intent"
    assert journal.advance("cut-1", "cut-committed").revision == 2


@pytest.mark.parametrize(
    "content",
    [b'{"version":1,"revision":3,"attemptId":"cut-1","ki', b"", b"[]", b'{"version":2}'],
)
def test_torn_or_malformed_journal_refuses_loudly(layout: Layout, content: bytes) -> None:
    desc = write_resume_document(layout, make_inventory())
    journal = Journal(layout)
    journal.advance("cut-1", "cut-intent", resume=desc)
    journal.path.write_bytes(content)
    with pytest.raises(Refusal) as info:
        journal.load()
    assert info.value.code == "journal-malformed"
    assert str(journal.path) in info.value.message
    assert "never resets" in info.value.cure and ".broken" in info.value.cure
    with pytest.raises(Refusal):
        journal.advance("cut-1", "cut-committed")
    assert journal.path.read_bytes() == content  # never silently reset


def test_journal_not_private_refused(layout: Layout) -> None:
    desc = write_resume_document(layout, make_inventory())
    journal = Journal(layout)
    journal.advance("cut-1", "cut-intent", resume=desc)
    os.chmod(journal.path, 0o644)
    with pytest.raises(Refusal, match="not private"):
        journal.load()


def test_advance_reproves_the_resume_document(layout: Layout) -> None:
    desc = write_resume_document(layout, make_inventory())
    journal = Journal(layout)
    journal.advance("cut-1", "cut-intent", resume=desc)
    resume_path(layout).write_bytes(b"x" * desc.bytes)
    with pytest.raises(Refusal, match="hashes to"):
        journal.advance("cut-1", "cut-committed")
    record = journal.load()
    assert record is not None and record.state == "cut-intent"
    # Degrading is how that gets reported, and it is always writable.
    degraded = journal.advance(
        "cut-1",
        "degraded",
        degraded=Degraded(reason="resume.json damaged", recourse="restore it from the cut's copy"),
    )
    assert degraded.state == "degraded" and degraded.revision == 2


def test_illegal_advance_and_discard(layout: Layout) -> None:
    desc = write_resume_document(layout, make_inventory())
    journal = Journal(layout)
    with pytest.raises(
        IllegalTransition, match='state "absent" does not allow event "complete-cut"'
    ):
        journal.advance("cut-1", "ready", resume=desc)
    journal.advance("cut-1", "cut-intent", resume=desc)
    journal.advance("cut-1", "cut-committed")
    with pytest.raises(
        IllegalTransition, match='state "cut-committed" does not allow event "discard"'
    ):
        journal.discard("cut-1")
    with pytest.raises(Refusal, match="belongs to attempt cut-1"):
        journal.advance("other", "ready")


# -- lock -----------------------------------------------------------------------------------------

CHILD_PRELUDE = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    root, go = Path(sys.argv[1]), Path(sys.argv[2])
    sys.stdout.write("ready\\n"); sys.stdout.flush()
    while not go.exists():
        time.sleep(0.002)
    from manager.workspace.layout import Layout
    from protocol.errors import Refusal
    layout = Layout.at(root)
    """
)

LOCK_CHILD = CHILD_PRELUDE + textwrap.dedent(
    """
    from manager.workspace.lock import MaintenanceLock
    lock = MaintenanceLock(layout, "attempt-" + sys.argv[3])
    try:
        lock.acquire()
    except Refusal as exc:
        print("refused", exc.code, flush=True)
        sys.exit(0)
    print("won", flush=True)
    release = Path(sys.argv[4])
    while not release.exists():
        time.sleep(0.01)
    lock.release()
    """
)

GENERATION_CHILD = CHILD_PRELUDE + textwrap.dedent(
    """
    from manager.workspace.generation import claim_successor
    i = int(sys.argv[3])
    try:
        n = claim_successor(layout, "main", "w", "a" * 26, 0, f"{i:026d}", f"attempt-{i}")
    except Refusal as exc:
        print("refused", exc.code, flush=True)
    else:
        print("won", n, flush=True)
    """
)


def race(
    script: str, root: Path, n: int, extra: list[str] | None = None
) -> list[subprocess.Popen[str]]:
    """Start `n` interpreters, wait until all are up, then release them at once."""
    go = root / "go"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, str(root), str(go), str(i), *(extra or [])],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
            cwd=REPO,
        )
        for i in range(n)
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline() == "ready\n"
    go.touch()
    return procs


@pytest.mark.parametrize("stale_first", [False, True])
def test_concurrent_lock_acquire_exactly_one_wins(tmp_path: Path, stale_first: bool) -> None:
    root = tmp_path / "root"
    root.mkdir()
    release = tmp_path / "release"
    if stale_first:
        # Every contender finds a dead owner's lock: reaping must still yield one winner.
        write_lock(Layout.at(root), pid=dead_pid(), start_time=12345)
    procs = race(LOCK_CHILD, root, 8, [str(release)])
    outcomes: dict[str, list[subprocess.Popen[str]]] = {"won": [], "refused": []}
    deadline = time.monotonic() + 60
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline().split()
        assert time.monotonic() < deadline
        outcomes[line[0]].append(p)
        if line[0] == "refused":
            assert line[1] == "lock-held"
    assert len(outcomes["won"]) == 1, outcomes
    assert len(outcomes["refused"]) == 7
    release.touch()
    for p in procs:
        assert p.wait(timeout=30) == 0
    assert not (Layout.at(root).maintenance / "lock").exists()


def write_lock(layout: Layout, **override: Any) -> None:
    pid = os.getpid()
    start = process_start_time(pid)
    assert start is not None
    fields: dict[str, Any] = {
        "pid": pid,
        "start_time": start,
        "boot_id": boot_id(),
        "host": socket.gethostname(),
        "attempt_id": "old-attempt",
        "created_at": "2025-01-01T00:00:00Z",
    }
    fields.update(override)
    layout.maintenance.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = layout.maintenance / "lock"
    path.write_bytes(encode_json(LockRecord(**fields)))
    os.chmod(path, 0o600)


def dead_pid() -> int:
    p = subprocess.Popen(["true"])
    p.wait()
    return p.pid


@pytest.mark.parametrize(
    "stale",
    [
        {"pid": "dead"},
        {"start_time": 1},  # our own pid, but not the process that took the lock
        {"boot_id": "00000000-0000-0000-0000-000000000000"},
    ],
)
def test_stale_lock_reaped(layout: Layout, stale: dict[str, Any]) -> None:
    if stale.get("pid") == "dead":
        stale = {"pid": dead_pid(), "start_time": 12345}
    write_lock(layout, **stale)
    with MaintenanceLock(layout, "new-attempt") as lock:
        assert lock.held
        record = json.loads((layout.maintenance / "lock").read_bytes())
        assert (record["pid"], record["attemptId"]) == (os.getpid(), "new-attempt")
        lock.verify()
    assert not (layout.maintenance / "lock").exists()


def test_live_owner_refused(layout: Layout) -> None:
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        start = process_start_time(sleeper.pid)
        assert start is not None
        write_lock(layout, pid=sleeper.pid, start_time=start, attempt_id="busy-attempt")
        with pytest.raises(Refusal) as info:
            MaintenanceLock(layout, "new-attempt").acquire()
        assert info.value.code == "lock-held"
        assert f"pid {sleeper.pid}" in info.value.message and "busy-attempt" in info.value.message
        assert (layout.maintenance / "lock").exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    # Once provably gone, the same lock is reaped.
    with MaintenanceLock(layout, "new-attempt"):
        pass


def test_other_host_is_not_judged(layout: Layout) -> None:
    write_lock(layout, host="some-other-host", boot_id="other-boot")
    with pytest.raises(Refusal, match="some-other-host"):
        MaintenanceLock(layout, "new-attempt").acquire()


def test_release_removes_only_our_own_lock(layout: Layout) -> None:
    lock = MaintenanceLock(layout, "mine")
    lock.acquire()
    write_lock(layout, attempt_id="someone-else")  # replaced behind our back
    with pytest.raises(Refusal) as info:
        lock.verify()
    assert info.value.code == "lock-lost"
    lock.release()
    assert json.loads((layout.maintenance / "lock").read_bytes())["attemptId"] == "someone-else"


def test_malformed_lock_refuses(layout: Layout) -> None:
    layout.maintenance.mkdir(parents=True, mode=0o700)
    (layout.maintenance / "lock").write_bytes(b"{garbage")
    with pytest.raises(Refusal) as info:
        MaintenanceLock(layout, "x").acquire()
    assert info.value.code == "lock-malformed"


# -- writer generation ----------------------------------------------------------------------------


def test_sixteen_concurrent_claims_exactly_one_wins(tmp_path: Path) -> None:
    procs = race(GENERATION_CHILD, tmp_path, 16)
    results = []
    for p in procs:
        out, _ = p.communicate(timeout=60)
        assert p.returncode == 0
        results.append(out.split())
    winners = [r for r in results if r[0] == "won"]
    assert winners == [["won", "1"]]
    assert sorted(r[1] for r in results if r[0] == "refused") == ["custody-lost"] * 15
    assert current_generation(Layout.at(tmp_path), "main", "w", UID) == 1


def test_claim_idempotent_for_same_holder_and_attempt(layout: Layout) -> None:
    assert current_generation(layout, "main", "w", UID) == 0
    assert claim_successor(layout, "main", "w", UID, 0, INSTANCE, "resume-1") == 1
    assert claim_successor(layout, "main", "w", UID, 0, INSTANCE, "resume-1") == 1
    with pytest.raises(Refusal) as info:
        claim_successor(layout, "main", "w", UID, 0, INSTANCE, "resume-2")
    assert info.value.code == "custody-lost" and "resume-1" in info.value.message
    with pytest.raises(
        Refusal, match="already records generation 1, claimed by instance " + INSTANCE
    ):
        claim_successor(layout, "main", "w", UID, 0, "c" * 26, "resume-1")
    # A later checkpoint, cut at generation 1, advances custody.
    assert claim_successor(layout, "main", "w", UID, 1, INSTANCE, "resume-3") == 2
    # A checkpoint from a root that was further along claims past the gap.
    assert claim_successor(layout, "main", "w", UID, 5, INSTANCE, "resume-4") == 6
    assert current_generation(layout, "main", "w", UID) == 6
    directory = generation_dir(layout, "main", "w", UID)
    assert sorted(os.listdir(directory)) == ["1", "2", "6"]
    assert all((directory / n).stat().st_mode & 0o777 == 0o600 for n in os.listdir(directory))
    assert directory.stat().st_mode & 0o777 == 0o700


def test_withdraw_only_our_own_top_claim(layout: Layout) -> None:
    claim_successor(layout, "main", "w", UID, 0, INSTANCE, "resume-1")
    assert not withdraw_claim(layout, "main", "w", UID, 1, INSTANCE, "resume-other")
    assert withdraw_claim(layout, "main", "w", UID, 1, INSTANCE, "resume-1")
    assert current_generation(layout, "main", "w", UID) == 0


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("1", b"{not json"),
        (
            "1",
            b'{"seat":"w","lifecycleUid":"'
            + b"a" * 26
            + b'","generation":2,"holder":"'
            + b"b" * 26
            + b'","attemptId":"x","claimedAt":"t"}',
        ),
        (
            "1",
            b'{"seat":"other","lifecycleUid":"'
            + b"a" * 26
            + b'","generation":1,"holder":"'
            + b"b" * 26
            + b'","attemptId":"x","claimedAt":"t"}',
        ),
        ("01", b"{}"),
        ("notes.txt", b""),
    ],
)
def test_malformed_generation_refuses(layout: Layout, name: str, content: bytes) -> None:
    directory = layout.seat_generation_dir("main", "w")
    directory.mkdir(parents=True)
    path = directory / name
    path.write_bytes(content)
    os.chmod(path, 0o600)
    with pytest.raises(Refusal) as info:
        current_generation(layout, "main", "w", UID)
    assert info.value.code == "generation-malformed"
    assert str(path) in info.value.message
    assert "never re-minted" in info.value.cure
    with pytest.raises(Refusal):
        claim_successor(layout, "main", "w", UID, 0, INSTANCE, "resume-1")
    assert path.read_bytes() == content


def test_generation_symlink_refused(layout: Layout, tmp_path: Path) -> None:
    directory = layout.seat_generation_dir("main", "w")
    directory.mkdir(parents=True)
    (tmp_path / "target").write_bytes(b"{}")
    os.symlink(tmp_path / "target", directory / "3")
    with pytest.raises(Refusal, match="not a regular file"):
        current_generation(layout, "main", "w", UID)


def test_staging_temp_from_a_crash_is_ignored(layout: Layout) -> None:
    directory = layout.seat_generation_dir("main", "w")
    directory.mkdir(parents=True)
    (directory / ".1.0123abcd.tmp").write_bytes(b"{torn")
    assert current_generation(layout, "main", "w", UID) == 0
    assert claim_successor(layout, "main", "w", UID, 0, INSTANCE, "resume-1") == 1
