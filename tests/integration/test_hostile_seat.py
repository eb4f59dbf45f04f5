"""A hostile seat reaches none of the manager's authority.

The seat runs tests/fixtures/hostile_seat.py (a stand-in speaking the jcode connector's
protocol, launched through `agents.jcode.binary`). From inside the seat it tries to read the
control token, the broker credential, the signing key, the manager's log, another seat's store
and pointer, the manager's environment (which holds a fake `OPENAI_API_KEY`) and memory, to
signal the manager, to lift the overmount, and to use the control socket with a token the test
hands it in a loot directory next to a hard link to the socket, so only the socket's seat check
stands between it and the daemon. Every attempt must fail, and the manager's log must record
the refused connection. Before the hostile seat runs, the test reads each target itself from
outside the seat, so a target that does not exist cannot make an attempt fail by accident.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from connectors import isolate, sandbox
from manager.control.server import parent_pid, seat_ancestor
from tests.conftest import REPO, Cli

pytestmark = pytest.mark.usefixtures("isolated_home")
HOSTILE = REPO / "tests" / "fixtures" / "hostile_seat.py"
SECRET_ENV = {"OPENAI_API_KEY": "sk-test-secret"}


def _hostile_binary(tmp_path: Path) -> Path:
    b = tmp_path / "bin" / "hostile"
    b.parent.mkdir()
    b.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{HOSTILE}" "$@"\n')
    b.chmod(0o755)
    return b


def _log_events(root: Path) -> list[dict[str, object]]:
    log = root / ".cotal" / "logs" / "manager.log"
    return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]


def test_a_hostile_seat_reaches_none_of_the_managers_authority(tmp_path: Path, cli: Cli) -> None:
    root = cli.root
    (root / "cotal.toml").write_text(f'[agents.jcode]\nbinary = "{_hostile_binary(tmp_path)}"\n')
    cli.run("up", "--detach", env=SECRET_ENV)
    try:
        doctor = [json.loads(line) for line in cli.run("doctor", "--json").stdout.splitlines()]
        [isolation] = [row for row in doctor if row["name"] == "isolation"]
        assert isolation["hidesSecrets"], isolation
        assert isolation["missing"] == [] and isolation["tmpMiB"] == sandbox.TMP_MIB_DEFAULT

        victim = cli.json("spawn", "victim")
        assert cli.json("send", "victim", "remember the phrase quartz-owl-17", "--wait")["reply"]
        auth = root / ".cotal" / "auth"
        store = root / ".cotal" / "sessions" / "scribe" / f"victim-{victim['lifecycleUid']}.store"
        [victim_session] = sorted(store.iterdir())
        mesh = json.loads((root / ".cotal" / "mesh.json").read_text())
        [signing_key] = sorted(auth.glob("manager-instance.*.json"))
        files = {
            "control token": auth / "control.token",
            "broker credential": auth / "broker.creds",
            "signing key": signing_key,
            "manager log": root / ".cotal" / "logs" / "manager.log",
            "other seat's session": victim_session,
            "other seat's pointer": store.with_suffix(".json"),
        }
        dirs = {
            ".cotal/auth": auth,
            "other seat's store": store,
            ".cotal/logs": root / ".cotal" / "logs",
        }
        # Every target is there and readable from outside the seat.
        for path in files.values():
            assert path.read_bytes(), path
        for path in dirs.values():
            assert os.listdir(path), path
        assert b"sk-test-secret" in Path(f"/proc/{mesh['manager']['pid']}/environ").read_bytes()

        # In the seat's cwd: a loot directory anywhere else under /tmp is not in its tree.
        loot = root / "loot"
        loot.mkdir()
        (loot / "control.token").write_text((auth / "control.token").read_text())
        os.link(root / ".cotal" / "manager.sock", loot / "manager.sock")
        # The victim's mesh socket, hidden from the seat's tree, and a link to it that is not:
        # reaching the socket is not being the seat.
        mesh_dir = root / ".cotal" / "seat-mesh" / f"victim-{victim['lifecycleUid']}"
        (loot / "mesh").mkdir()
        os.link(mesh_dir / "mesh.sock", loot / "mesh" / "mesh.sock")
        plan = {
            "root": str(root),
            "managerPid": mesh["manager"]["pid"],
            "files": {k: str(v) for k, v in files.items()},
            "dirs": {k: str(v) for k, v in dirs.items()},
            "stolenToken": str(loot / "control.token"),
            "stolenSocket": str(loot / "manager.sock"),
            "meshDir": str(mesh_dir),
            "meshLink": str(loot / "mesh"),
        }
        (root / "hostile-plan.json").write_text(json.dumps(plan))

        row = cli.json("spawn", "hostile", "--agent", "jcode")
        assert row["state"] == "running"
        results = json.loads((root / "hostile-result.json").read_text())
        reached = [r for r in results if r["reached"]]
        assert not reached, json.dumps(reached, indent=1)
        by_target = {r["target"]: r["detail"] for r in results}
        assert by_target["control socket, stolen token"].startswith("closed without a reply")
        assert by_target["another seat's mesh socket, linked"] == (
            "answered refused mesh-peer-refused"
        )
        assert len(results) >= 27

        refused = [
            e
            for e in _log_events(root)
            if e.get("event") == "control.refused" and e.get("reason") == "seat-process"
        ]
        assert refused, "the refused seat connection is not in the manager log"
        token = (auth / "control.token").read_text().strip()
        assert token not in (root / ".cotal" / "logs" / "manager.log").read_text()

        # Isolated, the seat still does its work, and ps says how it is isolated.
        assert cli.json("send", "hostile", "hello", "--wait")["reply"] == "OK."
        rows = {r["name"]: r for r in cli.ps()}
        assert rows["hostile"]["isolation"] == isolation["mode"]
        assert rows["victim"]["isolation"] == isolation["mode"]
        assert "ISOLATION" in cli.run("ps", "--wide").stdout
        # The operator's own CLI, outside every seat, is still served.
        assert cli.json("status")["state"] == "active"
    finally:
        cli.run("down", check=False)


def _wait_for(path: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text().strip()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def test_the_socket_check_sees_a_seat_child_that_left_its_tree_and_session(
    tmp_path: Path,
) -> None:
    """A seat's grandchild that double-forked and called setsid has neither the seat among its
    ancestors nor the seat's session; the seat's private mount namespace still names it."""
    found = sandbox.probe()
    if found.mount is None:
        pytest.skip(f"no mount namespace on this host ({found.detail})")
    (tmp_path / ".cotal").mkdir()
    pidfile = tmp_path / "escaped.pid"
    script = f"(setsid sleep 60 </dev/null >/dev/null 2>&1 & echo $! > {pidfile}); sleep 60"
    argv = ["/bin/sh", "-c", script]
    env = {"PATH": "/usr/bin:/bin", "COTAL_WORKSPACE_ROOT": str(tmp_path)}
    plan = sandbox.plan_for(
        argv, env, tmp_path, pointer=None, mount=found.mount, landlock=found.landlock
    )
    seat = subprocess.Popen(sandbox.launcher(plan) + argv, env=env, start_new_session=True)
    try:
        escaped = int(_wait_for(pidfile))
        # `$!` is known before the subshell has exited and setsid has run: wait until the
        # process has really left the seat's tree and session.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not (
            os.getsid(escaped) == escaped
            and parent_pid(escaped) not in (None, seat.pid, escaped)
            and seat_ancestor(escaped, [seat.pid]) != f"descends from seat process {seat.pid}"
        ):
            time.sleep(0.05)
        assert seat_ancestor(escaped, []) is None
        assert os.getsid(escaped) != seat.pid
        assert seat_ancestor(escaped, [seat.pid]) == (
            f"in the mount namespace of seat process {seat.pid}"
        )
        assert seat_ancestor(os.getpid(), [seat.pid]) is None
    finally:
        os.killpg(seat.pid, signal.SIGKILL)
        seat.wait()
        with contextlib.suppress(ProcessLookupError, ValueError, AssertionError):
            os.kill(int(_wait_for(pidfile, 0.1)), signal.SIGKILL)


def test_the_socket_check_sees_a_seat_descendant(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    seat = subprocess.Popen(
        ["/bin/sh", "-c", f"sh -c 'echo $$ > {pidfile}; exec sleep 60' & wait"],
        start_new_session=True,
    )
    try:
        child = int(_wait_for(pidfile))
        assert seat_ancestor(child, [seat.pid]) == f"descends from seat process {seat.pid}"
        assert seat_ancestor(child, [seat.pid + 100_000]) is None
    finally:
        os.killpg(seat.pid, signal.SIGKILL)
        seat.wait()


NOBODY = 65534
SYSTEM_PYTHON = Path("/usr/bin/python3")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become an unprivileged user")
def test_a_non_root_seat_is_isolated_inside_a_user_namespace(tmp_path: Path) -> None:
    """The non-root path: a user namespace mapping only the seat's own uid, the same overmount
    and Landlock. Run as `nobody` with the system interpreter (the launcher needs only the
    standard library)."""
    launcher_file = Path(isolate.__file__)
    if not SYSTEM_PYTHON.exists():
        pytest.skip("no /usr/bin/python3 to run the launcher as another user")
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"]
    probe = subprocess.run(
        as_nobody + [str(SYSTEM_PYTHON), "-I", "-S", str(launcher_file), "--probe"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        pytest.skip(f"nobody cannot run the launcher here: {probe.stderr.strip()}")
    found = json.loads(probe.stdout)
    if found["mount"] != "userns":
        pytest.skip(f"no unprivileged user namespace here: {found['detail']}")
    # pytest's own temp tree is private to root; nobody needs a path it may traverse.
    scratch = Path(tempfile.mkdtemp(prefix="cotal-nobody-"))
    try:
        _non_root_seat(scratch, [*as_nobody, str(SYSTEM_PYTHON)], int(found["landlock"]))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _non_root_seat(tmp_path: Path, python: list[str], landlock: int) -> None:
    launcher_file = Path(isolate.__file__)
    ws = tmp_path / "ws"
    sessions = ws / ".cotal" / "sessions" / "scribe"
    (ws / ".cotal" / "auth").mkdir(parents=True)
    (sessions / "me-u2.store").mkdir(parents=True)
    (sessions / "other-u1.store").mkdir()
    (ws / ".cotal" / "auth" / "control.token").write_text("secret-token\n")
    (sessions / "other-u1.json").write_text("other-pointer\n")
    (sessions / "other-u1.store" / "s.jsonl").write_text("other-session\n")
    for p in [tmp_path, *tmp_path.rglob("*")]:
        os.chown(p, NOBODY, NOBODY)
    pointer = sessions / "me-u2.json"
    script = (
        "cat .cotal/auth/control.token; cat .cotal/sessions/scribe/other-u1.json;"
        " cat .cotal/sessions/scribe/other-u1.store/s.jsonl; umount .cotal;"
        " echo mine > .cotal/sessions/scribe/.me-u2.json.t.tmp"
        " && mv .cotal/sessions/scribe/.me-u2.json.t.tmp .cotal/sessions/scribe/me-u2.json;"
        " echo stored > .cotal/sessions/scribe/me-u2.store/s.jsonl; echo done"
    )
    argv = ["/bin/sh", "-c", script, "--pointer", str(pointer)]
    env = {"PATH": "/usr/bin:/bin", "COTAL_WORKSPACE_ROOT": str(ws)}
    plan = sandbox.plan_for(argv, env, ws, pointer=pointer, mount="userns", landlock=landlock)
    out = subprocess.run(
        [*python, "-I", "-S", str(launcher_file), plan.encode(), "--", *argv],
        cwd=ws,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert out.stdout.strip() == "done", (out.stdout, out.stderr)
    assert "secret-token" not in out.stdout + out.stderr
    assert "other-pointer" not in out.stdout and "other-session" not in out.stdout
    # The seat's own pointer and store were written, on the real disk.
    assert pointer.read_text() == "mine\n"
    assert (sessions / "me-u2.store" / "s.jsonl").read_text() == "stored\n"
    assert (ws / ".cotal" / "auth" / "control.token").read_text() == "secret-token\n"


@pytest.mark.parametrize(
    ("plan_text", "why"),
    [
        ('{"control": "/x", "keep": [], "read": [], "write": [], "extra": 1}', "extra"),
        ('{"control": "/x", "keep": [], "read": []}', "write"),
        ('["not", "an", "object"]', "a plan is a JSON object"),
        ('{"control": "/x", "keep": "/x/a", "read": [], "write": []}', "'keep' is not a list"),
        ('{"control": "/x", "keep": [], "read": [], "write": [], "landlock": true}', "landlock"),
        ("{not json", "Expecting property name"),
        ('{"control": "/x", "keep": [], "read": [], "write": [], "tmp_mib": true}', "tmp_mib"),
        ('{"control": "/x", "keep": [], "read": [], "write": [], "registry": 3}', "registry"),
        ('{"control": "/x", "keep": [], "read": [], "write": [], "fresh": "/t"}', "'fresh'"),
    ],
)
def test_a_plan_the_launcher_cannot_read_is_refused_before_the_harness_runs(
    tmp_path: Path, plan_text: str, why: str
) -> None:
    """The launcher is strict: a plan with an unknown or a missing field, a field of the wrong
    type, or no plan at all, stops the seat with exit 2 and a message naming what was wrong;
    the harness never runs unisolated."""
    marker = tmp_path / "ran"
    launch = sandbox.launcher(sandbox.Plan(control="/x", keep=[], read=[], write=[]))
    assert launch[-1] == "--"
    argv = [*launch[:-2], plan_text, "--", "/bin/sh", "-c", f"echo ran > {marker}"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    assert out.returncode == 2
    assert out.stderr.startswith("cotal sandbox: refusing to start the seat: a bad plan (")
    assert why in out.stderr
    assert not marker.exists()


def test_a_plan_travels_to_the_launcher_unchanged() -> None:
    plan = sandbox.Plan(
        control="/w/.cotal",
        keep=["/w/.cotal/sessions/scribe/a.store"],
        read=["/usr"],
        write=["/w", "/w/scratch"],
        pointer_dir="/w/.cotal/sessions/scribe",
        own_prefix="a",
        mount="root",
        landlock=7,
        private_tmp=list(isolate.SYSTEM_WRITE),
        tmp_mib=512,
        fresh=["/w/scratch/tmp"],
        registry="/var/lib/cotal/roots",
    )
    assert isolate.Plan.decode(plan.encode()) == plan
    assert plan != isolate.Plan(control="/w/.cotal", keep=[], read=[], write=[])
