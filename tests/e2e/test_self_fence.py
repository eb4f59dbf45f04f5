"""A silent host fences itself (issue 39, item 3). One real broker the test owns and can stop
with SIGSTOP, two roots on it: `fo` with `[failover] enabled, after_s = 3`, `plain` without.

- A stall shorter than `after_s` changes nothing: same pid, running, nothing fenced.
- A stall longer than `after_s` kills the failover seat (its pid gone within `after_s` plus a
  small margin of the stall's start, measured); `ps` and `status` say why; `start` is refused by
  name; the seat of the root without failover lives through it. Once the broker answers, the
  manager re-reads the custody and runs the seat again in the same session and uid: it answers.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from tests.cluster import free_ports
from tests.conftest import Cli, cotal_env
from tests.helpers import ask, pid_alive, ps_row, stop_broker, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

AFTER_S = 3.0
PHRASE = "osprey-fence-39"
# What the watchdog's tick, the renewal period (after_s / 4) and a SIGKILL's reap may add.
MARGIN_S = 1.5


@contextmanager
def _broker(tmp_path: Path) -> Iterator[tuple[dict[str, str], int]]:
    """`cotal broker serve`: its url and creds, and the nats-server's own pid to stop."""
    (port,) = free_ports(1)
    argv = [sys.executable, "-m", "manager.cli", "broker", "serve"]
    argv += ["--store-dir", str(tmp_path / "broker"), "--port", str(port), "--json"]
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cotal_env()
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr else ""
    info = json.loads(line)
    try:
        yield info, int(info["pid"])
    finally:
        os.kill(int(info["pid"]), signal.SIGCONT)
        stop_broker(proc)


