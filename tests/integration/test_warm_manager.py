"""The warm manager (manager/coord/warm.py): an interpreter a coordinator starts early, which
becomes the manager only when it is handed the arguments, and otherwise leaves nothing behind.

Real processes throughout: the warm child is `python -m manager.cli manager warm`, the
coordinator is the real CLI.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Cli
from tests.gitrepo import git, init_repo, write
from tests.helpers import carry_to_new_host, processes_mentioning, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]


def warm_child(root: Path) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "manager.cli", "manager", "warm", "--root", str(root)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=root,
    )


def warm_pids(root: Path) -> list[int]:
    found = []
    for pid in processes_mentioning(str(root)):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"warm" in cmd:
            found.append(pid)
    return found


def test_a_warm_child_whose_coordinator_goes_away_exits_having_done_nothing(
    tmp_path: Path,
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    proc = warm_child(root)
    out, err = proc.communicate(b"", timeout=60)
    assert (proc.returncode, out, err) == (0, b"", b"")
    assert list(root.iterdir()) == []


@pytest.mark.parametrize(
    ("line", "refused"),
    [
        (
            b'{"argv": ["manager", "serve"], "out": "/dev/null", "extra": 1}\n',
            b"Object contains unknown field `extra`",
        ),
        (
            b'{"argv": ["down", "--preserve-state"], "out": "/dev/null"}\n',
            b"a warm manager only serves; it was asked for ['down', '--preserve-state']",
        ),
        (b'{"argv": ["manager", "serve"], "out": "/dev/null"}', b"exceed"),
        (b"x" * (64 * 1024 + 10) + b"\n", b"exceed 65536 bytes"),
    ],
    ids=["unknown-field", "not-serve", "no-newline", "oversize"],
)
def test_a_warm_child_refuses_anything_but_the_managers_own_arguments(
    tmp_path: Path, line: bytes, refused: bytes
) -> None:
    root = tmp_path / "root"
    root.mkdir()
    proc = warm_child(root)
    out, err = proc.communicate(line, timeout=60)
    assert proc.returncode == 2, (out, err)
    assert refused in out + err
    # Nothing was served: no socket, no log, no control directory.
    assert list(root.iterdir()) == []


async def test_up_hands_the_warm_child_its_arguments_and_down_leaves_no_process(
    cli: Cli,
) -> None:
    cli.run("up", "--detach")
    status = cli.json("status")
    cmdline = Path(f"/proc/{status['pid']}/cmdline").read_bytes().split(b"\0")
    assert cmdline[-4:-1] == [b"warm", b"--root", str(cli.root).encode()]
    out = (cli.root / ".cotal" / "logs" / "daemon.out").stat()
    assert out.st_mode & 0o777 == 0o600
    cli.run("down")
    await wait_until(lambda: processes_mentioning(str(cli.root)) == [], timeout=15)


async def test_a_refused_restore_reaps_its_warm_child(cli: Cli, tmp_path: Path) -> None:
    not_a_checkpoint = tmp_path / "nothing-sealed"
    not_a_checkpoint.mkdir()
    (not_a_checkpoint / "manifest.json").write_text("{}")
    cli.root.mkdir(parents=True, exist_ok=True)
    out = cli.run("up", "--restore", str(not_a_checkpoint), check=False)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr
    # Reaped before the command returned, not left to find its end of the pipe later.
    assert warm_pids(cli.root) == []
    assert not (cli.root / ".cotal" / "mesh.json").exists()


async def test_a_coordinator_killed_before_the_manager_start_leaves_no_warm_child(
    cli: Cli, tmp_path: Path
) -> None:
    init_repo(cli.root)
    write(cli.root / "f.txt", "x\n")
    git(cli.root, "add", "f.txt")
    git(cli.root, "commit", "-q", "-m", "one")
    cli.run("up", "--detach")
    cli.json("spawn", "kim", "--agent", "scribe")
    cut = json.loads(cli.run("down", "--preserve-state", "--json").stdout)
    copy = carry_to_new_host(cli.root, Path(cut["checkpointDir"]), tmp_path)
    killed = cli.run(
        "up",
        "--restore",
        str(copy),
        check=False,
        env={"COTAL_FAILPOINT": "resume.after-trees-restored"},
    )
    assert killed.returncode == -9, killed.stderr
    # Its stdin closed with the coordinator: the warm child ends without serving anything.
    await wait_until(lambda: warm_pids(cli.root) == [], timeout=30)
    assert not (cli.root / ".cotal" / "manager.sock").exists()
    # The rerun finishes the resume with a manager of its own.
    done = json.loads(cli.run("up", "--restore", str(copy), "--json").stdout)
    assert done["state"] == "active" and [s["name"] for s in done["seats"]] == ["kim"]
    cli.run("down")
