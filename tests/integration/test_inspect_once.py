"""Inspect once: the capture reuses the preflight only where it proves the input unchanged.

Every git process the capture starts is counted through a logging shim put in place of the git
binary; the repositories, the git runs and the artifacts are real.
"""

from __future__ import annotations

import hashlib
import shutil
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from manager.checkpoint import gitstate
from manager.checkpoint.gitstate import (
    capture_repository,
    names_tracked_change,
    preflight_repository,
)
from manager.checkpoint.inspect import InspectionCache, index_stamp
from manager.checkpoint.restore import restore_repository
from protocol.checkpoint import RepositoryRecord, porcelain_by_path
from protocol.codec import encode_json
from protocol.errors import Refusal
from tests.gitrepo import git, init_repo, make_rich_repo, seat_dir_for, write

pytestmark = pytest.mark.usefixtures("isolated_home")

# The rich repository has a stash, an intent-to-add entry and a config without credentials:
# the index scan asks two diffs for the intent-to-add entries, the capture reads the stash
# reflog at each end, and there is no redaction read-back. Runs that may overlap are listed
# sorted (`_overlapping_sorted`).
PREFLIGHT = ["rev-parse", "for-each-ref", *sorted(["ls-files", "diff", "diff", "status", "config"])]
PROBE = ["rev-parse", "for-each-ref", "reflog"]
CHECK = ["rev-parse", "for-each-ref", "status", "reflog"]
ARTIFACTS = ["bundle", "diff", "diff"]
CAPTURE_REUSING = PROBE + sorted(["status", *ARTIFACTS]) + CHECK
CAPTURE_ALONE = PROBE + sorted(PREFLIGHT[2:] + ARTIFACTS) + CHECK


