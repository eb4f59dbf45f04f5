"""A library's task that loses a cancellation does not keep a cotal process from exiting.

Python 3.11's `asyncio.wait_for` can lose a cancellation that lands as the call it waits on
fails; nats-py's reconnect loop to a dead broker then goes on retrying, and the loop's own
teardown, which cancels each task once and waits, never ends (a manager whose broker died did
not exit). `manager.eventloop.run` cancels what is left again until it ends. Each case runs in
a child process with a timeout, so a regression fails instead of hanging the suite."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.conftest import REPO

STUBBORN = textwrap.dedent(
    """
    import asyncio, sys, time
    from manager import eventloop

    lost = 0

    async def reconnect_loop() -> None:
        # As nats-py's loop behaves when its cancellation is lost: it carries on retrying.
        global lost
        while True:
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                if lost < LOSE:
                    lost += 1
                    continue
                raise

    async def main() -> str:
        # A library's own task, outside every task group: what nats-py starts.
        main.task = asyncio.get_running_loop().create_task(reconnect_loop())
        await asyncio.sleep(0.1)
        return "done"

    t0 = time.monotonic()
    print(eventloop.run(main), lost, round(time.monotonic() - t0, 1))
    """
)


def _run(lose: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", f"LOSE = {lose}\n" + STUBBORN],
        capture_output=True,
        text=True,
        timeout=30,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )


def test_a_task_that_loses_cancellations_is_cancelled_until_it_ends() -> None:
    out = _run(lose=3)
    assert out.returncode == 0, out.stderr
    result, lost, seconds = out.stdout.split()
    assert (result, lost) == ("done", "3")
    assert float(seconds) < 3.0, out.stdout
    assert "would not end" not in out.stderr


def test_a_process_with_nothing_left_exits_at_once() -> None:
    out = _run(lose=0)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[:2] == ["done", "0"]
