"""The one way cotal's processes enter their event loop: anyio on asyncio (nats-py is asyncio
only), with child processes watched through pidfds.

On Python 3.11, asyncio watches each child process with a thread of its own that blocks in
`waitpid` (`ThreadedChildWatcher`): a thread started and joined per git process, per seat, per
broker. A cut of 50 seats starts about 800 git processes from the manager, and that thread
was a third of what each cost the manager (1.3 ms against 0.85 ms with a pidfd, measured on
`git rev-parse`). A pidfd (Linux 5.3) is a file descriptor that becomes readable when the
process exits, so the loop itself notices the exit. Python 3.12 makes that choice on its own
and deprecates choosing, so this only acts on 3.11, and only when the kernel has `pidfd_open`.

A process that seems stuck says where it waits: SIGUSR1 writes every task's chain of awaits to
stderr (the loop must be turning to answer it), SIGUSR2 every thread's stack (answered by the
interpreter itself, so it works when a call blocks the loop). Frames only, never values.
"""

from __future__ import annotations

import faulthandler
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Iterator
from types import FrameType
from typing import TypeVar, TypeVarTuple

import anyio

T = TypeVar("T")
Ts = TypeVarTuple("Ts")
# How long what a library left behind is cancelled for, try after try, once `fn` has returned.
LEFTOVER_S = 5.0
LEFTOVER_TRY_S = 0.1


def _pidfd_usable() -> bool:
    if sys.version_info >= (3, 12) or not hasattr(os, "pidfd_open"):
        return False
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError:
        return False
    return True


def _awaiting(coro: object) -> Iterator[FrameType]:
    # A suspended task's own stack is its outermost frame only; what it waits on is down the
    # chain of awaits.
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        frame = frame or getattr(coro, "ag_frame", None)
        if frame is not None:
            yield frame
        nxt = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        coro = nxt or getattr(coro, "ag_await", None)


def dump_tasks() -> None:
    import asyncio

    out = sys.stderr
    tasks = asyncio.all_tasks()
    print(f"--- {len(tasks)} tasks of pid {os.getpid()}", file=out)
    for task in tasks:
        print(f"task {task.get_name()}:", file=out)
        for frame in _awaiting(task.get_coro()):
            code = frame.f_code
            print(f"  {code.co_filename}:{frame.f_lineno} in {code.co_name}", file=out)
    out.flush()


async def _watched(fn: Callable[[*Ts], Awaitable[T]], *args: *Ts) -> T:
    # Imported here, where the loop already has it: `cotal --help` and the CLI's other quick
    # answers import this module and never start a loop.
    import asyncio

    # Left in place after `fn`: the loop's own teardown (cancelling what is left) is where a
    # task that will not end shows, and closing the loop removes the handler.
    asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, dump_tasks)
    faulthandler.register(signal.SIGUSR2, all_threads=True)
    try:
        return await _with_pidfds(fn, *args)
    finally:
        with anyio.CancelScope(shield=True):
            await _end_leftovers()


async def _end_leftovers() -> None:
    """End the tasks a library left behind (nats-py's reconnect loop, its readers) before the
    loop's own teardown, which cancels each once and then waits for ever.

    On Python 3.11 `asyncio.wait_for` can lose a cancellation that lands as the call it waits
    on fails (measured: nats-py's reconnect loop, cancelled while a connect to a dead broker
    was refused, went on retrying, and a manager and a resume whose broker had died never
    exited). So what is left is cancelled again until it ends, within a bound; one that still
    will not end is named on stderr, and the teardown waits for it as it would have."""
    import asyncio

    loop = asyncio.get_running_loop()
    me = asyncio.current_task()
    deadline = loop.time() + LEFTOVER_S
    while True:
        left = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        if not left:
            return
        if loop.time() > deadline:
            print(f"cotal: {len(left)} task(s) would not end; where they wait:", file=sys.stderr)
            dump_tasks()
            return
        for task in left:
            task.cancel()
        await asyncio.wait(left, timeout=LEFTOVER_TRY_S)


async def _with_pidfds(fn: Callable[[*Ts], Awaitable[T]], *args: *Ts) -> T:
    if not _pidfd_usable():
        return await fn(*args)
    import asyncio

    previous = asyncio.get_child_watcher()
    watcher = asyncio.PidfdChildWatcher()
    watcher.attach_loop(asyncio.get_running_loop())
    asyncio.set_child_watcher(watcher)
    try:
        return await fn(*args)
    finally:
        # A later loop in this process (a command may run more than one) gets the watcher it
        # had, not this one, which is bound to a loop that is closing.
        watcher.attach_loop(None)
        asyncio.set_child_watcher(previous)


def run(fn: Callable[[*Ts], Awaitable[T]], *args: *Ts) -> T:
    return anyio.run(_watched, fn, *args, backend="asyncio")
