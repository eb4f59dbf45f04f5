"""Benchmark a fleet: several managers and their seats on one broker, as an operator sees and
steers it (issue 40, item 6).

    .venv/bin/python bench/fleet.py            # 4 managers, 120 seats; drain of 30, 4 at a time
    .venv/bin/python bench/fleet.py --quick    # 4 managers, 24 seats; drain of 8
    .venv/bin/python bench/fleet.py --json     # one JSON document on stdout (progress on stderr)
    .venv/bin/python bench/fleet.py --save F   # the table, and the JSON document written to F

One shared broker (`cotal broker serve`, bench/common.py's `shared_broker`) and `--managers`
roots, each `cotal up --detach --server URL --creds FILE` with a host label of its own
(`COTAL_HOST_LABEL`), all on the default space. Every seat is a built-in offline `scribe`. The
first root holds `--rss-seats` seats (50) and serves its metrics (`[metrics] listen` on a free
loopback port in its `cotal.toml`); the others share the rest of `--seats` (120 in all). Then:

1. **`ps --fleet`**: `cotal ps --fleet --json` at the first root, `--ps-calls` times (30), each
   a whole process (interpreter start included) timed as a subprocess; every call must list
   every seat `running`. p50 and p95. Interleaved with each, its floors: `cotal --version` (an
   interpreter and the CLI's parser) and an interpreter importing what the fleet read imports;
   of all three the CPU time (user + system) too, which other work on the machine moves far
   less than the wall; then the roster read alone, in process over one connection.
2. **Events**: `cotal events --fleet --json` at the first root runs as a follower (a child
   process; its stdout read in this process's event loop, each line stamped with time.time()
   as it arrives). Once it shows a first event (warm-up), `--events` direct messages are
   published in process (as `cotal send` publishes them) one every `--event-gap` s (0.1), round
   robin over every manager's seats, each a turn (`turn.started`, `turn.ended`); then `cotal
   stop` and `cotal start` of one seat per manager through the CLI (`seat.stopped`,
   `seat.restarted`, `seat.started`, ...). An event's latency is its arrival at the follower
   less its own `at`: the instant the manager stamped when it emitted the event, before it
   queued and published it (RFC 3339 with milliseconds, truncated, so a latency reads up to
   1 ms long; every process here shares one clock). p50 and p99 of every event from the
   warm-up on; for `turn.started`, also the time from the publish of its message.
3. **The console** (`cotal console`, issue 40 item 4; `bench/console.py`'s `measure`): the app
   headless in this process against the first root, showing the whole fleet; `--console-rounds`
   (20) stops and starts of that root's seats through the control socket, and for each change
   the time from its event's `at` (the change at the manager) to the first view the console
   draws with the seat in its new state. p50, p99, max.
4. **RSS**: the first root's manager, VmRSS and VmHWM (`/proc/<pid>/status`) sampled while
   `--rss-rounds` rounds (5) of one message to each of its seats run (events published, metrics
   counting) and its metrics endpoint is scraped after each round; the goal is judged on
   VmHWM, the most the manager was resident at any time since its start. Beside it, the other
   managers' VmRSS and what an interpreter importing the manager's modules holds (no seat).
5. **A drain**, on a fresh broker and fresh roots: `--drain-seats` seats (30, one small
   repository each, each with a commit of its own) on the first root, the other roots empty
   and trusting its key; `cotal drain --fleet --max-parallel N --json` (N = `--max-parallel`,
   4), its stderr lines
   stamped as they arrive (`wave K: ...` marks each wave). Its wall against 1.5 x the sum of
   its seats' `downtimeMs` (a wave's seats each report the wave's downtime) / N.

Every root is brought `cotal down` at the end of its part, on failure too, and every child
process reaped. Not a test: nothing here runs in CI; the numbers are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import resource
import shlex
import shutil
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, BinaryIO

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio  # noqa: E402
import nats  # noqa: E402
from anyio.streams.buffered import BufferedByteReceiveStream  # noqa: E402

from bench import console  # noqa: E402
from bench.common import (  # noqa: E402
    REPO,
    Cli,
    Mesh,
    bench_env,
    fresh_dir,
    git,
    machine_info,
    ms,
    run_stamped,
    say,
    shared_broker,
    temp_tree,
)
from bench.goals import FLEET_GOALS  # noqa: E402
from bench.move import code_state, signer_key  # noqa: E402
from bench.resume import make_root  # noqa: E402
from manager import logs  # noqa: E402
from manager.broker.dm import new_message_id  # noqa: E402
from protocol import names  # noqa: E402
from protocol.instant import now_iso, parse_instant  # noqa: E402
from protocol.mesh import decode_mesh  # noqa: E402
from protocol.messages import DirectMessage, encode  # noqa: E402

SPACE = names.DEFAULT_SPACE
OWNER = names.SEAT_OWNER
SENDER = "fleetbench"  # a sender of our own: the seats' replies land on its subjects, unread
WARMUP_TIMEOUT_S = 60.0
SETTLE_S = 2.0
FOLLOWER_LINE_CAP = 65536


# -- small pieces -------------------------------------------------------------------------------


def quantile_ms(samples_s: Sequence[float], q: int) -> float | None:
    """The q-th percentile (1-99) in ms, inclusive method; None with no sample."""
    if not samples_s:
        return None
    if len(samples_s) == 1:
        return ms(samples_s[0])
    return ms(statistics.quantiles(samples_s, n=100, method="inclusive")[q - 1])


def dist(samples_s: Sequence[float]) -> dict[str, Any]:
    return {
        "n": len(samples_s),
        "p50Ms": quantile_ms(samples_s, 50),
        "p95Ms": quantile_ms(samples_s, 95),
        "p99Ms": quantile_ms(samples_s, 99),
        "minMs": ms(min(samples_s)) if samples_s else None,
        "maxMs": ms(max(samples_s)) if samples_s else None,
    }


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def status_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in KiB."""
    found: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key = line.split(":", 1)[0]
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(line.split()[1])
    return found


