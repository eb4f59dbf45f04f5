"""A manager started before it is needed.

Starting the manager costs a coordinator its interpreter start and its imports (about a third
of a second on two cores) after everything it must come after: a resume's admission, custody,
inbox import and tree restore, or `up`'s broker start. So a coordinator starts a *warm*
manager first: an interpreter that imports the daemon and then blocks on its stdin. Nothing it
does before then can be seen (no socket, no broker connection, no file written), so it cannot
be confused with a manager by anything that looks for one. When the coordinator reaches the
point where it used to spawn the manager, it writes the manager's arguments on that pipe
(`go`) and the warm process becomes that manager. If the coordinator refuses or dies first,
the pipe closes and the warm process exits without having done anything.

Wire format (one line, this module both ends): a `WarmGo` JSON object, at most `GO_CAP` bytes.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, BinaryIO

import msgspec

from connectors.interpreter import own_python

GO_CAP = 64 * 1024
# What a warm process may become: only the manager's own command.
_SERVE = ("manager", "serve")

Arg = Annotated[str, msgspec.Meta(max_length=4096)]


class WarmGo(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The manager's command line after `python -I -m manager.cli`, and where its output goes."""

    argv: Annotated[list[Arg], msgspec.Meta(min_length=2, max_length=64)]
    out: Arg


class WarmManager:
    """The coordinator's end: a warm child it either hands its arguments or abandons."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        self._proc: subprocess.Popen[bytes] | None = proc

    @classmethod
    def start(cls, root: Path) -> WarmManager | None:
        """None when no warm child can be started: the caller then starts the manager cold."""
        try:
            proc = subprocess.Popen(
                # --root only names whose manager this is, for whoever lists the processes.
                [*own_python("manager.cli"), "manager", "warm", "--root", str(root)],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                # Its own session from the start, as the manager it may become must outlive
                # this command and its terminal.
                start_new_session=True,
                cwd=root,
            )
        except OSError:
            return None
        return cls(proc)

    def go(self, argv: Sequence[str], out: Path) -> subprocess.Popen[bytes] | None:
        """Hand the warm child the manager's arguments; it is the manager from here on. None
        when the child is gone (it could not import, say): the caller starts one cold."""
        proc, self._proc = self._proc, None
        if proc is None:
            return None
        assert proc.stdin is not None
        line = msgspec.json.encode(WarmGo(argv=list(argv), out=str(out))) + b"\n"
        try:
            proc.stdin.write(line)
            proc.stdin.close()
        except OSError:
            _reap(proc)
            return None
        return proc

    def abandon(self) -> None:
        """End the child unused, and reap it."""
        proc, self._proc = self._proc, None
        if proc is not None:
            _reap(proc)


def _reap(proc: subprocess.Popen[bytes]) -> None:
    # Before `go` the child has done nothing to undo, so it is killed rather than left to
    # finish its imports and find its stdin closed; a coordinator that dies instead of getting
    # here closes that stdin all the same, and the child exits on its own.
    if proc.stdin is not None:
        try:
            proc.stdin.close()
        except OSError:
            pass
    proc.kill()
    proc.wait()


@contextmanager
def warm_manager(root: Path) -> Iterator[WarmManager | None]:
    """A warm manager for this command, abandoned on the way out unless it was handed over."""
    warm = WarmManager.start(root)
    try:
        yield warm
    finally:
        if warm is not None:
            warm.abandon()


def read_go(stream: BinaryIO) -> WarmGo | None:
    """The child's end: one line from the coordinator, or None when its pipe closed first."""
    line = stream.readline(GO_CAP + 1)
    if not line:
        return None
    if len(line) > GO_CAP or not line.endswith(b"\n"):
        raise ValueError(f"the warm manager's arguments exceed {GO_CAP} bytes")
    go = msgspec.json.decode(line, type=WarmGo)
    if tuple(go.argv[:2]) != _SERVE:
        raise ValueError(f"a warm manager only serves; it was asked for {go.argv[:2]}")
    return go


def become(go: WarmGo) -> None:
    """Take the output file as stdout and stderr and let go of the coordinator's pipe."""
    out = os.open(go.out, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
    finally:
        os.close(out)
        os.close(null)
