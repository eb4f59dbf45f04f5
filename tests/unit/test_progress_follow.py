"""The progress poller beside a commit ends between polls: a poll still in flight when the
commit returns gets its answer, rather than a cancellation racing the reply (anyio's asyncio
socket streams print an `InvalidStateError` traceback when the two land in one loop pass)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import pytest

from manager.coord import progress
from protocol import control

pytestmark = pytest.mark.anyio


class _Side:
    def __init__(self, release: anyio.Event) -> None:
        self.release = release
        self.asked = anyio.Event()
        self.trail: list[str] = []

    async def request(self, op: object, args: object) -> control.ProgressResult:
        self.trail.append("asked")
        self.asked.set()
        try:
            await self.release.wait()
        except anyio.get_cancelled_exc_class():
            self.trail.append("cancelled")
            raise
        self.trail.append("answered")
        return control.ProgressResult(attempt_id="a1", records=[], done=False)


class _Session:
    def __init__(self, side: _Side) -> None:
        self.side = side

    @asynccontextmanager
    async def side_channel(self) -> AsyncIterator[_Side]:
        yield self.side

    async def request(self, op: object, args: object) -> control.ProgressResult:
        return control.ProgressResult(attempt_id="a1", records=[], done=False)


async def test_a_poll_in_flight_when_the_commit_returns_is_answered_not_cancelled() -> None:
    release = anyio.Event()
    side = _Side(release)

    async def commit() -> str:
        await side.asked.wait()
        return "committed"

    async def answer_late() -> None:
        # The reply lands only after the commit has returned and the poller has been told.
        for _ in range(5):
            await anyio.lowlevel.checkpoint()
        release.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(answer_late)
            view = progress.ProgressView(lambda line: None)
            got = await progress.follow_commit(_Session(side), "a1", view, commit)  # type: ignore[arg-type]
    assert got == "committed"
    assert side.trail == ["asked", "answered"]


async def test_a_poll_that_never_answers_is_cancelled_after_the_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(progress, "FOLLOW_GRACE_S", 0.05)
    side = _Side(anyio.Event())

    async def commit() -> str:
        await side.asked.wait()
        return "committed"

    with anyio.fail_after(5):
        got = await progress.follow_commit(
            _Session(side),  # type: ignore[arg-type]
            "a1",
            progress.ProgressView(lambda line: None),
            commit,
        )
    assert got == "committed"
    assert side.trail == ["asked", "cancelled"]
