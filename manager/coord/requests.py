"""What each coordinator is asked to do: one frozen record per coordinator, built by the CLI
from its command line or by the daemon from a move's offer.

The fields keep the names of the flags they come from, so a reader can go from `--map` to
`RestoreRequest.map` without a table; each default is the flag's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from protocol import control


@dataclass(frozen=True, kw_only=True)
class RestoreRequest:
    """`cotal up --restore`: resume a sealed attempt (a directory, or a packed file) here."""

    restore: str
    space: str = "main"
    server: str | None = None
    creds: str | None = None
    replicas: int | None = None
    # Comma-separated monitor endpoints for eviction evidence, as `--monitor` takes them.
    monitor: str | None = None
    map: tuple[str, ...] = ()
    trust_signer: tuple[str, ...] = ()
    accept_stale_checkpoint: bool = False
    take_back: bool = False


@dataclass(frozen=True, kw_only=True)
class CutRequest:
    """`cotal down --preserve-state` (or the cut inside `cotal move`)."""

    session_store: tuple[str, ...] = ()
    drain_timeout: float = 120.0
    include: tuple[str, ...] = ()
    since: str | None = None
    abort: bool = False
    # Empty: every seat (a whole cut, after which the manager stops).
    seat: tuple[str, ...] = ()
    # A move's pre-copied histories by seat (manager/coord/precopy.py), cut incrementally on.
    precopy: Mapping[str, control.PrecopyBase] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class VerifyRequest:
    """`cotal checkpoint verify DIR`: the three gates, changing nothing."""

    dir: str
    space: str = "main"
    server: str | None = None
    creds: str | None = None
    map: tuple[str, ...] = ()
    trust_signer: tuple[str, ...] = ()
    accept_stale_checkpoint: bool = False


@dataclass(frozen=True, kw_only=True)
class PackRequest:
    """`cotal checkpoint pack DIR -o FILE`."""

    dir: str
    output: str
    to: str | None = None
    space: str = "main"
    server: str | None = None
    creds: str | None = None


@dataclass(frozen=True, kw_only=True)
class MoveRequest:
    """`cotal move NAME... --to INSTANCE`."""

    names: tuple[str, ...]
    to: str
    drain_timeout: float = 120.0
