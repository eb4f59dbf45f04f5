"""Seat-to-seat direct message latency under load, against the operator's (issue 25).

    .venv/bin/python bench/mesh_latency.py [--seats 30] [--seconds 60] [--json]

One manager on a standalone broker runs `--seats` scribe seats in a ring, each allowed to send
to the next. Every second, each seat is handed one operator message `Tell NEXT: ping N` (the
publishes spread over the second), so each seat both receives an operator message and sends a
seat message every second, and receives the previous seat's. Two latencies, from the same
clock (every stamp is this host's):

- operator: from the message's `sentAt` (stamped just before this benchmark publishes it) to
  the recipient's turn start (`delivery.received` in the manager's log);
- seat: from the seat's message's `sentAt` (stamped by the manager as it takes the seat's call)
  to the recipient's turn start.

Each is reported as p50, p99 and max over every message of the run, with the count that
never reached a turn.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio  # noqa: E402
import nats  # noqa: E402

from bench.common import (  # noqa: E402
    Cli,
    Mesh,
    bench_env,
    fresh_dir,
    machine_info,
    say,
    shared_broker,
    temp_tree,
)
from manager import logs  # noqa: E402
from manager.broker.dm import new_message_id  # noqa: E402
from protocol import names  # noqa: E402
from protocol.errors import DecodeError  # noqa: E402
from protocol.instant import now_iso  # noqa: E402
from protocol.messages import DirectMessage, decode_dm, encode  # noqa: E402

SPACE = names.DEFAULT_SPACE
OWNER = names.SEAT_OWNER
OPERATOR = "operator"
DRAIN_S = 30.0


def _ts(stamp: str) -> float:
    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def seat(i: int) -> str:
    return f"s{i:02d}"


async def drive(broker: dict[str, Any], seats: int, seconds: float) -> list[str]:
    """The operator's messages, one per seat per second; returns their ids."""
    nc = await nats.connect(broker["url"], nkeys_seed=broker["creds"])
    sent: list[str] = []
    try:
        js = nc.jetstream()
        gap = 1.0 / seats
        start = time.monotonic()
        n = 0
        while time.monotonic() - start < seconds:
            n += 1
            for i in range(seats):
                to, nxt = seat(i), seat((i + 1) % seats)
                dm = DirectMessage(
                    new_message_id(),
                    f"{OWNER}.{OPERATOR}",
                    f"{OWNER}.{to}",
                    f"Tell {nxt}: ping {n}",
                    now_iso(),
                )
                subject = names.dm_subject(SPACE, OWNER, to, OWNER, OPERATOR)
                await js.publish(subject, encode(dm), headers={"Nats-Msg-Id": dm.id})
                sent.append(dm.id)
                due = start + (n - 1) + (i + 1) * gap
                await anyio.sleep(max(0.0, due - time.monotonic()))
    finally:
        await nc.close()
    return sent


async def stored(broker: dict[str, Any]) -> dict[str, DirectMessage]:
    """Every message of the space's DM stream, by id."""
    nc = await nats.connect(broker["url"], nkeys_seed=broker["creds"])
    out: dict[str, DirectMessage] = {}
    try:
        js = nc.jetstream()
        state = (await js.stream_info(names.dm_stream(SPACE))).state
        for seq in range(state.first_seq, state.last_seq + 1):
            try:
                msg = await js.get_msg(names.dm_stream(SPACE), seq)
            except nats.js.errors.NotFoundError:
                continue
            try:
                dm = decode_dm(msg.data or b"")
            except DecodeError:
                continue  # not a message of a seat's inbox (a marker the stream also holds)
            out[dm.id] = dm
    finally:
        await nc.close()
    return out


def turn_starts(root: Path) -> dict[str, float]:
    """The first `delivery.received` of each message id in the manager's log."""
    found: dict[str, float] = {}
    for line in (root / ".cotal" / "logs" / "manager.log").read_text().splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("event") == "delivery.received" and row.get("id") not in found:
            found[str(row["id"])] = _ts(row["timestamp"])
    return found


