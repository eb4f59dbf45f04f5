"""Stops that ask at once share a pass over /proc, and a pass answers only the stops that asked
before it began (manager/daemon/survivors.py), on real processes."""

from __future__ import annotations

import os
import subprocess
import threading
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path

import anyio
import pytest

from manager.daemon.survivors import LIFECYCLE_ENV, SurvivorScan
from manager.procs import processes_with_envs

pytestmark = pytest.mark.anyio


@pytest.fixture
def sleepers(tmp_path: Path) -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def _sleeper(uid: str, cwd: Path) -> subprocess.Popen[bytes]:
    env = {"PATH": os.environ["PATH"], LIFECYCLE_ENV: uid}
    return subprocess.Popen(["sleep", "60"], env=env, cwd=cwd, start_new_session=True)


async def test_twenty_stops_at_once_take_two_passes_and_each_gets_its_own_pids(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    uids = [f"u{uuid.uuid4().hex}" for _ in range(20)]
    # Every other lifecycle still has a process; the rest are gone.
    for uid in uids[::2]:
        sleepers.append(_sleeper(uid, tmp_path))
    scan = SurvivorScan()
    answers: dict[str, list[int]] = {}

    async def ask(uid: str) -> None:
        answers[uid] = await scan.survivors(uid)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for uid in uids:
                tg.start_soon(ask, uid)
    # The first ask begins a pass alone; the other nineteen gather for the next one.
    assert scan.passes == 2
    by_uid = {uid: [p.pid] for uid, p in zip(uids[::2], sleepers, strict=True)}
    assert answers == {uid: by_uid.get(uid, []) for uid in uids}


async def test_an_ask_made_while_a_pass_runs_is_answered_by_a_later_pass(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    early, late = f"u{uuid.uuid4().hex}", f"u{uuid.uuid4().hex}"
    first_begun, release = threading.Event(), threading.Event()
    calls: list[list[str]] = []

    def read(name: str, values: Iterable[str]) -> dict[str, list[int]]:
        values = list(values)
        calls.append(values)
        found = processes_with_envs(name, values)
        if len(calls) == 1:
            first_begun.set()
            # Held open after its read: a process started now is not in what it found.
            release.wait(10)
        return found

    scan = SurvivorScan(read=read)
    answers: dict[str, list[int]] = {}

    async def ask(uid: str) -> None:
        answers[uid] = await scan.survivors(uid)

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(ask, early)
            await anyio.to_thread.run_sync(first_begun.wait, 10)
            sleepers.append(_sleeper(late, tmp_path))
            tg.start_soon(ask, late)
            await anyio.wait_all_tasks_blocked()
            release.set()
    assert calls == [[early], [late]]
    assert answers == {early: [], late: [sleepers[0].pid]}


async def test_a_failed_pass_answers_nobody_and_the_others_ask_again(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    uids = [f"u{uuid.uuid4().hex}" for _ in range(3)]
    sleepers.append(_sleeper(uids[1], tmp_path))
    calls: list[list[str]] = []

    def read(name: str, values: Iterable[str]) -> dict[str, list[int]]:
        values = list(values)
        calls.append(values)
        if len(calls) == 2:
            raise PermissionError(13, "Permission denied", "/proc")
        return processes_with_envs(name, values)

    scan = SurvivorScan(read=read)
    answers: dict[str, list[int] | str] = {}

    async def ask(uid: str) -> None:
        try:
            answers[uid] = await scan.survivors(uid)
        except PermissionError as exc:
            answers[uid] = f"refused: {exc.filename}"

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            for uid in uids:
                tg.start_soon(ask, uid)
    # Pass 1 answers the first ask; pass 2 (the other two) fails for the one that ran it;
    # pass 3 answers the one left.
    assert calls[:2] == [[uids[0]], sorted(uids[1:])]
    assert len(calls) == 3 and len(calls[2]) == 1
    refused = next(u for u in uids[1:] if answers[u] == "refused: /proc")
    answered = next(u for u in uids[1:] if u != refused)
    assert answers[uids[0]] == []
    assert answers[answered] == ([sleepers[0].pid] if answered == uids[1] else [])
    assert calls[2] == [answered]
