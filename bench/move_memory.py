"""Benchmark the memory of `cotal move` with a big history: the peak RSS of every process that
carries it, which streams the history through the move bucket (goal: each under 200 MB with a
1 GiB history; before streaming, the source held the whole bundle and the whole archive).

    .venv/bin/python bench/move_memory.py              # a 1 GiB history
    .venv/bin/python bench/move_memory.py --history-mib 256
    .venv/bin/python bench/move_memory.py --json       # one JSON document on stdout

One shared broker (`cotal broker serve`), two roots A and B (`cotal up --detach --server`), each
trusting the other's key, and one scribe seat on A whose repository holds `--history-mib` MiB
of random, incompressible committed blobs. Two moves:

- `precopy`, A to B: the ordinary move. The history is bundled at A, streamed from the bundle
  file into the move bucket by the `cotal move` process, fetched into a file by B's fetch child
  (`manager/broker/precopyfetch.py`) and indexed; the cut carries nothing new.
- `whole`, B to A: a first `cotal move` is killed just past its fence (`COTAL_FAILPOINT=
  cut.after-cut-intent`), and the rerun, which ships no pre-copy, carries the whole history in
  the checkpoint: packed into an archive at B, streamed into the bucket by the `cotal move`
  process, fetched into a file by A's manager itself (the checkpoint's fetch stays in the
  manager: a child's start would be downtime).

Per move, peak RSS (`VmHWM`, or `ru_maxrss` of the `cotal move` process itself) of: the `cotal
move` process (the source's coordinator, run under a wrapper that records its own `ru_maxrss`
at exit), both managers (their peak reset before the move through `/proc/PID/clear_refs`), and
the destination's pre-copy fetch child (sampled while it lives). git's own processes (bundle,
index-pack) are not the mover and are not counted.

Not a test: nothing here runs in CI.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    Cli,
    Mesh,
    bench_env,
    fresh_dir,
    git,
    say,
    shared_broker,
    temp_tree,
)
from bench.move import signer_key  # noqa: E402
from bench.resume import make_root  # noqa: E402

GOAL_MB = 200.0
BLOB_MIB = 64
SAMPLE_EVERY_S = 0.05
# Runs the `cotal` command as `python -m manager.cli ARGS...` does and writes its own peak RSS
# (KiB) to $BENCH_RSS_OUT once it returns: ru_maxrss of the process alone, not of git's
# children. (`manager.cli.main.run` ends with os._exit, which no atexit hook survives.)
WRAPPER = """
import os, resource, sys
from manager.cli.main import main
code = main(sys.argv[1:])
with open(os.environ["BENCH_RSS_OUT"], "w") as f:
    f.write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
