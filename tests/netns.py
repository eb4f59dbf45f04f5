"""A host of its own on this machine: a network namespace joined to ours by one veth link.

The namespace has its own loopback and one address on the link (`.2`); our side of the link has
the other (`.1`). What a host in the namespace reaches must listen on our side's address: a
fake model server binds it directly, and the broker (which listens on 127.0.0.1 only) is reached
through a relay bound there (`tests/partition.Relay(listen=...)`). Only this link carries the
host's traffic, so `cut()` (our end of the link down: the namespace's end loses its carrier, its
packets go nowhere, as a pulled cable) is a partition of the kernel's own making, and `heal()`
brings the link back.

Making one needs CAP_NET_ADMIN (`ip netns add`); without it the test that asks is skipped,
saying so.
"""

from __future__ import annotations

import secrets
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


@dataclass(frozen=True)
class Namespace:
    name: str
    ours: str  # our end of the link
    outer: str  # the address on our side
    inner: str  # the namespace's address

    @property
    def exec_prefix(self) -> list[str]:
        """Run a command inside the namespace (its children stay there)."""
        return ["ip", "netns", "exec", self.name]

    def run(
        self, argv: list[str], *, env: dict[str, str], cwd: Path, timeout: float = 120.0
    ) -> subprocess.CompletedProcess[str]:
        """`argv` inside the namespace, to its end; what it starts detached stays there."""
        return subprocess.run(
            [*self.exec_prefix, *argv],
            env=env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def cut(self) -> None:
        _ip("link", "set", self.ours, "down")

    def heal(self) -> None:
        _ip("link", "set", self.ours, "up")


@contextmanager
def host_namespace() -> Iterator[Namespace]:
    tag = secrets.token_hex(3)
    name, ours, theirs = f"cotal-{tag}", f"cv{tag}a", f"cv{tag}b"
    # A /30 of its own per namespace, so tests side by side never share a link's addresses.
    third, fourth = secrets.randbelow(250) + 1, secrets.randbelow(63) * 4
    outer, inner = f"10.231.{third}.{fourth + 1}", f"10.231.{third}.{fourth + 2}"
    if shutil.which("ip") is None:
        pytest.skip("this machine has no `ip` (iproute2) to make a network namespace with")
    made = _ip("netns", "add", name, check=False)
    if made.returncode != 0:
        pytest.skip(f"this machine cannot make a network namespace: {made.stderr.strip()}")
    try:
        _ip("link", "add", ours, "type", "veth", "peer", "name", theirs)
        _ip("link", "set", theirs, "netns", name)
        _ip("addr", "add", f"{outer}/30", "dev", ours)
        _ip("link", "set", ours, "up")
        inside = ["-n", name]
        _ip(*inside, "addr", "add", f"{inner}/30", "dev", theirs)
        _ip(*inside, "link", "set", theirs, "up")
        _ip(*inside, "link", "set", "lo", "up")
        yield Namespace(name, ours, outer, inner)
    finally:
        _ip("link", "del", ours, check=False)
        _ip("netns", "del", name, check=False)
