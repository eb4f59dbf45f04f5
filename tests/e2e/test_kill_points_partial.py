"""The kill-point matrix of a cut of some seats: `cotal down --preserve-state --seat moved`,
SIGKILLed at every step boundary while `keep` runs beside it, then the recovery the cut's
crash-only rule names (docs/cli.md, "`--seat NAME`").

Every point ends with the other seat untouched (`keep` running and answering, under its own pid
wherever the manager did not die), the cut seat's repository as it was, and either the old state
whole (an abort: `moved` runs on under its pid, no journal) or the cut sealed and journaled
`ready`, no unsealed attempt directory verifying; and then the sealed cut is resumed in place,
adopted back into the running mesh with its uid, its session and the message queued before the
cut answered.
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
from tests.e2e.test_kill_points import no_partial_admitted, seat_pids
from tests.gitrepo import git, init_repo, stash_list, tree_digest, write
from tests.helpers import wait_gone, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home"), pytest.mark.killpoints]

PHRASE = "heron-partial-31"
KEEP_PHRASE = "wren-stays-8"
NOTE = "queued-before-the-partial-cut-4"

# (failpoint, which command carries it, recovery). `up` is `cotal up --detach`: the manager it
# starts inherits the point and dies during the cut, taking both seats with it.
CUT, DAEMON = "down --preserve-state --seat", "up"
CHECKPOINTS = ".cotal/maintenance/v1/checkpoints"

POINTS: list[tuple[str, str, str]] = [
    ("cut.after-lock", CUT, "rerun"),
    ("cut.after-prepare", CUT, "rerun"),
    ("cut.after-prepare", CUT, "abort"),
    ("cut.after-cut-intent", CUT, "rerun"),
    ("cut.after-cut-intent", CUT, "abort"),
    ("cut.after-commit", CUT, "rerun"),
    ("cut.after-cut-committed", CUT, "rerun"),
    # Died before any cut was journaled: the next manager re-adopts both seats, and the cut is
    # simply run again.
    ("preserve.after-fence", DAEMON, "up-rerun"),
    ("preserve.after-drain", DAEMON, "up-rerun"),
    ("preserve.after-persist", DAEMON, "up-rerun"),
    # Died after the commit began: the rerun finishes the cut offline, then `cotal up` takes
    # `keep` back.
    ("preserve.after-seat-stopped", DAEMON, "offline"),
    ("preserve.before-manifest-seal", DAEMON, "offline"),
]

# What each kill leaves: the journal's state, and the manager's cut of some seats as `status`
# shows it (state, whether its commit began) while the manager still runs.
JOURNAL_LEFT: dict[str, str | None] = {
    "cut.after-lock": None,
    "cut.after-prepare": None,
    "cut.after-cut-intent": "cut-intent",
    "cut.after-commit": "cut-intent",
    "cut.after-cut-committed": "cut-committed",
    "preserve.after-fence": None,
    "preserve.after-drain": None,
    "preserve.after-persist": None,
    "preserve.after-seat-stopped": "cut-intent",
    "preserve.before-manifest-seal": "cut-intent",
}
FENCE_LEFT: dict[str, tuple[str, bool] | None] = {
    "cut.after-lock": None,
    "cut.after-prepare": ("preserving", False),
    "cut.after-cut-intent": ("preserving", False),
    "cut.after-commit": ("preserved", True),
    "cut.after-cut-committed": ("preserved", True),
}

# Cases a product defect is known to fail, with the defect (strict: a fix turns them red).
KNOWN: dict[str, str] = {}


def _cases() -> list[Any]:
    out = []
    for point, command, recovery in POINTS:
        case_id = f"{point}-{recovery}"
        marks = (
            [pytest.mark.xfail(strict=True, raises=AssertionError, reason=KNOWN[case_id])]
            if case_id in KNOWN
            else []
        )
        out.append(pytest.param(point, command, recovery, id=case_id, marks=marks))
    return out


def committed_repo(repo: Path, name: str) -> Path:
    """A committed repository with an unstaged edit and an untracked file over it."""
    init_repo(repo)
    write(repo / "README.md", f"# {name}\n")
    write(repo / "src/app.py", "print('v1')\n")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    write(repo / "src/app.py", "print('v2 unstaged')\n")
    write(repo / "notes/todo.txt", f"untracked notes of {name}\n")
    return repo


def snapshot(repo: Path) -> tuple[object, ...]:
    porcelain = git(repo, "status", "--porcelain=v1", "-z", "--untracked-files=all")
    return tree_digest(repo), porcelain, stash_list(repo), git(repo, "rev-parse", "HEAD")


def killed(out: subprocess.CompletedProcess[str]) -> None:
    """The command died, by its own kill point or refused because the manager it needed did;
    never by a traceback."""
    assert out.returncode != 0, (out.stdout, out.stderr)
    assert "Traceback" not in out.stderr + out.stdout, out.stderr


def table(cli: Cli) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in cli.ps()}


async def settled(cli: Cli, names: list[str]) -> dict[str, dict[str, Any]]:
    """The table once `cotal up --detach` has re-adopted `names`: the manager answers (and `up`
    returns) while its re-adoptions still run, so a seat may be `restarting` at first."""
    seats: dict[str, dict[str, Any]] = {}

    def done() -> bool:
        seats.clear()
        seats.update(table(cli))
        states = {seats[n]["state"] if n in seats else None for n in names}
        # A seat refused or crashed for good does not come back by waiting.
        return states == {"running"} or bool(states & {None, "failed", "retired", "evicted"})

    await wait_until(done, timeout=20, every=0.1)
    assert {n: seats.get(n, {}).get("state") for n in names} == dict.fromkeys(names, "running"), (
        f"{seats}\n{evidence(cli)}"
    )
    return seats


def journal_state(cli: Cli) -> str | None:
    record = Journal(Layout.at(cli.root)).load() if Layout.at(cli.root).journal.exists() else None
    return None if record is None else record.state


def evidence(cli: Cli) -> str:
    """What a failed assertion shows: the journal and the manager's own account."""
    status = cli.run("status", "--json", check=False)
    return f"journal: {journal_state(cli)}\nstatus: {status.stdout}{status.stderr}"


