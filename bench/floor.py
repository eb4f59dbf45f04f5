"""The floors under issue 13's fan-out goals: what this machine charges for 1 and for N seats
before cotal does any work of its own.

    .venv/bin/python bench/floor.py            # N = 50, 3 repetitions: about 1 min
    .venv/bin/python bench/floor.py --json     # one JSON document on stdout; progress on stderr

Four parts, each timed as wall clock from the first process's start to the last one's end, with
N started at once (or, for the git work, as many at once as there are cores) and no cotal
process running:

1. **Harness starts.** N scribe harnesses (`python -m connectors.scribe`, the harness every
   benchmark seat runs, without cotal's launcher in front of it), each on its own new session
   store, until each has answered one state query on stdin. A resumed seat must be running and
   answering before the resume can prove it adopted, so no resume of N seats ends sooner.
2. **Shell captures.** The record's shell capture (`bench/cut.py`'s procedure, section 6 step
   5) of N small repositories as `bench/goals.py`'s fan-out builds them. It is the least a cut
   writes per seat; cotal's capture adds the checks the record asks for around it.
3. **Inspections.** The git processes of the three inspections issue 13 keeps for each seat:
   the preflight at prepare (`rev-parse`, `for-each-ref`, the index scan, `status`, the config
   listing), the capture's own reading (`rev-parse`, `for-each-ref`, `status`) and the
   after-capture check (the same three), with cotal's own arguments, as many at once as there
   are cores; the Python around them is left out.
4. **Broker exit.** nats-server with JetStream, one stream and N durable pull consumers (one per
   seat's inbox, as a mesh of N seats holds), from SIGTERM to its exit.

A ratio goal of 2.0 between N seats and one needs the N-seat wall within twice the one-seat
wall, so the table prints, for each part, half the N-seat floor: the least one-seat wall for
which that floor alone would leave the goal reachable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from statistics import median
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import cut as cut_bench  # noqa: E402
from bench.common import REPO, bench_env, machine_info, say, temp_tree  # noqa: E402
from manager.broker.embedded import nats_server_binary  # noqa: E402
from manager.checkpoint.gitstate import PROBE_ARGS, REFS_ARGS, STATUS_ARGS  # noqa: E402

STATE_QUERY = b'{"type":"get_state","id":"floor"}\n'


# What any coordinator written on the design card's stack imports before it can do anything:
# the async runtime on the backend nats-py needs, the codec and the logger.
STACK_IMPORTS = "import anyio, anyio._backends._asyncio, msgspec, structlog"
# A resume's coordinator also checks a signature and talks to the broker before any seat runs.
RESUME_STACK_IMPORTS = (
    f"{STACK_IMPORTS}, nats, nats.js, cryptography.hazmat.primitives.asymmetric.ed25519"
)


def stack_start(imports: str = STACK_IMPORTS) -> float:
    """One interpreter that imports the card's packages and exits: the part of any whole-process
    figure that no CLI on this stack can avoid."""
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", imports], check=True, env=dict(os.environ))
    return time.perf_counter() - t0


def harness_starts(scratch: Path, n: int) -> float:
    """N scribe harnesses started at once, until each answered its state query."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    t0 = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "connectors.scribe", "--store", str(scratch / f"store-{i}")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
            cwd=scratch,
        )
        for i in range(n)
    ]
    try:
        for proc in procs:
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(STATE_QUERY)
            proc.stdin.flush()
        for proc in procs:
            assert proc.stdout is not None
            while b'"type":"state"' not in (line := proc.stdout.readline()):
                if not line:
                    raise RuntimeError(f"a scribe harness exited before answering ({proc.wait()})")
        wall = time.perf_counter() - t0
    finally:
        for proc in procs:
            if proc.stdin is not None:
                proc.stdin.close()
        for proc in procs:
            proc.wait(timeout=30)
    for i in range(n):
        shutil.rmtree(scratch / f"store-{i}", ignore_errors=True)
    return wall


