"""One start of a seat's process that failed in its launcher, and whether it is tried again.

The launcher (`connectors/isolate.py`) sets the seat's isolation up in the child before the
harness runs. When the kernel refuses a step it exits 126 (127 when the exec fails) after one
JSON line to a pipe `SeatHandle` passed it: the step, the errno's name, the path. The handle
reads that line once the exit is reaped (`decode_fault`), and the Manager's refusal for a seat
that exited before it was ready becomes `StartFailed` (`seat-start-failed`), naming the step,
the errno and the path instead of an exit code alone.

A transient errno is tried again, with a short backoff, within the seat's restart budget (the
crash restart's: `SESSION_RESTART_LIMIT` within `SESSION_RESTART_WINDOW_S`, one budget for
both, so a seat that flaps at its start and then crashes cannot exceed it); any other errno is
refused at once, since a second launch on the same host meets the same refusal.
"""

from __future__ import annotations

import errno as _errno
import os
from pathlib import Path
from typing import Literal

import msgspec

from protocol import names
from protocol.errors import Refusal
from protocol.lifecycle import exit_text
from protocol.refusals import Code

Step = Literal["namespace", "mount", "hide", "landlock", "capabilities", "exec"]

# What the kernel says when the host is momentarily short, not when the launch is wrong:
# EBUSY (a mount point or the namespace machinery busy with a neighbour's mount or unmount,
# which is what concurrent seat starts meet), EAGAIN (a resource limit or lock that frees
# itself), EINTR (a call a signal interrupted) and ENOMEM (the kernel short of memory for a new
# namespace or tmpfs, which the seats starting beside it give back). EPERM, EACCES, ENOENT,
# EINVAL, ENOSPC (a namespace or mount count limit) and the rest say something about the host's
# policy or the seat's paths that a second launch meets again.
TRANSIENT_ERRNOS = frozenset({"EBUSY", "EAGAIN", "EINTR", "ENOMEM"})
# The first retry waits this long, each next one twice as long, up to RETRY_DELAY_MAX_S.
RETRY_DELAY_S = 0.1
RETRY_DELAY_MAX_S = 2.0
# The launcher writes one line under PIPE_BUF; anything longer is not its report.
REPORT_CAP = 4096


class LaunchFault(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """The launcher's report of the step it could not set up (`isolate.report_failure`)."""

    step: Step
    errno: str | None
    path: str | None
    detail: str

    @property
    def transient(self) -> bool:
        return self.errno in TRANSIENT_ERRNOS

    @property
    def said(self) -> str:
        """The errno as a person reads it: `EACCES (Permission denied)`."""
        if self.errno is None:
            return "an error without an errno"
        code = getattr(_errno, self.errno, None)
        return f"{self.errno} ({os.strerror(code)})" if isinstance(code, int) else self.errno


_decoder = msgspec.json.Decoder(LaunchFault)


def decode_fault(data: bytes) -> LaunchFault | None:
    """The report in what the pipe held, or None: nothing written (the exec happened, or the
    launcher died before it could say why) or not a report (which is then only its log's)."""
    line = data.strip()
    if not line or len(data) > REPORT_CAP or b"\n" in line:
        return None
    try:
        return _decoder.decode(line)
    except (msgspec.ValidationError, msgspec.DecodeError):
        return None


_CURES: dict[str, str] = {
    "namespace": "this host refused the seat a private mount namespace: see `cotal doctor`, "
    "the user-namespace limit (user.max_user_namespaces) and any seccomp or AppArmor policy on "
    "the manager",
    "mount": "the manager's user must be able to mount a tmpfs over that path and bind the "
    "seat's own paths back beneath it: check that it exists and is not held read-only or busy "
    "by the host (see `cotal doctor`)",
    "hide": "the manager's user must be able to mount over that path (another root, a `.cotal` "
    "or a seat's own path under it): check that it exists and is a directory or file of that "
    "user's (see `cotal doctor`)",
    "landlock": "this kernel refused the Landlock ruleset: see `cotal doctor`; "
    "COTAL_SEAT_ISOLATION=none runs seats with no isolation at all, only for a host where that "
    "is accepted",
    "capabilities": "the kernel refused to drop the seat's privileges (no_new_privs, the "
    "capability bounding set): see `cotal doctor`",
    "exec": "the harness program could not be run: check that it is installed and executable "
    "(`cotal doctor`, `cotal tools install`)",
}


class StartFailed(Refusal):
    """`seat-start-failed`: the seat's launcher could not set up one step before the harness ran."""

    def __init__(
        self,
        seat: str,
        fault: LaunchFault,
        returncode: int | None,
        log_path: Path,
        *,
        budget: str = "",
    ) -> None:
        self.seat = seat
        self.fault = fault
        self.returncode = returncode
        self.log_path = log_path
        where = f" on {fault.path}" if fault.path else ""
        message = (
            f"seat {seat} could not start: its launcher's {fault.step} step failed with "
            f"{fault.said}{where} before the harness ran (exit {exit_text(returncode)})"
            f"{budget}"
        )
        if fault.transient:
            cure = (
                f"{fault.errno} is a passing shortage or contention on the host: start it again "
                "(spawn, `cotal start`, or the resume) when the host is less busy"
            )
        else:
            cure = _CURES[fault.step]
        cure = f"{cure}; the launcher's line is in {log_path}"
        super().__init__(Code.SEAT_START_FAILED, message, cure)

    def budget_spent(self, attempts: int) -> StartFailed:
        """The same refusal, saying that the tries again ran out."""
        return StartFailed(
            self.seat,
            self.fault,
            self.returncode,
            self.log_path,
            budget=(
                f"; {attempts} attempts, and the seat's restart budget "
                f"({names.SESSION_RESTART_LIMIT} within {names.SESSION_RESTART_WINDOW_S:.0f}s) "
                "is spent"
            ),
        )


def next_try(failure: StartFailed, crashes: list[float], failures: int, now: float) -> float:
    """How long to wait before starting again after `failures` + 1 failed starts, the retry
    counted in `crashes` (the seat's restart budget, changed in place). Raises the refusal when
    it is not tried again: a permanent errno, or a budget already spent."""
    if not failure.fault.transient:
        raise failure
    crashes[:] = [t for t in crashes if now - t < names.SESSION_RESTART_WINDOW_S]
    if len(crashes) >= names.SESSION_RESTART_LIMIT:
        raise failure.budget_spent(failures + 1)
    crashes.append(now)
    delay: float = min(RETRY_DELAY_S * 2**failures, RETRY_DELAY_MAX_S)
    return delay
