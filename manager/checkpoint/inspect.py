"""Inspect once: what a capture may reuse from the preflight at prepare, and why that is sound.

The daemon preflights every seat's repository at prepare, while the seats still run, and
captures it at commit, after they are proven stopped. Between the two the seat may have done
anything to its repository, so nothing the preflight learned is trusted because of *when* it was
learned; a fact is reused only when the input it is a pure function of is proven unchanged:

1. The index scan (`git ls-files --stage -t -v`: unmerged entries, gitlinks, the skip-worktree
   entries and the assume-unchanged bits, tracked control-dir paths; and the intent-to-add
   entries, from two diffs of the index against HEAD that differ exactly on them) depends on
   nothing but the bytes of the index file. Its stamp is the file's size and its
   trailer, the checksum git writes over the whole content and checks on every read, so equal
   stamps mean equal bytes; timestamps are not used, since a rewrite in the same tick leaves
   them equal. A split index is covered too: the main file names its shared index by hash. An
   index without a checksum (`index.skipHash`) or an absent one is never reused.
2. The config listing (`git config --file config --null --list`) depends on nothing but the
   bytes of `config` (`--file` does not follow includes); it is reused only when the bytes read
   at capture hash as the bytes that were listed did, read before and after git listed them.

Everything else is read again at every inspection, because no cheap stamp covers it:

- the probe (one `git rev-parse`: top level, git dir, shallow, operation markers, the HEAD
  commit; one `git for-each-ref`: every ref and the branch HEAD is on) is cheap and exact, and
  its answers are what the record and the after-capture check compare;
- the status and the untracked list (one `git status`): an unstaged edit of a tracked file or a
  new untracked file changes the worktree and not the index, so no index or ref stamp can prove
  the status unchanged; only reading the worktree again can;
- the declared ignored paths, the hooks and `info/exclude` (a directory listing, no git);
- a shallow clone's boundary (`.git/shallow`), `info/sparse-checkout` and `config.worktree`
  (small files read whole), and whether each skip-worktree entry's file is absent from the
  worktree (the reused index scan names the entries; only an `lstat` can say their files are
  still gone).

The after-capture check still reads the probe and the status again and compares them, and
compares the index stamp too, so a change during the capture is refused as
`changed-during-capture` whatever was reused before it.

The cache is keyed by the resolved seat cwd, holds at most `CACHE_LIMIT` inspections (the
oldest is dropped first), and an entry is taken out, not copied, by the capture that uses it.
It lives in the daemon process, which is where both the prepare and the commit run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

CACHE_LIMIT = 256
# A SHA-256 repository's index ends in a 32-byte checksum, a SHA-1 one in 20; the last 32 bytes
# cover either.
_TRAILER = 32

T = TypeVar("T")


@dataclass(frozen=True)
class IndexStamp:
    """The index file as its size and trailing checksum: a stamp of its content."""

    size: int
    trailer: bytes

    @property
    def reusable(self) -> bool:
        # Without a checksum (index.skipHash writes zeros) the stamp says nothing of content.
        return self.size > _TRAILER and self.trailer.strip(b"\0") != b""


def index_stamp(path: Path) -> IndexStamp | None:
    """The stamp of the index at `path`, or None when there is none to read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        trailer = os.pread(fd, _TRAILER, max(st.st_size - _TRAILER, 0))
        after = os.fstat(fd)
    finally:
        os.close(fd)
    if (st.st_size, st.st_mtime_ns, st.st_ctime_ns) != (
        after.st_size,
        after.st_mtime_ns,
        after.st_ctime_ns,
    ):
        return None
    return IndexStamp(size=st.st_size, trailer=trailer)


class InspectionCache(Generic[T]):
    """The last inspection of each repository, kept until a capture takes it."""

    def __init__(self, limit: int = CACHE_LIMIT) -> None:
        self._limit = limit
        self._entries: dict[Path, T] = {}

    def remember(self, top: Path, inspection: T) -> None:
        self._entries.pop(top, None)
        self._entries[top] = inspection
        while len(self._entries) > self._limit:
            del self._entries[next(iter(self._entries))]

    def take(self, top: Path) -> T | None:
        return self._entries.pop(top, None)

    def __len__(self) -> int:
        return len(self._entries)
