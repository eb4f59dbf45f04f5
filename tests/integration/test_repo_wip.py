"""Work in progress is refused exactly (issue 42 item 6): a merge with conflicts, a rebase, `git
am`, a cherry-pick, a revert, a cherry-pick sequence and a bisect, each reached by running git
itself (not by planting its marker), and a nested repository that is not a submodule. Each
refuses by name, with the cure, before anything is written; the cure run, the same tree cuts.

Why refused rather than carried: each operation keeps its state in files of the git dir (the
todo list, the original HEAD, the conflict stages, the bisect log) that name this host's paths
and commits a bundle does not order; half of it carried would let `--continue` at the
destination do something else than here. docs/design.md, capture section.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from manager.checkpoint.gitstate import preflight_repository
from protocol.errors import Refusal
from tests.conftest import Cli
from tests.gitrepo import committed_repo, full_digest, git, init_repo, write
from tests.helpers import refused

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

PHRASE = "plover-wip-7"


def _diverged(repo: Path) -> Path:
    """`main` and `other` each change c.txt's one line: any replay of one onto the other
    conflicts."""
    init_repo(repo)
    write(repo / "c.txt", "base\n")
    git(repo, "add", "c.txt")
    git(repo, "commit", "-q", "-m", "base")
    git(repo, "checkout", "-q", "-b", "other")
    for n in (1, 2):
        write(repo / "c.txt", f"other {n}\n")
        git(repo, "commit", "-q", "-am", f"other {n}")
    git(repo, "checkout", "-q", "main")
    write(repo / "c.txt", "main\n")
    git(repo, "commit", "-q", "-am", "main")
    return repo


def _merge(repo: Path) -> None:
    git(repo, "merge", "other", check=False)


def _rebase(repo: Path) -> None:
    git(repo, "rebase", "other", check=False)


def _am(repo: Path) -> None:
    patch = git(repo, "format-patch", "-1", "--stdout", "other")
    git(repo, "am", stdin=patch, check=False)


def _cherry_pick(repo: Path) -> None:
    git(repo, "cherry-pick", "other", check=False)


def _revert(repo: Path) -> None:
    git(repo, "revert", "--no-edit", "HEAD~1", check=False)


def _sequence(repo: Path) -> None:
    git(repo, "cherry-pick", "other~1", "other", check=False)


def _bisect(repo: Path) -> None:
    git(repo, "bisect", "start", "main", "main~1")


# (operation, how git gets there, the marker the refusal names, the cure git itself offers)
OPERATIONS: list[tuple[str, Callable[[Path], None], str, list[str]]] = [
    ("merge", _merge, "MERGE_HEAD", ["merge", "--abort"]),
    ("rebase", _rebase, "rebase-merge", ["rebase", "--abort"]),
    ("am", _am, "rebase-apply", ["am", "--abort"]),
    ("cherry-pick", _cherry_pick, "CHERRY_PICK_HEAD", ["cherry-pick", "--abort"]),
    ("revert", _revert, "REVERT_HEAD", ["revert", "--abort"]),
    ("sequence", _sequence, "CHERRY_PICK_HEAD", ["cherry-pick", "--abort"]),
    ("bisect", _bisect, "BISECT_LOG", ["bisect", "reset"]),
]


@pytest.mark.parametrize(
    ("operation", "start", "marker", "cure"), OPERATIONS, ids=[o[0] for o in OPERATIONS]
)
async def test_an_operation_in_progress_is_refused_by_name_and_its_cure_cuts(
    tmp_path: Path, operation: str, start: Callable[[Path], None], marker: str, cure: list[str]
) -> None:
    repo = _diverged(tmp_path / "repo")
    start(repo)
    assert (repo / ".git" / marker).exists(), f"git did not leave {operation} in progress"
    before = full_digest(repo)
    with pytest.raises(Refusal) as err:
        await preflight_repository(repo)
    assert err.value.code == "operation-in-progress"
    assert f"(.git/{marker} exists)" in err.value.message and str(repo) in err.value.message
    assert " ".join(cure) in err.value.cure, err.value.cure
    # Nothing written, not even the index's stat refresh.
    assert full_digest(repo) == before
    git(repo, *cure)
    await preflight_repository(repo)


async def test_a_nested_repository_is_refused_by_name_unless_declared_ignored(
    tmp_path: Path,
) -> None:
    repo = committed_repo(tmp_path / "repo")
    committed_repo(repo / "tools" / "inner", "inner")
    before = full_digest(repo)
    with pytest.raises(Refusal) as err:
        await preflight_repository(repo)
    assert err.value.code == "untracked-unsupported"
    assert "tools/inner/" in err.value.message and str(repo) in err.value.message
    assert full_digest(repo) == before
    # Ignored and not declared, it is the operator's to carry: the cut goes on without it.
    write(repo / ".gitignore", "tools/\n")
    git(repo, "add", ".gitignore")
    git(repo, "commit", "-q", "-m", "ignore tools")
    await preflight_repository(repo)


async def test_a_seat_mid_rebase_refuses_the_cut_and_nothing_stops(cli: Cli) -> None:
    repo = _diverged(cli.root / "repo")
    _rebase(repo)
    cli.run("up", "--detach")
    try:
        seat = cli.json(
            "spawn", "wip", "--agent", "scribe", "--cwd", str(repo),
            "--prompt", f"Remember the phrase {PHRASE}.",
        )  # fmt: skip
        before = full_digest(repo)
        out = cli.run("down", "--preserve-state", "--json", check=False)
        message = refused(out, "operation-in-progress")
        assert "seat wip" in message and "a rebase is in progress" in message
        assert "nothing was stopped" in message
        assert "`git rebase --abort`, then cut again" in message
        [row] = cli.ps()
        assert (row["pid"], row["state"]) == (seat["pid"], "running")
        assert not (cli.root / ".cotal/maintenance/v1/journal.json").exists()
        checkpoints = cli.root / ".cotal/maintenance/v1/checkpoints"
        assert not checkpoints.exists() or list(checkpoints.iterdir()) == []
        assert full_digest(repo) == before
        reply = cli.json("send", "wip", "what was the phrase?", "--wait")
        assert reply["reply"] == f"The phrase is {PHRASE}.", reply
    finally:
        cli.run("down", check=False)
