"""SeatHandle: one harness process the manager owns.

The child runs in its own process group (so a stop reaches everything it started) and carries
a parent-death signal (so a manager that dies, even by SIGKILL, leaves no unsupervised writer).
"Exited" means reaped: `wait_for_exit` returns only after the kernel handed back the status.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Literal

import anyio
import structlog
from anyio.abc import Process

from connectors.base import LaunchSpec

log = structlog.get_logger("cotal.seat")

GRACE_S = 3.0
SeatStatus = Literal["starting", "running", "exited"]


def _pdeathsig_prefix() -> list[str]:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise RuntimeError(
            "setpriv (util-linux) is required to tie seats to the manager's lifetime"
        )
    return [setpriv, "--pdeathsig", "KILL", "--"]


class SeatHandle:
    def __init__(self, spec: LaunchSpec, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        self.process: Process | None = None
        self.returncode: int | None = None
        self._exited = anyio.Event()

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    async def start(self) -> Process:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600)
        try:
            self.process = await anyio.open_process(
                _pdeathsig_prefix() + list(self.spec.argv),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=fd,
                cwd=self.spec.cwd,
                env=self.spec.env,
                start_new_session=True,
            )
        finally:
            os.close(fd)
        log.info("seat.started", pid=self.process.pid, argv0=self.spec.argv[0])
        return self.process

    def status(self) -> SeatStatus:
        if self.process is None:
            return "starting"
        return "exited" if self._exited.is_set() else "running"

    async def wait_for_exit(self) -> int:
        """Return once the kernel has handed back the child's exit status."""
        assert self.process is not None
        if not self._exited.is_set():
            self.returncode = await self.process.wait()
            self._exited.set()
        assert self.returncode is not None
        return self.returncode

    async def exited(self) -> int:
        await self._exited.wait()
        assert self.returncode is not None
        return self.returncode

    def _signal_group(self, sig: signal.Signals) -> None:
        if self.process is None or self._exited.is_set():
            return
        try:
            os.killpg(self.process.pid, sig)
        except ProcessLookupError:
            pass

    async def stop(self, *, graceful: bool, grace: float = GRACE_S) -> None:
        """Graceful: SIGTERM, then SIGKILL after `grace`. Hard: SIGKILL now. Both wait for the
        reaper; a cancellation cannot cut the stop in half."""
        if self.process is None:
            return
        with anyio.CancelScope(shield=True):
            if graceful:
                self._signal_group(signal.SIGTERM)
                with anyio.move_on_after(grace):
                    await self.wait_for_exit()
            self._signal_group(signal.SIGKILL)
            await self.wait_for_exit()
            # Anything the harness left in its group dies with it.
            try:
                os.killpg(self.process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
