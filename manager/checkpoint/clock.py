"""Whether this host's clock may judge a checkpoint's age (record 2.2, gate 3).

Recency compares a source's capturedAt with this host's clock. A clock nobody keeps in step can
be off by any amount, so a freshness gate that read it anyway would fail open. The kernel knows:
`adjtimex(2)` answers TIME_ERROR and sets STA_UNSYNC when no time daemon (chrony, ntpd,
systemd-timesyncd) has disciplined the clock within its error bound, and that reading, not a
daemon's own claim, is what admission trusts.

A host that cannot run a time daemon (a container, whose clock the host keeps) gets the
operator's declaration instead: `[recency] clock = "trusted"` with `clock_reason` in
`cotal.toml`. It counts only when the kernel says unsynchronized, and never quietly: the reading
names it as its source with the reason, and every admission it decides journals and prints it.

Tests have no time daemon to start, so `COTAL_TEST_CLOCK_STATUS` (`synchronized` or
`unsynchronized`) stands in for the kernel's answer. It is a test hook, never an operator's
setting: the reading names it as its source, and admission journals and prints it as it does a
declaration; `cotal doctor` warns.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from dataclasses import dataclass

TEST_HOOK_ENV = "COTAL_TEST_CLOCK_STATUS"
_TIME_ERROR = 5
_STA_UNSYNC = 0x0040


class _Timeval(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_usec", ctypes.c_long)]


class _Timex(ctypes.Structure):
    # struct timex of <sys/timex.h>: the fields we read, then the kernel's padding.
    _fields_ = [
        ("modes", ctypes.c_uint),
        ("offset", ctypes.c_long),
        ("freq", ctypes.c_long),
        ("maxerror", ctypes.c_long),
        ("esterror", ctypes.c_long),
        ("status", ctypes.c_int),
        ("constant", ctypes.c_long),
        ("precision", ctypes.c_long),
        ("tolerance", ctypes.c_long),
        ("time", _Timeval),
        ("tick", ctypes.c_long),
        ("ppsfreq", ctypes.c_long),
        ("jitter", ctypes.c_long),
        ("shift", ctypes.c_int),
        ("stabil", ctypes.c_long),
        ("jitcnt", ctypes.c_long),
        ("calcnt", ctypes.c_long),
        ("errcnt", ctypes.c_long),
        ("stbcnt", ctypes.c_long),
        ("tai", ctypes.c_int),
        ("_pad", ctypes.c_int * 11),
    ]


DECLARED = "cotal.toml [recency] clock"


@dataclass(frozen=True)
class ClockReading:
    synchronized: bool
    # `kernel`; the operator's declaration (DECLARED) when it vouched for an unsynchronized
    # kernel clock; or the test hook's variable name when it stood in for the kernel.
    source: str
    # What the reading was, for a refusal to quote: the kernel's state and status bits and its
    # maximum error, or the hook's value.
    detail: str


def read_clock(declared_reason: str | None = None) -> ClockReading:
    """The clock's trust for a recency gate: the kernel's own reading; or, where the kernel says
    unsynchronized and the operator declared the clock trusted (`declared_reason`), that
    declaration, named with its reason and the kernel's reading beside it."""
    # The test hook stands in for the kernel's answer, so a declaration layers over it alike.
    kernel = _read_clock()
    if kernel.synchronized or not declared_reason:
        return kernel
    return ClockReading(
        True,
        DECLARED,
        f"trusted by the operator's declaration ({declared_reason}); the kernel reads "
        f"{kernel.detail}",
    )


def _read_clock() -> ClockReading:
    hook = os.environ.get(TEST_HOOK_ENV)
    if hook is not None:
        if hook not in ("synchronized", "unsynchronized"):
            return ClockReading(False, TEST_HOOK_ENV, f"{TEST_HOOK_ENV}={hook!r} is not a reading")
        return ClockReading(hook == "synchronized", TEST_HOOK_ENV, f"{TEST_HOOK_ENV}={hook}")
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    tx = _Timex()
    state = libc.adjtimex(ctypes.byref(tx))
    if state < 0:
        err = ctypes.get_errno()
        return ClockReading(False, "kernel", f"adjtimex failed: {os.strerror(err)}")
    synced = state != _TIME_ERROR and not tx.status & _STA_UNSYNC
    detail = (
        f"adjtimex state {state}{' (TIME_ERROR)' if state == _TIME_ERROR else ''}, status "
        f"{tx.status:#x}{' (STA_UNSYNC)' if tx.status & _STA_UNSYNC else ''}, maximum error "
        f"{tx.maxerror / 1e6:g} s"
    )
    return ClockReading(synced, "kernel", detail)
