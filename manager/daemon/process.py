"""SeatHandle: one harness process the manager owns.

The child runs in its own process group (so a stop reaches everything it started) and carries
a parent-death signal (so a manager that dies, even by SIGKILL, leaves no unsupervised writer).
"Exited" means reaped: `wait_for_exit` returns only after the kernel handed back the status.
Whether the seat is starting, running or stopping is the Manager's lifecycle, not this handle's:
the handle knows only whether its process has been reaped.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

import anyio
import structlog
from anyio.abc import Process

from connectors import sandbox
from connectors.base import LaunchSpec
from connectors.harnesses import source_checkout, tools_dir
from manager.daemon.startfault import REPORT_CAP, LaunchFault, decode_fault
from manager.workspace import roots

log = structlog.get_logger("cotal.seat")

GRACE_S = 3.0
# The whole stop, grace included, must end in a reaped exit within this deadline.
STOP_DEADLINE_S = 10.0
# After the deadline the group is killed once more and given this long to be reaped.
LAST_KILL_WAIT_S = 2.0


def _pdeathsig_prefix() -> list[str]:
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        raise RuntimeError(
            "setpriv (util-linux) is required to tie seats to the manager's lifetime"
        )
    # `--no-new-privs` is the seat mark (connectors/sandbox.py), set whatever the isolation:
    # every cotal manager on the host refuses a process that carries it.
    return [setpriv, "--pdeathsig", "KILL", "--no-new-privs", "--"]


def _isolation_prefix(spec: LaunchSpec, status_fd: int) -> tuple[list[str], str]:
    """The launcher that isolates this seat before its harness runs, and the mode in force;
    `status_fd` is the pipe it reports a set-up failure on."""
    found = sandbox.probe()
    if found.mode == "none":
        return [], "none"
    read_only = [tools_dir()]
    checkout = source_checkout()
    if checkout is not None:
        # cotal's own source: the scribe harness runs from it, and it holds no secret.
        read_only.append(checkout)
    registry = roots.registry_dir() if found.mount is not None else None
    plan = sandbox.plan_for(
        spec.argv,
        spec.env,
        spec.cwd,
        pointer=spec.session_pointer_path,
        read_only=read_only,
        mount=found.mount,
        landlock=found.landlock,
        registry=registry,
    )
    plan.status_fd = status_fd
    plan.fault = sandbox.launch_fault_hook()
    return sandbox.launcher(plan), found.mode


class SeatHandle:
    def __init__(self, spec: LaunchSpec, log_path: Path) -> None:
        self.spec = spec
        self.log_path = log_path
        self.process: Process | None = None
        self.returncode: int | None = None
        self._exited = anyio.Event()
        self.isolation: str | None = None
        # The read end of the launcher's report pipe, until the exit is reaped.
        self._status: int | None = None
        # What the launcher reported when it could not set the seat up (read at the reap).
        self.launch_fault: LaunchFault | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    async def start(self) -> Process:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        # The launcher's report goes to a pipe of its own, not to its stderr: the seat's log is
        # the harness's to write as well, and a harness must not be able to pass for it.
        status, report = os.pipe2(os.O_CLOEXEC)
        try:
            isolate, self.isolation = _isolation_prefix(self.spec, report)
            fd = os.open(
                self.log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW, 0o600
            )
            try:
                self.process = await anyio.open_process(
                    _pdeathsig_prefix() + isolate + list(self.spec.argv),
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=fd,
                    cwd=self.spec.cwd,
                    # The fault hook is the manager's alone (`sandbox.launch_fault_hook`).
                    env={k: v for k, v in self.spec.env.items() if k != sandbox.FAULT_ENV},
                    start_new_session=True,
                    pass_fds=(report,) if isolate else (),
                )
            finally:
                os.close(fd)
        except BaseException:
            os.close(status)
            raise
        finally:
            # Only the child holds the write end now: its exit or its exec ends the pipe.
            os.close(report)
        if isolate:
            os.set_blocking(status, False)
            self._status = status
        else:
            os.close(status)
        log.info(
            "seat.started",
            pid=self.process.pid,
            argv0=self.spec.argv[0],
            isolation=self.isolation,
        )
        return self.process

    def _read_report(self) -> None:
        """Once the exit is reaped, what the launcher wrote is all in the pipe, or nothing is."""
        status, self._status = self._status, None
        if status is None:
            return
        try:
            data = os.read(status, REPORT_CAP + 1)
        except BlockingIOError:
            # A process the launcher left behind holds the write end and wrote nothing.
            data = b""
        finally:
            os.close(status)
        self.launch_fault = decode_fault(data)
        if self.launch_fault is None and data:
            log.warning("seat.launch_report_unreadable", bytes=len(data), log=str(self.log_path))

    @property
    def reaped(self) -> bool:
        return self._exited.is_set()

    async def wait_for_exit(self) -> int:
        """Return once the kernel has handed back the child's exit status."""
        assert self.process is not None
        if not self._exited.is_set():
            self.returncode = await self.process.wait()
            # Before the exit is announced: whoever turns an early exit into a refusal reads it.
            self._read_report()
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

    async def stop(
        self,
        *,
        graceful: bool,
        grace: float = GRACE_S,
        deadline: float = STOP_DEADLINE_S,
        last_wait: float = LAST_KILL_WAIT_S,
    ) -> bool:
        """Graceful: SIGTERM, then SIGKILL after `grace`. Hard: SIGKILL now. True once the exit
        is reaped; False if it was not reaped by `deadline` plus one more SIGKILL and
        `last_wait`. The waits are bounded here, so a caller may shield the whole stop and
        still get an answer in time; the process stays in this handle for a later reap."""
        if self.process is None:
            return True
        with anyio.move_on_after(deadline):
            if graceful:
                self._signal_group(signal.SIGTERM)
                with anyio.move_on_after(grace):
                    await self.wait_for_exit()
            self._signal_group(signal.SIGKILL)
            await self.wait_for_exit()
        if not self.reaped:
            self._signal_group(signal.SIGKILL)
            with anyio.move_on_after(last_wait):
                await self.wait_for_exit()
        if not self.reaped:
            return False
        self._kill_leftovers()
        return True

    async def reap(self) -> int | None:
        """Kill the group and wait for the kernel's status however long it takes: the cleanup
        that must finish, so the caller shields it."""
        if self.process is None:
            return None
        self._signal_group(signal.SIGKILL)
        code = await self.wait_for_exit()
        self._kill_leftovers()
        return code

    def _kill_leftovers(self) -> None:
        # Anything the harness left in its group dies with it.
        assert self.process is not None
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