sys.stdout.flush()
os._exit(code)
"""


def history_repo(path: Path, env: dict[str, str], mib: int) -> Path:
    """A repository whose history is `mib` MiB of random blobs, `BLOB_MIB` each in its own
    commit (stored uncompressed: random bytes do not compress, and zlib would only cost time)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    make_root(path, env)
    git(path, env, "config", "core.compression", "0")
    # Stored whole, never deltified: random blobs have no deltas to find, and looking for them
    # in 64 MiB blobs is most of what the gc and the bundle would cost.
    git(path, env, "config", "core.bigFileThreshold", "16m")
    for i in range(max(1, mib // BLOB_MIB)):
        with (path / f"blob{i:03d}.bin").open("wb") as f:
            for _ in range(BLOB_MIB):
                f.write(os.urandom(1 << 20))
        git(path, env, "add", "-A")
        git(path, env, "commit", "-q", "-m", f"blob {i}")
    git(path, env, "gc", "-q")
    return path


def manager_pid(root: Path) -> int:
    record = json.loads((root / ".cotal" / "mesh.json").read_text())
    return int(record["manager"]["pid"])


def vm_hwm_kib(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def reset_peak(pid: int) -> None:
    # "5" resets the process's peak RSS to its current RSS (proc(5), clear_refs).
    Path(f"/proc/{pid}/clear_refs").write_text("5")


@contextmanager
def fetch_children() -> Iterator[dict[str, int]]:
    """The peak RSS of each pre-copy fetch child seen while the block runs, by pid."""
    peaks: dict[str, int] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.wait(SAMPLE_EVERY_S):
            for entry in Path("/proc").iterdir():
                if not entry.name.isdigit():
                    continue
                try:
                    cmdline = (entry / "cmdline").read_bytes()
                except OSError:
                    continue
                if b"manager.broker.precopyfetch" in cmdline:
                    hwm = vm_hwm_kib(int(entry.name))
                    if hwm is not None:
                        peaks[entry.name] = max(peaks.get(entry.name, 0), hwm)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        yield peaks
    finally:
        stop.set()
        thread.join()


def move(cli: Cli, seat: str, to: str, scratch: Path, extra_env: dict[str, str]) -> dict[str, Any]:
    """`cotal move` under the wrapper: its result (or refusal) and its own peak RSS."""
    out = scratch / "move-rss"
    out.unlink(missing_ok=True)
    env = {**cli.env, **extra_env, "BENCH_RSS_OUT": str(out)}
    t0 = time.monotonic()
    argv = ["move", seat, "--to", to, "--json", "--root", str(cli.root)]
    proc = subprocess.run(
        [sys.executable, "-c", WRAPPER, *argv],
        capture_output=True,
        text=True,
        timeout=1800,
        env=env,
        cwd=cli.root,
        check=False,
    )
    took = time.monotonic() - t0
    rss = int(out.read_text()) if out.exists() else None
    doc: dict[str, Any] = {"exit": proc.returncode, "seconds": round(took, 2), "moveRssKiB": rss}
    # What carried the history: a pre-copy that was skipped would measure another path.
    doc["progress"] = proc.stderr.splitlines()[-40:]
    if proc.returncode == 0:
        doc["result"] = json.loads(proc.stdout)
    return doc


def measured(src: Cli, dst: Cli, seat: str, to: str, scratch: Path, failpoint: str | None) -> Any:
    """One move, the managers' peaks reset first; with `failpoint`, a first run killed there
    and the rerun measured."""
    pids = {"source": manager_pid(src.root), "destination": manager_pid(dst.root)}
    if failpoint is not None:
        died = move(src, seat, to, scratch, {"COTAL_FAILPOINT": failpoint})
        say(f"  first run died at {failpoint}: exit {died['exit']}")
    for pid in pids.values():
        reset_peak(pid)
    with fetch_children() as children:
        doc = move(src, seat, to, scratch, {})
    doc["managerRssKiB"] = {role: vm_hwm_kib(pid) for role, pid in pids.items()}
    doc["fetchChildRssKiB"] = max(children.values(), default=None)
    return doc


def run(args: argparse.Namespace) -> dict[str, Any]:
    doc: dict[str, Any] = {"historyMiB": args.history_mib, "goalMB": GOAL_MB}
    with temp_tree("cotal-bench-move-memory-") as scratch, ExitStack() as stack:
        home = fresh_dir(scratch, "home")
        env = bench_env(home)
        broker = stack.enter_context(shared_broker(scratch, env))
        clis = []
        for name in ("a", "b"):
            make_root(scratch / name, env)
            cli = Cli(scratch / name, env)
            stack.enter_context(Mesh(cli))
            cli.run("up", "--detach", "--server", broker["url"], "--creds", broker["creds"])
            clis.append(cli)
        a, b = clis
        a.run("trust", "add", signer_key(b.root), "--name", "host-b")
        b.run("trust", "add", signer_key(a.root), "--name", "host-a")
        say(f"building a {args.history_mib} MiB history")
        repo = history_repo(scratch / "a" / "seats" / "big", env, args.history_mib)
        a.json("spawn", "big", "--agent", "scribe", "--cwd", str(repo))
        to_a, to_b = a.json("status")["instanceId"], b.json("status")["instanceId"]
        say("move A -> B (pre-copy)")
        doc["precopy"] = measured(a, b, "big", to_b, scratch, None)
        say("move B -> A (the rerun of a move killed past its fence: the whole history)")
        doc["whole"] = measured(b, a, "big", to_a, scratch, "cut.after-cut-intent")
    return doc


def peaks_mb(row: dict[str, Any]) -> dict[str, float | None]:
    def mb(kib: int | None) -> float | None:
        return None if kib is None else round(kib * 1024 / 1e6, 1)

    return {
        "cotal move": mb(row["moveRssKiB"]),
        "source manager": mb(row["managerRssKiB"]["source"]),
        "destination manager": mb(row["managerRssKiB"]["destination"]),
        "pre-copy fetch child": mb(row["fetchChildRssKiB"]),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--history-mib", type=int, default=1024)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    doc = run(args)
    ok = True
    for label in ("precopy", "whole"):
        row = doc[label]
        row["peakMB"] = peaks_mb(row)
        moved = row["exit"] == 0
        under = all(v is None or v < GOAL_MB for v in row["peakMB"].values())
        ok = ok and moved and under
        if not args.json:
            print(f"{label}: exit {row['exit']} in {row['seconds']} s")
            if moved:
                [seat] = row["result"]["seats"]
                print(
                    f"  pre-copied {seat.get('precopyBytes', 0)} bytes, cut bundle "
                    f"{seat.get('bundleBytes', '-')} bytes, downtime {seat['downtimeMs']} ms"
                )
            for who, value in row["peakMB"].items():
                print(f"  {who:22} {'-' if value is None else f'{value:.1f} MB'}")
            if not moved:
                print("\n".join(row["progress"]))
    doc["underGoal"] = ok
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"every peak under {GOAL_MB:g} MB: {ok}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
