"""Benchmark `cotal move`: the downtime of one seat moved between two running managers, and what
the other seats see while it moves.

    .venv/bin/python bench/move.py             # 10 moves of each seat, 2,000 commits, 32 MiB
    .venv/bin/python bench/move.py --quick     # 4 moves of each, 300 commits, 4 MiB blob
    .venv/bin/python bench/move.py --json      # one JSON document on stdout (progress on stderr)

One shared broker (`cotal broker serve`, as the tests' `shared_broker`), two roots A and B each
`cotal up --detach --server URL --creds FILE`, each trusting the other's key (`cotal trust add`).
Seats, all scribe: `small` (bench/common.py's small repository, staged, unstaged and untracked
changes) and `big` (issue 13's repository, as bench/goals.py builds it: a history of
`--commits` commits, a committed blob of `--blob-mib` MiB of random bytes, 20 staged, 20
unstaged and 300 untracked files) on A; `stay_a` on A and `stay_b` on B, which never move.

Traffic, in process against the shared broker, from the first measurement to the last:

- the other seats: one round trip at a time to each of `stay_a` and `stay_b` (a DM published as
  `cotal send` publishes it, the clock stopped when its reply is published on the DM stream),
  then `--ping-gap` seconds of rest (0.1). A round trip counts "during a move" when it was sent
  between the start and the end of a `cotal move` process, "without" when sent in the
  `--baseline` seconds before the first move (the same traffic, no move). One that fails to
  publish or gets no reply in `PING_TIMEOUT_S` is a failed send;
- the moved seat: a DM every `PROBE_EVERY_S` to the seat being moved, from its first move to its
  last and no reply awaited, so the seat is idle but for a turn of a few milliseconds five times
  a second, and every move has mail waiting for its first turn at the destination. Each reply is
  counted twice: as published (a core subscription sees every publish, one the stream drops as
  a duplicate too) and as stored (an ordered consumer of the DM stream sees what a reader of
  its inbox would). Every message must be answered exactly once in the stream.

Then `--moves` moves of `small`, A->B->A..., and as many of `big`. Per move, from `--json`,
`downtimeMs` (from the source's fence to the destination's answer once the seat runs there),
and on this host's one clock: the time from the fence to the first reply from the destination
(the issue's "first answered turn"), and the phases by the marks the move leaves: its progress
lines on stderr (stamped as they arrive) and the destination manager's log (`move.adopting`,
`move.adopted`). After each move `ps` on both roots says where the seat runs; at the end, the
other seats' pids and restart counts against those at the start.

Last, the floors: for each repository, `git bundle create --all`, the bundle put into an Object
Store bucket on the shared broker and got back (as one bytes object and into a file, as the
destination gets it), `git init` + `git bundle unbundle`, and a checkout. Without pre-copy all of
it is inside the window: the big repository's sum less the small one's is what its moves would
add to the small ones' downtime at the least. With pre-copy (`cotal move` ships and indexes the
history before the fence) only the checkout of the bigger tree stays inside it.

Not a test: nothing here runs in CI, and the numbers are recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio  # noqa: E402
import nats  # noqa: E402
from nats.aio.msg import Msg  # noqa: E402
from nats.js import JetStreamContext  # noqa: E402

from bench.common import (  # noqa: E402
    REPO,
    Cli,
    Mesh,
    bench_env,
    fresh_dir,
    git,
    machine_info,
    make_small_repo,
    ms,
    run_stamped,
    say,
    shared_broker,
    summarize,
    temp_tree,
)
from bench.goals import build_big_repo  # noqa: E402
from bench.resume import make_root  # noqa: E402
from manager import logs  # noqa: E402
from manager.broker.dm import new_message_id  # noqa: E402
from protocol import names  # noqa: E402
from protocol.instant import now_iso  # noqa: E402
from protocol.messages import DirectMessage, decode_dm, encode  # noqa: E402

SPACE = names.DEFAULT_SPACE
OWNER = names.SEAT_OWNER
SMALL, BIG, STAY_A, STAY_B = "small", "big", "stay_a", "stay_b"
# Two senders of our own, so each kind of traffic has its own reply subjects.
PING, PROBE = "ping", "probe"
PING_GAP_S = 0.1
PING_TIMEOUT_S = 60.0
PROBE_EVERY_S = 0.2
# Between moves: the moved seat's mail caught up, and round trips "between" moves to compare.
SETTLE_S = 1.0
# After the last move: every reply the last messages will get has had time to come.
DRAIN_S = 60.0
FLOOR_REPS = 3
FLOOR_OBJECT = "bench-floor"
# The phases of one move, each from its mark to the next one's (bench/move.py's docstring).
PHASES = (
    "probe",
    "precopy",
    "fencePlan",
    "stopCaptureSeal",
    "packPut",
    "fetch",
    "restoreToLaunch",
    "launchToAdopted",
    "answerForgetExit",
)
HOME_OF = {STAY_A: "A", STAY_B: "B"}
DOWNTIME_GOAL_MS = 1000.0
BIG_RATIO_GOAL = 1.3
P99_RATIO_GOAL = 2.0


def p99(samples: list[float]) -> float | None:
    if not samples:
        return None
    if len(samples) < 2:
        return ms(samples[0])
    return ms(statistics.quantiles(samples, n=100, method="inclusive")[98])


def _ts(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def log_rows(root: Path, after: float, before: float) -> list[tuple[float, str]]:
    """The events of `root`'s manager log between two instants (epoch seconds), in order."""
    found: list[tuple[float, str]] = []
    try:
        text = (root / ".cotal" / "logs" / "manager.log").read_text()
    except OSError:
        return found
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        # A delivery of the traffic is no mark of the move's.
        if row.get("event") == "delivery.acked":
            continue
        if after <= (t := _ts(row["timestamp"])) <= before:
            found.append((t, str(row.get("event"))))
    return found


