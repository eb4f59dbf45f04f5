"""Benchmark the space half of a resume: a cut seat whose inbox holds N messages, against the
same seat with an empty inbox.

    .venv/bin/python bench/inbox.py                 # N = 10000 (what a checkpoint carries at most)
    .venv/bin/python bench/inbox.py --inbox 2000    # a smaller inbox
    .venv/bin/python bench/inbox.py --json          # one JSON document on stdout

Per case: a workspace root with one small repository, `cotal up --detach --server URL` against a
shared broker (`cotal broker serve`), one scribe seat; for the inbox case the seat is held in
one slow turn (`#slow`) while N-1 direct messages of about `--payload` bytes each are published
to it from one sender, so its inbox holds N at the cut. Then `cotal down --preserve-state`, and:

- `export_inbox` against the shared broker (the durable is still there: the cut keeps it), in
  process, timed; and the bytes of the checkpoint's `inbox.jsonl`;
- `import_inbox` of those messages into a second, fresh embedded broker, in process, timed;
- the attempt copied out, the root taken away and recreated empty, and `cotal up --restore DIR
  --json` (its own fresh embedded broker, so the inbox is republished there) timed as a
  subprocess; every carried message must be reported republished, then `cotal down`.

Not a test: nothing here runs in CI, and the numbers are recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio  # noqa: E402
import nats  # noqa: E402
from nats.js import JetStreamContext  # noqa: E402

from bench.common import (  # noqa: E402
    Cli,
    Mesh,
    bench_env,
    fresh_dir,
    machine_info,
    make_small_repo,
    ms,
    run_stamped,
    say,
    shared_broker,
    temp_tree,
    timed,
)
from bench.resume import copy_out, make_root  # noqa: E402
from manager import logs  # noqa: E402
from manager.broker import embedded, space  # noqa: E402
from manager.broker.dm import new_message_id  # noqa: E402
from protocol import names  # noqa: E402
from protocol.checkpoint import INBOX_FILE, MAX_CARRIED_MESSAGES  # noqa: E402
from protocol.messages import DirectMessage, encode  # noqa: E402

SEAT = "s00"
SENDER = "local.bench"
# Long enough to cover publishing N messages on a loaded 2-core machine and the start of the
# cut; the cut waits the rest of it out at the turn boundary.
HOLD_MS = 20_000
# After the cut's prepare counted the inbox (a moment after it starts) and before the held turn
# ends: the in-flight message is acknowledged at that boundary, so the last of N is sent here.
LAST_AFTER_S = 3.0
BATCH = 500


async def _connect(url: str, creds: str) -> tuple[Any, JetStreamContext]:
    nc = await nats.connect(url, nkeys_seed=creds)
    return nc, nc.jetstream()


def queue_messages(broker: dict[str, Any], n: int, payload: int, first: int = 0) -> float:
    """Publish n DMs from one sender to the seat as `cotal send` would; returns seconds."""
    subject = names.dm_subject(names.DEFAULT_SPACE, "local", SEAT, "local", "bench")

    def body(i: int) -> bytes:
        stamp = "2026-01-01T00:00:00.000Z"
        base = DirectMessage(new_message_id(), SENDER, f"local.{SEAT}", "", stamp)
        pad = max(1, payload - len(encode(base)) - 8)
        text = f"{i:07d} " + "x" * pad
        return encode(DirectMessage(base.id, SENDER, f"local.{SEAT}", text, stamp))

    async def run() -> float:
        nc, js = await _connect(broker["url"], broker["creds"])

        async def one(data: bytes) -> None:
            mid = json.loads(data)["id"]
            await js.publish(subject, data, headers={"Nats-Msg-Id": mid})

        try:
            t0 = time.perf_counter()
            for start in range(0, n, BATCH):
                async with anyio.create_task_group() as tg:
                    for i in range(start, min(start + BATCH, n)):
                        tg.start_soon(one, body(first + i))
            return time.perf_counter() - t0
        finally:
            await nc.close()

    return anyio.run(run, backend="asyncio")


def export_import(
    scratch: Path, broker: dict[str, Any], uid: str, case: str
) -> tuple[dict[str, Any], int]:
    """Time export_inbox at the source and import_inbox into a fresh embedded broker."""
    base = fresh_dir(scratch, f"dest-broker-{case}")
    dest = embedded.start_embedded(base / "nats", base / "broker.creds")
    out: dict[str, Any] = {}

    async def run() -> int:
        nc, js = await _connect(broker["url"], broker["creds"])
        try:
            t0 = time.perf_counter()
            record, messages = await space.export_inbox(js, names.DEFAULT_SPACE, SEAT, uid)
            out["exportMs"] = ms(time.perf_counter() - t0)
        finally:
            await nc.close()
        nd, jd = await _connect(dest.url, dest.creds)
        try:
            t0 = time.perf_counter()
            done = await space.import_inbox(
                jd,
                names.DEFAULT_SPACE,
                SEAT,
                uid,
                record,
                messages,
                attempt_id="bench",
                shared=False,
            )
            out["importMs"] = ms(time.perf_counter() - t0)
            if done.kept or done.republished != len(messages):
                raise RuntimeError(f"import_inbox into a fresh broker: {done}")
        finally:
            await nd.close()
        return len(messages)

    try:
        carried = anyio.run(run, backend="asyncio")
    finally:
        embedded.stop_embedded(dest.identity)
        shutil.rmtree(base, ignore_errors=True)
    return out, carried


def one_case(
    scratch: Path,
    env: dict[str, str],
    broker: dict[str, Any],
    inbox: int,
    payload: int,
    keep: Path | None = None,
) -> dict[str, Any]:
    """One case; `keep`, a directory the sealed attempt is also copied into (bench/goals.py
    resumes it again), named by the row's `keptAttempt`."""
    case = f"inbox-{inbox}"
    root = scratch / case
    carried_parent = scratch / f"carried-{case}"
    row: dict[str, Any] = {"inboxRequested": inbox}
    try:
        make_root(root, env)
        repo = root / "seats" / SEAT
        make_small_repo(repo, env)
        cli = Cli(root, env)
        with Mesh(cli) as mesh:
            cli.run("up", "--detach", "--server", broker["url"], "--creds", broker["creds"])
            uid = mesh.spawn(SEAT, "--cwd", str(repo))["lifecycleUid"]
            held_at = time.perf_counter()
            if inbox:
                cli.run("send", SEAT, f"#slow:{HOLD_MS} hold the inbox")
                held_at = time.perf_counter()
                say(f"{case}: publishing {inbox - 1} messages of ~{payload} bytes")
                row["publishMs"] = ms(queue_messages(broker, inbox - 1, payload))
                if time.perf_counter() - held_at + LAST_AFTER_S + 3.0 > HOLD_MS / 1000:
                    raise RuntimeError("publishing outlasted the held turn; raise HOLD_MS")
            say(f"{case}: cutting")
            t0 = time.perf_counter()
            down = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "manager.cli",
                    "down",
                    "--preserve-state",
                    "--json",
                    "--root",
                    str(root),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=root,
            )
            if inbox:
                time.sleep(LAST_AFTER_S)
                queue_messages(broker, 1, payload, first=inbox - 1)
            stdout, stderr = down.communicate(timeout=600)
            row["cutWallMs"] = ms(time.perf_counter() - t0)
            cut = json.loads(stdout or "{}")
            if down.returncode or cut.get("failures") or cut.get("journal") != "ready":
                raise RuntimeError(f"cut did not seal: {stdout}\n{stderr}")
            attempt = Path(cut["checkpointDir"])
            row["inboxJsonlBytes"] = (attempt / SEAT / INBOX_FILE).stat().st_size
            row["checkpointBytes"] = sum(
                p.stat().st_size for p in attempt.rglob("*") if p.is_file()
            )
            say(f"{case}: export_inbox and import_inbox in process")
            timings, carried = export_import(scratch, broker, uid, case)
            row.update(timings)
            row["carried"] = carried
            if carried != inbox:
                raise RuntimeError(f"{case}: the cut carried {carried} messages, not {inbox}")
            copied = copy_out(attempt, carried_parent)
            if keep is not None:
                row["keptAttempt"] = str(copy_out(attempt, keep))
            # Host A is gone; the destination starts its own broker, so the inbox is rebuilt.
            shutil.rmtree(root)
            root.mkdir()
            say(f"{case}: cotal up --restore")
            # The source's own key, pinned for this run: the benchmark resumes its own cut.
            signer = json.loads((copied / "manifest.json").read_text())["signer"]["publicKey"]
            run = run_stamped(
                [
                    sys.executable,
                    "-m",
                    "manager.cli",
                    "up",
                    "--restore",
                    str(copied),
                    "--json",
                    "--trust-signer",
                    signer,
                    "--root",
                    str(root),
                ],
                env=env,
                cwd=root,
            )
            if run["rc"] != 0:
                raise RuntimeError(
                    f"cotal up --restore failed ({run['rc']}):\n{run['stdout']}\n"
                    + "\n".join(text for _, text in run["lines"])
                )
            result = json.loads(run["stdout"])
            [seat] = result["seats"]
            [moved] = result.get("inbox") or [{"kept": False, "republished": 0}]
            if not (seat["sameUid"] and seat["sameSession"]) or moved["republished"] != carried:
                raise RuntimeError(f"restore of {case}: {run['stdout'][:2000]}")
            row["restoreWallMs"] = ms(run["wallS"])
            row["restoreReportedMs"] = result["wallMs"]
            row["republished"] = moved["republished"]
            down_s, _ = timed(lambda: cli.run("down", timeout=600.0))
            row["downMs"] = ms(down_s)
        return row
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(carried_parent, ignore_errors=True)


