"""The proof that no process of a lifecycle survives, shared by the stops that need it at once.

A stop is proven by one pass over every process's environment (`procs.processes_with_envs`),
and a pass reads every process on the machine whatever it looks for. A cut stops its seats side
by side, so 50 stops made 50 passes over about 200 processes each: the stop phase of a 50-seat
cut spent half a second of the manager's CPU reading /proc. Here a pass answers every stop that
was waiting when it began: a stop that asks while a pass runs waits for the next one, which
covers it and every other stop that arrived meanwhile.

The proof stays what it was: a pass is only an answer for the stops that asked before it began,
so it starts after each of their harnesses was reaped. A pass that fails (or whose caller is
cancelled) answers nobody; each stop it held asks again, and the first of them runs the next.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import anyio

from manager.procs import processes_with_envs

LIFECYCLE_ENV = "COTAL_LIFECYCLE_UID"


@dataclass(eq=False)
class _Pass:
    uids: set[str] = field(default_factory=set)
    found: dict[str, list[int]] | None = None
    ended: anyio.Event = field(default_factory=anyio.Event)


class SurvivorScan:
    """`survivors(uid)`: the live pids carrying the lifecycle `uid`, from a pass that began after
    the call; concurrent calls share passes."""

    def __init__(
        self,
        env_name: str = LIFECYCLE_ENV,
        read: Callable[[str, Iterable[str]], dict[str, list[int]]] = processes_with_envs,
    ) -> None:
        self._env_name = env_name
        self._read = read
        # The pass gathering its askers (not yet begun), and the one reading /proc.
        self._gathering: _Pass | None = None
        self._running: _Pass | None = None
        self.passes = 0

    def _join(self, uid: str) -> _Pass:
        if self._gathering is None:
            self._gathering = _Pass()
        self._gathering.uids.add(uid)
        return self._gathering

    async def survivors(self, uid: str) -> list[int]:
        mine = self._join(uid)
        while mine.found is None:
            if mine.ended.is_set():
                # The pass that held this ask failed: ask again.
                mine = self._join(uid)
            running = self._running
            if running is not None:
                await running.ended.wait()
                continue
            assert self._gathering is not None
            begun, self._gathering, self._running = self._gathering, None, self._gathering
            try:
                # Not abandoned on cancel: the pass always ends, so its askers are answered.
                found = await anyio.to_thread.run_sync(
                    self._read, self._env_name, sorted(begun.uids)
                )
                begun.found = found
                self.passes += 1
            finally:
                self._running = None
                begun.ended.set()
        return mine.found[uid]