def _event(rows: list[tuple[float, str]], event: str) -> float | None:
    return next((t for t, e in rows if e == event), None)


# -- the traffic --------------------------------------------------------------------------------


@dataclass
class RoundTrip:
    seat: str
    sent: float
    seconds: float | None  # None: the send failed (publish refused, or no reply in time)


@dataclass
class Traffic:
    """Everything the traffic saw, stamped with time.time() like the move's own marks."""

    nc: Any
    js: JetStreamContext
    trips: list[RoundTrip] = field(default_factory=list)
    waiting: dict[str, anyio.Event] = field(default_factory=dict)
    target: str | None = None
    probes: dict[str, tuple[str, float]] = field(default_factory=dict)
    probe_failures: int = 0
    published: Counter[str] = field(default_factory=Counter)
    stored: Counter[str] = field(default_factory=Counter)
    replies: list[tuple[float, str, str]] = field(default_factory=list)
    stopping: bool = False
    ping_gap_s: float = PING_GAP_S
    all_answered: anyio.Event = field(default_factory=anyio.Event)

    def unanswered(self) -> int:
        return sum(1 for mid in self.probes if mid not in self.stored)

    async def on_ping_reply(self, msg: Msg) -> None:
        dm = decode_dm(msg.data)
        if dm.in_reply_to in self.waiting:
            self.waiting[dm.in_reply_to].set()

    async def on_probe_reply(self, msg: Msg) -> None:
        dm = decode_dm(msg.data)
        if dm.in_reply_to:
            self.published[dm.in_reply_to] += 1
            self.replies.append((time.time(), dm.sender.split(".", 1)[1], dm.in_reply_to))

    async def on_probe_stored(self, msg: Msg) -> None:
        dm = decode_dm(msg.data)
        if dm.in_reply_to:
            self.stored[dm.in_reply_to] += 1
            if self.target is None and not self.unanswered():
                self.all_answered.set()

    async def publish(self, seat: str, sender: str, text: str, mid: str | None = None) -> str:
        dm = DirectMessage(
            mid or new_message_id(), f"{OWNER}.{sender}", f"{OWNER}.{seat}", text, now_iso()
        )
        subject = names.dm_subject(SPACE, OWNER, seat, OWNER, sender)
        await self.js.publish(subject, encode(dm), headers={"Nats-Msg-Id": dm.id})
        return dm.id

    async def ping_loop(self, seat: str) -> None:
        n = 0
        while not self.stopping:
            n += 1
            sent = time.time()
            seconds: float | None = None
            event = anyio.Event()
            # Waited for before the publish: the reply can come before the publish's ack does.
            mid = new_message_id()
            self.waiting[mid] = event
            try:
                t0 = time.perf_counter()
                await self.publish(seat, PING, f"ping {n}", mid)
                with anyio.move_on_after(PING_TIMEOUT_S):
                    await event.wait()
                    seconds = time.perf_counter() - t0
            except Exception as exc:
                say(f"  ping to {seat} failed: {exc!r}")
            finally:
                self.waiting.pop(mid, None)
            if seconds is None:
                say(f"  ping {n} to {seat}: no reply in {PING_TIMEOUT_S} s")
            self.trips.append(RoundTrip(seat, sent, seconds))
            await anyio.sleep(self.ping_gap_s)

    async def probe_loop(self) -> None:
        n = 0
        while not self.stopping:
            target = self.target
            if target is not None:
                n += 1
                sent = time.time()
                try:
                    mid = await self.publish(target, PROBE, f"probe {n}")
                    self.probes[mid] = (target, sent)
                except Exception as exc:
                    self.probe_failures += 1
                    say(f"  probe to {target} failed: {exc!r}")
            await anyio.sleep(PROBE_EVERY_S)


# -- the moves ----------------------------------------------------------------------------------


@dataclass
class Host:
    name: str
    cli: Cli
    mesh: Mesh
    instance: str = ""
    key: str = ""


def signer_key(root: Path) -> str:
    [identity] = (root / ".cotal" / "auth").glob("manager-instance.*.json")
    key = json.loads(identity.read_text())["publicKey"]
    assert isinstance(key, str)
    return key


def _first(lines: list[tuple[float, str]], prefix: str) -> float | None:
    return next((t for t, text in lines if text.startswith(prefix)), None)


