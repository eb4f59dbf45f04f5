"""Benchmark failover (issue 39): a standby taking a dead host's seat over, and what a standing
checkpoint costs each turn.

    .venv/bin/python bench/takeover.py            # after_s 30, 5 takeovers, 40 turns per seat
    .venv/bin/python bench/takeover.py --quick    # after_s 5, 3 takeovers, 20 turns per seat
    .venv/bin/python bench/takeover.py --json     # one JSON document on stdout

One shared broker (`cotal broker serve`) and two roots, `h1` and `h2`, each with `[failover]
enabled = true, after_s = S, standby = true`, trusting each other's key: each is the other's
standby. Seats, all scribe:

- `small` (bench/common.py's small repository) and `big` (issue 13's repository, as
  bench/goals.py builds it: `--commits` commits, a `--blob-mib` MiB blob, 20 staged, 20
  unstaged, 300 untracked files) on h1. Each is sent `--turns` messages one after another; the
  manager's `standing.stored` lines give each standing checkpoint's time, which is what each
  turn's acknowledgement waited (the capture runs between the reply's publish and the ack).
- `keeper` (the small repository again), the seat taken over: its holder's whole process tree
  (manager and seats) is SIGKILLed, and the time runs from the kill to the first reply from the
  standby, which is asked every 0.25 s (`cotal send --wait`, 2 s each) once its `ps` lists the
  seat. The dead root is brought back (`cotal up --detach --server`) and forgets the seat, and the
  next takeover goes the other way. Goal: median <= after_s + 3 s.

Last, the broker bytes the standing checkpoints hold: the object store's stream
(`OBJ_cotal_standing_<space>`), one object per seat lifecycle.

Not a test: nothing here runs in CI; the figures are recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import anyio  # noqa: E402

from bench.common import (  # noqa: E402
    Cli,
    CliError,
    bench_env,
    fresh_dir,
    machine_info,
    make_small_repo,
    say,
    shared_broker,
    temp_tree,
)
from bench.goals import build_big_repo  # noqa: E402
from protocol import names  # noqa: E402

SPACE = "main"


def signer_key(root: Path) -> str:
    [identity] = (root / ".cotal" / "auth").glob("manager-instance.*.json")
    key: str = json.loads(identity.read_text())["publicKey"]
    return key


def up(cli: Cli, broker: dict[str, Any]) -> None:
    server = ("--server", broker["url"], "--creds", broker["creds"])
    cli.run("up", "--detach", "--space", SPACE, *server)


def kill_tree(cli: Cli) -> float:
    """SIGKILL the root's manager and every seat process; the monotonic time of the kill."""
    manager = int(cli.json("status")["pid"])
    seats = [int(r["pid"]) for r in _ps(cli) if r.get("pid")]
    t0 = time.monotonic()
    for pid in [manager, *seats]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return t0


def _ps(cli: Cli) -> list[dict[str, Any]]:
    out = cli.run("ps", "--json").stdout.strip().splitlines()
    return [json.loads(line) for line in out]


def answered_at(cli: Cli, seat: str, deadline_s: float) -> float:
    """The monotonic time of the first reply from `seat` at this root."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if any(r["name"] == seat and r["state"] == "running" for r in _ps(cli)):
            try:
                cli.run("send", seat, "ping", "--wait", "--timeout", "2", timeout=10)
                return time.monotonic()
            except CliError:
                pass
        time.sleep(0.25)
    raise RuntimeError(f"{seat} did not answer at {cli.root} within {deadline_s:g} s")


def standing_times(root: Path, seat: str) -> list[float]:
    """Each `standing.stored` of the seat in the manager's log: its time in seconds."""
    log = (root / ".cotal" / "logs" / "manager.log").read_text().splitlines()
    rows = [json.loads(line) for line in log if '"standing.stored"' in line]
    return [r["took_ms"] / 1000 for r in rows if r.get("seat") == seat]


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def spread_ms(samples: list[float]) -> dict[str, Any]:
    return {
        "p50Ms": round(statistics.median(samples) * 1000, 1),
        "p99Ms": round(pct(samples, 0.99) * 1000, 1),
        "maxMs": round(max(samples) * 1000, 1),
        "n": len(samples),
    }