def _run_at_cores(argvs: list[list[str]], env: dict[str, str]) -> float:
    """Every command, as many at once as there are cores; the wall until the last one ends."""
    jobs = os.cpu_count() or 1
    pending = list(argvs)
    running: list[subprocess.Popen[bytes]] = []
    t0 = time.perf_counter()
    while pending or running:
        while pending and len(running) < jobs:
            running.append(
                subprocess.Popen(
                    pending.pop(0), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
            )
        # Polled, not os.wait(): the subprocess module reaps children of its own accord.
        time.sleep(0.0005)
        for proc in [p for p in running if p.poll() is not None]:
            running.remove(proc)
            if proc.returncode != 0:
                raise RuntimeError(f"{proc.args!r:.80} failed ({proc.returncode})")
    return time.perf_counter() - t0


def shell_captures(scratch: Path, repos: list[Path], env: dict[str, str]) -> float:
    """The record's shell capture of every repository."""
    outs = [scratch / f"out-{i}" for i in range(len(repos))]
    for out in outs:
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
    return _run_at_cores(
        [
            ["bash", "-c", cut_bench.SHELL_PROCEDURE, "bash", str(repo), str(out)]
            for repo, out in zip(repos, outs, strict=True)
        ],
        env,
    )


def _git(repo: Path, *args: str) -> str:
    return shlex.join(["git", "-C", str(repo), *args])


def inspections(repos: list[Path], env: dict[str, str]) -> float:
    """The git processes of each seat's three inspections, one shell per seat."""
    reading = (PROBE_ARGS, REFS_ARGS, STATUS_ARGS)
    preflight = (*reading, ("ls-files", "-s", "-t", "-v", "-z"))
    config = ("config", "--file", ".git/config", "--null", "--list")
    scripts = [
        "set -e\n"
        + "\n".join(
            _git(repo, *args) + " >/dev/null" for args in (*preflight, config, *reading, *reading)
        )
        for repo in repos
    ]
    return _run_at_cores([["bash", "-c", script] for script in scripts], env)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


async def _add_consumers(url: str, n: int) -> None:
    import nats

    async def quiet(_exc: Exception) -> None:
        return None

    for _ in range(200):
        try:
            nc = await nats.connect(
                url,
                connect_timeout=1,
                allow_reconnect=False,
                error_cb=quiet,
                max_reconnect_attempts=0,
            )
            break
        except Exception:  # noqa: BLE001 - the server is still starting
            await asyncio.sleep(0.02)
    else:
        raise RuntimeError("nats-server did not start")
    js = nc.jetstream()
    await js.add_stream(name="DM", subjects=["dm.>"])
    for i in range(n):
        await js.publish(f"dm.s{i}", b"x")
        sub = await js.pull_subscribe(f"dm.s{i}", durable=f"c{i}", stream="DM")
        [msg] = await sub.fetch(1)
        await msg.ack()
    await nc.drain()


def broker_exit(scratch: Path, n: int) -> float:
    """nats-server holding N durable pull consumers, from SIGTERM to its exit."""
    store = scratch / "js"
    shutil.rmtree(store, ignore_errors=True)
    port = _free_port()
    conf = scratch / "floor.conf"
    conf.write_text(f'listen: 127.0.0.1:{port}\njetstream {{ store_dir: "{store}" }}\n')
    server = subprocess.Popen(
        [nats_server_binary(), "-c", str(conf)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        asyncio.run(_add_consumers(f"nats://127.0.0.1:{port}", n))
        t0 = time.perf_counter()
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=60)
        return time.perf_counter() - t0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()


def measure(n: int, reps: int) -> dict[str, Any]:
    doc: dict[str, Any] = {"seats": n, "reps": reps, "parts": {}}
    with temp_tree("cotal-floor-") as scratch:
        env = bench_env(scratch / "home")
        doc["machine"] = machine_info(scratch)
        repos = cut_bench.make_root(scratch / "root", env, n)
        parts: dict[str, Callable[[int], float]] = {
            "harnessStarts": lambda k: harness_starts(scratch, k),
            "shellCaptures": lambda k: shell_captures(scratch, repos[:k], env),
            "inspections": lambda k: inspections(repos[:k], env),
            "brokerExit": lambda k: broker_exit(scratch, k),
        }
        for name, part in parts.items():
            walls: dict[int, list[float]] = {1: [], n: []}
            for rep in range(reps):
                for k in (1, n):
                    walls[k].append(part(k))
                say(f"{name}: repetition {rep + 1}/{reps}")
            one, many = median(walls[1]), median(walls[n])
            doc["parts"][name] = {
                "oneMs": round(one * 1000, 1),
                "manyMs": round(many * 1000, 1),
                "halfManyMs": round(many * 500, 1),
                "samplesMs": {str(k): [round(w * 1000, 1) for w in v] for k, v in walls.items()},
            }
    return doc


def table(doc: dict[str, Any]) -> str:
    n = doc["seats"]
    rows = [
        f"floors on {doc['machine']['nproc']} cores, medians of {doc['reps']} repetitions",
        f"{'part':<16} {'1 seat':>10} {f'{n} seats':>10} {'half of it':>11}",
    ]
    for name, part in doc["parts"].items():
        rows.append(
            f"{name:<16} {part['oneMs'] / 1000:>9.3f}s {part['manyMs'] / 1000:>9.3f}s "
            f"{part['halfManyMs'] / 1000:>10.3f}s"
        )
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--seats", type=int, default=50, help="the large size (default 50)")
    p.add_argument("--reps", type=int, default=3, help="repetitions of each part (default 3)")
    p.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    args = p.parse_args(argv)
    doc = measure(args.seats, args.reps)
    print(json.dumps(doc, indent=2) if args.json else table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