def manager_pid(root: Path) -> int:
    record = decode_mesh((root / ".cotal" / "mesh.json").read_bytes())
    assert record.manager is not None
    return record.manager.pid


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


# -- a fleet ------------------------------------------------------------------------------------


@dataclass
class Root:
    name: str
    cli: Cli
    mesh: Mesh
    instance: str = ""
    key: str = ""
    seats: list[str] = field(default_factory=list)


def open_fleet(
    stack: ExitStack,
    parent: Path,
    env: dict[str, str],
    broker: dict[str, Any],
    count: int,
    metrics_port: int | None = None,
) -> list[Root]:
    """`count` roots under `parent`, each up on the broker; each one's Mesh is entered on
    `stack`, so it is brought down (and its seats ended) whatever happens after."""
    roots: list[Root] = []
    for i in range(count):
        path = parent / f"host{i}"
        make_root(path, env)
        if i == 0 and metrics_port is not None:
            (path / "cotal.toml").write_text(f'[metrics]\nlisten = "127.0.0.1:{metrics_port}"\n')
        cli = Cli(path, dict(env, COTAL_HOST_LABEL=f"host{i}"))
        root = Root(f"host{i}", cli, stack.enter_context(Mesh(cli)))
        roots.append(root)
        cli.run("up", "--detach", "--server", broker["url"], "--creds", broker["creds"])
        root.instance = cli.json("status")["instanceId"]
        root.key = signer_key(path)
    return roots


def spawn_all(roots: list[Root], plan: dict[str, list[tuple[str, Path | None]]]) -> float:
    """Spawn each root's seats (name, cwd) through the CLI, one thread per root (each root's
    spawns in order); the wall of the whole."""

    def one_root(root: Root) -> None:
        for name, cwd in plan.get(root.name, []):
            root.mesh.spawn(name, *(["--cwd", str(cwd)] if cwd is not None else []))
            root.seats.append(name)

    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(roots)) as pool:
        for done in [pool.submit(one_root, r) for r in roots]:
            done.result()
    return time.perf_counter() - t0


def down_all(roots: list[Root]) -> float:
    """`cotal down` of every root at once; the wall. Each Mesh's own exit then checks what is
    left (nothing, after a clean down)."""
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(roots)) as pool:
        procs = list(pool.map(lambda r: r.cli.run("down", timeout=300.0, check=False), roots))
    wall = time.perf_counter() - t0
    for root, proc in zip(roots, procs, strict=True):
        if proc.returncode != 0:
            say(f"  cotal down at {root.name} exited {proc.returncode}: {proc.stderr.strip()}")
    return wall


