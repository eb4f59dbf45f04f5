"""A seat sees its own work and nothing of any other root on the host.

Two roots on one host, both under the test's temp directory (so under /tmp): a seat of root A
runs tests/fixtures/hostile_neighbour.py (through `agents.jcode.binary`) and goes after root B's
control token, broker credential and signing key, its control socket, a seat of B's cwd under
/tmp, a third root kept under a system path Landlock lets every seat read (`/run`), the
registry that names them all, and fills its /tmp past the cap. Every target is first read from
outside the seat, so an attempt cannot fail because the target is missing, and each attempt must
fail with the exact errno: ENOENT (not in the seat's tree), EROFS (the registry), ENOSPC (the
cap). B's manager must also refuse a process that carries the seat mark even when it can reach
the socket and holds the token: a process under `no_new_privs` connecting directly.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from connectors import isolate, sandbox
from manager.workspace import roots
from tests.conftest import REPO, Cli, _kill_leftovers

pytestmark = pytest.mark.usefixtures("isolated_home")
HOSTILE = REPO / "tests" / "fixtures" / "hostile_neighbour.py"
TMP_MIB = 4
TMP = isolate.SYSTEM_WRITE[0]


@pytest.fixture
def neighbour(tmp_path: Path) -> Iterator[Cli]:
    """Root B, beside root A (`cli`) under the same temp directory."""
    root = tmp_path / "wsB"
    root.mkdir()
    yield Cli(root)
    _kill_leftovers(root)


@pytest.fixture
def system_root() -> Iterator[Path]:
    """A third root under /run, a path every seat's Landlock rules may read: registered as its
    manager would register it, with a token in place."""
    if not os.access("/run", os.W_OK):
        pytest.skip("cannot create a root under /run here")
    scratch = Path(tempfile.mkdtemp(prefix="cotal-test-root-", dir="/run"))
    root = scratch / "ws"
    (root / ".cotal" / "auth").mkdir(parents=True, mode=0o700)
    (root / ".cotal" / "auth" / "control.token").write_text("system-root-token\n")
    entry = roots.register(root)
    try:
        yield root
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        entry.unlink(missing_ok=True)


def _hostile_binary(tmp_path: Path) -> Path:
    b = tmp_path / "bin" / "hostile"
    b.parent.mkdir()
    b.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{HOSTILE}" "$@"\n')
    b.chmod(0o755)
    return b


def _hello(sock: Path, token: str, *, marked: bool) -> subprocess.CompletedProcess[str]:
    """Say hello to a control socket from a child process, under `no_new_privs` or not; it
    prints the reply, or `closed` when the daemon hung up without one."""
    client = (
        "import json,socket,struct,sys\n"
        "s=socket.socket(socket.AF_UNIX);s.settimeout(10);s.connect(sys.argv[1])\n"
        "b=json.dumps({'op':'hello','token':sys.argv[2]}).encode()\n"
        "try:\n s.sendall(struct.pack('>I',len(b))+b);d=s.recv(65536)\n"
        "except (BrokenPipeError,ConnectionResetError):\n d=b''\n"
        "print(d[4:].decode() if d else 'closed')\n"
    )
    prefix = ["setpriv", "--no-new-privs", "--"] if marked else []
    argv = [*prefix, sys.executable, "-I", "-c", client, str(sock), token]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=True)


def _log(root: Path) -> list[dict[str, Any]]:
    text = (root / ".cotal" / "logs" / "manager.log").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def test_a_seat_reaches_nothing_of_another_root(
    tmp_path: Path, cli: Cli, neighbour: Cli, system_root: Path
) -> None:
    if sandbox.probe().mount is None:
        pytest.skip(f"no mount namespace on this host ({sandbox.probe().detail})")
    root_a, root_b = cli.root, neighbour.root
    (root_a / "cotal.toml").write_text(f'[agents.jcode]\nbinary = "{_hostile_binary(tmp_path)}"\n')
    neighbour.run("up", "--detach")
    cli.run("up", "--detach", env={sandbox.TMP_MIB_ENV: str(TMP_MIB)})
    try:
        bwork = tmp_path / "bwork"
        bwork.mkdir()
        (bwork / "notes.txt").write_text("the neighbour's work\n")
        assert neighbour.json("spawn", "neighbour", "--cwd", str(bwork))["state"] == "running"

        auth = root_b / ".cotal" / "auth"
        [signing_key] = sorted(auth.glob("manager-instance.*.json"))
        registry = roots.registry_dir()
        reads = {
            "B control token": auth / "control.token",
            "B broker credential": auth / "broker.creds",
            "B signing key": signing_key,
            "B's seat's cwd": bwork / "notes.txt",
            "system root's control token": system_root / ".cotal" / "auth" / "control.token",
        }
        lists = {"B": root_b, "system root": system_root, "roots registry": registry}
        for path in reads.values():
            assert path.read_bytes(), path
        for path in lists.values():
            assert os.listdir(path), path
        assert root_b in roots.known() and system_root in roots.known()
        plan = {
            "reads": {k: str(v) for k, v in reads.items()},
            "lists": {**{k: str(v) for k, v in lists.items()}, "parent": ".."},
            "connects": {"B control socket": str(root_b / ".cotal" / "manager.sock")},
            "writes": {
                "into B's seat's cwd": str(bwork / "planted.txt"),
                "into B": str(root_b / "planted.txt"),
                "into the roots registry": str(registry / "planted.json"),
            },
            "fill": TMP,
            "fillLimit": 4 * TMP_MIB << 20,
        }
        (root_a / "hostile-plan.json").write_text(json.dumps(plan))

        row = cli.json("spawn", "hostile", "--agent", "jcode")
        assert row["state"] == "running"
        results = {r["target"]: r for r in json.loads((root_a / "hostile-result.json").read_text())}
        got = {target: r["errno"] for target, r in results.items()}
        assert got == {
            "read B control token": "ENOENT",
            "read B broker credential": "ENOENT",
            "read B signing key": "ENOENT",
            "read B's seat's cwd": "ENOENT",
            "read system root's control token": "ENOENT",
            "list B": "ENOENT",
            "list system root": None,
            # Landlock grants no path there; without it the registry is an empty directory.
            "list roots registry": "EACCES" if sandbox.probe().landlock else None,
            "list parent": None,
            "connect B control socket": "ENOENT",
            "write into B's seat's cwd": "ENOENT",
            "write into B": "ENOENT",
            "write into the roots registry": "EROFS",
            "fill /tmp": "ENOSPC",
        }, json.dumps(results, indent=1)
        # What a seat can list there is empty: the system root and the registry are empty
        # read-only directories, and beside its own root it sees only what it was handed.
        assert results["list system root"]["detail"] == "listed []"
        if not sandbox.probe().landlock:
            assert results["list roots registry"]["detail"] == "listed []"
        assert results["list parent"]["detail"] == "listed ['bin', 'home', 'ws']"
        written = int(results["fill /tmp"]["detail"].split()[1])
        assert (TMP_MIB - 1) << 20 < written <= TMP_MIB << 20
        assert not (bwork / "planted.txt").exists()
        assert not (root_b / "planted.txt").exists()
        assert not (registry / "planted.json").exists()
        assert not list(Path(TMP).glob("fill-*"))

        # The seat's own root still works for it, under /tmp.
        assert cli.json("send", "hostile", "hello", "--wait")["reply"] == "OK."
        assert (root_a / "hostile-result.json").exists()
    finally:
        cli.run("down", check=False)
        neighbour.run("down", check=False)


def test_another_roots_manager_refuses_a_process_carrying_the_seat_mark(
    cli: Cli, neighbour: Cli
) -> None:
    """Even holding B's socket and token, a process under `no_new_privs` (every seat of every
    root runs under it) gets no reply from B's manager; the same hello unmarked is served. An
    operator's CLI under `no_new_privs` is told why."""
    neighbour.run("up", "--detach")
    try:
        sock = neighbour.root / ".cotal" / "manager.sock"
        token = (neighbour.root / ".cotal" / "auth" / "control.token").read_text().strip()
        assert _hello(sock, token, marked=True).stdout.strip() == "closed"
        served = json.loads(_hello(sock, token, marked=False).stdout)
        assert served["ok"] is True and served["result"] == {"hello": "ok"}
        refused = [
            e
            for e in _log(neighbour.root)
            if e.get("event") == "control.refused" and e.get("reason") == "seat-process"
        ]
        assert [e["detail"] for e in refused] == ["carries the seat mark (NoNewPrivs: 1)"]
        assert token not in (neighbour.root / ".cotal" / "logs" / "manager.log").read_text()

        from tests.conftest import cotal_env

        cli_argv = [sys.executable, "-m", "manager.cli", "ps", "--root", str(neighbour.root)]
        out = subprocess.run(
            ["setpriv", "--no-new-privs", "--", *cli_argv],
            capture_output=True,
            text=True,
            timeout=60,
            env=cotal_env(),
            cwd=neighbour.root,
            check=False,
        )
        assert out.returncode == 2
        assert out.stderr.startswith("cotal: the manager closed the connection at hello: ")
        assert "no_new_privs (NoNewPrivs: 1 in /proc/self/status)" in out.stderr, out.stderr
        assert "run cotal from a shell without no_new_privs" in out.stderr
        assert neighbour.json("status")["state"] == "active"
    finally:
        neighbour.run("down", check=False)


def test_a_seat_is_marked_whatever_its_isolation(tmp_path: Path, cli: Cli) -> None:
    """With isolation turned off the seat still runs under `no_new_privs`, so another root's
    manager still refuses it."""
    cli.run("up", "--detach", env={sandbox.ISOLATION_ENV: "none"})
    try:
        row = cli.json("spawn", "plain")
        assert row["isolation"] == "none"
        assert sandbox.carries_seat_mark(row["pid"]) is True
        assert sandbox.carries_seat_mark("self") is False
        wide = cli.run("ps", "--wide").stdout
        assert "isolation none: missing mount-ns: no mount namespace:" in wide
        assert "isolation none: missing landlock: no Landlock:" in wide
    finally:
        cli.run("down", check=False)