async def standing_bytes(broker: dict[str, Any]) -> dict[str, Any]:
    import nats

    nc = await nats.connect(broker["url"], nkeys_seed=broker["creds"])
    try:
        js = nc.jetstream()
        info = await js.stream_info(f"OBJ_{names.standing_bucket(SPACE)}")
        store = await js.object_store(names.standing_bucket(SPACE))
        objects = {o.name: o.size for o in await store.list()}
    finally:
        await nc.close()
    return {"streamBytes": info.state.bytes, "objects": objects}


def bench(scratch: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = bench_env(fresh_dir(scratch, "home"))
    doc: dict[str, Any] = {"machine": machine_info(scratch), "afterS": args.after_s}
    with shared_broker(scratch, env) as broker:
        hosts = [Cli(fresh_dir(scratch, name), env) for name in ("h1", "h2")]
        toml = f"[failover]\nenabled = true\nafter_s = {args.after_s:g}\nstandby = true\n"
        for cli in hosts:
            (cli.root / "cotal.toml").write_text(toml)
            up(cli, broker)
        for cli, other in ((hosts[0], hosts[1]), (hosts[1], hosts[0])):
            cli.run("trust", "add", signer_key(other.root), "--name", other.root.name)

        h1 = hosts[0]
        make_small_repo(h1.root / "small", env)
        make_small_repo(h1.root / "keep", env)
        say(f"building a repository of {args.commits} commits and a {args.blob_mib} MiB blob")
        doc["repo"] = build_big_repo(h1.root / "big", env, args.commits, args.blob_mib)
        for seat, cwd in (("small", "small"), ("big", "big"), ("keeper", "keep")):
            h1.run("spawn", seat, "--agent", "scribe", "--cwd", str(h1.root / cwd))

        say(f"standing checkpoints: {args.turns} turns of small and of big")
        for seat in ("small", "big"):
            for i in range(args.turns):
                h1.run("send", seat, f"turn {i}", "--wait", "--timeout", "60")
        doc["standing"] = {
            seat: spread_ms(standing_times(h1.root, seat)) for seat in ("small", "big")
        }
        h1.run("send", "keeper", "Remember the phrase bench-39.", "--wait")
        doc["brokerBytes"] = anyio.run(standing_bytes, broker)

        rounds: list[float] = []
        holder, standby = hosts
        for n in range(args.rounds):
            # The seats that are not taken over would be too: only keeper lives on the holder.
            for seat in ("small", "big"):
                if any(r["name"] == seat for r in _ps(holder)):
                    holder.run("rm", seat)
            t0 = kill_tree(holder)
            t1 = answered_at(standby, "keeper", args.after_s + 120)
            rounds.append(t1 - t0)
            where = standby.root.name
            say(f"  takeover {n + 1}: answered on {where} {t1 - t0:.2f} s after the kill")
            up(holder, broker)
            holder, standby = standby, holder
        doc["takeover"] = {
            "medianS": round(statistics.median(rounds), 2),
            "minS": round(min(rounds), 2),
            "maxS": round(max(rounds), 2),
            "samplesS": [round(r, 2) for r in rounds],
            "goalS": args.after_s + 3,
        }
        for cli in hosts:
            cli.run("down", check=False)
    return doc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", action="store_true")
    p.add_argument("--after-s", type=float, default=None)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--turns", type=int, default=None)
    p.add_argument("--commits", type=int, default=None)
    p.add_argument("--blob-mib", type=int, default=None)
    args = p.parse_args(argv)
    args.after_s = args.after_s or (5.0 if args.quick else 30.0)
    args.rounds = args.rounds or (3 if args.quick else 5)
    args.turns = args.turns or (20 if args.quick else 40)
    args.commits = args.commits or (300 if args.quick else 2000)
    args.blob_mib = args.blob_mib or (4 if args.quick else 32)
    with temp_tree("cotal-takeover-bench-") as scratch:
        doc = bench(scratch, args)
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        s, t = doc["standing"], doc["takeover"]
        for seat in ("small", "big"):
            print(
                f"standing checkpoint, {seat}: p50 {s[seat]['p50Ms']} ms, p99 {s[seat]['p99Ms']} ms"
            )
        print(f"broker bytes: {doc['brokerBytes']}")
        print(
            f"takeover (after_s {doc['afterS']:g}): median {t['medianS']} s "
            f"(min {t['minS']}, max {t['maxS']}; goal <= {t['goalS']:g} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