@contextmanager
def _stalled(pid: int) -> Iterator[float]:
    """The broker stopped (SIGSTOP) until the block ends; yields the stall's start."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield time.monotonic()
    finally:
        os.kill(pid, signal.SIGCONT)


def _root(tmp_path: Path, name: str, info: dict[str, str], toml: str) -> Cli:
    cli = Cli(tmp_path / name)
    cli.root.mkdir()
    (cli.root / "cotal.toml").write_text(toml)
    cli.run("up", "--detach", "--space", name, "--server", info["url"], "--creds", info["creds"])
    cli.json("spawn", name, "--prompt", f"Remember the phrase {PHRASE}.")
    return cli


def _status(cli: Cli) -> dict[str, object]:
    doc: dict[str, object] = cli.json("status")
    return doc


async def test_a_silent_host_fences_its_failover_seats_and_only_those(tmp_path: Path) -> None:
    with _broker(tmp_path) as (info, nats_pid):
        fo = _root(tmp_path, "fo", info, f"[failover]\nenabled = true\nafter_s = {AFTER_S}\n")
        plain = _root(tmp_path, "plain", info, "")
        try:
            await _run_cases(fo, plain, nats_pid)
        finally:
            fo.run("down", check=False)
            plain.run("down", check=False)


async def _run_cases(fo: Cli, plain: Cli, nats_pid: int) -> None:
    before = ps_row(fo, "fo")
    plain_pid = ps_row(plain, "plain")["pid"]
    assert before["state"] == "running" and pid_alive(before["pid"])

    # 1. A stall shorter than after_s changes nothing.
    with _stalled(nats_pid):
        await anyio.sleep(AFTER_S / 2)
    assert ask(fo, "fo", "what was the phrase?") == f"The phrase is {PHRASE}."
    row = ps_row(fo, "fo")
    assert (row["state"], row["pid"], row["reason"]) == ("running", before["pid"], None)
    assert "selfFenced" not in _status(fo)["seats"]  # type: ignore[operator]

    # 2. A stall longer than after_s: the failover seat dies within after_s (plus the margin)
    # of the stall's start; the manager says why and refuses to start it; `plain` lives on.
    with _stalled(nats_pid) as stalled_at:
        await wait_until(lambda: not pid_alive(before["pid"]), timeout=AFTER_S + 10, every=0.05)
        took = time.monotonic() - stalled_at
        assert took <= AFTER_S + MARGIN_S, took
        await wait_until(lambda: ps_row(fo, "fo")["state"] == "stopped", timeout=10)
        row = ps_row(fo, "fo")
        assert row["reason"].startswith("self-fenced: no lease renewal for"), row
        assert row["lastExit"] == "SIGKILL", row
        fenced = _status(fo)["seats"]["selfFenced"]  # type: ignore[index]
        assert list(fenced) == ["fo"], fenced
        assert "fenced    seat(s) fo killed: self-fenced" in fo.run("status").stdout
        assert "fo: self-fenced: no lease renewal for" in fo.run("ps").stdout
        refused = fo.run("start", "fo", "--json", check=False)
        assert refused.returncode != 0
        assert "self-fenced" in refused.stdout + refused.stderr
        assert "start fo refused" in refused.stdout + refused.stderr
        # Past after_s by a margin, the seat of the root without failover still runs.
        await anyio.sleep(max(0.0, AFTER_S + MARGIN_S - (time.monotonic() - stalled_at)))
        assert pid_alive(plain_pid)
        assert ps_row(plain, "plain")["state"] == "running"

    # The broker answers: the manager renews, re-reads the custody and runs the seat again in
    # its session and uid.
    await wait_until(lambda: ps_row(fo, "fo")["state"] == "running", timeout=60, every=0.2)
    after = ps_row(fo, "fo")
    assert after["lifecycleUid"] == before["lifecycleUid"]
    assert after["sessionId"] == before["sessionId"]
    assert after["pid"] != before["pid"] and after["reason"] is None
    assert "selfFenced" not in _status(fo)["seats"]  # type: ignore[operator]
    assert ask(fo, "fo", "what was the phrase?") == f"The phrase is {PHRASE}."
    # Fenced once, lifted once: the silence the fence acted on does not fence it again.
    assert ps_row(fo, "fo")["pid"] == after["pid"]
    assert log_count(fo, "failover.self_fenced") == 1
    assert log_count(fo, "failover.seat_started_again") == 1
    kinds = [
        e["type"] for e in fo.json("events", "--seat", "fo", "--since", "10m", "--until", "now")
    ]
    assert kinds.count("seat.self_fenced") == kinds.count("seat.fence_lifted") == 1, kinds

    # 3. The root without failover: nothing was killed, and it still answers.
    row = ps_row(plain, "plain")
    assert (row["state"], row["pid"], row["reason"]) == ("running", plain_pid, None)
    assert ask(plain, "plain", "what was the phrase?") == f"The phrase is {PHRASE}."

    # 4. The manager itself stopped longer than after_s: on waking, its own monotonic clock
    # shows the silence, and it kills its seat at once, then reads the broker and runs it again.
    await _manager_stalled(fo, after)
    assert log_count(fo, "failover.self_fenced") == 2


def log_count(cli: Cli, event: str) -> int:
    return (cli.root / ".cotal" / "logs" / "manager.log").read_text().count(f'"{event}"')


async def _manager_stalled(fo: Cli, before: dict[str, object]) -> None:
    manager_pid = int(_status(fo)["pid"])  # type: ignore[call-overload]
    seat_pid = int(before["pid"])  # type: ignore[call-overload]
    with _stalled(manager_pid) as stalled_at:
        await anyio.sleep(AFTER_S + 1)
    woke_at = time.monotonic()
    await wait_until(lambda: not pid_alive(seat_pid), timeout=10, every=0.05)
    assert time.monotonic() - woke_at <= MARGIN_S, time.monotonic() - stalled_at
    await wait_until(lambda: ps_row(fo, "fo")["state"] == "running", timeout=60, every=0.2)
    row = ps_row(fo, "fo")
    assert (row["lifecycleUid"], row["sessionId"]) == (before["lifecycleUid"], before["sessionId"])
    assert ask(fo, "fo", "what was the phrase?") == f"The phrase is {PHRASE}."