class GitLog:
    """A shim in place of git that logs each run's subcommand, then runs the real git."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on: str = "") -> None:
        self.path = tmp_path / "git-runs.log"
        self.path.write_text("")
        shim = tmp_path / "git-shim"
        real = shutil.which("git")
        assert real is not None
        # SAFE_CONFIG's four arguments come first; the fifth is the subcommand.
        shim.write_text(
            f'#!/bin/sh\nprintf "%s\\n" "$5" >> "{self.path}"\n{on}\nexec "{real}" "$@"\n'
        )
        shim.chmod(0o755)
        monkeypatch.setattr(gitstate, "GIT", str(shim))

    def take(self) -> list[str]:
        runs = self.path.read_text().splitlines()
        self.path.write_text("")
        return _overlapping_sorted(runs)


# The runs that may start in either order: the index scan (`ls-files` and its two intent-to-add
# diffs) beside the status, and the bundle beside the whole inspection and the diffs (docs/
# design.md decision 19); which git starts first is the scheduler's choice.
OVERLAPPING = frozenset({"bundle", "diff", "ls-files", "status", "config"})


def _overlapping_sorted(runs: list[str]) -> list[str]:
    """`runs` with each stretch of runs that may overlap sorted."""
    out: list[str] = []
    stretch: list[str] = []
    for run in runs:
        if run in OVERLAPPING:
            stretch.append(run)
            continue
        out += sorted(stretch) + [run]
        stretch = []
    return out + sorted(stretch)


def _artifacts(record: RepositoryRecord, seat: Path) -> dict[str, bytes]:
    return {ref.file: (seat / ref.file).read_bytes() for ref in record.files()}


@pytest.mark.anyio
async def test_capture_after_an_unchanged_preflight_reuses_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_rich_repo(tmp_path / "repo")
    runs = GitLog(tmp_path, monkeypatch)

    await preflight_repository(repo)
    assert runs.take() == PREFLIGHT
    seat = seat_dir_for(tmp_path, "reusing")
    reusing = await capture_repository(repo, seat)
    # Neither the index scan nor the config listing runs again; the probe, the status and the
    # stash reflog do, before and after the artifacts.
    assert runs.take() == CAPTURE_REUSING
    assert len(CAPTURE_REUSING) == 11

    # The entry was taken by the capture: the next capture inspects from scratch.
    alone_seat = seat_dir_for(tmp_path, "alone")
    alone = await capture_repository(repo, alone_seat)
    assert runs.take() == CAPTURE_ALONE
    assert len(CAPTURE_ALONE) == 15

    assert encode_json(reusing) == encode_json(alone)
    assert _artifacts(reusing, seat) == _artifacts(alone, alone_seat)


def _new_commit(repo: Path) -> None:
    write(repo / "committed.txt", "a new commit\n")
    git(repo, "add", "committed.txt")
    git(repo, "commit", "-q", "-m", "between prepare and commit")


def _staged_change(repo: Path) -> None:
    write(repo / "tracked.txt", "staged between prepare and commit\n")
    git(repo, "add", "tracked.txt")


def _unstaged_edit(repo: Path) -> None:
    write(repo / "dir/nested.txt", "edited, not staged\n")


def _new_untracked(repo: Path) -> None:
    write(repo / "late.txt", "untracked, after the preflight\n")


def _new_intent_to_add(repo: Path) -> None:
    write(repo / "late_ita.txt", "intent to add, after the preflight\n")
    git(repo, "add", "-N", "late_ita.txt")


def _config_credential(repo: Path) -> None:
    git(repo, "remote", "add", "late", "https://user:late-secret@example.invalid/r.git")


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("change", "index_changed", "seen"),
    [
        (_new_commit, True, lambda r: "committed.txt" not in porcelain_by_path(r.status)),
        (_staged_change, True, lambda r: porcelain_by_path(r.status)["tracked.txt"] == "M "),
        (_unstaged_edit, False, lambda r: porcelain_by_path(r.status)["dir/nested.txt"] == " M"),
        (_new_untracked, False, lambda r: porcelain_by_path(r.status)["late.txt"] == "??"),
        (_new_intent_to_add, True, lambda r: "late_ita.txt" in r.intent_to_add),
        (_config_credential, False, lambda r: r.config_redacted == ["remote.late.url"]),
    ],
    ids=["commit", "staged", "unstaged", "untracked", "intent-to-add", "config"],
)
async def test_a_change_after_the_preflight_is_captured_as_without_it(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    change: Callable[[Path], None],
    index_changed: bool,
    seen: Callable[[RepositoryRecord], bool],
) -> None:
    repo = make_rich_repo(tmp_path / "repo")
    await preflight_repository(repo)
    stamp = index_stamp(repo / ".git" / "index")
    change(repo)
    assert (index_stamp(repo / ".git" / "index") != stamp) == index_changed

    runs = GitLog(tmp_path, monkeypatch)
    seat = seat_dir_for(tmp_path, "after-preflight")
    reusing = await capture_repository(repo, seat)
    inspection = runs.take()[: -len(CHECK)]
    assert seen(reusing)
    # A changed index is scanned again; an unchanged one is not, and the worktree change
    # reaches the record through the status, which is always read again.
    assert ("ls-files" in inspection) == index_changed

    alone_seat = seat_dir_for(tmp_path, "alone")
    alone = await capture_repository(repo, alone_seat)
    assert encode_json(reusing) == encode_json(alone)
    assert _artifacts(reusing, seat) == _artifacts(alone, alone_seat)


@pytest.mark.anyio
async def test_a_new_untracked_file_travels_though_the_index_scan_is_reused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_rich_repo(tmp_path / "repo")
    await preflight_repository(repo)
    _new_untracked(repo)
    runs = GitLog(tmp_path, monkeypatch)
    seat = seat_dir_for(tmp_path)
    record = await capture_repository(repo, seat)
    assert runs.take() == CAPTURE_REUSING
    with tarfile.open(seat / record.untracked.file) as tar:
        late = tar.extractfile("late.txt")
        assert late is not None and late.read() == b"untracked, after the preflight\n"


@pytest.mark.anyio
async def test_a_worktree_edit_during_the_capture_is_refused_after_a_preflight(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_rich_repo(tmp_path / "repo")
    await preflight_repository(repo)
    # Written once the status was read: the worktree diff runs after the inspection (the
    # bundle may run before it, and an edit then is simply part of what is captured).
    GitLog(
        tmp_path,
        monkeypatch,
        on='[ "$5" = diff ] && echo "written during the diffs" >> dir/nested.txt',
    )
    with pytest.raises(Refusal) as err:
        await capture_repository(repo, seat_dir_for(tmp_path))
    assert err.value.code == "changed-during-capture"


@pytest.mark.anyio
async def test_a_stat_refresh_during_the_capture_is_not_a_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `git diff` rewrites a stale index's stat data even under GIT_OPTIONAL_LOCKS=0, as on any
    # tree copied with `cp -a` or copytree; a refresh says nothing of what the index holds.
    made = make_rich_repo(tmp_path / "made")
    repo = tmp_path / "repo"
    shutil.copytree(made, repo, symlinks=True)
    await preflight_repository(repo)
    before = git(repo, "status", "--porcelain=v1", "-z", "--untracked-files=all", "--no-renames")
    index = (repo / ".git" / "index").read_bytes()
    GitLog(
        tmp_path,
        monkeypatch,
        on='[ "$5" = bundle ] && touch -d "2001-01-01" dir/nested.txt && '
        f'"{shutil.which("git")}" update-index -q --refresh',
    )
    record = await capture_repository(repo, seat_dir_for(tmp_path))
    assert (repo / ".git" / "index").read_bytes() != index
    assert record.status.encode() == before


@pytest.mark.anyio
async def test_an_index_flag_set_during_the_capture_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_rich_repo(tmp_path / "repo")
    await preflight_repository(repo)
    # A flag set once the inspection read the index is caught by the after-capture scan.
    GitLog(
        tmp_path,
        monkeypatch,
        on=f'[ "$5" = diff ] && "{shutil.which("git")}" update-index --skip-worktree bin.dat',
    )
    with pytest.raises(Refusal) as err:
        await capture_repository(repo, seat_dir_for(tmp_path))
    assert err.value.code == "changed-during-capture"
    assert "index" in err.value.message


@pytest.mark.anyio
async def test_a_refused_preflight_leaves_nothing_to_reuse(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repo = make_rich_repo(tmp_path / "repo")
    # Refused after the index scan, by a state that leaves the index as it is once cured.
    git(repo / "udir", "init", "-q", "inner")
    with pytest.raises(Refusal) as err:
        await preflight_repository(repo)
    assert err.value.code == "untracked-unsupported"
    shutil.rmtree(repo / "udir" / "inner")
    runs = GitLog(tmp_path, monkeypatch)
    await capture_repository(repo, seat_dir_for(tmp_path))
    assert runs.take() == CAPTURE_ALONE


def test_the_inspection_cache_is_bounded_and_taken_once() -> None:
    cache: InspectionCache[str] = InspectionCache(limit=2)
    cache.remember(Path("/a"), "a")
    cache.remember(Path("/b"), "b")
    cache.remember(Path("/a"), "a2")
    cache.remember(Path("/c"), "c")
    assert len(cache) == 2
    assert cache.take(Path("/b")) is None
    assert cache.take(Path("/a")) == "a2"
    assert cache.take(Path("/a")) is None
    assert cache.take(Path("/c")) == "c"


@pytest.mark.anyio
async def test_a_repository_with_no_tracked_change_is_carried_without_diff_or_apply(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A seat at rest has committed its work: its two diffs are empty, so neither the capture
    runs `git diff` nor the restore `git apply`; the artifacts are what git would have written
    (nothing), and the restored tree reads as the source did."""
    repo = init_repo(tmp_path / "clean")
    write(repo / "tracked.txt", "committed\n")
    git(repo, "add", "tracked.txt")
    git(repo, "commit", "-q", "-m", "one")
    write(repo / "notes/untracked.txt", "not yet added\n")
    assert git(repo, "diff", "--cached", "--binary") == b""
    assert git(repo, "diff", "--binary") == b""
    runs = GitLog(tmp_path, monkeypatch)

    seat = seat_dir_for(tmp_path, "clean")
    record = await capture_repository(repo, seat)
    captured = runs.take()
    assert "diff" not in captured
    assert captured.count("bundle") == 1
    assert porcelain_by_path(record.status) == {"notes/untracked.txt": "??"}
    for ref in (record.index_diff, record.worktree_diff):
        assert (ref.bytes, ref.sha256) == (0, hashlib.sha256(b"").hexdigest())
        assert (seat / ref.file).read_bytes() == b""

    target = tmp_path / "dest" / "clean"
    await restore_repository(seat, record, target, stamp="20261201T000000Z")
    assert "apply" not in runs.take()
    assert (target / "notes" / "untracked.txt").read_text() == "not yet added\n"
    assert git(target, "status", "--porcelain=v1", "-z", "--untracked-files=all") == (
        b"?? notes/untracked.txt\0"
    )


def test_only_untracked_and_ignored_entries_leave_both_diffs_empty() -> None:
    assert not names_tracked_change("")
    assert not names_tracked_change("?? a\0!! b\0")
    for xy in ("M ", " M", "A ", " A", "D ", " D", "T ", "MM", "UU"):
        assert names_tracked_change(f"?? a\0{xy} b\0")
