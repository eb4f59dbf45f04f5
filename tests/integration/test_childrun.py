"""`manager.childrun.run_collect`, the daemon's git runner, gives what `anyio.run_process` gave:
both outputs whole, the status, the program's absence, and on cancellation a child killed and
reaped. Real processes, real pipes."""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

import anyio
import pytest

from manager.childrun import run_collect

pytestmark = pytest.mark.anyio


async def test_both_outputs_and_the_status_come_back_exactly() -> None:
    done = await run_collect(["sh", "-c", "printf 'to out'; printf 'to err' >&2; exit 3"])
    assert (done.returncode, done.stdout, done.stderr) == (3, b"to out", b"to err")


async def test_megabytes_on_both_pipes_at_once_and_on_stdin_arrive_whole(tmp_path: Path) -> None:
    # Interleaved writes of 3 MiB to each pipe: a runner that read one pipe to its end before
    # the other would deadlock on the full one.
    script = (
        "import sys\n"
        "data = sys.stdin.buffer.read()\n"
        "for i in range(0, len(data), 4096):\n"
        "    piece = data[i:i+4096]\n"
        "    sys.stdout.buffer.write(piece); sys.stderr.buffer.write(piece[::-1])\n"
    )
    payload = os.urandom(3 << 20)
    with anyio.fail_after(60):
        done = await run_collect([sys.executable, "-c", script], input=payload, cwd=tmp_path)
    assert done.returncode == 0
    assert hashlib.sha256(done.stdout).digest() == hashlib.sha256(payload).digest()
    expected_err = b"".join(payload[i : i + 4096][::-1] for i in range(0, len(payload), 4096))
    assert hashlib.sha256(done.stderr).digest() == hashlib.sha256(expected_err).digest()


async def test_a_child_that_reads_no_input_does_not_hang_the_writer() -> None:
    with anyio.fail_after(30):
        done = await run_collect(["sh", "-c", "exit 0"], input=os.urandom(1 << 20))
    assert (done.returncode, done.stdout, done.stderr) == (0, b"", b"")


async def test_a_missing_program_is_file_not_found_and_leaves_no_descriptor() -> None:
    before = sorted(os.listdir("/proc/self/fd"))
    with pytest.raises(FileNotFoundError):
        await run_collect(["/nonexistent/cotal-no-such-program"])
    for _ in range(20):
        await run_collect(["true"])
    assert sorted(os.listdir("/proc/self/fd")) == before


async def test_a_cancelled_run_kills_and_reaps_its_child(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    with anyio.fail_after(10):
        with anyio.move_on_after(0.5) as scope:
            await run_collect(["sh", "-c", f"echo $$ > {pid_file}; exec sleep 30"])
    assert scope.cancelled_caught
    pid = int(pid_file.read_text())
    # Reaped, not a zombie: the pid names no process at all.
    assert not Path(f"/proc/{pid}").exists()
