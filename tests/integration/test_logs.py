"""`cotal logs` driven as a subprocess: exact rendering of a written log, the seat filter with the
seat's harness stderr, `--since`, `--json`, following across a rotation, the size-capped
rotation of the daemon's own sink, and the transcript of a real scribe seat on a real broker."""

from __future__ import annotations

import json
import os
import pty
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import ByteReceiveStream

from manager import logs
from manager.cli.output import EX_OK, EX_REFUSED, EX_USAGE
from protocol.instant import format_instant
from tests.conftest import Cli, cotal_env

UID_OLD = "0ldu1d0ldu1d0ldu1d0ldu1d0ldu1d"
UID_NEW = "newu1dnewu1dnewu1dnewu1dnewu1d"
PHRASE = "juniper-ledger-41"

EVENTS: list[dict[str, Any]] = [
    {
        "event": "daemon.starting",
        "instance": "k4ixtj2qznrgb3h9z5oshtwnso",
        "level": "info",
        "pid": 6612,
        "root": "/srv/ws",
        "space": "main",
        "timestamp": "2026-12-01T13:00:00.125Z",
    },
    {
        "agent": "scribe",
        "event": "seat.spawned",
        "level": "info",
        "logger": "manager.daemon",
        "seat": "alice",
        "session": "s-1",
        "timestamp": "2026-12-01T13:00:01.500Z",
        "uid": UID_NEW,
    },
    {
        "detail": "no reply in 5 s",
        "event": "delivery.retained",
        "level": "warning",
        "seat": "bob",
        "status": "error",
        "timestamp": "2026-12-01T13:05:00.000Z",
        "tries": [1, 2],
    },
    {
        "event": "seat.exited",
        "exit": None,
        "level": "error",
        "seat": "alice",
        "signalled": True,
        "timestamp": "2026-12-01T13:10:00.999999Z",
    },
]
MALFORMED = '{"event": "seat.restarted", "seat": "alice", "timest'

RENDERED = [
    "13:00:00.125  INFO   -         daemon.starting       instance=k4ixtj2qznrgb3h9z5oshtwnso"
    " pid=6612 root=/srv/ws space=main",
    f"13:00:01.500  INFO   alice     seat.spawned          agent=scribe session=s-1 uid={UID_NEW}",
    MALFORMED,
    '13:05:00.000  WARN   bob       delivery.retained     detail="no reply in 5 s" status=error'
    " tries=[1,2]",
    "13:10:00.999  ERROR  alice     seat.exited           exit=null signalled=true",
]


def cotal(root: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "manager.cli", "logs", *args, "--root", str(root)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=cotal_env(),
        cwd=root,
    )


def write_log(root: Path, lines: list[str], name: str = "manager.log") -> Path:
    path = root / ".cotal" / "logs" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.fixture
def written(root: Path) -> Path:
    """A manager.log as the daemon writes it, with one line cut short by a crash, and two
    lifecycles of alice's harness stderr (the older one touched into the past)."""
    lines = [json.dumps(e, sort_keys=True) for e in EVENTS]
    lines.insert(2, MALFORMED)
    write_log(root, lines)
    old = write_log(root, ["from the first lifecycle"], f"seat-alice-{UID_OLD}.log")
    os.utime(old, (1_000_000_000, 1_000_000_000))
    write_log(root, ["booting", "warn: slow disk"], f"seat-alice-{UID_NEW}.log")
    write_log(root, ["bob's own stderr"], f"seat-bob-{UID_NEW}.log")
    return root


def test_every_event_is_one_line_for_people(written: Path) -> None:
    proc = cotal(written)
    assert (proc.returncode, proc.stderr) == (EX_OK, "")
    assert proc.stdout.splitlines() == RENDERED


def test_a_seat_shows_its_events_then_its_newest_harness_stderr(written: Path) -> None:
    proc = cotal(written, "alice")
    assert (proc.returncode, proc.stderr) == (EX_OK, "")
    assert proc.stdout.splitlines() == [
        RENDERED[1],
        RENDERED[2],  # the cut-short line still names alice
        RENDERED[4],
        "stderr  booting",
        "stderr  warn: slow disk",
    ]


def test_json_prints_the_objects_still_filtered(written: Path) -> None:
    proc = cotal(written, "alice", "--json")
    assert proc.returncode == EX_OK
    assert [json.loads(line) for line in proc.stdout.splitlines()] == [
        EVENTS[1],
        {"malformed": MALFORMED},
        EVENTS[3],
        {"seat": "alice", "stderr": "booting", "uid": UID_NEW},
        {"seat": "alice", "stderr": "warn: slow disk", "uid": UID_NEW},
    ]


def test_since_an_instant(written: Path) -> None:
    for since in ("2026-12-01T13:05:00Z", "2026-12-01T13:05:00.000Z"):
        proc = cotal(written, "--since", since)
        assert (proc.returncode, proc.stdout.splitlines()) == (EX_OK, RENDERED[3:]), since
    later = cotal(written, "--since", "2026-12-01T13:00:01.501Z")
    # The cut-short line has no time of its own: it stands after 13:00:01.500, before --since.
    assert later.stdout.splitlines() == RENDERED[3:]