def first_answer(traffic: Traffic, row: dict[str, Any]) -> float | None:
    """From the fence to the seat's first reply from the destination, in ms. The first reply
    after the checkpoint left the source is the destination's: the seat stopped before the
    seal, so the source answers nothing after it."""
    fence, carried = row["phaseStarts"]["fencePlan"], row["phaseStarts"]["fetch"]
    if fence is None or carried is None:
        return None
    replies = list(traffic.replies)
    first = next((t for t, who, _ in replies if who == row["seat"] and t >= carried), None)
    return ms(first - fence) if first is not None else None


def move_once(
    env: dict[str, str], traffic: Traffic, seat: str, src: Host, dst: Host, index: int
) -> dict[str, Any]:
    run = run_stamped(
        [
            sys.executable,
            "-m",
            "manager.cli",
            "move",
            seat,
            "--to",
            dst.instance,
            "--json",
            "--root",
            str(src.cli.root),
        ],
        env=env,
        cwd=src.cli.root,
        timeout=600.0,
    )
    lines: list[tuple[float, str]] = run["lines"]
    if run["rc"] != 0:
        raise RuntimeError(
            f"move {index} of {seat} {src.name}->{dst.name} failed ({run['rc']}):\n"
            f"{run['stdout']}\n" + "\n".join(text for _, text in lines)
        )
    out = json.loads(run["stdout"])
    probed = _first(lines, "destination ")
    fence = _first(lines, "cutting ") or _first(lines, "continuing the move")
    cut = _first(lines, "stopping the cut seat")
    carried = _first(lines, "carried ")
    there = log_rows(dst.cli.root, run["start"], run["end"])
    here = log_rows(src.cli.root, run["start"], run["end"])
    row: dict[str, Any] = {
        "seat": seat,
        "from": src.name,
        "to": dst.name,
        "downtimeMs": out["downtimeMs"],
        "totalMs": out["totalMs"],
        "wallMs": ms(run["wallS"]),
        "start": run["start"],
        "end": run["end"],
        "progress": [[round((t - run["start"]) * 1000.0, 1), text] for t, text in lines],
        "sourceLog": [[round((t - run["start"]) * 1000.0, 1), e] for t, e in here],
        "destinationLog": [[round((t - run["start"]) * 1000.0, 1), e] for t, e in there],
    }
    adopting = _event(there, "move.adopting")
    launched = next(
        (t for t, e in there if e == "seat.started" and adopting and t >= adopting), None
    )
    # Each phase runs from its own mark to the next one's.
    marks = [
        ("probe", run["start"]),
        ("precopy", probed),
        ("fencePlan", fence),
        ("stopCaptureSeal", cut),
        ("packPut", _first(lines, "  sealed: ")),
        ("fetch", carried),
        ("restoreToLaunch", adopting),
        ("launchToAdopted", launched),
        ("answerForgetExit", _event(there, "move.adopted")),
        ("end", run["end"]),
    ]
    phases: dict[str, float | None] = {}
    for (key, start), (_, end) in zip(marks, marks[1:], strict=False):
        phases[key] = ms(end - start) if start is not None and end is not None else None
    row["phasesMs"] = phases
    row["phaseStarts"] = {key: at for key, at in marks}
    row["firstAnswerMs"] = first_answer(traffic, row)
    return row