def figures(latencies: list[float], lost: int) -> dict[str, Any]:
    if len(latencies) < 2:
        return {"n": len(latencies), "lost": lost}
    q = statistics.quantiles(latencies, n=100, method="inclusive")
    return {
        "n": len(latencies),
        "lost": lost,
        "p50Ms": round(statistics.median(latencies) * 1000, 1),
        "p99Ms": round(q[98] * 1000, 1),
        "maxMs": round(max(latencies) * 1000, 1),
    }


def measure(seats: int, seconds: float) -> dict[str, Any]:
    with temp_tree("cotal-bench-mesh-") as scratch:
        env = bench_env(fresh_dir(scratch, "home"))
        doc: dict[str, Any] = {
            "machine": machine_info(scratch),
            "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
            "seats": seats,
            "seconds": seconds,
        }
        root = fresh_dir(scratch, "root")
        with shared_broker(scratch, env) as broker:
            cli = Cli(root, env)
            with Mesh(cli) as mesh:
                cli.run("up", "--detach", "--server", broker["url"], "--creds", broker["creds"])
                say(f"spawning {seats} scribe seats in a ring")
                for i in range(seats):
                    mesh.spawn(seat(i), "--allow-send", seat((i + 1) % seats))
                say(f"{seats} operator messages and {seats} seat messages a second, {seconds:g} s")
                operator_ids = anyio.run(drive, broker, seats, seconds)
                by_id: dict[str, DirectMessage] = {}
                deadline = time.monotonic() + DRAIN_S
                while time.monotonic() < deadline:
                    by_id = anyio.run(stored, broker)
                    starts = turn_starts(root)
                    if all(i in starts for i in [*operator_ids, *_seat_ids(by_id)]):
                        break
                    time.sleep(1.0)
                starts = turn_starts(root)
        doc["operator"] = _latencies(operator_ids, by_id, starts)
        doc["seat"] = _latencies(_seat_ids(by_id), by_id, starts)
        if "p50Ms" in doc["operator"] and "p50Ms" in doc["seat"]:
            doc["ratio"] = {
                "p50": round(doc["seat"]["p50Ms"] / doc["operator"]["p50Ms"], 2),
                "p99": round(doc["seat"]["p99Ms"] / doc["operator"]["p99Ms"], 2),
            }
        return doc


def _seat_ids(by_id: dict[str, DirectMessage]) -> list[str]:
    """The seats' own messages to seats; their replies go to the operator, with no turn."""
    operator = f"{OWNER}.{OPERATOR}"
    return [i for i, dm in by_id.items() if operator not in (dm.sender, dm.recipient)]


def _latencies(
    ids: list[str], by_id: dict[str, DirectMessage], starts: dict[str, float]
) -> dict[str, Any]:
    got = [starts[i] - _ts(by_id[i].sent_at) for i in ids if i in starts and i in by_id]
    return figures(got, len(ids) - len(got))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--seats", type=int, default=30)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    args = p.parse_args(argv)
    logs.quiet()
    doc = measure(args.seats, args.seconds)
    if args.json:
        print(json.dumps(doc, indent=1))
        return 0
    print(f"{args.seats} seats, {args.seconds:g} s, on {doc['machine'].get('cpuModel', '?')}")
    for kind in ("operator", "seat"):
        f = doc[kind]
        print(
            f"  {kind:8} n={f['n']:5} lost={f['lost']:3}  p50 {f.get('p50Ms', '-')} ms  "
            f"p99 {f.get('p99Ms', '-')} ms  max {f.get('maxMs', '-')} ms"
        )
    if "ratio" in doc:
        print(f"  seat/operator: p50 {doc['ratio']['p50']}x, p99 {doc['ratio']['p99']}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
