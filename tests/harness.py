"""Helpers for driving one connector's seat in a test, without the manager: launch options in
the workspace layout, the real harness process under anyio with the driver's reader running,
and whatever the test left running reaped. Also the small file helpers connector tests share.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

import anyio
from anyio.abc import Process

from connectors.base import ByteReceive, ByteSend, Driver, LaunchOpts, LaunchSpec
from protocol.names import mint_lifecycle_uid
from protocol.session import SessionPointer, decode_pointer

D = TypeVar("D", bound=Driver)
D_co = TypeVar("D_co", bound=Driver, covariant=True)


class SeatConnector(Protocol[D_co]):
    name: str

    def build_launch(self, opts: LaunchOpts) -> LaunchSpec: ...

    def make_driver(self, stdin: ByteSend, stdout: ByteReceive, spec: LaunchSpec) -> D_co: ...


def seat_opts(
    root: Path,
    agent: str,
    name: str,
    *,
    config: dict[str, Any],
    uid: str | None = None,
    space: str = "main",
    cwd: Path | None = None,
    **kw: Any,
) -> LaunchOpts:
    """Launch options for seat `name` of `agent`, with its pointer where the workspace layout
    puts it."""
    uid = uid or mint_lifecycle_uid()
    return LaunchOpts(
        space=space,
        name=name,
        lifecycle_uid=uid,
        workspace_root=root,
        cwd=cwd or root,
        session_pointer_path=root / ".cotal" / "sessions" / agent / f"{name}-{uid}.json",
        config=config,
        **kw,
    )


@dataclass
class Seat(Generic[D]):
    spec: LaunchSpec
    proc: Process
    driver: D


SeatT = TypeVar("SeatT", bound=Seat[Any])


@asynccontextmanager
async def running_seat(
    connector: SeatConnector[D],
    opts: LaunchOpts,
    log_dir: Path,
    *,
    timeout: float,
    seat: Callable[[LaunchSpec, Process, D], SeatT],
) -> AsyncIterator[SeatT]:
    """build_launch + the real harness process + the driver's reader in a task group; yields
    `seat(spec, process, driver)` (`Seat`, or a subclass naming more of the seat's files).

    On a clean exit of the block the driver closes stdin and the harness must exit within
    `timeout`; whatever happens, the harness is killed if still running and reaped. Its stderr
    goes to `<log_dir>/<connector>-<seat>.stderr`, for a test to read after a failure.
    """
    spec = connector.build_launch(opts)
    # Run outside a manager, the harness has no sandbox and so no /tmp of its own: what it
    # writes to its temporary directory (Gemini CLI's error reports, say) stays in the test's.
    env = spec.env
    if "TMPDIR" not in env:
        tmp = log_dir / f"{connector.name}-{opts.name}.tmp"
        tmp.mkdir(mode=0o700, exist_ok=True)
        env = {**env, "TMPDIR": str(tmp)}
    # The fd is the child's once it is spawned; ours is closed right after.
    err = os.open(
        log_dir / f"{connector.name}-{opts.name}.stderr",
        os.O_WRONLY | os.O_CREAT | os.O_APPEND,
        0o600,
    )
    try:
        proc = await anyio.open_process(
            spec.argv,
            cwd=spec.cwd,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=err,
        )
    finally:
        os.close(err)
    try:
        assert proc.stdin is not None and proc.stdout is not None
        driver = connector.make_driver(proc.stdin, proc.stdout, spec)
        async with anyio.create_task_group() as tg:
            await tg.start(driver.run)
            yield seat(spec, proc, driver)
            await driver.aclose()
            with anyio.fail_after(timeout):
                await proc.wait()
    finally:
        with anyio.CancelScope(shield=True):
            if proc.returncode is None:
                proc.kill()
            with anyio.move_on_after(10):
                await proc.wait()


async def until(condition: Callable[[], bool]) -> None:
    """Poll a condition that no event signals (another process's file); bound it with fail_after."""
    while True:
        if condition():
            return
        await anyio.sleep(0.05)


class Pipe:
    """One direction of a byte pipe over an anyio memory stream: a driver's stdin or stdout."""

    def __init__(self) -> None:
        self.send_end, self.recv_end = anyio.create_memory_object_stream[bytes](100)

    async def send(self, item: bytes) -> None:
        await self.send_end.send(item)

    async def aclose(self) -> None:
        await self.send_end.aclose()

    async def receive(self, max_bytes: int = 65536) -> bytes:
        return await self.recv_end.receive()


# -- files ----------------------------------------------------------------------------------------


def placeholder_binary(tmp_path: Path, name: str) -> Path:
    """An executable `tmp_path/bin/<name>` that exits 99: a launch can point at it, nothing runs."""
    b = tmp_path / "bin" / name
    b.parent.mkdir()
    b.write_text("#!/bin/sh\nexit 99\n")
    b.chmod(0o755)
    return b


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def read_pointer(path: Path) -> SessionPointer:
    return decode_pointer(path.read_bytes(), where=str(path))


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def claude_installed() -> bool:
    """Whether the pinned Claude Code is installed under the tools directory."""
    from connectors.harnesses import which
    from protocol.errors import Refusal

    try:
        which("claude")
        return True
    except Refusal:
        return False