def split_seats(total: int, managers: int, first: int) -> list[int]:
    """The first root holds `first` seats; the rest are shared as evenly as can be."""
    rest = total - first
    others = managers - 1
    return [first] + [rest // others + (1 if i < rest % others else 0) for i in range(others)]


# -- 1. ps --fleet ------------------------------------------------------------------------------


# What any `cotal ps --fleet` must do before it asks the broker anything: an interpreter, the
# CLI's imports and the modules its fleet read imports (nats-py among them).
IMPORT_FLOOR = "import manager.cli.main, manager.broker.fleet, manager.broker.connection"


def timed_run(argv: list[str], root: Root) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """Wall and CPU (user + system, the child's own) of one whole process. The CPU is read
    from this process's children's usage before and after: nothing else here ends a child
    meanwhile. A CPU figure is far less moved by other work on the machine than a wall."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        argv, capture_output=True, text=True, env=root.cli.env, cwd=root.cli.root, check=False
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[1:5])} failed ({proc.returncode}): {proc.stderr}")
    return wall, cpu, proc


def check_roster(rows: list[dict[str, Any]], expect: int) -> None:
    states = Counter(r["state"] for r in rows)
    if len(rows) != expect or states["running"] != expect:
        raise RuntimeError(f"ps --fleet listed {len(rows)} seats ({dict(states)}), not {expect}")


def bench_ps(root: Root, calls: int, expect: int) -> dict[str, Any]:
    """Each call interleaved with its floors: `cotal --version` (an interpreter and the CLI's
    parser) and IMPORT_FLOOR; then the roster read alone, in process over one connection."""
    cli = [sys.executable, "-m", "manager.cli"]
    argv = [*cli, "ps", "--fleet", "--json", "--root", str(root.cli.root)]
    keys = ("psFleet", "cliVersion", "importFloor")
    walls: dict[str, list[float]] = {k: [] for k in keys}
    cpus: dict[str, list[float]] = {k: [] for k in keys}
    for i in range(calls):
        steps = [
            ("psFleet", argv),
            ("cliVersion", [*cli, "--version"]),
            ("importFloor", [sys.executable, "-c", IMPORT_FLOOR]),
        ]
        for key, step in steps if i % 2 == 0 else reversed(steps):
            wall, cpu, proc = timed_run(step, root)
            walls[key].append(wall)
            cpus[key].append(cpu)
            if key == "psFleet":
                check_roster(json.loads(proc.stdout), expect)
    doc = {**dist(walls["psFleet"]), "samplesMs": [ms(s) for s in walls["psFleet"]]}
    doc["cliVersion"] = dist(walls["cliVersion"])
    doc["importFloor"] = dist(walls["importFloor"])
    doc["cpuMs"] = {k: dist(v) for k, v in cpus.items()}
    doc["inProcess"] = anyio.run(roster_reads, root, calls, expect, backend="asyncio")
    return doc


async def roster_reads(root: Root, calls: int, expect: int) -> dict[str, Any]:
    """The broker's part alone: connect once, then `calls` roster reads, as `ps --fleet` reads."""
    from manager.broker import fleet
    from manager.broker.connection import LazyConnection
    from manager.coord import mesh
    from manager.workspace.layout import Layout

    record = mesh.read_mesh(Layout.at(root.cli.root))
    assert record is not None and record.creds is not None
    samples: list[float] = []
    t0 = time.perf_counter()
    async with LazyConnection(record.server, Path(record.creds), name="fleet-bench") as conn:
        js = await conn.jetstream()
        connect_s = time.perf_counter() - t0
        for _ in range(calls):
            t1 = time.perf_counter()
            rows = await fleet.roster(js, record.space)
            samples.append(time.perf_counter() - t1)
            if len(rows) != expect:
                raise RuntimeError(f"the roster read {len(rows)} seats, not {expect}")
    return {**dist(samples), "connectMs": ms(connect_s)}


# -- 2. events ----------------------------------------------------------------------------------


@dataclass
class Follower:
    """What `cotal events --fleet --json` printed, each line with its arrival (time.time())."""

    lines: list[tuple[float, bytes]] = field(default_factory=list)
    first: anyio.Event = field(default_factory=anyio.Event)

    async def read(self, stream: Any) -> None:
        buffered = BufferedByteReceiveStream(stream)
        while True:
            try:
                line = await buffered.receive_until(b"\n", FOLLOWER_LINE_CAP)
            except (anyio.EndOfStream, anyio.IncompleteRead):
                return
            self.lines.append((time.time(), line))
            self.first.set()


async def publish_dm(js: Any, seat: str, text: str) -> None:
    dm = DirectMessage(new_message_id(), f"{OWNER}.{SENDER}", f"{OWNER}.{seat}", text, now_iso())
    subject = names.dm_subject(SPACE, OWNER, seat, OWNER, SENDER)
    await js.publish(subject, encode(dm), headers={"Nats-Msg-Id": dm.id})


async def reap(proc: Any) -> None:
    """SIGTERM, then SIGKILL after 10 s; always waited for."""
    with anyio.CancelScope(shield=True):
        if proc.returncode is None:
            proc.terminate()
            with anyio.move_on_after(10.0):
                await proc.wait()
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
        await proc.aclose()


async def cause_events(
    js: Any, roots: list[Root], count: int, gap: float, sent: dict[str, list[float]]
) -> None:
    """`count` messages round robin over every root's seats, one every `gap` s; then a stop and
    a start of one seat per root through the CLI."""
    order = [
        root.seats[i] for i in range(max(len(r.seats) for r in roots)) for root in roots
        if i < len(root.seats)
    ]  # fmt: skip
    for n in range(count):
        seat = order[n % len(order)]
        sent.setdefault(seat, []).append(time.time())
        await publish_dm(js, seat, f"event probe {n}")
        await anyio.sleep(gap)
    for root in roots:
        victim = root.seats[-1]
        await anyio.to_thread.run_sync(partial(root.cli.run, "stop", victim))
        await anyio.sleep(gap)
        await anyio.to_thread.run_sync(partial(root.cli.run, "start", victim))
        await anyio.sleep(gap)


async def run_events(
    err: BinaryIO, roots: list[Root], broker: dict[str, Any], count: int, gap: float
) -> dict[str, Any]:
    """The follower's stderr goes to `err`."""
    follower = Follower()
    sent: dict[str, list[float]] = {}
    nc = await nats.connect(broker["url"], nkeys_seed=broker["creds"])
    try:
        js = nc.jetstream()
        argv = [sys.executable, "-m", "manager.cli", "events", "--fleet", "--json"]
        proc = await anyio.open_process(
            [*argv, "--root", str(roots[0].cli.root)],
            env=roots[0].cli.env,
            cwd=roots[0].cli.root,
            stdin=subprocess.DEVNULL,
            stderr=err,
        )
        try:
            async with anyio.create_task_group() as tg:
                assert proc.stdout is not None
                tg.start_soon(follower.read, proc.stdout)
                with anyio.fail_after(WARMUP_TIMEOUT_S):
                    while not follower.first.is_set():
                        await publish_dm(js, roots[0].seats[0], "warm-up")
                        with anyio.move_on_after(0.5):
                            await follower.first.wait()
                since = time.time()
                await cause_events(js, roots, count, gap, sent)
                await anyio.sleep(SETTLE_S)
                tg.cancel_scope.cancel()
        finally:
            await reap(proc)
    finally:
        await nc.close()
    return event_figures(follower.lines, since, sent, roots)


def event_figures(
    lines: list[tuple[float, bytes]],
    since: float,
    sent: dict[str, list[float]],
    roots: list[Root],
) -> dict[str, Any]:
    """Each event's arrival less its own `at`, from the warm-up's end on; per type too."""
    lat: list[float] = []
    by_type: dict[str, list[float]] = {}
    from_publish: list[float] = []
    instances: Counter[str] = Counter()
    for arrived, raw in lines:
        event = json.loads(raw)
        at = parse_instant(event["at"]).timestamp()
        if at < since:
            continue
        seconds = arrived - at
        lat.append(seconds)
        by_type.setdefault(event["type"], []).append(seconds)
        instances[event["instance"]] += 1
        if event["type"] == "turn.started" and event["seat"] in sent:
            before = [t for t in sent[event["seat"]] if t <= at]
            if before:
                from_publish.append(arrived - before[-1])
    names_of = {r.instance: r.name for r in roots}
    return {
        "fromAt": dist(lat),
        "byType": {k: dist(v) for k, v in sorted(by_type.items())},
        "turnStartedFromPublish": dist(from_publish),
        "eventsPerManager": {names_of.get(k, k): v for k, v in sorted(instances.items())},
        "messagesSent": sum(len(v) for v in sent.values()),
        "over100Ms": sum(1 for s in lat if s > 0.1),
    }


# -- 4. RSS -------------------------------------------------------------------------------------


def scrape(port: int) -> dict[str, float]:
    """Two figures of the manager's own metrics endpoint: its resident memory and seats running."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    found: dict[str, float] = {"bytes": float(len(text))}
    for line in text.splitlines():
        if line.startswith("cotal_manager_resident_memory_bytes "):
            found["residentBytes"] = float(line.split()[1])
        elif line.startswith('cotal_seats{state="running"} '):
            found["running"] = float(line.split()[1])
    return found


async def run_rss(
    root: Root, broker: dict[str, Any], port: int, rounds: int, gap: float
) -> dict[str, Any]:
    pid = manager_pid(root.cli.root)
    samples = [status_kib(pid)]
    scrapes: list[dict[str, float]] = []
    nc = await nats.connect(broker["url"], nkeys_seed=broker["creds"])
    try:
        js = nc.jetstream()
        for n in range(rounds):
            for seat in root.seats:
                await publish_dm(js, seat, f"rss round {n}")
                await anyio.sleep(gap)
            samples.append(status_kib(pid))
            scrapes.append(await anyio.to_thread.run_sync(scrape, port))
        await anyio.sleep(SETTLE_S)
    finally:
        await nc.close()
    samples.append(status_kib(pid))
    scrapes.append(await anyio.to_thread.run_sync(scrape, port))
    if scrapes[-1].get("running") != len(root.seats):
        raise RuntimeError(f"metrics say {scrapes[-1].get('running')} seats run at {root.name}")
    return {
        "seats": len(root.seats),
        "messages": rounds * len(root.seats),
        "vmRssMB": [round(s["VmRSS"] * 1024 / 1e6, 1) for s in samples],
        "maxVmRssMB": round(max(s["VmRSS"] for s in samples) * 1024 / 1e6, 1),
        "vmHwmMB": round(samples[-1]["VmHWM"] * 1024 / 1e6, 1),
        "metricResidentMB": [round(s.get("residentBytes", 0) / 1e6, 1) for s in scrapes],
        "scrapeBytes": int(scrapes[-1]["bytes"]),
    }


def imports_rss(root: Root) -> float:
    """The VmRSS (MB) of an interpreter that imported what the manager imports: the part of a
    manager's memory that no seat, event or metric adds."""
    # As `cotal manager` starts: the console's libraries marked absent first (manager/lean.py).
    code = (
        "from manager import lean; lean.without_console_libraries(); "
        "import manager.daemon.serve, pathlib; print(next(ln.split()[1] for ln in "
        "pathlib.Path('/proc/self/status').read_text().splitlines() if ln.startswith('VmRSS:')))"
    )
    _, _, proc = timed_run([sys.executable, "-c", code], root)
    return round(int(proc.stdout.strip()) * 1024 / 1e6, 1)


# -- 5. a drain ---------------------------------------------------------------------------------


def template_repo(path: Path, env: dict[str, str]) -> Path:
    path.mkdir(parents=True)
    git(path, env, "init", "-q", "-b", "main")
    for name in ("a.txt", "b.txt"):
        (path / name).write_text(f"{name}\n" * 20)
    git(path, env, "add", "-A")
    git(path, env, "commit", "-q", "-m", "one")
    (path / "a.txt").write_text("changed\n")
    return path


def seat_repo(template: Path, path: Path, env: dict[str, str]) -> Path:
    """A copy of the template with a commit of its own: each seat's history differs, so no
    pre-copied bundle (named by its digest) serves two seats. Its tree keeps the template's
    change, so each cut captures something."""
    shutil.copytree(template, path, symlinks=True)
    (path / "seat.txt").write_text(f"{path.name}\n")
    git(path, env, "add", "seat.txt")
    git(path, env, "commit", "-q", "-m", f"seat {path.name}")
    return path


def drain_run(root: Root, parallel: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "manager.cli", "drain", "--fleet", "--max-parallel"]
    argv += [str(parallel), "--json", "--root", str(root.cli.root)]
    run = run_stamped(argv, env=root.cli.env, cwd=root.cli.root, timeout=900.0)
    if run["rc"] != 0:
        text = "\n".join(t for _, t in run["lines"])
        raise RuntimeError(f"drain exited {run['rc']}:\n{run['stdout']}\n{text}")
    return run


def wave_phases(lines: list[tuple[float, str]], end: float) -> dict[str, list[float]]:
    """Each wave's phases by its progress lines: `wave K:` to `destination ... takes` (the
    probe), to `cutting` (the pre-copy), to the next wave (the cut, carry and offer: the
    downtime, and what the source does after it)."""
    phases: dict[str, list[float]] = {"probeMs": [], "precopyMs": [], "cutToNextWaveMs": []}
    starts = [i for i, (_, text) in enumerate(lines) if text.startswith("wave ")]
    for k, i in enumerate(starts):
        stop = starts[k + 1] if k + 1 < len(starts) else len(lines)
        marks = lines[i:stop]
        t_next = lines[stop][0] if stop < len(lines) else end
        t_probe = next((t for t, x in marks if x.startswith("destination ")), None)
        t_cut = next((t for t, x in marks if x.startswith("cutting ")), None)
        if t_probe is None or t_cut is None:
            continue
        phases["probeMs"].append(ms(t_probe - marks[0][0]))
        phases["precopyMs"].append(ms(t_cut - t_probe))
        phases["cutToNextWaveMs"].append(ms(t_next - t_cut))
    return phases


def drain_figures(run: dict[str, Any], seats: int, parallel: int) -> dict[str, Any]:
    out = json.loads(run["stdout"])
    moved = out["moved"]
    if len(moved) != seats or out["refused"] or out["left"]:
        raise RuntimeError(f"the drain did not move all {seats} seats: {run['stdout'][:2000]}")
    downtimes = [m["downtimeMs"] for m in moved]
    # Each wave starts at its `wave K:` line; its seats each report the wave's one downtime.
    starts = [t for t, text in run["lines"] if text.startswith("wave ")]
    edges = [*starts, run["end"]]
    wave_walls = [ms(b - a) for a, b in zip(edges, edges[1:], strict=False)]
    per_wave: list[int] = []
    for i in range(0, len(moved), parallel):
        per_wave.append(moved[i]["downtimeMs"])
    wall_ms = ms(run["wallS"])
    bound = FLEET_GOALS["drainOverDowntime"] * sum(downtimes) / parallel
    return {
        "seats": seats,
        "maxParallel": parallel,
        "waves": out["waves"],
        "wallMs": wall_ms,
        "sumDowntimeMs": sum(downtimes),
        "sumWaveDowntimeMs": sum(per_wave),
        "boundMs": round(bound, 1),
        "ratio": round(wall_ms / (sum(downtimes) / parallel), 2),
        "waveWallsMs": wave_walls,
        "waveDowntimesMs": per_wave,
        "beforeFirstWaveMs": ms(starts[0] - run["start"]) if starts else None,
        "destinations": dict(Counter(m["to"] for m in moved)),
        "progress": [[ms(t - run["start"]), text] for t, text in run["lines"]],
        "wavePhasesMs": wave_phases(run["lines"], run["end"]),
    }


def bench_drain(
    scratch: Path, env: dict[str, str], managers: int, seats: int, parallel: int
) -> dict[str, Any]:
    parent = fresh_dir(scratch, "drain")
    template = template_repo(parent / "template", env)
    with shared_broker(parent, env) as broker, ExitStack() as stack:
        say(f"drain: {managers} fresh roots on a fresh broker")
        roots = open_fleet(stack, parent, env, broker, managers)
        src = roots[0]
        for other in roots[1:]:
            other.cli.run("trust", "add", src.key, "--name", src.name)
        plan: list[tuple[str, Path | None]] = []
        for i in range(seats):
            plan.append(
                (f"d{i:02d}", seat_repo(template, src.cli.root / "seats" / f"d{i:02d}", env))
            )
        say(f"drain: spawning {seats} seats on {src.name}")
        spawn_all(roots, {src.name: plan})
        say(f"drain: cotal drain --fleet --max-parallel {parallel}")
        load = loadavg()
        run = drain_run(src, parallel)
        doc = drain_figures(run, seats, parallel)
        doc["loadAvgBefore"] = load
        doc["destinations"] = {
            next(r.name for r in roots if r.instance == k): v
            for k, v in doc["destinations"].items()
        }
        left = [ln for ln in src.cli.run("ps", "--json").stdout.splitlines() if ln.strip()]
        if left:
            raise RuntimeError(f"after the drain {src.name} still runs {len(left)} seat(s)")
        for root in roots[1:]:
            # The moved seats' uids, so their Mesh's exit can prove them gone.
            root.mesh.uids.extend(
                json.loads(ln)["lifecycleUid"]
                for ln in root.cli.run("ps", "--json").stdout.splitlines()
                if ln.strip()
            )
        doc["downS"] = round(down_all(roots), 1)
    return doc


# -- the fleet: parts 1 to 4 -------------------------------------------------------------


def bench_fleet(scratch: Path, env: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    parent = fresh_dir(scratch, "fleet")
    counts = split_seats(args.seats, args.managers, args.rss_seats)
    port = free_port()
    doc: dict[str, Any] = {"managers": args.managers, "seats": args.seats, "perManager": counts}
    with shared_broker(parent, env) as broker, ExitStack() as stack:
        say(f"fleet: {args.managers} roots up on one broker")
        roots = open_fleet(stack, parent, env, broker, args.managers, metrics_port=port)
        plan: dict[str, list[tuple[str, Path | None]]] = {
            r.name: [(f"h{i}s{j:02d}", None) for j in range(counts[i])] for i, r in enumerate(roots)
        }
        say(f"fleet: spawning {args.seats} seats ({', '.join(map(str, counts))})")
        doc["spawnAllS"] = round(spawn_all(roots, plan), 1)
        doc["loadAvg"] = {"afterSpawns": loadavg()}
        say(f"ps --fleet: {args.ps_calls} calls")
        doc["psFleet"] = bench_ps(roots[0], args.ps_calls, args.seats)
        doc["loadAvg"]["afterPs"] = loadavg()
        say(f"events: {args.events} messages, one every {args.event_gap} s, then stops and starts")
        with open(parent / "events-follower.err", "wb") as err:
            doc["events"] = anyio.run(
                run_events, err, roots, broker, args.events, args.event_gap, backend="asyncio"
            )
        doc["loadAvg"]["afterEvents"] = loadavg()
        say(f"console: {args.console_rounds} stops and starts at {roots[0].name}")
        doc["console"] = anyio.run(
            console.measure,
            roots[0].cli.root,
            roots[0].seats[:10],
            args.console_rounds,
            backend="asyncio",
        )
        doc["loadAvg"]["afterConsole"] = loadavg()
        say(f"rss: {args.rss_rounds} rounds of a message to each of {roots[0].name}'s seats")
        doc["rss"] = anyio.run(
            run_rss, roots[0], broker, port, args.rss_rounds, args.event_gap / 4, backend="asyncio"
        )
        doc["rss"]["otherManagersVmRssMB"] = [
            round(status_kib(manager_pid(r.cli.root))["VmRSS"] * 1024 / 1e6, 1) for r in roots[1:]
        ]
        doc["rss"]["importsAloneMB"] = imports_rss(roots[0])
        doc["loadAvg"]["afterRss"] = loadavg()
        say("fleet: cotal down at every root")
        doc["downS"] = round(down_all(roots), 1)
    return doc


# -- the table ----------------------------------------------------------------------------------


def goal_rows(doc: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    g = FLEET_GOALS
    fleet, drain = doc["fleet"], doc["drain"]
    ps, ev, rss = fleet["psFleet"], fleet["events"]["fromAt"], fleet["rss"]
    con = fleet["console"]

    def met(ok: bool) -> str:
        return "yes" if ok else "NO"

    n, s = fleet["managers"], fleet["seats"]
    return [
        (
            f"ps --fleet --json, whole process ({n} managers, {s} seats)",
            f"p50 {ps['p50Ms']:.0f} ms, p95 {ps['p95Ms']:.0f} ms (n {ps['n']})",
            f"p50 <= {g['psFleetP50Ms']:.0f} ms",
            met(ps["p50Ms"] <= g["psFleetP50Ms"]),
        ),
        (
            "event seen by events --fleet, after its `at`",
            f"p50 {ev['p50Ms']:.0f} ms, p99 {ev['p99Ms']:.0f} ms, max {ev['maxMs']:.0f} "
            f"(n {ev['n']})",
            f"p99 <= {g['eventP99Ms']:.0f} ms",
            met(ev["p99Ms"] <= g["eventP99Ms"]),
        ),
        (
            f"console redraw after a change ({con['seatsShown']} seats shown)",
            f"p50 {con['p50Ms']:.0f} ms, p99 {con['p99Ms']:.0f} ms, max {con['maxMs']:.0f} "
            f"(n {con['n']})",
            f"<= {g['consoleRedrawMs']:.0f} ms",
            met(con["maxMs"] <= g["consoleRedrawMs"]),
        ),
        (
            f"drain of {drain['seats']} seats, --max-parallel {drain['maxParallel']}",
            f"{drain['wallMs'] / 1000:.1f} s = {drain['ratio']:.2f}x sum(downtime)/"
            f"{drain['maxParallel']} ({drain['sumDowntimeMs'] / 1000:.1f} s)",
            f"<= {g['drainOverDowntime']}x ({drain['boundMs'] / 1000:.1f} s)",
            met(drain["ratio"] <= g["drainOverDowntime"]),
        ),
        (
            f"manager VmHWM, {rss['seats']} seats, events and metrics on",
            f"{rss['vmHwmMB']:.1f} MB (VmRSS max {rss['maxVmRssMB']:.1f})",
            f"<= {g['managerRssMB']:.0f} MB",
            met(rss["vmHwmMB"] <= g["managerRssMB"]),
        ),
    ]


def print_table(doc: dict[str, Any]) -> None:
    m, fleet, drain = doc["machine"], doc["fleet"], doc["drain"]
    out = sys.stdout.write
    out(f"cotal fleet benchmark (issue 40 item 6), {m['date']}\n")
    out(
        f"machine: nproc {m['nproc']}, {m['cpuModel']}, {m['memGiB']} GiB, Linux {m['kernel']}, "
        f"Python {m['python']}; load {m['loadAvgAtStart']} at start, {doc['loadAvgAtEnd']} at "
        f"end; {doc['totalS']} s\ncommand: {doc['command']}\n"
        f"code: {doc['code']['head']}, changed beside it: {len(doc['code']['changedFiles'])} "
        "file(s)\n\n"
    )
    rows = [("figure", "measured", "goal", "met"), *goal_rows(doc)]
    width = [max(len(r[i]) for r in rows) for i in range(4)]
    for k, row in enumerate(rows):
        out("  " + " | ".join(f"{c:<{width[i]}}" for i, c in enumerate(row)) + "\n")
        if k == 0:
            out("  " + "-+-".join("-" * w for w in width) + "\n")
    ps = fleet["psFleet"]
    out(
        f"\n  ps --fleet p50s (ms): whole {ps['p50Ms']:.0f}; its floors, interleaved: "
        f"`cotal --version` {ps['cliVersion']['p50Ms']:.0f}, the imports alone "
        f"{ps['importFloor']['p50Ms']:.0f}; the roster read in process "
        f"{ps['inProcess']['p50Ms']:.1f} (p95 {ps['inProcess']['p95Ms']:.1f}; "
        f"connect {ps['inProcess']['connectMs']:.0f})\n"
        "  and their CPU (user + system) p50s (ms): "
        + ", ".join(f"{k} {v['p50Ms']:.0f}" for k, v in ps["cpuMs"].items())
        + "\n"
    )
    ev = fleet["events"]
    out(f"\n  events per type (ms from `at`; {ev['messagesSent']} messages sent):\n")
    for kind, d in ev["byType"].items():
        out(f"    {kind:<18} n {d['n']:>4}  p50 {d['p50Ms']:>6.1f}  p99 {d['p99Ms']:>6.1f}"
            f"  max {d['maxMs']:>6.1f}\n")  # fmt: skip
    tp = ev["turnStartedFromPublish"]
    if tp["n"]:
        out(f"    turn.started from the message's publish: p50 {tp['p50Ms']:.1f}, "
            f"p99 {tp['p99Ms']:.1f} ms\n")  # fmt: skip
    out(f"    events per manager: {ev['eventsPerManager']}; over 100 ms: {ev['over100Ms']}\n")
    rss = fleet["rss"]
    out(
        f"\n  RSS of {rss['seats']}-seat manager (MB): VmRSS {rss['vmRssMB']}, its metric "
        f"{rss['metricResidentMB']}; other managers (seats {fleet['perManager'][1:]}) "
        f"{rss['otherManagersVmRssMB']}; the "
        f"manager's imports alone {rss['importsAloneMB']}\n"
        f"  spawn of {fleet['seats']} seats {fleet['spawnAllS']} s; down {fleet['downS']} s; "
        f"load {fleet['loadAvg']}\n"
    )
    out(
        f"\n  drain: {drain['waves']} waves to {drain['destinations']}; before the first wave "
        f"{drain['beforeFirstWaveMs']} ms\n    wave walls (ms)     {drain['waveWallsMs']}\n"
        f"    wave downtimes (ms) {drain['waveDowntimesMs']}\n"
    )
    for key, values in drain["wavePhasesMs"].items():
        if values:
            out(f"    {key:<19} median {statistics.median(values):>7.0f}  {values}\n")


# -- main ---------------------------------------------------------------------------------------


def parse(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="24 seats (10 on the first), drain of 8")
    p.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    p.add_argument("--save", metavar="FILE", help="also write the JSON document to FILE")
    p.add_argument("--managers", type=int, default=4, help="roots on the broker (default 4)")
    p.add_argument("--seats", type=int, help="seats in the fleet (default 120; quick 24)")
    p.add_argument("--rss-seats", type=int, help="of them, on the first root (default 50)")
    p.add_argument("--ps-calls", type=int, help="ps --fleet calls (default 30; quick 10)")
    p.add_argument("--events", type=int, help="messages sent to cause events (default 200)")
    p.add_argument("--event-gap", type=float, default=0.1, help="seconds between them")
    p.add_argument("--console-rounds", type=int, help="console stop+start rounds (default 20)")
    p.add_argument("--rss-rounds", type=int, help="message rounds to the first root (default 5)")
    p.add_argument("--drain-seats", type=int, help="seats drained (default 30; quick 8)")
    p.add_argument("--max-parallel", type=int, default=4, help="the drain's wave size")
    p.add_argument("--only", choices=("fleet", "drain"), help="only that part")
    args = p.parse_args(argv)
    q = args.quick
    args.seats = args.seats or (24 if q else 120)
    args.rss_seats = args.rss_seats or (10 if q else 50)
    args.ps_calls = args.ps_calls or (10 if q else 30)
    args.events = args.events or (40 if q else 200)
    args.rss_rounds = args.rss_rounds or (2 if q else 5)
    args.console_rounds = args.console_rounds or (5 if q else 20)
    args.drain_seats = args.drain_seats or (8 if q else 30)
    if args.managers < 2:
        p.error("--managers is at least 2: a fleet, and a drain needs somewhere to go")
    if not 1 <= args.rss_seats <= min(names.MAX_SEATS, args.seats - (args.managers - 1)):
        p.error("--rss-seats leaves every other root a seat, and a manager runs at most 50")
    if args.seats - args.rss_seats > (args.managers - 1) * names.MAX_SEATS:
        p.error("too many seats for the other roots (50 each at most)")
    if args.drain_seats > min(names.MAX_SEATS, (args.managers - 1) * names.MAX_SEATS):
        p.error("--drain-seats is at most 50")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    logs.quiet()
    # `pip install` of the wheel byte-compiles cotal; a checkout must have the same caches, or
    # every whole process times the compiler on the modules changed since (as bench/goals.py).
    for package in ("protocol", "connectors", "manager"):
        compileall.compile_dir(REPO / package, quiet=1)
    t0 = time.perf_counter()
    with temp_tree("cotal-bench-fleet-") as scratch:
        env = bench_env(fresh_dir(scratch, "home"))
        doc: dict[str, Any] = {
            "machine": machine_info(scratch),
            "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
            "code": code_state(env),
            "goalsSet": FLEET_GOALS,
        }
        if args.only in (None, "fleet"):
            doc["fleet"] = bench_fleet(scratch, env, args)
        if args.only in (None, "drain"):
            doc["drain"] = bench_drain(
                scratch, env, args.managers, args.drain_seats, args.max_parallel
            )
    doc["totalS"] = round(time.perf_counter() - t0, 1)
    doc["loadAvgAtEnd"] = loadavg()
    if args.save:
        Path(args.save).write_text(json.dumps(doc, sort_keys=True, indent=1, default=str) + "\n")
    if args.json or args.only:
        sys.stdout.write(json.dumps(doc, sort_keys=True, default=str) + "\n")
    else:
        print_table(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
