"""What a cut leaves behind: the ignored files of a seat's tree that nobody declared.

A checkpoint carries the tracked tree, the changes and the untracked files, and of the ignored
files only those the operator declares (`[carry] include`, `--include`): a build directory,
`node_modules/`, a local `.env` stay on this host. That is usually right and sometimes a loss
the operator only finds at the destination, so the cut says, before it stops anything, how
many ignored files and bytes stay behind and which paths hold the most, for the operator to
`--include` them or accept their absence (issue 42 item 7).

Names and sizes only, never contents: an ignored `.env` is named, not read. git lists the
ignored paths, collapsing a wholly ignored directory into one entry (`--directory`); this walks
each such directory itself (no symlink followed, no other file system entered) within a budget
of entries, past which the figures are lower bounds and the survey says so.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from pathlib import Path

import anyio

from manager.checkpoint.gitstate import EXCLUDE_CONTROL, EXCLUDE_STAGING, run_git
from protocol.control import IgnoredPath, IgnoredSurvey

# How many directory entries one survey reads at most: a checkout's node_modules can hold
# hundreds of thousands, and the survey runs while the cut's fence holds the seat's mail.
WALK_BUDGET = 100_000
# How many of the largest paths the survey names.
LARGEST = 3


async def survey_ignored(cwd: Path, include: Sequence[str]) -> IgnoredSurvey:
    """The ignored files under `cwd` that no pattern of `include` carries."""
    listed = await run_git(
        cwd,
        "ls-files", "--others", "--ignored", "--exclude-standard", "--directory", "-z",
        "--", ".", EXCLUDE_CONTROL, *EXCLUDE_STAGING,
    )  # fmt: skip
    entries = _outermost([os.fsdecode(e) for e in listed.stdout.split(b"\0") if e])
    carried: frozenset[str] = frozenset()
    if include and entries:
        declared = await run_git(
            cwd,
            "ls-files", "--others", "--ignored", "--exclude-standard", "-z",
            "--", *(f":(glob){pattern}" for pattern in include), EXCLUDE_CONTROL,
            *EXCLUDE_STAGING,
        )  # fmt: skip
        carried = frozenset(os.fsdecode(e) for e in declared.stdout.split(b"\0") if e)
    return await anyio.to_thread.run_sync(_measure, cwd, entries, carried)


def _outermost(entries: list[str]) -> list[str]:
    """git can list a directory whose files are all ignored and those files too (`src/` and
    `src/trace.log`): the directory's walk counts them, so they are dropped."""
    dirs = [e for e in entries if e.endswith("/")]
    return [e for e in entries if not any(e != d and e.startswith(d) for d in dirs)]


def _measure(cwd: Path, entries: list[str], carried: frozenset[str]) -> IgnoredSurvey:
    budget = [WALK_BUDGET]
    sized: list[IgnoredPath] = []
    files = total = 0
    for entry in entries:
        count, size = _size_of(cwd, entry, carried, budget)
        if count:
            sized.append(IgnoredPath(path=entry, files=count, bytes=size))
            files += count
            total += size
    sized.sort(key=lambda p: (-p.bytes, p.path))
    return IgnoredSurvey(files=files, bytes=total, largest=sized[:LARGEST], complete=budget[0] > 0)


def _size_of(cwd: Path, entry: str, carried: frozenset[str], budget: list[int]) -> tuple[int, int]:
    """Files and bytes at `entry` (a file, or a directory git collapsed) not carried."""
    if not entry.endswith("/"):
        if entry in carried:
            return 0, 0
        try:
            st = os.lstat(cwd / entry)
        except OSError:
            return 0, 0
        budget[0] -= 1
        return 1, st.st_size
    files = size = 0
    top = cwd / entry
    try:
        device = os.lstat(top).st_dev
    except OSError:
        return 0, 0
    stack = [top]
    while stack and budget[0] > 0:
        here = stack.pop()
        try:
            with os.scandir(here) as it:
                found = list(it)
        except OSError:
            continue
        for item in found:
            if budget[0] <= 0:
                break
            budget[0] -= 1
            try:
                st = item.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if st.st_dev == device:
                    stack.append(Path(item.path))
                continue
            if os.path.relpath(item.path, cwd) in carried:
                continue
            files += 1
            size += st.st_size
    return files, size
