"""Benchmark custody at the broker: the compare-and-set claim and the writer fence's cost.

    .venv/bin/python bench/custody.py            # 500 claims, 2000+2000 publishes, 3 failovers
    .venv/bin/python bench/custody.py --quick    # 100 claims, 400+400 publishes, 1 failover
    .venv/bin/python bench/custody.py --json     # one JSON document on stdout (progress on stderr)

Two topologies, each started fresh under one temporary directory and stopped afterwards:
`single`, the embedded broker cotal starts itself (one `nats-server -js` on 127.0.0.1, nkey
auth, replicas 1); `cluster`, three `nats-server` nodes on 127.0.0.1 (`tests/cluster.py`),
replicas 3, as `cotal up --server URL,URL,URL` makes them. The client is cotal's own
`connect` (all URLs, reconnecting), as the manager and the resume coordinator use it.

(a) claim: each sample first `custody.establish`es a fresh key (create, generation 0, timed
    too), then times `custody.claim` on it (update with the expected last revision,
    generation 1) - the call a resume makes per seat.
(b) fence: `WriterFence.publish` (the expected-last-subject-sequence headers on the seat's
    outbound filter) against `js.publish` of the same encoded DM and the same `Nats-Msg-Id`
    header shape to the same stream, on another seat's subject so the two never disturb each
    other. Sequential awaited publishes, as a seat's replies are; interleaved in blocks of 100
    so drift in the machine hits both sides alike.
(c) failover (cluster only): the custody bucket's leader is killed (after moving it off the
    node this client is connected to, so no reconnect is counted) and a claim is retried every
    ~0.25 s until one succeeds: the window in which any custody call fails. The node is then
    restarted and the cluster waited on until every replica is current.

Not a test: nothing here runs in CI, and the numbers are recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio  # noqa: E402
from nats.aio.client import Client  # noqa: E402
from nats.js import JetStreamContext  # noqa: E402
from nats.js.api import StreamInfo  # noqa: E402

from bench.common import machine_info, say, temp_tree  # noqa: E402
from manager import logs  # noqa: E402
from manager.broker import custody  # noqa: E402
from manager.broker.connection import connect  # noqa: E402
from manager.broker.fence import WriterFence  # noqa: E402
from manager.broker.footprint import ensure_dm_stream, ensure_kv  # noqa: E402
from protocol import names  # noqa: E402
from protocol.messages import DirectMessage, encode  # noqa: E402

SPACE = "bench"
FENCED_SEAT = "fenced"
PLAIN_SEAT = "plain"
BLOCK = 100


# -- statistics ---------------------------------------------------------------------------------


def pct(sorted_s: list[float], q: float) -> float:
    """Nearest-rank percentile of already sorted samples."""
    k = max(0, min(len(sorted_s) - 1, int(round(q / 100.0 * len(sorted_s) + 0.5)) - 1))
    return sorted_s[k]


def stats(samples_s: list[float]) -> dict[str, Any]:
    s = sorted(samples_s)
    us = 1e6
    return {
        "n": len(s),
        "medianUs": round(statistics.median(s) * us, 1),
        "p95Us": round(pct(s, 95) * us, 1),
        "p99Us": round(pct(s, 99) * us, 1),
        "minUs": round(s[0] * us, 1),
        "maxUs": round(s[-1] * us, 1),
        "meanUs": round(statistics.fmean(s) * us, 1),
    }


# -- measurements -------------------------------------------------------------------------------


async def bench_claims(js: JetStreamContext, replicas: int, n: int) -> dict[str, Any]:
    kv = await ensure_kv(js, names.custody_bucket(SPACE), ttl=None, replicas=replicas)
    holder_a, holder_b, attempt = (
        names.mint_instance_id(),
        names.mint_instance_id(),
        names.mint_attempt_id(),
    )
    # A few untimed rounds first: connection, stream and interest warm.
    for _ in range(10):
        held = await custody.establish(kv, "warm", names.mint_lifecycle_uid(), holder_a)
    establish_s: list[float] = []
    claim_s: list[float] = []
    for i in range(n):
        uid = names.mint_lifecycle_uid()
        t0 = time.perf_counter()
        held = await custody.establish(kv, "seat", uid, holder_a)
        t1 = time.perf_counter()
        won = await custody.claim(
            kv,
            "seat",
            uid,
            expected_revision=held.revision,
            generation=1,
            holder=holder_b,
            attempt_id=attempt,
        )
        t2 = time.perf_counter()
        assert won.record.generation == 1 and won.revision > held.revision
        establish_s.append(t1 - t0)
        claim_s.append(t2 - t1)
        if (i + 1) % max(1, n // 4) == 0:
            say(f"    claims {i + 1}/{n}")
    return {"establish": stats(establish_s), "claim": stats(claim_s)}


def _dm(sender_seat: str, i: int) -> tuple[str, bytes, dict[str, str]]:
    """A seat's reply to the operator, encoded exactly as cotal publishes it."""
    msg_id = f"{sender_seat}-{i:06d}-{names.mint_lifecycle_uid()}"
    dm = DirectMessage(
        id=msg_id,
        sender=names.principal(names.SEAT_OWNER, sender_seat),
        recipient=names.principal(names.SEAT_OWNER, names.OPERATOR_ACTOR),
        text="The phrase is juniper-ledger-41. " * 4,
        sent_at="2026-01-01T00:00:00.000Z",
    )
    subject = names.dm_subject(
        SPACE, names.SEAT_OWNER, names.OPERATOR_ACTOR, names.SEAT_OWNER, sender_seat
    )
    return subject, encode(dm), {"Nats-Msg-Id": msg_id}