def test_since_a_duration(root: Path) -> None:
    now = datetime.now(UTC)
    old = {
        "event": "old.one",
        "level": "info",
        "timestamp": format_instant(now - timedelta(hours=2)),
    }
    new = {
        "event": "new.one",
        "level": "info",
        "timestamp": format_instant(now - timedelta(minutes=5)),
    }
    write_log(root, [json.dumps(old), json.dumps(new)])
    assert [json.loads(x) for x in cotal(root, "--since", "10m", "--json").stdout.splitlines()] == [
        new
    ]
    assert len(cotal(root, "--since", "3h", "--json").stdout.splitlines()) == 2
    assert cotal(root, "--since", "30s", "--json").stdout == ""


def test_what_cannot_be_done_is_refused(written: Path, tmp_path: Path) -> None:
    bad = cotal(written, "--since", "yesterday")
    assert bad.returncode == EX_USAGE and "argument --since: 'yesterday' is neither" in bad.stderr
    nobody = cotal(written, "carol")
    assert nobody.returncode == EX_REFUSED and nobody.stdout == ""
    assert "no event and no harness log of a seat named 'carol'" in nobody.stderr
    seatless = cotal(written, "--transcript")
    assert seatless.returncode == EX_REFUSED and "it needs SEAT" in seatless.stderr
    empty = tmp_path / "empty"
    empty.mkdir()
    none = cotal(empty)
    assert none.returncode == EX_REFUSED and "has no .cotal directory" in none.stderr


def test_a_connector_that_keeps_no_transcript_is_refused_by_name(root: Path) -> None:
    pointer = root / ".cotal" / "sessions" / "jcode" / f"j1-{UID_NEW}.json"
    pointer.parent.mkdir(parents=True)
    pointer.write_text(json.dumps({"version": 1, "sessionId": "j-1", "status": "running"}))
    proc = cotal(root, "j1", "--transcript", "--json")
    assert proc.returncode == EX_REFUSED and proc.stdout == ""
    refusal = json.loads(proc.stderr)
    assert refusal["code"] == "no-transcript"
    assert "the jcode connector keeps no transcript" in refusal["error"]


# -- following ------------------------------------------------------------------------------------


async def read_until(stream: ByteReceiveStream, seen: bytearray, text: str) -> None:
    while text.encode() not in seen:
        seen += await stream.receive()


@pytest.mark.anyio
async def test_follow_prints_new_events_across_a_rotation_and_stops_on_sigterm(
    written: Path,
) -> None:
    log = written / ".cotal" / "logs" / "manager.log"
    argv = [sys.executable, "-m", "manager.cli", "logs", "-f", "alice", "--root", str(written)]
    appended = {**EVENTS[1], "event": "seat.restarted", "timestamp": "2026-12-01T13:20:00.000Z"}
    after = {**EVENTS[1], "event": "seat.stopped", "timestamp": "2026-12-01T13:30:00.000Z"}
    async with await anyio.open_process(argv, env=cotal_env()) as proc:
        assert proc.stdout is not None
        seen = bytearray()
        with anyio.fail_after(30):
            await read_until(proc.stdout, seen, "stderr  warn: slow disk\n")
            with log.open("a") as f:
                f.write(json.dumps({**appended, "seat": "bob"}) + "\n")
                f.write(json.dumps(appended) + "\n")
            await read_until(proc.stdout, seen, "seat.restarted")
            # Rotation under the reader: the old file renamed aside, a new one started.
            os.replace(log, log.with_name("manager.log.1"))
            write_log(written, [json.dumps(after)])
            with (written / ".cotal" / "logs" / f"seat-alice-{UID_NEW}.log").open("a") as f:
                f.write("late stderr line\n")
            await read_until(proc.stdout, seen, "seat.stopped")
            await read_until(proc.stdout, seen, "stderr  late stderr line\n")
            proc.send_signal(signal.SIGTERM)
            assert await proc.wait() == EX_OK
            seen += b"".join([chunk async for chunk in proc.stdout])
    lines = seen.decode().splitlines()
    assert lines[:5] == [RENDERED[1], RENDERED[2], RENDERED[4], "stderr  booting"] + [
        "stderr  warn: slow disk"
    ]
    assert sorted(lines[5:]) == sorted(
        [
            "13:20:00.000  INFO   alice     seat.restarted        agent=scribe session=s-1"
            f" uid={UID_NEW}",
            "13:30:00.000  INFO   alice     seat.stopped          agent=scribe session=s-1"
            f" uid={UID_NEW}",
            "stderr  late stderr line",
        ]
    )


# -- rotation ------------------------------------------------------------------------------------