def answers(cli: Cli, seat: str, phrase: str) -> None:
    reply = cli.json("send", seat, "What was the phrase?", "--wait")
    assert reply["reply"] == f"The phrase is {phrase}.", reply


def store_text(cli: Cli, seat: dict[str, Any]) -> str:
    store = cli.root / ".cotal/sessions/scribe" / f"{seat['name']}-{seat['lifecycleUid']}.store"
    return "\n".join(p.read_text(errors="replace") for p in store.rglob("*") if p.is_file())


def note_handled(cli: Cli, moved: dict[str, Any]) -> None:
    # One message in flight, FIFO: the note queued before the cut was handled before the
    # question just answered.
    assert NOTE in store_text(cli, moved), evidence(cli)


def cut_seat(cli: Cli, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return cli.run(
        "down", "--preserve-state", "--seat", "moved", "--json", check=False, timeout=60, env=env
    )


@pytest.mark.parametrize(("point", "command", "recovery"), _cases())
async def test_partial_kill_point(cli: Cli, point: str, command: str, recovery: str) -> None:
    fail = {"COTAL_FAILPOINT": point}
    keep_repo = committed_repo(cli.root / "keep", "keep")
    moved_repo = committed_repo(cli.root / "moved", "moved")
    cli.run("up", "--detach", env=fail if command == DAEMON else None)
    keep = cli.json(
        "spawn", "keep", "--agent", "scribe", "--cwd", str(keep_repo),
        "--prompt", f"Remember the phrase {KEEP_PHRASE}.",
    )  # fmt: skip
    moved = cli.json(
        "spawn", "moved", "--agent", "scribe", "--cwd", str(moved_repo),
        "--prompt", f"Remember the phrase {PHRASE}.",
    )  # fmt: skip
    before = snapshot(moved_repo)
    # Sent without waiting behind a slow turn: in flight or queued when the fence lands.
    cli.json("send", "moved", f"#slow:1000 {NOTE}")

    died = cut_seat(cli, env=fail if command == CUT else None)
    killed(died)
    no_partial_admitted(cli, cli.root / CHECKPOINTS, None)

    assert journal_state(cli) == JOURNAL_LEFT[point], evidence(cli)
    if command == CUT:
        # Only the coordinator died: the manager, the broker and `keep` ran on untouched, and
        # the fence, if any, holds `moved` alone.
        status = cli.json("status")
        left = status["partialCut"]
        fence = None if left is None else (left["state"], left["commitStarted"])
        assert fence == FENCE_LEFT[point], evidence(cli)
        assert left is None or left["seats"] == ["moved"], left
        assert status["manager"]["state"] == "active", status
        assert table(cli)["keep"]["pid"] == keep["pid"], evidence(cli)
        answers(cli, "keep", KEEP_PHRASE)
    if recovery == "abort":
        aborted = cli.json("down", "--preserve-state", "--abort")
        assert aborted["aborted"] is True, aborted
        assert journal_state(cli) is None
        seats = table(cli)
        assert {n: (r["state"], r["pid"]) for n, r in seats.items()} == {
            "keep": ("running", keep["pid"]),
            "moved": ("running", moved["pid"]),
        }, evidence(cli)
        answers(cli, "moved", PHRASE)
        note_handled(cli, moved)
        answers(cli, "keep", KEEP_PHRASE)
        assert snapshot(moved_repo) == before
        # The fence is lifted for good: the same cut now runs whole, and resumes in place below.
        cut = cut_seat(cli)
    elif recovery == "rerun":
        cut = cut_seat(cli)
    else:
        # The manager's death takes both seats with it.
        await wait_gone(seat_pids(cli.root), timeout=30)
        if recovery == "up-rerun":
            cli.run("up", "--detach")
            seats = await settled(cli, ["keep", "moved"])
            assert {n: (r["state"], r["lifecycleUid"]) for n, r in seats.items()} == {
                "keep": ("running", keep["lifecycleUid"]),
                "moved": ("running", moved["lifecycleUid"]),
            }, evidence(cli)
        if point == "preserve.before-manifest-seal":
            # A rerun may leave `--seat` out: the journal names the cut of some seats.
            cut = cli.run("down", "--preserve-state", "--json", check=False, timeout=60)
        else:
            cut = cut_seat(cli)
    assert cut.returncode == 0, f"{cut.stdout}\n{cut.stderr}\n{evidence(cli)}"
    result = json.loads(cut.stdout)
    assert result["journal"] == "ready", result
    # A cut of some seats says so, finished through the manager or, in its place and saying
    # that too, offline.
    assert (result["partial"], result.get("offline")) == (
        True,
        True if recovery == "offline" else None,
    ), result
    assert [s["lifecycleUid"] for s in result["seats"]] == [moved["lifecycleUid"]], result
    assert journal_state(cli) == "ready"
    sealed = Path(result["checkpointDir"])
    no_partial_admitted(cli, cli.root / CHECKPOINTS, sealed)
    assert snapshot(moved_repo) == before

    if recovery == "offline":
        # Finished offline: the manager is gone; a plain `cotal up` takes `keep` back.
        cli.run("up", "--detach")
        await settled(cli, ["keep"])
    seats = table(cli)
    assert sorted(seats) == ["keep"] and seats["keep"]["state"] == "running", evidence(cli)
    assert seats["keep"]["lifecycleUid"] == keep["lifecycleUid"]
    if command == CUT:
        assert seats["keep"]["pid"] == keep["pid"]
    keep_pid = seats["keep"]["pid"]
    answers(cli, "keep", KEEP_PHRASE)

    # In place: the running mesh adopts `moved` back from its own sealed cut, `keep` running.
    restore = cli.run("up", "--restore", str(sealed), "--json", check=False, timeout=60)
    assert restore.returncode == 0, f"{restore.stdout}\n{restore.stderr}\n{evidence(cli)}"
    restored = json.loads(restore.stdout)
    assert (restored["adopted"], restored["journal"]) == (True, "retired"), restored
    [seat] = restored["seats"]
    assert (seat["name"], seat["uidAfter"], seat["sessionAfter"]) == (
        "moved",
        moved["lifecycleUid"],
        moved["sessionId"],
    ), restored
    answers(cli, "moved", PHRASE)
    note_handled(cli, moved)
    assert snapshot(moved_repo) == before
    seats = table(cli)
    assert {n: r["state"] for n, r in seats.items()} == {"keep": "running", "moved": "running"}
    assert seats["keep"]["pid"] == keep_pid
    assert seats["moved"]["sessionId"] == moved["sessionId"]
    answers(cli, "keep", KEEP_PHRASE)
    cli.run("down")
