"""The service manager's readiness protocol (sd_notify), spoken without libsystemd.

Under `Type=notify` systemd passes `$NOTIFY_SOCKET`, a Unix datagram socket (a path, or an
abstract name when it starts with `@`), and waits for `READY=1` before it counts the unit as
started. One datagram carries newline-separated `KEY=value` assignments.
"""

from __future__ import annotations

import os
import socket

import structlog

log = structlog.get_logger("cotal.daemon")

NOTIFY_VAR = "NOTIFY_SOCKET"


def _address(value: str) -> str | bytes:
    if value.startswith("@"):
        # Linux abstract namespace: a leading NUL byte instead of the '@'.
        return b"\0" + value[1:].encode()
    return value


def sd_notify(state: str) -> bool:
    """Send `state` to the service manager; False when none listens or the send failed.

    Never raises: a daemon must not die because its supervisor's socket is gone, so a failure
    is only logged."""
    target = os.environ.get(NOTIFY_VAR)
    if not target:
        return False
    if not (target.startswith("@") or target.startswith("/")):
        log.warning("daemon.notify_failed", socket=target, error="not an absolute path or @name")
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(_address(target))
            sock.sendall(state.encode())
    except (OSError, UnicodeError) as exc:
        log.warning("daemon.notify_failed", socket=target, error=str(exc))
        return False
    return True
