"""Run one short child process to its end and keep what it wrote: the daemon's git commands.

A cut of 50 seats runs about 700 git processes from the manager, and the manager's one core is
what bounds it (docs/benchmarks.md, issue 27). `anyio.run_process` builds, for each child,
asyncio's subprocess transport and protocol, a stream per pipe and three tasks to drain them:
0.66-0.74 ms of the manager's CPU per `git --version`, against 0.35-0.37 ms here (measured on
this machine, 300 runs each, with the manager's pidfd watcher in both). Here the child is
started by `subprocess.Popen`, its pipes are read by callbacks on the loop's own selector, and
its exit is noticed through a pidfd, as `manager.eventloop` makes asyncio do.

What the caller sees is what `anyio.run_process(..., check=False)` gave: the exit status and
both outputs whole, `FileNotFoundError` when the program cannot be found, and on cancellation a
child that is killed and reaped before the cancellation goes on. Where the kernel has no pidfd
(before 5.3) the exit is waited for in a worker thread once both pipes have ended, and where
`os` has no `pidfd_open` at all (not Linux) this is `anyio.run_process` itself.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import anyio

from manager.procs import pidfd_of

_CHUNK = 1 << 18


@dataclass(frozen=True)
class Finished:
    returncode: int
    stdout: bytes
    stderr: bytes


class _Child:
    """One child's pipes and exit, watched by the loop's selector until all three have ended."""

    def __init__(self, loop: asyncio.AbstractEventLoop, proc: subprocess.Popen[bytes]) -> None:
        self.loop, self.proc = loop, proc
        self.out, self.err = bytearray(), bytearray()
        self.ended = anyio.Event()
        self._open: set[int] = set()
        self._input = b""
        self._stdin: int | None = None

    def _reader(self, fd: int, into: bytearray) -> None:
        os.set_blocking(fd, False)
        self._open.add(fd)

        def ready() -> None:
            try:
                chunk = os.read(fd, _CHUNK)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if chunk:
                into.extend(chunk)
                return
            self._close(fd)

        self.loop.add_reader(fd, ready)

    def _writer(self, fd: int, data: bytes) -> None:
        os.set_blocking(fd, False)
        self._open.add(fd)
        self._stdin, self._input = fd, data

        def ready() -> None:
            try:
                sent = os.write(fd, self._input[:_CHUNK])
            except BlockingIOError:
                return
            except OSError:
                # The child closed its end (it exited or read no more): its status says why.
                sent = len(self._input)
            self._input = self._input[sent:]
            if not self._input:
                self._close(fd)

        self.loop.add_writer(fd, ready)

    def _exit_watch(self, pidfd: int) -> None:
        self._open.add(pidfd)

        def ready() -> None:
            self.proc.wait()
            self._close(pidfd)

        self.loop.add_reader(pidfd, ready)

    def _close(self, fd: int) -> None:
        if fd not in self._open:
            return
        self._open.discard(fd)
        if fd == self._stdin:
            self.loop.remove_writer(fd)
        else:
            self.loop.remove_reader(fd)
        os.close(fd)
        if not self._open:
            self.ended.set()

    def close_all(self) -> None:
        for fd in list(self._open):
            self._close(fd)


async def run_collect(
    argv: Sequence[str],
    *,
    cwd: Path | str | None = None,
    env: Mapping[str, str] | None = None,
    input: bytes | None = None,  # noqa: A002 - the name `anyio.run_process` gives it
) -> Finished:
    """Run `argv` to its exit; its stdout and stderr, whole, and its exit status."""
    if not hasattr(os, "pidfd_open"):
        done = await anyio.run_process(list(argv), cwd=cwd, env=env, input=input, check=False)
        return Finished(done.returncode, done.stdout, done.stderr)
    # The pipes are made here, not by Popen, so no file object stands between them and the
    # selector; the child's ends are closed in this process as soon as it has them.
    ours: list[int] = []
    theirs: list[int] = []
    try:
        out_r, out_w = os.pipe2(os.O_CLOEXEC)
        ours.append(out_r)
        theirs.append(out_w)
        err_r, err_w = os.pipe2(os.O_CLOEXEC)
        ours.append(err_r)
        theirs.append(err_w)
        in_w: int | None = None
        stdin: int = subprocess.DEVNULL
        if input:
            in_r, in_w = os.pipe2(os.O_CLOEXEC)
            ours.append(in_w)
            theirs.append(in_r)
            stdin = in_r
        # Popen returns once the child has exec'd (it waits on no more than that), which is
        # what asyncio's own subprocess transport does on this loop too.
        proc = subprocess.Popen(  # noqa: ASYNC220
            list(argv), cwd=cwd, env=env, stdin=stdin, stdout=out_w, stderr=err_w
        )
    except BaseException:
        for fd in ours:
            os.close(fd)
        raise
    finally:
        for fd in theirs:
            os.close(fd)
    child = _Child(asyncio.get_running_loop(), proc)
    child._reader(out_r, child.out)
    child._reader(err_r, child.err)
    if in_w is not None:
        assert input is not None
        child._writer(in_w, input)
    try:
        pidfd = pidfd_of(proc.pid)
        if pidfd is not None:
            child._exit_watch(pidfd)
        await child.ended.wait()
        if pidfd is None:
            await anyio.to_thread.run_sync(proc.wait)
    except BaseException:
        with anyio.CancelScope(shield=True):
            child.close_all()
            if proc.returncode is None:
                try:
                    proc.send_signal(signal.SIGKILL)
                except ProcessLookupError:
                    pass
                await anyio.to_thread.run_sync(proc.wait)
        raise
    assert proc.returncode is not None
    return Finished(proc.returncode, bytes(child.out), bytes(child.err))
