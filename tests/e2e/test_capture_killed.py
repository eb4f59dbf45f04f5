"""A capture's worker killed in the middle of a seat's capture (issue 27's test, for the workers
this design has: the git processes a capture runs) is that seat's failure by name; the other
seat is captured, nothing is sealed, and a rerun of the same command seals both, which then
resume with their sessions and trees.

The git is real. For the one seat's bundle a shim in front of it on the manager's PATH parks a
process (`sleep`, the bundle's stand-in) and says where; the test kills it with SIGKILL, as the
kernel's OOM killer or an operator would. Every other git run, and the rerun's bundle, is the
real git.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from manager.checkpoint.gitstate import KILLED_CURE
from manager.workspace.journal import Journal
from manager.workspace.layout import Layout
from tests.conftest import Cli, cotal_env
from tests.gitrepo import git, init_repo, tree_digest, write
from tests.helpers import carry_to_new_host, pid_alive, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

PHRASES = {"victim": "cedar-lantern-12", "other": "quartz-harbor-58"}


def repo_for(path: Path, name: str) -> Path:
    init_repo(path)
    write(path / f"{name}.txt", f"{name}\n")
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "one")
    write(path / f"{name}.txt", f"{name}, changed\n")
    write(path / "notes.txt", "untracked\n")
    return path


def git_shim(directory: Path, victim: Path, started: Path) -> Path:
    """A `git` that, once, for `bundle create` in `victim`, becomes a parked process and writes
    its pid to `started`; otherwise the real git."""
    real = shutil.which("git")
    assert real is not None
    directory.mkdir()
    held = started.with_suffix(".held")
    shim = directory / "git"
    # SAFE_CONFIG's four arguments come first, so the subcommand is $5.
    shim.write_text(
        "#!/bin/sh\n"
        f'if [ "$(pwd -P)" = "{victim.resolve()}" ] && [ "$5" = bundle ] && [ "$6" = create ] '
        f'&& [ ! -e "{held}" ]; then\n'
        f'  : > "{held}"\n'
        f'  echo $$ > "{started}.tmp" && mv "{started}.tmp" "{started}"\n'
        "  exec sleep 600\n"
        "fi\n"
        f'exec "{real}" "$@"\n'
    )
    shim.chmod(0o755)
    return directory


async def run_cli(cli: Cli, *args: str) -> subprocess.CompletedProcess[bytes]:
    return await anyio.run_process(
        [sys.executable, "-m", "manager.cli", *args, "--root", str(cli.root)],
        check=False,
        env=cotal_env(cli.env),
        cwd=cli.root,
    )


async def test_a_git_killed_mid_capture_fails_that_seat_by_name_and_a_rerun_seals(
    tmp_path: Path, cli: Cli
) -> None:
    repos = {name: repo_for(cli.root / name, name) for name in PHRASES}
    before = {name: tree_digest(repo) for name, repo in repos.items()}
    started = tmp_path / "bundle-parked"
    shims = git_shim(tmp_path / "shims", repos["victim"], started)
    cli.env = {"PATH": f"{shims}:{os.environ['PATH']}"}
    cli.run("up", "--detach")
    rows = {
        name: cli.json(
            "spawn",
            name,
            "--agent",
            "scribe",
            "--cwd",
            str(repo),
            "--prompt",
            f"Remember the phrase {PHRASES[name]}. Reply with it.",
        )
        for name, repo in repos.items()
    }
    layout = Layout.at(cli.root)

    result: list[subprocess.CompletedProcess[bytes]] = []
    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:

            async def cut() -> None:
                result.append(await run_cli(cli, "down", "--preserve-state", "--json"))

            tg.start_soon(cut)
            await wait_until(started.exists, timeout=60, every=0.02)
            parked = int(started.read_text())
            assert pid_alive(parked)
            os.kill(parked, signal.SIGKILL)
    [failed] = result
    err = failed.stderr.decode()
    assert failed.returncode != 0, err
    assert "Traceback" not in err and "internal error" not in err
    refusal = json.loads([line for line in err.splitlines() if line.startswith("{")][-1])
    attempts = sorted((layout.maintenance / "checkpoints").iterdir())
    assert len(attempts) == 1 and ".failed-" in attempts[0].name
    attempt = attempts[0].name.split(".failed-")[0]
    assert refusal == {
        "ok": False,
        "code": "git-failed",
        "error": (
            f"cut {attempt} is incomplete: victim: `git bundle create --quiet - --glob=refs/* "
            f"HEAD` was killed by SIGKILL in {repos['victim']} before it finished; "
            f"{KILLED_CURE}; the seats are stopped and their durables kept; fix the cause and "
            f"rerun `cotal down --preserve-state` to capture again; evidence kept at {attempts[0]}"
        ),
    }
    # Nothing sealed: the attempt is kept aside as evidence, the journal stays at its intent,
    # and both seats are stopped, so the cut can only be finished.
    assert not (attempts[0] / "manifest.json").exists()
    record = Journal(layout).load()
    assert record is not None and record.state == "cut-intent"
    assert not pid_alive(rows["victim"]["pid"]) and not pid_alive(rows["other"]["pid"])

    with anyio.fail_after(120):
        done = await run_cli(cli, "down", "--preserve-state", "--json")
    assert done.returncode == 0, done.stderr.decode()
    sealed = json.loads(done.stdout)
    assert sealed["journal"] == "ready" and sealed["failures"] == []
    assert sorted(s["name"] for s in sealed["seats"]) == ["other", "victim"]
    checkpoint = Path(sealed["checkpointDir"])
    assert (checkpoint / "manifest.json").exists()

    copy = carry_to_new_host(cli.root, checkpoint, tmp_path)
    cli.env = {}
    out = json.loads(cli.run("up", "--restore", str(copy), "--json").stdout)
    assert sorted((s["name"], s["sameSession"], s["sameUid"]) for s in out["seats"]) == [
        ("other", True, True),
        ("victim", True, True),
    ]
    for name, repo in repos.items():
        assert tree_digest(repo) == before[name]
        reply = cli.json("send", name, "What was the phrase?", "--wait")["reply"]
        assert reply == f"The phrase is {PHRASES[name]}."
    cli.run("down")
