"""The ordered bounded map and the jobs limit (manager/concurrency.py)."""

from __future__ import annotations

import argparse
import threading
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from manager import concurrency
from protocol.errors import Refusal


@pytest.mark.anyio
async def test_outcomes_come_back_in_input_order_whatever_order_they_finish_in() -> None:
    finished: list[int] = []
    gates = {i: anyio.Event() for i in range(6)}

    async def step(i: int) -> str:
        await gates[i].wait()
        finished.append(i)
        return f"item-{i}"

    async def release_backwards() -> None:
        for i in reversed(range(6)):
            await anyio.lowlevel.checkpoint()
            gates[i].set()
            await anyio.wait_all_tasks_blocked()

    async with anyio.create_task_group() as tg:
        tg.start_soon(release_backwards)
        outcomes = await concurrency.ordered_map(step, list(range(6)), anyio.CapacityLimiter(6))
    assert finished == [5, 4, 3, 2, 1, 0]
    assert [o.value for o in outcomes] == [f"item-{i}" for i in range(6)]
    assert all(o.error is None for o in outcomes)


@pytest.mark.anyio
async def test_one_failure_is_its_own_outcome_and_cancels_nobody() -> None:
    async def step(i: int) -> int:
        await anyio.lowlevel.checkpoint()
        if i in (2, 4):
            raise Refusal("odd", f"item {i} refused", "none")
        return i * 10

    outcomes = await concurrency.ordered_map(step, list(range(6)), anyio.CapacityLimiter(3))
    assert [o.value for o in outcomes] == [0, 10, None, 30, None, 50]
    assert [o.error is not None for o in outcomes] == [False, False, True, False, True, False]
    first = concurrency.first_error(outcomes)
    assert isinstance(first, Refusal) and first.message == "item 2 refused"
    with pytest.raises(Refusal, match="item 4 refused"):
        outcomes[4].unwrap()
    assert outcomes[5].unwrap() == 50


@pytest.mark.anyio
@pytest.mark.parametrize("limit", [1, 3, 8])
async def test_never_more_than_the_limit_at_once(limit: int) -> None:
    running = peak = 0
    release = anyio.Event()

    async def step(i: int) -> int:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1
        return i

    async def controller() -> None:
        # Once everything that can start has started, exactly the limit is running.
        await anyio.wait_all_tasks_blocked()
        assert running == limit
        release.set()

    async with anyio.create_task_group() as tg:
        tg.start_soon(controller)
        outcomes = await concurrency.ordered_map(
            step, list(range(20)), anyio.CapacityLimiter(limit)
        )
    assert peak == limit
    assert [o.value for o in outcomes] == list(range(20))


@pytest.mark.anyio
async def test_an_empty_list_maps_to_nothing() -> None:
    async def step(i: int) -> int:
        raise AssertionError("never called")

    assert await concurrency.ordered_map(step, [], anyio.CapacityLimiter(2)) == []


def test_the_default_is_twice_the_cores_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(concurrency.ENV, raising=False)
    for cores, expected in [(1, 2), (2, 4), (4, 8), (8, 16), (64, 16)]:
        monkeypatch.setattr(concurrency, "usable_cores", lambda cores=cores: cores)
        assert concurrency.jobs() == expected


@pytest.mark.parametrize("value", ["", "0", "-1", "+3", " 4", "4 ", "3.0", "0x4", "٣", "257"])
def test_cotal_jobs_is_parsed_strictly(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(concurrency.ENV, value)
    with pytest.raises(Refusal) as caught:
        concurrency.jobs()
    assert caught.value.code == "bad-jobs"
    assert caught.value.message == (
        f"COTAL_JOBS={value!r} is not a whole number of jobs from 1 to {concurrency.MAX_JOBS}"
    )


@pytest.mark.parametrize("value", ["1", "7", "256"])
def test_cotal_jobs_overrides_the_default(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(concurrency.ENV, value)
    assert concurrency.jobs() == int(value)
    assert concurrency.limiter().total_tokens == int(value)


def test_the_jobs_flag_hands_its_value_on_as_cotal_jobs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(concurrency.ENV, raising=False)
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--jobs", action=concurrency.JobsAction)
    assert parser.parse_args(["--jobs", "5"]).jobs == 5
    assert concurrency.jobs() == 5
    with pytest.raises(argparse.ArgumentError, match="--jobs='five' is not a whole number"):
        parser.parse_args(["--jobs", "five"])


def test_admission_checks_bundles_at_once_and_names_the_first_seat_in_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from types import SimpleNamespace

    from manager.checkpoint import admit

    monkeypatch.setenv(concurrency.ENV, "3")
    names = ["s1", "s2", "s3"]
    # s3 refuses at once; s2 refuses only once s3 has: a loop over the seats would name s2.
    s3_refused = threading.Event()
    running: set[str] = set()
    peak = 0
    lock = threading.Lock()

    def check(name: str, *_: object, **__: object) -> None:
        nonlocal peak
        with lock:
            running.add(name)
            peak = max(peak, len(running))
        try:
            if name == "s3":
                s3_refused.set()
                raise Refusal("refs-mismatch", f"seat {name}: bad", "cure")
            if name == "s2":
                assert s3_refused.wait(10)
                raise Refusal("base-missing", f"seat {name}: bad", "cure")
            assert s3_refused.wait(10)
        finally:
            with lock:
                running.discard(name)

    monkeypatch.setattr(admit, "check_repository", check)
    records = {n: SimpleNamespace(repository=None) for n in names}
    with pytest.raises(Refusal) as caught:
        admit._check_repositories(
            Path("/nonexistent"),
            {n: n for n in names},
            records,  # type: ignore[arg-type]
            {n: [] for n in names},
            None,
        )
    assert (caught.value.code, caught.value.message) == ("base-missing", "seat s2: bad")
    assert peak == 3
