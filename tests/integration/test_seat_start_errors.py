"""A seat start whose launcher cannot set up the sandbox (real daemon, real broker, real
launcher, scribe seats): the launcher reports step, errno and path on the manager's pipe; a
transient errno is tried again within the seat's restart budget, a permanent one is refused at
once as `seat-start-failed` naming all three. The fault is the launcher's test hook,
COTAL_TEST_LAUNCH_FAULT, honoured only from the manager's own environment."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors import sandbox
from manager.daemon.incarnation import LaunchFault, decode_fault
from tests.conftest import Cli

FOUND = sandbox.probe()
pytestmark = pytest.mark.skipif(
    FOUND.mount is None, reason=f"no mount namespace on this host ({FOUND.detail})"
)

MOUNT_CURE = (
    "the manager's user must be able to mount a tmpfs over that path and bind the seat's own "
    "paths back beneath it: check that it exists and is not held read-only or busy by the host "
    "(see `cotal doctor`)"
)


def _up(cli: Cli, fault: str) -> Iterator[Cli]:
    cli.run("up", "--detach", env={sandbox.FAULT_ENV: fault})
    yield cli
    cli.run("down", check=False)


def _refusal(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    document: dict[str, Any] = json.loads(proc.stderr)
    return document


def _seat_log(cli: Cli, name: str) -> str:
    [log] = (cli.root / ".cotal" / "logs").glob(f"seat-{name}-*.log")
    return log.read_text()


@pytest.fixture
def counter(tmp_path: Path) -> Path:
    return tmp_path / "fault-counter"


@pytest.fixture
def busy_twice(cli: Cli, counter: Path) -> Iterator[Cli]:
    yield from _up(cli, f"mount:EBUSY:2:{counter}")


@pytest.fixture
def denied(cli: Cli, counter: Path) -> Iterator[Cli]:
    yield from _up(cli, f"mount:EACCES:5:{counter}")


@pytest.fixture
def busy_always(cli: Cli, counter: Path) -> Iterator[Cli]:
    yield from _up(cli, f"mount:EBUSY:99:{counter}")


def test_a_start_that_meets_ebusy_twice_is_tried_again_and_runs(
    busy_twice: Cli, counter: Path
) -> None:
    row = busy_twice.json("spawn", "alice")
    assert row["state"] == "running" and row["name"] == "alice"
    # Two launches failed, the third ran: the count is the launcher's own, across launches.
    assert counter.read_text() == "2"
    log = _seat_log(busy_twice, "alice")
    failed = "mount /tmp: Device or resource busy (COTAL_TEST_LAUNCH_FAULT)"
    assert log.count(failed) == 2
    # The seat that came up is a working one.
    assert busy_twice.json("send", "alice", "ping", "--wait")["reply"]


def test_a_permanent_errno_is_refused_at_once_naming_step_errno_and_path(
    denied: Cli, counter: Path
) -> None:
    refused = _refusal(denied.run("spawn", "bob", "--json", check=False))
    assert refused["code"] == "seat-start-failed"
    text = refused["error"]
    match = re.fullmatch(
        r"seat bob could not start: its launcher's mount step failed with EACCES \(Permission "
        r"denied\) on /tmp before the harness ran \(exit 126\); (?P<cure>.*); the launcher's "
        r"line is in (?P<log>/\S+/\.cotal/logs/seat-bob-[0-9a-z]+\.log)",
        text,
    )
    assert match is not None, text
    assert match["cure"] == MOUNT_CURE
    # Tried once only: a second launch on this host meets the same refusal.
    assert counter.read_text() == "1"
    assert "mount /tmp: Permission denied" in Path(match["log"]).read_text()
    assert [r["name"] for r in denied.ps()] == []


def test_a_transient_errno_past_the_restart_budget_is_refused_saying_so(
    busy_always: Cli, counter: Path
) -> None:
    refused = _refusal(busy_always.run("spawn", "carol", "--json", check=False))
    assert refused["code"] == "seat-start-failed"
    assert refused["error"].startswith(
        "seat carol could not start: its launcher's mount step failed with EBUSY (Device or "
        "resource busy) on /tmp before the harness ran (exit 126); 4 attempts, and the seat's "
        "restart budget (3 within 120s) is spent; EBUSY is a passing shortage or contention on "
        "the host: start it again (spawn, `cotal start`, or the resume) when the host is less "
        "busy; the launcher's line is in "
    )
    # The first launch and its three restarts, the seat's whole budget.
    assert counter.read_text() == "4"


# -- the launcher alone ----------------------------------------------------------------------


def _launch(
    tmp_path: Path, argv: list[str], *, fault: str | None, env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], LaunchFault | None, bytes]:
    """The launcher as the daemon runs it, with a report pipe (`{fd}` in argv names it)."""
    seat_env = {"PATH": "/usr/bin:/bin", "COTAL_WORKSPACE_ROOT": str(tmp_path), **(env or {})}
    status, report = os.pipe2(os.O_CLOEXEC)
    argv = [arg.replace("{fd}", str(report)) for arg in argv]
    plan = sandbox.plan_for(
        argv, seat_env, tmp_path, pointer=None, mount=FOUND.mount, landlock=FOUND.landlock
    )
    plan.status_fd, plan.fault = report, fault
    try:
        out = subprocess.run(
            [*sandbox.launcher(plan), *argv],
            cwd=tmp_path,
            env=seat_env,
            pass_fds=(report,),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    finally:
        os.close(report)
    try:
        data = os.read(status, 8192)
    finally:
        os.close(status)
    return out, decode_fault(data), data


def test_the_fault_in_a_seats_own_environment_is_not_honoured(tmp_path: Path) -> None:
    counter = tmp_path / "counter"
    out, fault, data = _launch(
        tmp_path,
        ["/bin/sh", "-c", "echo ran"],
        fault=None,
        env={sandbox.FAULT_ENV: f"namespace:EPERM:9:{counter}"},
    )
    assert (out.returncode, out.stdout, fault, data) == (0, "ran\n", None, b"")
    assert not counter.exists()


def test_a_harness_that_ran_cannot_write_the_launchers_report(tmp_path: Path) -> None:
    # The write end is closed by the exec: a forged report has nowhere to go.
    out, fault, data = _launch(
        tmp_path, ["/bin/sh", "-c", "( echo forged >&{fd} ) 2>/dev/null; echo ran"], fault=None
    )
    assert (out.returncode, out.stdout, fault, data) == (0, "ran\n", None, b"")


@pytest.mark.parametrize(
    ("spec", "code", "expected"),
    [
        ("namespace:EPERM", 126, LaunchFault("namespace", "EPERM", None, "")),
        ("hide:ENOENT", 126, LaunchFault("hide", "ENOENT", None, "")),
        ("exec:ENOMEM", 127, LaunchFault("exec", "ENOMEM", "/bin/true", "")),
    ],
)
def test_each_step_reports_its_name_and_errno(
    tmp_path: Path, spec: str, code: int, expected: LaunchFault
) -> None:
    out, fault, _ = _launch(tmp_path, ["/bin/true"], fault=f"{spec}:1:{tmp_path / 'counter'}")
    assert out.returncode == code, out.stderr
    assert fault is not None
    assert (fault.step, fault.errno, fault.path) == (expected.step, expected.errno, expected.path)
    # Spent: the next launch runs.
    again, none, _ = _launch(tmp_path, ["/bin/true"], fault=f"{spec}:1:{tmp_path / 'counter'}")
    assert (again.returncode, none) == (0, None)


def test_a_real_exec_failure_names_the_program(tmp_path: Path) -> None:
    missing = str(tmp_path / "no-such-harness")
    out, fault, _ = _launch(tmp_path, [missing], fault=None)
    assert out.returncode == 127
    assert fault == LaunchFault(
        "exec", "ENOENT", missing, f"[Errno 2] No such file or directory: '{missing}'"
    )


def test_a_fault_spec_that_cannot_be_honoured_refuses_the_launch(tmp_path: Path) -> None:
    out, fault, _ = _launch(tmp_path, ["/bin/true"], fault="mount:EWHAT:1:/x")
    assert out.returncode == 2
    assert out.stderr == (
        "cotal sandbox: refusing to start the seat: a bad plan (COTAL_TEST_LAUNCH_FAULT "
        "'mount:EWHAT:1:/x': no step 'mount' or no errno 'EWHAT')\n"
    )
    assert fault is None