WRITER = """
import sys
from pathlib import Path
import structlog
from manager import logs
logs.configure(Path(sys.argv[1]), max_bytes=int(sys.argv[2]), backups=int(sys.argv[3]))
log = structlog.get_logger()
for i in range(int(sys.argv[4])):
    log.info("tick", seat="alice", i=i, pad="x" * 40)
"""


def test_the_daemon_log_rotates_by_size_and_logs_reads_the_files_in_order(root: Path) -> None:
    assert (logs.MAX_BYTES, logs.BACKUPS) == (10 * 1024 * 1024, 5)
    log = root / ".cotal" / "logs" / "manager.log"
    cap, backups, count = 2000, 2, 60
    subprocess.run(
        [sys.executable, "-c", WRITER, str(log), str(cap), str(backups), str(count)],
        check=True,
        env=cotal_env(),
        timeout=60,
    )
    files = logs.rotated_files(log, backups)
    assert [p.name for p in files] == ["manager.log.2", "manager.log.1", "manager.log"]
    assert not log.with_name("manager.log.3").exists()
    assert all(0 < p.stat().st_size <= cap for p in files)
    kept = [json.loads(line)["i"] for p in files for line in p.read_text().splitlines()]
    # The oldest backups were dropped; what is kept is the newest events, contiguous.
    assert kept == list(range(count - len(kept), count)) and len(kept) < count
    proc = cotal(root, "--json")
    assert proc.returncode == EX_OK
    assert [json.loads(line)["i"] for line in proc.stdout.splitlines()] == kept
    text = cotal(root).stdout.splitlines()
    assert len(text) == len(kept) and text[0].split()[1:5] == [
        "INFO",
        "alice",
        "tick",
        f"i={kept[0]}",
    ]


def test_a_terminal_gets_events_for_people_and_the_file_stays_json(root: Path) -> None:
    log = root / "m.log"
    script = (
        "import sys, structlog; from pathlib import Path; from manager import logs;"
        "logs.configure(Path(sys.argv[1])); structlog.get_logger().info('seat.spawned', seat='a')"
    )
    main, replica = pty.openpty()
    try:
        subprocess.run(
            [sys.executable, "-c", script, str(log)],
            stderr=replica,
            check=True,
            env=cotal_env(),
            timeout=60,
        )
        os.close(replica)
        shown = b"".join(_drain_pty(main)).decode()
    finally:
        os.close(main)
    [record] = [json.loads(line) for line in log.read_text().splitlines()]
    assert (record["event"], record["seat"], record["level"]) == ("seat.spawned", "a", "info")
    assert "seat.spawned" in shown and "seat=a" in shown and "{" not in shown


def _drain_pty(fd: int) -> Iterator[bytes]:
    while True:
        try:
            chunk = os.read(fd, 4096)
        except OSError:  # EIO: the writer side is closed and everything was read
            return
        if not chunk:
            return
        yield chunk


# -- a real seat ----------------------------------------------------------------------------------


def test_a_real_scribe_seat_its_events_and_its_transcript(mesh: Cli) -> None:
    row = mesh.json(
        "spawn", "s1", "--agent", "scribe", "--prompt", f"Remember the phrase {PHRASE}."
    )
    mesh.json("spawn", "s2", "--agent", "scribe")
    assert PHRASE in mesh.json("send", "s1", "What was the phrase?", "--wait")["reply"]

    events = [json.loads(line) for line in mesh.run("logs", "s1", "--json").stdout.splitlines()]
    assert events and all(e["seat"] == "s1" for e in events if "stderr" not in e)
    [spawned] = [e for e in events if e.get("event") == "seat.spawned"]
    assert spawned["uid"] == row["lifecycleUid"] and spawned["session"] == row["sessionId"]
    assert "delivery.acked" in {e.get("event") for e in events}
    text = mesh.run("logs", "s1").stdout.splitlines()
    [line] = [x for x in text if "seat.spawned" in x]
    assert line.split()[1:4] == ["INFO", "s1", "seat.spawned"]
    assert f"uid={row['lifecycleUid']}" in line.split()

    transcript = mesh.run("logs", "s1", "--transcript").stdout.splitlines()
    store = mesh.root / ".cotal" / "sessions" / "scribe" / f"s1-{row['lifecycleUid']}.store"
    assert transcript[0] == f"==> {store / (row['sessionId'] + '.jsonl')} <=="
    turns = [json.loads(x) for x in transcript[1:]]
    assert turns[0]["type"] == "session" and turns[0]["id"] == row["sessionId"]
    assert [(t["role"], t["text"]) for t in turns[1:]] == [
        ("user", f"Remember the phrase {PHRASE}."),
        ("assistant", f"Noted: {PHRASE}."),
        ("user", "What was the phrase?"),
        ("assistant", f"The phrase is {PHRASE}."),
    ]
    machine = mesh.run("logs", "s1", "--transcript", "--json").stdout.splitlines()
    assert [json.loads(x) for x in machine] == turns