def print_table(doc: dict[str, Any]) -> None:
    m = doc["machine"]
    out = sys.stdout.write
    out(f"cotal inbox benchmark, {m['date']}\n")
    out(
        f"machine: nproc {m['nproc']}, {m['cpuModel']}, {m['memGiB']} GiB, Linux {m['kernel']}, "
        f"Python {m['python']}\ncommand: {doc['command']}; {doc['totalS']} s\n\n"
    )
    cols = [
        ("carried", "carried", "{:>8}"),
        ("inbox.jsonl", "inboxJsonlBytes", "{:>12}"),
        ("ckpt bytes", "checkpointBytes", "{:>11}"),
        ("export", "exportMs", "{:>9.0f}"),
        ("import", "importMs", "{:>9.0f}"),
        ("up --restore", "restoreWallMs", "{:>13.0f}"),
        ("(wallMs)", "restoreReportedMs", "{:>9.0f}"),
    ]
    out("  " + " ".join(f"{h:>{len(f.format(0)) if 'f' not in f else 9}}" for h, _, f in cols))
    out("\n")
    for row in doc["cases"]:
        out("  " + " ".join(f.format(row.get(k, 0)) for _, k, f in cols) + "\n")
    out(
        "  times in ms; export/import: in process against the shared broker and a fresh "
        "embedded one;\n  up --restore: the CLI as a subprocess, end to end, into a fresh "
        "embedded broker.\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "--inbox", type=int, default=MAX_CARRIED_MESSAGES, help="messages queued at the cut"
    )
    p.add_argument("--payload", type=int, default=200, help="bytes per message, about")
    p.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    args = p.parse_args(argv)
    if not 2 <= args.inbox <= MAX_CARRIED_MESSAGES:
        p.error(f"--inbox is between 2 and {MAX_CARRIED_MESSAGES}")
    logs.quiet()
    with temp_tree("cotal-bench-inbox-") as scratch:
        env = bench_env(fresh_dir(scratch, "home"))
        saved = os.environ.get("HOME")
        os.environ["HOME"] = env["HOME"]
        try:
            doc: dict[str, Any] = {
                "machine": machine_info(scratch),
                "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
            }
            t0 = time.perf_counter()
            with shared_broker(scratch, env) as broker:
                doc["cases"] = [
                    one_case(scratch, env, broker, n, args.payload) for n in (0, args.inbox)
                ]
            doc["totalS"] = round(time.perf_counter() - t0, 1)
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