def where(hosts: list[Host]) -> dict[str, dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for host in hosts:
        # `ps --json` is one row per line.
        for line in host.cli.run("ps", "--json").stdout.splitlines():
            if line.strip():
                r = json.loads(line)
                rows[r["name"]] = {**r, "host": host.name}
    return rows


async def run_series(
    env: dict[str, str],
    traffic: Traffic,
    seat: str,
    hosts: list[Host],
    moves: int,
    uid: str,
) -> list[dict[str, Any]]:
    traffic.target = seat
    rows: list[dict[str, Any]] = []
    for i in range(moves):
        src, dst = (hosts[0], hosts[1]) if i % 2 == 0 else (hosts[1], hosts[0])
        say(f"{seat}: move {i + 1}/{moves}, {src.name} -> {dst.name}")
        row = await anyio.to_thread.run_sync(move_once, env, traffic, seat, src, dst, i)
        await anyio.sleep(SETTLE_S)
        at = await anyio.to_thread.run_sync(where, hosts)
        if at[seat]["host"] != dst.name or at[seat]["lifecycleUid"] != uid:
            raise RuntimeError(f"after move {i} {seat} is {at[seat]}")
        if at[seat]["state"] != "running":
            raise RuntimeError(f"after move {i} {seat} is {at[seat]['state']} at {dst.name}")
        if row["firstAnswerMs"] is None:
            # Its first answer there may come after the settle; take it as it came.
            row["firstAnswerMs"] = first_answer(traffic, row)
        say(
            f"  downtimeMs {row['downtimeMs']}, first answer {row['firstAnswerMs']} ms, "
            f"wall {row['wallMs']:.0f} ms"
        )
        rows.append(row)
    return rows


# -- the floor ----------------------------------------------------------------------------------


async def carry_floor(
    scratch: Path, env: dict[str, str], js: JetStreamContext, repo: Path
) -> dict[str, float]:
    """What carrying `repo`'s whole history costs at the least: bundle, put and get, unbundle."""
    from manager.broker import carry

    out = scratch / "floor"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    bundle, dest = out / "repo.bundle", out / "dest"

    def make() -> bytes:
        git(repo, env, "bundle", "create", "-q", str(bundle), "--all")
        return bundle.read_bytes()

    def unbundle() -> str:
        git(out, env, "init", "-q", str(dest))
        return git(dest, env, "bundle", "unbundle", str(bundle)).decode().split()[0]

    def checkout(head: str) -> None:
        git(dest, env, "checkout", "-q", "--detach", head)

    t0 = time.perf_counter()
    data = await anyio.to_thread.run_sync(make)
    bundle_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    await carry.put(js, SPACE, FLOOR_OBJECT, data)
    put_s = time.perf_counter() - t0
    # As the destination fetches it: chunk by chunk into a file (`carry.get_into`).
    t0 = time.perf_counter()
    await carry.get_into(js, SPACE, FLOOR_OBJECT, out / "got")
    get_s = into_file_s = time.perf_counter() - t0
    await carry.drop(js, SPACE, FLOOR_OBJECT)
    if (out / "got").read_bytes() != data:
        raise RuntimeError("the move bucket gave back other bytes")
    t0 = time.perf_counter()
    head = await anyio.to_thread.run_sync(unbundle)
    t1 = time.perf_counter()
    await anyio.to_thread.run_sync(checkout, head)
    checkout_s = time.perf_counter() - t1
    unbundle_s = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    return {
        "bundleBytes": float(len(data)),
        "bundleMs": ms(bundle_s),
        "putMs": ms(put_s),
        "getMs": ms(get_s),
        "getIntoFileMs": ms(into_file_s),
        "unbundleCheckoutMs": ms(unbundle_s),
        "sumMs": ms(bundle_s + put_s + min(get_s, into_file_s) + unbundle_s),
        # What a pre-copied move still does inside its window: write the tree out.
        "checkoutMs": ms(checkout_s),
    }


# What a pre-copied move must still do between the fence and the seat's start, in shell: read
# the tree's changes at the source, then lay them onto a checkout of HEAD the destination made
# before the fence (the seed's staging tree), with the record's own commands.
WINDOW_CAPTURE = r"""set -e
cd "$1"
git diff --binary --cached > "$2/index.diff"
git diff --binary > "$2/worktree.diff"
git ls-files --others --exclude-standard -z | tar --null --files-from=- -cf "$2/untracked.tar"
cd "$2"
sha256sum index.diff worktree.diff untracked.tar > sums
"""
WINDOW_RESTORE = r"""set -e
cd "$2"
sha256sum -c --quiet sums
cd "$1"
git apply --binary --allow-empty --index "$2/index.diff"
git apply --binary --allow-empty "$2/worktree.diff"
tar -xf "$2/untracked.tar"
git update-index -q --refresh >/dev/null || true
"""


def window_floor(scratch: Path, env: dict[str, str], repo: Path) -> dict[str, float]:
    """The least a pre-copied move of `repo` does inside its window: the capture of the
    changes on top of HEAD, and their restore onto a checkout of HEAD made beforehand."""
    out = scratch / "window"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir()
    carried, staged = out / "carried", out / "staged"
    carried.mkdir()
    head = git(repo, env, "rev-parse", "HEAD").decode().strip()
    git(out, env, "clone", "-q", "--no-checkout", str(repo), str(staged))
    git(staged, env, "checkout", "-q", "--detach", head)

    def shell(script: str, *paths: Path) -> float:
        t0 = time.perf_counter()
        subprocess.run(["bash", "-c", script, "bash", *map(str, paths)], env=env, check=True)
        return time.perf_counter() - t0

    capture_s = shell(WINDOW_CAPTURE, repo, carried)
    restore_s = shell(WINDOW_RESTORE, staged, carried)
    shutil.rmtree(out, ignore_errors=True)
    return {"windowCaptureMs": ms(capture_s), "windowRestoreMs": ms(restore_s)}


# -- the run ------------------------------------------------------------------------------------


def code_state(env: dict[str, str]) -> dict[str, Any]:
    """The commit measured, and which of cotal's own files differed from it when the run began."""
    head = git(REPO, env, "rev-parse", "--short", "HEAD").decode().strip()
    status = git(REPO, env, "status", "--porcelain", "--", "manager", "connectors", "protocol")
    return {"head": head, "changedFiles": sorted(line[3:] for line in status.decode().splitlines())}


def up(host: Host, broker: dict[str, Any]) -> None:
    host.cli.run("up", "--detach", "--server", broker["url"], "--creds", broker["creds"])
    host.instance = host.cli.json("status")["instanceId"]
    host.key = signer_key(host.cli.root)


async def bench(
    scratch: Path,
    env: dict[str, str],
    broker: dict[str, Any],
    hosts: list[Host],
    args: argparse.Namespace,
    doc: dict[str, Any],
) -> None:
    a, b = hosts
    nc = await nats.connect(broker["url"], nkeys_seed=broker["creds"])
    try:
        traffic = Traffic(nc, nc.jetstream(), ping_gap_s=args.ping_gap)
        await nc.subscribe(names.dm_filter(SPACE, OWNER, PING), cb=traffic.on_ping_reply)
        await nc.subscribe(names.dm_filter(SPACE, OWNER, PROBE), cb=traffic.on_probe_reply)
        await traffic.js.subscribe(
            names.dm_filter(SPACE, OWNER, PROBE),
            cb=traffic.on_probe_stored,
            ordered_consumer=True,
            deliver_policy=nats.js.api.DeliverPolicy.NEW,
        )
        before = await anyio.to_thread.run_sync(where, hosts)
        uids = {n: before[n]["lifecycleUid"] for n in (SMALL, BIG)}
        series: dict[str, list[dict[str, Any]]] = {}
        async with anyio.create_task_group() as tg:
            tg.start_soon(traffic.ping_loop, STAY_A)
            tg.start_soon(traffic.ping_loop, STAY_B)
            tg.start_soon(traffic.probe_loop)
            say(f"round trips to {STAY_A} and {STAY_B} for {args.baseline} s without a move")
            base_from = time.time()
            traffic.target = SMALL
            await anyio.sleep(args.baseline)
            base_to = time.time()
            for seat in (SMALL, BIG):
                series[seat] = await run_series(env, traffic, seat, hosts, args.moves, uids[seat])
            traffic.target = None
            say("waiting for the last replies")
            with anyio.move_on_after(DRAIN_S):
                if traffic.unanswered():
                    await traffic.all_answered.wait()
            await anyio.sleep(1.0)
            traffic.stopping = True
        after = await anyio.to_thread.run_sync(where, hosts)

        floors: dict[str, list[dict[str, float]]] = {SMALL: [], BIG: []}
        say("the floor: bundle, put and get, unbundle of each repository")
        for _ in range(FLOOR_REPS):
            for seat in (SMALL, BIG):
                repo = Path(after[seat]["cwd"])
                floor = await carry_floor(scratch, env, traffic.js, repo)
                floor.update(await anyio.to_thread.run_sync(window_floor, scratch, env, repo))
                floors[seat].append(floor)
    finally:
        await nc.close()
    doc["series"] = series
    doc["floor"] = {
        seat: {k: statistics.median(f[k] for f in runs) for k in runs[0]}
        for seat, runs in floors.items()
    }
    doc["others"] = others(traffic, series, (base_from, base_to), before, after)
    doc["movedSeat"] = exactly_once(traffic)
    # Messages the source had fetched but not handed to the seat when its fence closed: released
    # there, they are the ones a move could lose or answer twice.
    doc["movedSeat"]["releasedAtFence"] = sum(
        1 for rows in series.values() for r in rows for _, e in r["sourceLog"]
        if e == "delivery.released"
    )  # fmt: skip


def _stats(trips: list[RoundTrip]) -> dict[str, Any]:
    ok = [x.seconds for x in trips if x.seconds is not None]
    return {
        "n": len(trips),
        "failed": len(trips) - len(ok),
        "p50Ms": ms(statistics.median(ok)) if ok else None,
        "p99Ms": p99(ok),
        "maxMs": ms(max(ok)) if ok else None,
    }


def _phase_of(row: dict[str, Any], t: float) -> str:
    found = "probe"
    for key in PHASES:
        at = row["phaseStarts"].get(key)
        if at is not None and at <= t:
            found = key
    return found


def others(
    traffic: Traffic,
    series: dict[str, list[dict[str, Any]]],
    baseline: tuple[float, float],
    before: dict[str, dict[str, Any]],
    after: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    moves = [r for rows in series.values() for r in rows]

    def move_at(t: float) -> dict[str, Any] | None:
        return next((r for r in moves if r["start"] <= t <= r["end"]), None)

    quiet = [x for x in traffic.trips if baseline[0] <= x.sent < baseline[1]]
    moving = [x for x in traffic.trips if move_at(x.sent) is not None]
    between = [x for x in traffic.trips if x.sent >= baseline[1] and move_at(x.sent) is None]
    restarts = {
        n: {
            "pidBefore": before[n]["pid"],
            "pidAfter": after[n]["pid"],
            "restartsBefore": before[n]["restarts"],
            "restartsAfter": after[n]["restarts"],
        }
        for n in (STAY_A, STAY_B)
    }
    doc: dict[str, Any] = {
        "without": _stats(quiet),
        "duringMoves": _stats(moving),
        "betweenMoves": _stats(between),
        "failedSends": sum(1 for x in traffic.trips if x.seconds is None),
        "restarts": sum(
            r["restartsAfter"] - r["restartsBefore"] + (r["pidAfter"] != r["pidBefore"])
            for r in restarts.values()
        ),
        "seats": restarts,
    }
    for seat, rows in series.items():
        spans = [(r["start"], r["end"]) for r in rows]
        doc[f"during_{seat}"] = _stats(
            [x for x in moving if any(a <= x.sent <= b for a, b in spans)]
        )
    base, hot = doc["without"]["p99Ms"], doc["duringMoves"]["p99Ms"]
    doc["p99Ratio"] = round(hot / base, 2) if base and hot else None
    # Where the slow round trips were: the phase of the move at the middle of each trip, and
    # whether the seat answering it runs on the move's source host or its destination's.
    slow_over = 2 * (base or 0.0) / 1000.0
    by_phase: dict[str, list[float]] = {}
    for x in moving:
        if x.seconds is None:
            continue
        mid = x.sent + x.seconds / 2
        row = move_at(mid) or move_at(x.sent)
        assert row is not None
        role = "source" if HOME_OF[x.seat] == row["from"] else "destination"
        cell = by_phase.setdefault(f"{row['seat']}.{_phase_of(row, mid)}.{role}", [])
        cell.append(x.seconds)
    doc["slowOverMs"] = ms(slow_over)
    doc["byPhase"] = {
        key: {"n": len(v), "p99Ms": p99(v), "slow": sum(1 for s in v if s > slow_over)}
        for key, v in sorted(by_phase.items())
    }
    return doc


def exactly_once(traffic: Traffic) -> dict[str, Any]:
    sent = traffic.probes
    per_seat: dict[str, Any] = {}
    for seat in (SMALL, BIG):
        ids = [mid for mid, (s, _) in sent.items() if s == seat]
        stored = [traffic.stored.get(mid, 0) for mid in ids]
        published = [traffic.published.get(mid, 0) for mid in ids]
        per_seat[seat] = {
            "sent": len(ids),
            "answeredOnce": sum(1 for c in stored if c == 1),
            "lost": sum(1 for c in stored if c == 0),
            "duplicated": sum(1 for c in stored if c > 1),
            "publishedTwiceOrMore": sum(1 for c in published if c > 1),
        }
    total = {k: sum(v[k] for v in per_seat.values()) for k in per_seat[SMALL]}
    return {**total, "seats": per_seat, "publishFailures": traffic.probe_failures}


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for seat, rows in doc["series"].items():
        phases = {
            k: statistics.median(v for r in rows if (v := r["phasesMs"][k]) is not None)
            for k in PHASES
        }
        out[seat] = {
            "downtimeMs": summarize([r["downtimeMs"] / 1000 for r in rows]),
            "firstAnswerMs": summarize(
                [r["firstAnswerMs"] / 1000 for r in rows if r["firstAnswerMs"] is not None]
            ),
            "wallMs": summarize([r["wallMs"] / 1000 for r in rows]),
            "phasesMedianMs": {k: round(v, 1) for k, v in phases.items()},
        }
    small, big = out[SMALL], out[BIG]
    floor_extra = doc["floor"][BIG]["sumMs"] - doc["floor"][SMALL]["sumMs"]
    window_extra = doc["floor"][BIG]["checkoutMs"] - doc["floor"][SMALL]["checkoutMs"]
    # The seed checks HEAD out before the fence, so what stays inside is the changes' round trip.
    changes = ("windowCaptureMs", "windowRestoreMs")
    changes_extra = sum(doc["floor"][BIG][k] - doc["floor"][SMALL][k] for k in changes)
    out["goals"] = {
        "smallDowntimeMedianMs": small["downtimeMs"]["medianMs"],
        "smallDowntimeGoalMet": small["downtimeMs"]["medianMs"] <= DOWNTIME_GOAL_MS,
        "bigOverSmall": round(big["downtimeMs"]["medianMs"] / small["downtimeMs"]["medianMs"], 2),
        "bigOverSmallFirstAnswer": round(
            big["firstAnswerMs"]["medianMs"] / small["firstAnswerMs"]["medianMs"], 2
        ),
        "bigGoalMet": big["downtimeMs"]["medianMs"]
        <= BIG_RATIO_GOAL * small["downtimeMs"]["medianMs"],
        "bigAllowedExtraMs": round((BIG_RATIO_GOAL - 1) * small["downtimeMs"]["medianMs"], 1),
        "bigMeasuredExtraMs": round(
            big["downtimeMs"]["medianMs"] - small["downtimeMs"]["medianMs"], 1
        ),
        "floorExtraMs": round(floor_extra, 1),
        "floorRatio": round(
            (small["downtimeMs"]["medianMs"] + floor_extra) / small["downtimeMs"]["medianMs"], 2
        ),
        # With pre-copy only the checkout of the bigger tree must stay inside the window.
        "precopyFloorExtraMs": round(window_extra, 1),
        "precopyFloorRatio": round(
            (small["downtimeMs"]["medianMs"] + window_extra) / small["downtimeMs"]["medianMs"], 2
        ),
        "changesFloorExtraMs": round(changes_extra, 1),
        "changesFloorRatio": round(
            (small["downtimeMs"]["medianMs"] + changes_extra) / small["downtimeMs"]["medianMs"], 2
        ),
        "othersFailedSends": doc["others"]["failedSends"],
        "othersRestarts": doc["others"]["restarts"],
        "othersP99Ratio": doc["others"]["p99Ratio"],
        "othersGoalMet": doc["others"]["failedSends"] == 0
        and doc["others"]["restarts"] == 0
        and doc["others"]["p99Ratio"] is not None
        and doc["others"]["p99Ratio"] <= P99_RATIO_GOAL,
        "exactlyOnce": doc["movedSeat"]["answeredOnce"] == doc["movedSeat"]["sent"],
    }
    return out


def print_table(doc: dict[str, Any]) -> None:
    m, s = doc["machine"], doc["summary"]
    g = s["goals"]
    out = sys.stdout.write
    out(f"cotal move benchmark, {m['date']}\n")
    out(
        f"machine: nproc {m['nproc']}, {m['cpuModel']}, {m['memGiB']} GiB, Linux {m['kernel']}, "
        f"Python {m['python']}, load {m['loadAvgAtStart']} at start, "
        f"{m['loadAvgAtEnd']} at end\n"
        f"command: {doc['command']}; {doc['totalS']} s\n"
        f"code: {doc['code']['head']}, changed beside it: {doc['code']['changedFiles'] or 'none'}\n"
        f"big repository: {doc['repo']['commits']} commits, {doc['repo']['blobMiB']} MiB blob, "
        f"{doc['repo']['objectBytes']} object bytes\n\n"
    )
    out("  per move (ms)          downtime med/max   first answer med/max   wall med\n")
    for seat in (SMALL, BIG):
        d, f, w = s[seat]["downtimeMs"], s[seat]["firstAnswerMs"], s[seat]["wallMs"]
        out(
            f"  {seat:<8} x{d['n']:<3}        {d['medianMs']:>7.0f} {d['maxMs']:>7.0f}"
            f"        {f['medianMs']:>7.0f} {f['maxMs']:>7.0f}      {w['medianMs']:>7.0f}\n"
        )
    out(f"\n  {'phase medians (ms)':<24} {SMALL:>8} {BIG:>8}\n")
    for key in PHASES:
        small, big = s[SMALL]["phasesMedianMs"][key], s[BIG]["phasesMedianMs"][key]
        out(f"  {key:<24} {small:>8.0f} {big:>8.0f}\n")
    fl = doc["floor"]
    out(
        "\n  floor of carrying the history (ms)  bundle     put  get (bytes, into a file)"
        "  unbundle+checkout     sum  checkout\n"
    )
    for seat in (SMALL, BIG):
        f = fl[seat]
        out(
            f"  {seat:<8} {f['bundleBytes']:>11.0f} B {f['bundleMs']:>13.0f} {f['putMs']:>7.0f}"
            f" {f['getMs']:>10.0f} {f['getIntoFileMs']:>10.0f} {f['unbundleCheckoutMs']:>18.0f}"
            f" {f['sumMs']:>7.0f} {f['checkoutMs']:>9.0f}\n"
        )
    out(
        "  sum: bundle + put + the faster get + unbundle and checkout (all inside the window "
        "without pre-copy); checkout: what stays inside it with pre-copy\n"
    )
    out("\n  floor of the tree's changes (ms)   capture  restore onto a checkout of HEAD\n")
    for seat in (SMALL, BIG):
        f = fl[seat]
        out(f"  {seat:<8} {f['windowCaptureMs']:>32.0f} {f['windowRestoreMs']:>8.0f}\n")
    o = doc["others"]
    out("\n  other seats' round trips (ms)     n  failed    p50     p99     max\n")
    for key in ("without", "duringMoves", f"during_{SMALL}", f"during_{BIG}", "betweenMoves"):
        r = o[key]
        out(
            f"  {key:<30} {r['n']:>5} {r['failed']:>6} {r['p50Ms'] or 0:>7.1f}"
            f" {r['p99Ms'] or 0:>7.1f} {r['maxMs'] or 0:>7.1f}\n"
        )
    slow = sorted(o["byPhase"].items(), key=lambda kv: -kv[1]["slow"])
    out(
        f"  round trips over {o['slowOverMs']:.0f} ms (2x p99 without), by seat moved, phase of "
        "the move, host:\n"
    )
    for key, cell in [kv for kv in slow if kv[1]["slow"]][:8]:
        out(f"    {key:<40} {cell['slow']:>4} of {cell['n']:>4}, p99 {cell['p99Ms']:.0f} ms\n")
    mv = doc["movedSeat"]
    out(
        f"\n  moved seats' mail: sent {mv['sent']}, answered exactly once {mv['answeredOnce']}, "
        f"lost {mv['lost']}, duplicated {mv['duplicated']} (published twice or more: "
        f"{mv['publishedTwiceOrMore']}); {mv['releasedAtFence']} of them released at the source "
        "(fence or stop) and answered at the destination\n\n"
    )
    out("  goal                                   measured          goal      met\n")
    rows = [
        ("small downtime median", f"{g['smallDowntimeMedianMs']:.0f} ms", "<= 1000 ms",
         g["smallDowntimeGoalMet"]),
        ("big / small downtime", f"{g['bigOverSmall']:.2f}x", "<= 1.3x", g["bigGoalMet"]),
        ("  floor with pre-copy", f"{g['precopyFloorRatio']:.2f}x", "", None),
        ("  floor of the changes alone", f"{g['changesFloorRatio']:.2f}x", "", None),
        ("  floor without pre-copy", f"{g['floorRatio']:.2f}x", "", None),
        ("others: failed sends", str(g["othersFailedSends"]), "0",
         g["othersFailedSends"] == 0),
        ("others: restarts", str(g["othersRestarts"]), "0", g["othersRestarts"] == 0),
        ("others: p99 during / without", f"{g['othersP99Ratio']}x", "<= 2.0x",
         g["othersP99Ratio"] is not None and g["othersP99Ratio"] <= P99_RATIO_GOAL),
        ("moved seat: answered exactly once", f"{mv['answeredOnce']}/{mv['sent']}", "all",
         g["exactlyOnce"]),
    ]  # fmt: skip
    for name, value, goal, met in rows:
        mark = "" if met is None else ("yes" if met else "NO")
        out(f"  {name:<36} {value:>12} {goal:>13} {mark:>8}\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--moves", type=int, help="moves of each seat (default 10; --quick 4)")
    p.add_argument("--commits", type=int, help="history of the big repository (default 2000)")
    p.add_argument("--blob-mib", type=int, help="its binary blob in MiB (default 32)")
    p.add_argument("--baseline", type=float, default=20.0, help="seconds of traffic, no move")
    p.add_argument(
        "--ping-gap", type=float, default=PING_GAP_S, help="seconds between an other seat's trips"
    )
    p.add_argument("--quick", action="store_true", help="4 moves each, 300 commits, 4 MiB blob")
    p.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    p.add_argument(
        "--keep-logs",
        metavar="DIR",
        type=Path,
        help="copy both managers' logs here at the end (each destination's restore steps are "
        "its `move.progress` lines, stamped as they were said)",
    )
    args = p.parse_args(argv)
    args.moves = args.moves or (4 if args.quick else 10)
    commits = args.commits or (300 if args.quick else 2000)
    blob_mib = args.blob_mib or (4 if args.quick else 32)
    if args.moves < 2 or args.moves % 2:
        p.error("--moves is even and at least 2: each seat ends where it began")
    logs.quiet()
    with temp_tree("cotal-bench-move-") as scratch:
        env = bench_env(fresh_dir(scratch, "home"))
        saved = os.environ.get("HOME")
        os.environ["HOME"] = env["HOME"]
        try:
            doc: dict[str, Any] = {
                "machine": machine_info(scratch),
                "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
                "moves": args.moves,
                "code": code_state(env),
                "traffic": {
                    "pingGapS": args.ping_gap,
                    "probeEveryS": PROBE_EVERY_S,
                    "baselineS": args.baseline,
                },
            }
            t0 = time.perf_counter()
            roots = [scratch / "a", scratch / "b"]
            for root in roots:
                make_root(root, env)
            small = roots[0] / "seats" / SMALL
            make_small_repo(small, env)
            say(f"building a repository of {commits} commits and a {blob_mib} MiB blob")
            doc["repo"] = build_big_repo(roots[0] / "seats" / BIG, env, commits, blob_mib)
            with shared_broker(scratch, env) as broker:
                clis = [Cli(root, env) for root in roots]
                with Mesh(clis[0]) as mesh_a, Mesh(clis[1]) as mesh_b:
                    hosts = [Host("A", clis[0], mesh_a), Host("B", clis[1], mesh_b)]
                    for host in hosts:
                        up(host, broker)
                    a, b = hosts
                    a.cli.run("trust", "add", b.key, "--name", "host-b")
                    b.cli.run("trust", "add", a.key, "--name", "host-a")
                    a.mesh.spawn(SMALL, "--cwd", str(small))
                    a.mesh.spawn(BIG, "--cwd", str(roots[0] / "seats" / BIG))
                    a.mesh.spawn(STAY_A)
                    b.mesh.spawn(STAY_B)
                    anyio.run(bench, scratch, env, broker, hosts, args, doc, backend="asyncio")
                    if args.keep_logs is not None:
                        args.keep_logs.mkdir(parents=True, exist_ok=True)
                        for host in hosts:
                            log = host.cli.root / ".cotal" / "logs" / "manager.log"
                            shutil.copyfile(log, args.keep_logs / f"manager-{host.name}.log")
            doc["totalS"] = round(time.perf_counter() - t0, 1)
            doc["machine"]["loadAvgAtEnd"] = [round(x, 2) for x in os.getloadavg()]
            doc["summary"] = summary(doc)
        finally:
            if saved is None:
                os.environ.pop("HOME", None)
            else:
                os.environ["HOME"] = saved
    if args.json:
        sys.stdout.write(json.dumps(doc, sort_keys=True) + "\n")
    else:
        print_table(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
