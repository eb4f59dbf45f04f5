"""The kill-point matrix: SIGKILL of the coordinator, the manager or the broker at every step
boundary of the cut and of the resume, then the recovery `docs/operations.md` names for it.

Every point must end with the old state intact (an abort) or the new state complete (a rerun):
the repository's bytes, index and stashes as they were, the seat answering its phrase, the
message queued before the cut answered, and no unsealed attempt directory admitted.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from manager.workspace.journal import Journal
from manager.workspace.layout import Layout
from tests.conftest import Cli
from tests.gitrepo import git, init_repo, stash_list, tree_digest, write
from tests.helpers import carry_to_new_host, pid_alive, wait_gone, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home"), pytest.mark.killpoints]

PHRASE = "kestrel-point-12"
NOTE = "queued-before-the-cut-5"

# (failpoint, which command carries it, recovery). `up` is `cotal up --detach`: the manager it
# starts inherits the point and dies during the cut.
CUT, DAEMON, RESUME = "down --preserve-state", "up", "up --restore"
POINTS: list[tuple[str, str, str]] = [
    ("cut.after-lock", CUT, "rerun"),
    ("cut.after-prepare", CUT, "rerun"),
    ("cut.after-prepare", CUT, "abort"),
    ("cut.after-cut-intent", CUT, "rerun"),
    ("cut.after-cut-intent", CUT, "abort"),
    ("cut.after-commit", CUT, "rerun"),
    ("cut.after-cut-committed", CUT, "rerun"),
    ("cut.after-manager-stopped", CUT, "rerun"),
    ("cut.after-broker-stopped", CUT, "rerun"),
    ("cut.after-cut-intent:manager", CUT, "rerun"),
    ("cut.after-prepare:broker", CUT, "rerun"),
    # The broker killed at each step of the cut and of the resume, the coordinator carrying on:
    # every rerun starts the broker again.
    ("cut.after-cut-intent:broker", CUT, "rerun"),
    ("resume.after-admission:broker", RESUME, "rerun"),
    ("resume.after-resume-intent:broker", RESUME, "rerun"),
    ("resume.after-custody-claim:broker", RESUME, "rerun"),
    ("preserve.after-fence", DAEMON, "up-rerun"),
    ("preserve.after-drain", DAEMON, "up-rerun"),
    ("preserve.after-persist", DAEMON, "up-rerun"),
    ("preserve.after-seat-stopped", DAEMON, "rerun"),
    ("preserve.after-seat-sealed", DAEMON, "rerun"),
    ("preserve.before-manifest-seal", DAEMON, "rerun"),
    ("resume.after-admission", RESUME, "rerun"),
    ("resume.after-resume-intent", RESUME, "rerun"),
    ("resume.after-custody-claim", RESUME, "rerun"),
    ("resume.after-trees-restored", RESUME, "rerun"),
    ("resume.after-manager-started", RESUME, "rerun"),
    ("resume.after-resume-preserved", RESUME, "rerun"),
    ("resume.after-resume-active", RESUME, "rerun"),
    ("resume.after-commit-resume", RESUME, "rerun"),
    ("resume.after-resume-committed", RESUME, "rerun"),
    ("resume.after-finalize", RESUME, "rerun"),
    ("resume.daemon.after-seat-adopted", RESUME, "rerun"),
    ("resume.daemon.after-commit-resume", RESUME, "rerun"),
    ("resume.daemon.after-finalize", RESUME, "rerun"),
    ("resume.after-manager-started:broker", RESUME, "rerun"),
    ("cut.after-lock:broker", CUT, "rerun"),
    ("resume.after-trees-restored:broker", RESUME, "rerun"),
    ("resume.after-resume-preserved:broker", RESUME, "rerun"),
    ("resume.after-resume-active:broker", RESUME, "rerun"),
    # Past the commit the cut stops the broker anyway, and the resume starts a dead one again
    # before it finalizes and after: the command itself finishes.
    ("cut.after-commit:broker", CUT, "finishes"),
    ("cut.after-cut-committed:broker", CUT, "finishes"),
    ("resume.after-commit-resume:broker", RESUME, "finishes"),
    ("resume.after-resume-committed:broker", RESUME, "finishes"),
    ("resume.after-finalize:broker", RESUME, "finishes"),
]


def _cases() -> list[Any]:
    out = []
    for point, command, recovery in POINTS:
        case_id = f"{point}-{recovery}"
        out.append(pytest.param(point, command, recovery, id=case_id))
    return out


def make_repo(repo: Path) -> None:
    """Staged, unstaged and untracked changes over two stashes."""
    init_repo(repo)
    write(repo / "README.md", "# kill points\n")
    write(repo / "src/app.py", "print('v1')\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    for n in (1, 2):
        write(repo / "src/app.py", f"print('stashed {n}')\n")
        git(repo, "stash", "push", "-q", "-m", f"stash {n}")
    write(repo / "src/app.py", "print('v2 staged')\n")
    git(repo, "add", "src/app.py")
    write(repo / "src/app.py", "print('v3 unstaged')\n")
    write(repo / "notes/todo.txt", "untracked notes\n")


def porcelain(repo: Path) -> bytes:
    return git(repo, "status", "--porcelain=v1", "-z", "--untracked-files=all")


def snapshot(repo: Path) -> tuple[object, ...]:
    return tree_digest(repo), porcelain(repo), stash_list(repo), git(repo, "rev-parse", "HEAD")


def store_texts(root: Path) -> str:
    return "\n".join(
        p.read_text(errors="replace")
        for p in (root / ".cotal" / "sessions").rglob("*")
        if p.is_file()
    )


def killed(out: subprocess.CompletedProcess[str]) -> None:
    """The command died, by its own kill point or refused because a process it needed did;
    never by a traceback."""
    assert out.returncode != 0, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr + out.stdout, out.stderr


def no_partial_admitted(cli: Cli, checkpoints: Path, sealed: Path | None) -> None:
    """Every attempt directory without its manifest refuses; once the cut is done, so does
    every one but the sealed attempt (a try moved aside as evidence)."""
    if not checkpoints.is_dir():
        return
    for d in checkpoints.iterdir():
        if not d.is_dir():
            continue
        if sealed is None and (d / "manifest.json").exists():
            # Sealed before the kill: the recovery finishes this very attempt.
            continue
        if sealed is None or d.resolve() != sealed.resolve():
            verify = cli.run("checkpoint", "verify", str(d), "--json", check=False)
            assert verify.returncode != 0, f"unsealed {d} verified: {verify.stdout}"


def seat_pids(root: Path) -> list[int]:
    pids = []
    for f in (root / ".cotal" / "seats").glob("*.json"):
        try:
            pid = json.loads(f.read_text()).get("pid")
        except ValueError:
            continue
        if isinstance(pid, int):
            pids.append(pid)
    return pids


def answers(cli: Cli) -> None:
    reply = cli.json("send", "scribe", "What was the phrase?", "--wait")
    assert reply["reply"] == f"The phrase is {PHRASE}.", reply
    # One message in flight, FIFO: the note queued before the cut was handled before this.
    assert NOTE in store_texts(cli.root)


@pytest.mark.parametrize(("point", "command", "recovery"), _cases())
async def test_kill_point(
    tmp_path: Path, cli: Cli, point: str, command: str, recovery: str
) -> None:
    fail = {"COTAL_FAILPOINT": point}
    if point.endswith(":broker"):
        # The killed embedded broker never comes back by waiting: the command that meets it
        # dead refuses after this much rather than the election budget (25 s), and the rerun
        # starts it again. What is asserted is unchanged; only the waiting is shorter.
        cli.env["COTAL_BROKER_PATIENCE_S"] = "5"
    repo = cli.root / "repo"
    make_repo(repo)
    cli.run("up", "--detach", env=fail if command == DAEMON else None)
    cli.json(
        "spawn", "scribe", "--agent", "scribe", "--cwd", str(repo),
        "--prompt", f"Remember the phrase {PHRASE}.",
    )  # fmt: skip
    before = snapshot(repo)
    # Sent without waiting behind a slow turn: in flight or queued when the fence lands.
    cli.json("send", "scribe", f"#slow:1000 {NOTE}")
    checkpoints = cli.root / ".cotal/maintenance/v1/checkpoints"

    cut = cli.run(
        "down", "--preserve-state", "--json", check=False, timeout=90,
        env=fail if command in (CUT, DAEMON) else None,
    )  # fmt: skip
    if command in (CUT, DAEMON) and recovery != "finishes":
        killed(cut)
        no_partial_admitted(cli, checkpoints, None)
        if recovery == "abort":
            aborted = cli.json("down", "--preserve-state", "--abort")
            assert aborted["aborted"] is True, aborted
            assert not (cli.root / ".cotal/maintenance/v1/journal.json").exists()
            assert [r["state"] for r in cli.ps()] == ["running"]
            answers(cli)
            assert snapshot(repo) == before
            cli.run("down")
            return
        # The manager's death takes its seats with it; the rerun proves them gone itself.
        await wait_gone(seat_pids(cli.root), timeout=30)
        if recovery == "up-rerun":
            # Died before any cut was journaled: the next manager re-adopts every seat, so the
            # mesh is as it was before the cut, and the cut is simply run again.
            cli.run("up", "--detach")
            # `up` returns once the manager answers; its re-adoption may still be relaunching.
            await wait_until(
                lambda: [r["state"] for r in cli.ps()] == ["running"], timeout=30, every=0.3
            )
        cut = cli.run("down", "--preserve-state", "--json", check=False, timeout=90)
    assert cut.returncode == 0, cut.stderr
    result = json.loads(cut.stdout)
    assert result["journal"] == "ready" or result.get("alreadyComplete"), result
    sealed = Path(result["checkpointDir"])
    no_partial_admitted(cli, checkpoints, sealed)
    assert snapshot(repo) == before

    copy = carry_to_new_host(cli.root, sealed, tmp_path)
    restore = cli.run(
        "up", "--restore", str(copy), "--json", check=False, timeout=90,
        env=fail if command == RESUME else None,
    )  # fmt: skip
    if command == RESUME and recovery != "finishes":
        killed(restore)
        await wait_gone([p for p in seat_pids(cli.root) if pid_alive(p)], timeout=30)
        left = Journal(Layout.at(cli.root)).load()
        # Past resume-active the seats ran on the restored trees: what they wrote since is
        # theirs, and a rerun that restored again would lose it.
        ran = left is not None and left.state in ("resume-active", "resume-committed")
        if ran:
            write(repo / "written-after-active.txt", "kept\n")
        restore = cli.run("up", "--restore", str(copy), "--json", check=False, timeout=90)
        if ran:
            assert (repo / "written-after-active.txt").read_text() == "kept\n"
            (repo / "written-after-active.txt").unlink()
    assert restore.returncode == 0, restore.stderr
    assert json.loads(restore.stdout)["journal"] == "retired"
    journal = Journal(Layout.at(cli.root)).load()
    assert journal is not None and journal.state == "retired"
    answers(cli)
    assert snapshot(repo) == before
    cli.run("down")


# -- a capture that fails deterministically after the commit, then the abort ----------------------

# SIGKILL of the abort's coordinator at each of its step boundaries (None: no kill), after a cut
# whose capture failed with its seat stopped; the recovery is always the rerun of `--abort`.
ABORT_POINTS: list[str | None] = [None, "cut.abort.after-lock", "cut.abort.after-fence-lifted"]


@pytest.mark.parametrize("point", ABORT_POINTS, ids=lambda p: p or "no-kill")
async def test_abort_after_a_failed_capture(
    cli: Cli, isolated_home: Path, point: str | None
) -> None:
    repo = cli.root / "repo"
    make_repo(repo)
    # A session store with a symlink in it: the capture refuses it (`unsafe-store`) every time,
    # after the commit stopped the seat, and no rerun cures it while the link is there.
    store = isolated_home / "odd-store"
    write(store / "real.jsonl", "{}\n")
    (store / "link.jsonl").symlink_to(store / "real.jsonl")
    cli.run("up", "--detach")
    seat = cli.json(
        "spawn", "scribe", "--agent", "scribe", "--cwd", str(repo),
        "--prompt", f"Remember the phrase {PHRASE}.",
    )  # fmt: skip
    before = snapshot(repo)
    cli.json("send", "scribe", f"#slow:1000 {NOTE}")
    checkpoints = cli.root / ".cotal/maintenance/v1/checkpoints"
    for _ in range(2):
        cut = cli.run(
            "down", "--preserve-state", "--session-store", str(store), "--json", check=False,
            timeout=90,
        )  # fmt: skip
        assert cut.returncode == 2 and '"code": "unsafe-store"' in cut.stderr, cut.stderr
        assert [r["state"] for r in cli.ps()] == ["stopped"]
    # Two tries, two directories of evidence: the first moved aside as `.failed-`; the second
    # too, unless it failed within the same second (the evidence's name is then taken, and it
    # keeps the attempt's name, unsealed).
    evidence = sorted(checkpoints.iterdir())
    assert len(evidence) == 2 and any(".failed-" in p.name for p in evidence), evidence
    assert not any((p / "manifest.json").exists() for p in evidence)
    no_partial_admitted(cli, checkpoints, None)
    if point is not None:
        killed(
            cli.run(
                "down",
                "--preserve-state",
                "--abort",
                "--json",
                check=False,
                env={"COTAL_FAILPOINT": point},
            )  # fmt: skip
        )
    aborted = cli.json("down", "--preserve-state", "--abort")
    assert aborted["aborted"] is True and aborted["journalDiscarded"] is True, aborted
    assert not (cli.root / ".cotal/maintenance/v1/journal.json").exists()
    [row] = cli.ps()
    assert row["state"] == "running" and row["pid"] != seat["pid"]
    assert (row["lifecycleUid"], row["sessionId"]) == (seat["lifecycleUid"], seat["sessionId"])
    answers(cli)
    assert snapshot(repo) == before
    assert sorted(checkpoints.iterdir()) == evidence
    no_partial_admitted(cli, checkpoints, None)
    cli.run("down")
