"""Gate 1's re-stat, forced: a real file that changes while it is read is refused, by name.

The change happens from inside the read, through the one hook the reader offers (what consumes
each chunk), so it lands exactly between the first stat and the re-stat, never by timing.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from connectors.privatefs import UnsafeFile, stream_stable
from manager.checkpoint.reader import verify_file
from protocol.checkpoint import CarriedMessage, FileRef, InboxReader
from protocol.errors import Refusal

BODY = b'{"seq": 1}\n' * 64


def _written(tmp_path: Path) -> Path:
    path = tmp_path / "inbox.jsonl"
    path.write_bytes(BODY)
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    return path


def _touch(path: Path) -> None:
    # Only the times move: the bytes read are still the file's, so nothing but the re-stat
    # can tell.
    os.utime(path, ns=(2_000_000_000, 2_000_000_000))


def _append(path: Path) -> None:
    with path.open("ab") as f:
        f.write(b"late\n")


def _replace(path: Path) -> None:
    # A rename over the path: the open fd keeps the old inode, the path names another.
    other = path.with_name("other")
    other.write_bytes(BODY)
    os.utime(other, ns=(1_000_000_000, 1_000_000_000))
    os.rename(other, path)


def _remove(path: Path) -> None:
    path.unlink()


@pytest.mark.parametrize(
    ("change", "read"),
    [(_touch, BODY), (_append, BODY + b"late\n"), (_replace, BODY), (_remove, BODY)],
)
def test_a_file_changed_while_streamed_is_unstable(
    tmp_path: Path, change: Callable[[Path], None], read: bytes
) -> None:
    path = _written(tmp_path)
    seen: list[bytes] = []

    def consume(chunk: bytes) -> None:
        seen.append(chunk)
        if len(seen) == 1:
            change(path)

    with pytest.raises(UnsafeFile) as caught:
        stream_stable(path, consume)
    assert caught.value.problem == "unstable"
    assert caught.value.path == path
    assert str(caught.value) == f"{path} changed while it was being read"
    # All the open fd held was read (an append too): the refusal is the re-stat's, not a
    # short read.
    assert b"".join(seen) == read


def test_a_file_left_alone_is_read_whole(tmp_path: Path) -> None:
    path = _written(tmp_path)
    seen: list[bytes] = []
    st = stream_stable(path, seen.append)
    assert b"".join(seen) == BODY and st.st_size == len(BODY)


class _ChangesTheFile(InboxReader):
    """Stands where gate 1 feeds the carried inbox line by line: after the first chunk it
    changes the file under the read, as a writer racing a verify would."""

    def __init__(self, path: Path, change: Callable[[Path], None]) -> None:
        # No record to prove lines against: this reader's job is only the change.
        self.path = path
        self.change = change
        self.fed = 0

    def feed(self, chunk: bytes) -> None:
        self.fed += 1
        if self.fed == 1:
            self.change(self.path)

    def finish(self) -> list[CarriedMessage]:
        raise AssertionError("a file that changed must be refused before its lines are judged")


@pytest.mark.parametrize("change", [_touch, _replace])
def test_gate_one_refuses_a_checkpoint_file_changed_while_hashed(
    tmp_path: Path, change: Callable[[Path], None]
) -> None:
    path = _written(tmp_path)
    # The record matches the bytes exactly: size and digest pass, only the re-stat refuses.
    ref = FileRef(file=path.name, bytes=len(BODY), sha256=hashlib.sha256(BODY).hexdigest())
    with pytest.raises(Refusal) as caught:
        verify_file(tmp_path, ref, _ChangesTheFile(path, change))
    assert caught.value.code == "integrity"
    assert caught.value.message == (f"checkpoint integrity: {path} changed while it was being read")
    assert caught.value.cure == "retry once nothing writes to the checkpoint"


def test_gate_one_admits_the_same_file_left_alone(tmp_path: Path) -> None:
    path = _written(tmp_path)
    ref = FileRef(file=path.name, bytes=len(BODY), sha256=hashlib.sha256(BODY).hexdigest())
    verify_file(tmp_path, ref)