async def bench_fence(js: JetStreamContext, replicas: int, n: int) -> dict[str, Any]:
    await ensure_dm_stream(js, SPACE, replicas=replicas)
    fence = WriterFence(js, SPACE, FENCED_SEAT, names.mint_instance_id(), 0)
    t0 = time.perf_counter()
    await fence.establish()
    establish_s = time.perf_counter() - t0

    async def fenced(i: int) -> None:
        subject, payload, headers = _dm(FENCED_SEAT, i)
        await fence.publish(subject, payload, headers)

    async def plain(i: int) -> None:
        subject, payload, headers = _dm(PLAIN_SEAT, i)
        with anyio.fail_after(5.0):
            await js.publish(subject, payload, headers=headers)

    for i in range(50):  # warm both paths, untimed
        await fenced(-1 - i)
        await plain(-1 - i)
    samples: dict[str, list[float]] = {"fenced": [], "plain": []}
    sides: list[tuple[str, Callable[[int], Awaitable[None]]]] = [
        ("fenced", fenced),
        ("plain", plain),
    ]
    done = 0
    while done < n:
        block = min(BLOCK, n - done)
        for name, fn in sides if (done // BLOCK) % 2 == 0 else reversed(sides):
            for i in range(done, done + block):
                t = time.perf_counter()
                await fn(i)
                samples[name].append(time.perf_counter() - t)
        done += block
        if done % max(BLOCK, n // 4) == 0:
            say(f"    publishes {done}/{n} each")
    f, p = stats(samples["fenced"]), stats(samples["plain"])
    return {
        "fenceEstablishUs": round(establish_s * 1e6, 1),
        "fenced": f,
        "unfenced": p,
        "ratioMedian": round(f["medianUs"] / p["medianUs"], 3),
        "ratioMean": round(f["meanUs"] / p["meanUs"], 3),
        "lastSeq": fence.last_seq,
    }


def _cluster_leader(info: StreamInfo) -> str | None:
    if info.cluster is None:
        raise RuntimeError(f"stream {info.config.name} is not clustered")
    return info.cluster.leader


async def _leader(js: JetStreamContext, stream: str) -> str | None:
    try:
        info = await js.stream_info(stream)
    except Exception:
        return None
    return info.cluster.leader if info.cluster else None


async def move_leader_off(nc: Client, stream: str, node: str, others: list[str]) -> None:
    """JetStream's leader-stepdown API, with a preferred peer, until `node` no longer leads."""
    js = nc.jetstream(timeout=1.0)
    body = json.dumps({"placement": {"preferred": others[0]}}).encode()
    with anyio.fail_after(30):
        while (leader := await _leader(js, stream)) in (node, None):
            if leader == node:
                try:
                    await nc.request(f"$JS.API.STREAM.LEADER.STEPDOWN.{stream}", body, timeout=2)
                except Exception:  # noqa: S110 - asked again on the next round
                    pass
            await anyio.sleep(0.2)


async def caught_up(nc: Client, stream: str, nodes: int) -> None:
    """Until the stream has a leader and every other replica reports current."""
    js = nc.jetstream(timeout=1.0)
    with anyio.fail_after(60):
        while True:
            try:
                c = (await js.stream_info(stream)).cluster
            except Exception:
                c = None
            if (
                c is not None
                and c.leader
                and len(c.replicas or []) == nodes - 1
                and all(r.current for r in c.replicas or [])
            ):
                return
            await anyio.sleep(0.2)


async def bench_failover(cluster: Any, nc: Client, trials: int) -> list[dict[str, Any]]:
    """Kill the custody bucket's leader; time until a claim succeeds again."""
    js = nc.jetstream()
    stream = f"KV_{names.custody_bucket(SPACE)}"
    kv = await ensure_kv(js, names.custody_bucket(SPACE), ttl=None, replicas=3)
    holder_a, holder_b = names.mint_instance_id(), names.mint_instance_id()
    out = []
    saved_call_s = custody.CALL_S
    for trial in range(trials):
        mine = next(
            n.name
            for n in cluster.nodes
            if nc.connected_url is not None and nc.connected_url.port == n.client_port
        )
        await move_leader_off(nc, stream, mine, [n.name for n in cluster.nodes if n.name != mine])
        victim = _cluster_leader(await js.stream_info(stream))
        uid = names.mint_lifecycle_uid()
        held = await custody.establish(kv, "seat", uid, holder_a)
        attempt = names.mint_attempt_id()
        cluster.kill(victim)
        killed = time.perf_counter()
        tries = 0
        errors: dict[str, int] = {}
        custody.CALL_S = 0.25  # a short deadline per try, to see when the window closes
        try:
            with anyio.fail_after(60):
                while True:
                    tries += 1
                    try:
                        await custody.claim(
                            kv,
                            "seat",
                            uid,
                            expected_revision=held.revision,
                            generation=1,
                            holder=holder_b,
                            attempt_id=attempt,
                        )
                        break
                    except Exception as exc:  # what a caller of claim() sees in the window
                        errors[type(exc).__name__] = errors.get(type(exc).__name__, 0) + 1
                        await anyio.sleep(0.05)
        finally:
            custody.CALL_S = saved_call_s
        gap = time.perf_counter() - killed
        new_leader = _cluster_leader(await js.stream_info(stream))
        say(
            f"    failover {trial + 1}/{trials}: killed {victim}, claims failed for {gap:.2f} s "
            f"({tries} tries: {errors}), new leader {new_leader}"
        )
        cluster.start(victim)
        await cluster.wait_ready()
        t0 = time.perf_counter()
        await caught_up(nc, stream, len(cluster.nodes))
        out.append(
            {
                "killed": victim,
                "newLeader": new_leader,
                "gapS": round(gap, 2),
                "tries": tries,
                "errors": errors,
                "rejoinS": round(time.perf_counter() - t0, 2),
            }
        )
    return out


# -- topologies ---------------------------------------------------------------------------------


async def run_single(scratch: Path, claims: int, publishes: int) -> dict[str, Any]:
    from manager.broker import embedded

    info = embedded.start_embedded(
        scratch / "single" / "store",
        scratch / "single" / "broker.creds",
        log_path=scratch / "single" / "nats.log",
    )
    try:
        nc = await connect(info.url, Path(info.creds), name="bench-custody")
        try:
            js = nc.jetstream()
            say("  single node: claims")
            claim = await bench_claims(js, 1, claims)
            say("  single node: fenced vs unfenced publishes")
            fence = await bench_fence(js, 1, publishes)
        finally:
            await nc.close()
    finally:
        embedded.stop_embedded(info.identity)
    return {
        "topology": "single",
        "replicas": 1,
        "server": "embedded nats-server (cotal up)",
        **claim,
        "fence": fence,
    }


async def run_cluster(scratch: Path, claims: int, publishes: int, failovers: int) -> dict[str, Any]:
    from tests.cluster import Cluster

    with Cluster(scratch / "cluster") as cluster:
        await cluster.wait_ready()
        nc = await connect(cluster.urls, Path(cluster.creds), name="bench-custody")
        try:
            js = nc.jetstream()
            say("  3-node cluster: claims")
            claim = await bench_claims(js, 3, claims)
            say("  3-node cluster: fenced vs unfenced publishes")
            fence = await bench_fence(js, 3, publishes)
            failover: list[dict[str, Any]] = []
            if failovers:
                say("  3-node cluster: custody leader failover")
                failover = await bench_failover(cluster, nc, failovers)
        finally:
            await nc.close()
    return {
        "topology": "cluster",
        "replicas": 3,
        "server": "3 x nats-server on 127.0.0.1 (tests/cluster.py)",
        **claim,
        "fence": fence,
        "failover": failover,
    }


# -- output -------------------------------------------------------------------------------------


def _ms(us: float) -> str:
    return f"{us / 1000:.3f}"


def table(doc: dict[str, Any]) -> str:
    m = doc["machine"]
    lines = [
        f"custody benchmark {m['date']}  nproc {m['nproc']}  {m['cpuModel']}  "
        f"nats-server {doc['natsServer']}  nats-py {doc['natsPy']}",
        "",
        f"{'topology':<9} {'operation':<26} {'n':>5} {'median ms':>10} {'p95 ms':>9} {'p99 ms':>9} "
        f"{'max ms':>9}",
    ]
    for r in doc["results"]:
        rows = [
            ("establish (create)", r["establish"]),
            ("claim (CAS update)", r["claim"]),
            ("publish, unfenced", r["fence"]["unfenced"]),
            ("publish, fenced", r["fence"]["fenced"]),
        ]
        for label, s in rows:
            lines.append(
                f"{r['topology']:<9} {label:<26} {s['n']:>5} {_ms(s['medianUs']):>10} "
                f"{_ms(s['p95Us']):>9} "
                f"{_ms(s['p99Us']):>9} {_ms(s['maxUs']):>9}"
            )
        lines.append(
            f"{r['topology']:<9} {'fenced / unfenced':<26} {'':>5} "
            f"{r['fence']['ratioMedian']:>10.3f} "
            f"  (median; mean {r['fence']['ratioMean']:.3f})"
        )
    for r in doc["results"]:
        for f in r.get("failover", []):
            lines.append(
                f"{r['topology']:<9} failover: custody leader {f['killed']} killed, "
                f"claims failed for {f['gapS']:.2f} s, new leader {f['newLeader']}, node caught up "
                f"{f['rejoinS']:.2f} s after restart"
            )
    return "\n".join(lines) + "\n"


def _versions() -> tuple[str, str]:
    import subprocess
    from importlib.metadata import version

    from manager.broker.embedded import nats_server_binary

    out = subprocess.run(
        [nats_server_binary(), "--version"], capture_output=True, text=True, check=False
    )
    return out.stdout.strip().split()[-1] if out.stdout.strip() else "?", version("nats-py")


async def run(args: argparse.Namespace) -> dict[str, Any]:
    claims = args.claims or (100 if args.quick else 500)
    publishes = args.publishes or (400 if args.quick else 2000)
    failovers = args.failovers if args.failovers is not None else (1 if args.quick else 3)
    with temp_tree("cotal-bench-custody-") as scratch:
        machine = machine_info(scratch)
        results = []
        if args.topology in ("single", "both"):
            results.append(await run_single(scratch, claims, publishes))
        if args.topology in ("cluster", "both"):
            results.append(await run_cluster(scratch, claims, publishes, failovers))
    nats_server, nats_py = _versions()
    return {
        "benchmark": "custody",
        "machine": machine,
        "natsServer": nats_server,
        "natsPy": nats_py,
        "command": " ".join(["bench/custody.py", *sys.argv[1:]]),
        "claims": claims,
        "publishes": publishes,
        "results": results,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "--quick", action="store_true", help="100 claims, 400 publishes per side, 1 failover"
    )
    p.add_argument(
        "--json", action="store_true", help="print one JSON document instead of the table"
    )
    p.add_argument("--claims", type=int, help="override the number of claims")
    p.add_argument("--publishes", type=int, help="override the publishes per side")
    p.add_argument(
        "--failovers", type=int, help="override the number of leader kills on the cluster (0: none)"
    )
    p.add_argument("--topology", choices=("single", "cluster", "both"), default="both")
    args = p.parse_args(argv)
    logs.quiet()
    # nats-py logs every refused reconnect to a killed node with a traceback; the failover
    # counts what the caller sees instead.
    logging.getLogger("nats").setLevel(logging.CRITICAL)
    doc = anyio.run(run, args, backend="asyncio")
    sys.stdout.write(json.dumps(doc, sort_keys=True) + "\n" if args.json else table(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
