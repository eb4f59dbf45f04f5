"""Every speed goal of issue 27 measured in one run, each figure beside its floor from the same
run, as interleaved pairs.

    .venv/bin/python bench/goals.py            # 50 seats, 2,000 commits, 10,000 messages, 5 pairs
    .venv/bin/python bench/goals.py --quick    # 10 seats, 300 commits, 1,000 messages, 3 pairs
    .venv/bin/python bench/goals.py --json     # one JSON document on stdout (progress on stderr)
    .venv/bin/python bench/goals.py --save F   # the table, and the JSON document written to F
    .venv/bin/python bench/goals.py --vs DIR   # every resume also run by the checkout DIR

Whole processes are timed as subprocesses, interpreter start included. A *pair* is cotal's
process and its floor's processes run back to back (their order alternating pair to pair, so a
drift in the machine's speed lands on both); each figure is the median of its pairs' ratios,
shown with their spread (min-max).

1. **Per added seat** (`--seats`, 1 and N, sizes alternating). Per size: root A as bench/cut.py
   builds it (one small repository per seat), `cotal up --detach`, N idle scribe seats; at N,
   the manager's VmRSS and 200 `ps` round trips (in process, after 20 of warm-up); then
   `cotal down --preserve-state --json`, and at once its floor, bench/floor.py's shell captures
   plus inspections of the same repositories (as many at once as cores). The sealed attempt is
   carried to a fresh root B (own HOME, own embedded broker); the floor of its resume, the
   record's shell restore of each seat's artifacts (as many at once as cores) plus N bare
   scribe harness starts (bench/floor.py), and `cotal up --restore DIR --json`. Per pair (one
   repetition of both sizes): cotal's (wall(N) - wall(1)) / (N - 1) over the floor's.
2. **Issue 13's repository** (`--commits`, `--blob-mib`), built as before: per pair, the whole
   cut of one seat in a copy of it against the shell capture; the whole resume of that cut
   against the shell restore of the same artifacts plus one bare harness start.
3. **A carried inbox**: bench/inbox.py's case of N queued messages (10,000 at full size) and
   the same case with an empty inbox, each cut once; then, per pair, each sealed attempt resumed
   on a fresh root with its own embedded broker (so every message is republished).

`--vs DIR` (a checkout of cotal with its own `.venv`, such as main before a change): every
timed resume is also run, in the same pair, by DIR's code on a root of its own, and each resume
figure gets a row "this checkout / DIR". A figure is *within the noise* when the spread of its
pairs' ratios straddles the goal (or, for a `--vs` row, 1.0): this machine then cannot say on
which side it is. Not a test: nothing here runs in CI; the numbers are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio  # noqa: E402

from bench import cut as cut_bench  # noqa: E402
from bench import floor as floor_bench  # noqa: E402
from bench import inbox as inbox_bench  # noqa: E402
from bench import resume as resume_bench  # noqa: E402
from bench.common import (  # noqa: E402
    REPO,
    Cli,
    Mesh,
    bench_env,
    build_history_repo,
    dirty_worktree,
    fresh_dir,
    git,
    machine_info,
    say,
    shared_broker,
    temp_tree,
    timed,
    tree_digest,
)
from connectors import isolate  # noqa: E402
from manager import logs  # noqa: E402
from manager.checkpoint import admit  # noqa: E402
from manager.coord.mesh import control  # noqa: E402
from manager.workspace.layout import Layout  # noqa: E402
from protocol import control as ops  # noqa: E402
from protocol.mesh import decode_mesh  # noqa: E402

GOALS = {
    "cutPerSeat": 1.5,
    "resumePerSeat": 1.5,
    "cutVsShell": 1.10,
    "resumeVsFloor": 1.15,
    "inboxResume": 1.5,
    "managerRssMB": 60.0,
    "psP50Ms": 5.0,
}
# Issue 40 item 6, measured by bench/fleet.py: a fleet of 4 managers and 120 seats on one broker.
FLEET_GOALS = {
    # `cotal ps --fleet --json` as a whole process, interpreter start included: its p50.
    "psFleetP50Ms": 150.0,
    # An event's arrival at a `cotal events --fleet` follower less its own `at`: the p99.
    "eventP99Ms": 100.0,
    # `cotal console` redrawn after a change (issue 40 item 4; bench/console.py).
    "consoleRedrawMs": 250.0,
    # A drain's wall over the sum of its seats' move downtimes divided by --max-parallel.
    "drainOverDowntime": 1.5,
    # The VmHWM of a manager of 50 seats with events published and its metrics served.
    "managerRssMB": 60.0,
}
PS_WARMUP = 20
PS_TRIPS = 200


# -- small pieces -------------------------------------------------------------------------------


class Side:
    """Whose code a cotal process runs: this checkout, or `--vs DIR` (its own venv and tree)."""

    def __init__(self, label: str, python: str, tree: Path) -> None:
        self.label, self.python, self.tree = label, python, tree

    def env(self, env: dict[str, str]) -> dict[str, str]:
        return dict(env, PYTHONPATH=str(self.tree))

    def argv(self, root: Path, *args: str) -> list[str]:
        return [self.python, "-m", "manager.cli", *args, "--root", str(root)]


OURS = Side("this", sys.executable, REPO)


def run_whole(argv: list[str], env: dict[str, str], cwd: Path) -> tuple[float, str]:
    """One command as a whole process: its wall and its stdout; a failure stops the run."""
    t0 = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=cwd, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv[2:5])} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
        )
    return wall, proc.stdout


def cut(cli: Cli, seats: int) -> tuple[float, dict[str, Any]]:
    """`cotal down --preserve-state --json` as a subprocess; it must seal every seat."""
    wall, stdout = run_whole(
        OURS.argv(cli.root, "down", "--preserve-state", "--json"), cli.env, cli.root
    )
    result: dict[str, Any] = json.loads(stdout)
    if (
        result.get("failures")
        or result.get("journal") != "ready"
        or len(result.get("seats", [])) != seats
    ):
        raise RuntimeError(f"cut of {seats} seat(s) did not seal cleanly: {stdout[:2000]}")
    return wall, result


def signer_of(attempt: Path) -> str:
    key: str = json.loads((attempt / "manifest.json").read_text())["signer"]["publicKey"]
    return key


def resume_fresh(
    side: Side,
    parent: Path,
    env: dict[str, str],
    carried: Path,
    seats: int,
    *,
    inbox: int | None = None,
) -> tuple[float, Path]:
    """`cotal up --restore COPY --json --trust-signer KEY` by `side` on a fresh root under
    `parent` (its own embedded broker), timed; every seat must come back with its uid and
    session, and `inbox` carried messages (when given) republished. The root is left running
    for the caller's checks; `finish` ends it."""
    root = parent / "workspace"
    root.mkdir(parents=True)
    copy = resume_bench.copy_out(carried, parent / "carried")
    side_env = side.env(env)
    argv = side.argv(
        root, "up", "--restore", str(copy), "--json", "--trust-signer", signer_of(carried)
    )
    try:
        wall, stdout = run_whole(argv, side_env, root)
        result: dict[str, Any] = json.loads(stdout)
        rows = result.get("seats", [])
        moved = result.get("inbox") or [{"republished": 0}]
        if (
            len(rows) != seats
            or not all(r["sameUid"] and r["sameSession"] for r in rows)
            or result.get("state") != "active"
            or (inbox is not None and sum(m["republished"] for m in moved) != inbox)
        ):
            raise RuntimeError(
                f"resume of {seats} seat(s) did not come back whole: {stdout[:2000]}"
            )
    except RuntimeError as exc:
        # The scratch tree goes when the run ends; a failure's logs are what says why.
        logs_dir = root / ".cotal" / "logs"
        if logs_dir.is_dir():
            kept = Path(tempfile.mkdtemp(prefix="cotal-bench-failed-"))
            shutil.copytree(logs_dir, kept / "logs")
            exc.args = (f"{exc}\n(the destination's logs are kept in {kept})",)
        finish(root, env, [])
        raise
    return wall, root


def finish(root: Path, env: dict[str, str], uids: list[str]) -> None:
    """End a resumed root (its manager, seats and broker) and remove it."""
    cli = Cli(root, env)
    cli.run("down", timeout=300.0, check=False)
    mesh = Mesh(cli)
    mesh.uids = uids
    with mesh:
        pass
    shutil.rmtree(root.parent, ignore_errors=True)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/status has no VmRSS")


def manager_rss_kib(root: Path) -> int:
    """VmRSS of the manager `.cotal/mesh.json` names; seats and broker are other processes."""
    record = decode_mesh((root / ".cotal" / "mesh.json").read_bytes())
    assert record.manager is not None
    return rss_kib(record.manager.pid)


def ps_round_trips(root: Path, seats: int) -> list[float]:
    """Seconds per `ps` over one in-process control session: the socket and the daemon, without
    an interpreter start."""

    async def run() -> list[float]:
        samples = []
        async with control(Layout.at(root)) as session:
            for i in range(PS_WARMUP + PS_TRIPS):
                t0 = time.perf_counter()
                rows = await session.request(ops.PS, ops.NoArgs())
                if i >= PS_WARMUP:
                    samples.append(time.perf_counter() - t0)
                if len(rows) != seats:
                    raise RuntimeError(f"ps listed {len(rows)} seats, not {seats}")
        return samples

    return anyio.run(run, backend="asyncio")


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def spread(values: list[float], digits: int = 3) -> dict[str, Any]:
    return {
        "median": round(median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "samples": [round(v, digits) for v in values],
    }


def shell_restores(parent: Path, carried: Path, env: dict[str, str]) -> float:
    """The record's shell restore of every seat's artifacts, as many at once as cores."""
    adm = admit.integrity(carried, trusted_keys=[signer_of(carried)])
    parent.mkdir()
    targets = [
        resume_bench.prepare_shell_dir(
            parent / name, resume_bench.seat_dir_of(adm, name), adm.records[name]
        )
        for name in adm.records
    ]
    argvs = [["bash", "-c", resume_bench.SHELL_PROCEDURE, "bash", str(t)] for t in targets]
    wall = floor_bench._run_at_cores(argvs, env)
    shutil.rmtree(parent)
    return wall


def in_order(rep: int, *steps: Callable[[], None]) -> None:
    """The steps of one pair, reversed on odd pairs."""
    for step in steps if rep % 2 == 0 else reversed(steps):
        step()


# -- 1. per added seat --------------------------------------------------------------------------


def fan_out_once(
    scratch: Path,
    env_a: dict[str, str],
    env_b: dict[str, str],
    seats: int,
    rep: int,
    vs: Side | None,
) -> dict[str, float]:
    base = scratch / f"fan-{seats}-r{rep}"
    root_a = base / "a"
    row: dict[str, float] = {}
    try:
        base.mkdir()
        repos = cut_bench.make_root(root_a, env_a, seats)
        cli_a = Cli(root_a, env_a)
        with Mesh(cli_a) as mesh_a:
            mesh_a.up()
            for i, r in enumerate(repos):
                mesh_a.spawn(f"s{i:02d}", "--cwd", str(r))
            if seats > 1:
                row["managerRssKiB"] = manager_rss_kib(root_a)
                row["psP50Ms"] = median(ps_round_trips(root_a, seats)) * 1000.0
                row["managerRssKiB"] = max(row["managerRssKiB"], manager_rss_kib(root_a))
            row["cutS"], result = cut(cli_a, seats)
            if mesh_a.survivors() or (root_a / ".cotal" / "mesh.json").exists():
                raise RuntimeError("after the cut a seat process or mesh.json was left")
            carried = resume_bench.copy_out(Path(result["checkpointDir"]), base / "carried")
        floors = fresh_dir(base, "floor")
        row["cutFloorS"] = floor_bench.shell_captures(
            floors, repos, env_a
        ) + floor_bench.inspections(repos, env_a)
        # What the issue's floor leaves out and no cut that keeps its seats' inboxes can:
        # nats-server stopping one durable consumer after another (docs/benchmarks.md).
        row["brokerExitS"] = floor_bench.broker_exit(floors, seats)
        shutil.rmtree(root_a)

        def floor() -> None:
            row["resumeFloorS"] = shell_restores(
                base / "shell-restore", carried, env_b
            ) + floor_bench.harness_starts(floors, seats)

        def resume(side: Side) -> Callable[[], None]:
            def step() -> None:
                wall, root = resume_fresh(side, base / f"b-{side.label}", env_b, carried, seats)
                row[f"resumeS.{side.label}"] = wall
                finish(root, env_b, list(mesh_a.uids))

            return step

        in_order(rep, floor, resume(OURS), *([resume(vs)] if vs else []))
        return row
    finally:
        shutil.rmtree(base, ignore_errors=True)


def bench_fan_out(
    scratch: Path,
    env_a: dict[str, str],
    env_b: dict[str, str],
    large: int,
    reps: int,
    vs: Side | None,
) -> dict[str, Any]:
    pairs = []
    for rep in range(reps):
        pair: dict[int, dict[str, float]] = {}
        for n in (1, large) if rep % 2 == 0 else (large, 1):
            say(f"per added seat: {n} seat(s), pair {rep + 1}/{reps}")
            pair[n] = fan_out_once(scratch, env_a, env_b, n, rep, vs)
        pairs.append(pair)
    added = large - 1

    def per_seat(key: str) -> list[float]:
        return [(p[large][key] - p[1][key]) / added * 1000.0 for p in pairs]

    cut_ms, cut_floor = per_seat("cutS"), per_seat("cutFloorS")
    broker_exit = per_seat("brokerExitS")
    with_broker = [a + b for a, b in zip(cut_floor, broker_exit, strict=True)]
    res_ms, res_floor = per_seat("resumeS.this"), per_seat("resumeFloorS")
    doc: dict[str, Any] = {
        "seats": large,
        "pairs": reps,
        "cutPerSeatMs": spread(cut_ms, 1),
        "cutFloorPerSeatMs": spread(cut_floor, 1),
        "cutRatio": spread([a / b for a, b in zip(cut_ms, cut_floor, strict=True)]),
        "brokerExitPerSeatMs": spread(broker_exit, 1),
        "cutRatioWithBroker": spread([a / b for a, b in zip(cut_ms, with_broker, strict=True)]),
        "resumePerSeatMs": spread(res_ms, 1),
        "resumeFloorPerSeatMs": spread(res_floor, 1),
        "resumeRatio": spread([a / b for a, b in zip(res_ms, res_floor, strict=True)]),
        "managerRssMB": spread([p[large]["managerRssKiB"] * 1024 / 1e6 for p in pairs], 1),
        "psP50Ms": spread([p[large]["psP50Ms"] for p in pairs]),
        "pairsRaw": [{str(k): v for k, v in p.items()} for p in pairs],
    }
    for n in (1, large):
        doc[f"wall{n}"] = {
            k: spread([p[n][k] * 1000.0 for p in pairs], 1)
            for k in pairs[0][n]
            if k.endswith("S") or k.startswith("resumeS.")
        }
    if vs is not None:
        base_ms = per_seat(f"resumeS.{vs.label}")
        doc["resumePerSeatMsVs"] = spread(base_ms, 1)
        doc["resumeVs"] = spread([a / b for a, b in zip(res_ms, base_ms, strict=True)])
        doc["resumeWallVs"] = spread(
            [p[large]["resumeS.this"] / p[large][f"resumeS.{vs.label}"] for p in pairs]
        )
    return doc


# -- 2. issue 13's repository -------------------------------------------------------------------


def build_big_repo(path: Path, env: dict[str, str], commits: int, blob_mib: int) -> dict[str, Any]:
    # `commits` in all: the history, then the blob's commit.
    shape = build_history_repo(path, env, commits=commits - 1)
    # The text changes first, so none of them lands on the blob; the blob's commit then takes
    # that one path alone (`--only`), leaving the 20 staged changes staged.
    shape.update(dirty_worktree(path, env, staged=20, unstaged=20, untracked=300))
    # Random bytes: neither zlib nor a delta makes the blob smaller, as with a real binary asset.
    (path / "assets").mkdir()
    (path / "assets" / "blob.bin").write_bytes(os.urandom(blob_mib * 1024 * 1024))
    git(path, env, "add", "assets/blob.bin")
    git(path, env, "commit", "-q", "--only", "-m", "a binary asset", "--", "assets/blob.bin")
    shape["commits"] = commits
    shape["blobMiB"] = blob_mib
    shape["objectBytes"] = sum(
        p.stat().st_size for p in (path / ".git" / "objects").rglob("*") if p.is_file()
    )
    return shape


def copy_tree(src: Path, dest: Path, env: dict[str, str]) -> None:
    """A copy of the repository whose index is as current as the original's: `cp -a` keeps
    mtimes but not inodes or ctimes, so without the refresh the copy's first `git status`
    re-hashes every tracked file, a cost of the copying, not of the cut."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cp", "-a", str(src), str(dest)], check=True)
    git(dest, env, "update-index", "-q", "--refresh")


def big_once(
    scratch: Path,
    env_a: dict[str, str],
    env_b: dict[str, str],
    template: Path,
    rep: int,
    vs: Side | None,
) -> dict[str, Any]:
    base = scratch / f"big-r{rep}"
    root_a = base / "a"
    row: dict[str, Any] = {}
    try:
        base.mkdir()
        resume_bench.make_root(root_a, env_a)
        seat_repo = root_a / "seats" / "big"
        copy_tree(template, seat_repo, env_a)
        cli_a = Cli(root_a, env_a)
        out = base / "capture"
        with Mesh(cli_a) as mesh_a:
            mesh_a.up()
            mesh_a.spawn("big", "--cwd", str(seat_repo))

            def ours_cut() -> None:
                os.sync()
                row["cutS"], first = cut(cli_a, 1)
                row["carried"] = resume_bench.copy_out(
                    Path(first["checkpointDir"]), base / "carried"
                )

            def shell_cut() -> None:
                out.mkdir()
                os.sync()
                row["shellCaptureS"], _ = timed(
                    lambda: cut_bench.run_shell(cut_bench.SHELL_PROCEDURE, template, out, env_a)
                )
                shutil.rmtree(out)
                row["stackStartS"] = floor_bench.stack_start()

            in_order(rep, ours_cut, shell_cut)
        carried: Path = row.pop("carried")
        shutil.rmtree(root_a)
        adm = admit.integrity(carried, trusted_keys=[signer_of(carried)])
        [name] = list(adm.records)
        shell_tree: list[str] = []

        def shell_restore() -> None:
            target = resume_bench.prepare_shell_dir(
                base / "restore", resume_bench.seat_dir_of(adm, name), adm.records[name]
            )
            os.sync()
            row["shellRestoreS"], _ = timed(
                lambda: resume_bench.run_shell(resume_bench.SHELL_PROCEDURE, target, env_a)
            )
            row["harnessStartS"] = floor_bench.harness_starts(fresh_dir(base, "stores"), 1)
            row["resumeStackStartS"] = floor_bench.stack_start(floor_bench.RESUME_STACK_IMPORTS)
            shell_tree.append(tree_digest(target))
            shutil.rmtree(base / "restore")

        def resume(side: Side) -> Callable[[], None]:
            def step() -> None:
                os.sync()
                wall, root = resume_fresh(side, base / f"b-{side.label}", env_b, carried, 1)
                row[f"resumeS.{side.label}"] = wall
                row[f"tree.{side.label}"] = tree_digest(root / "seats" / "big")
                finish(root, env_b, list(mesh_a.uids))

            return step

        in_order(rep, shell_restore, resume(OURS), *([resume(vs)] if vs else []))
        for key in [k for k in row if k.startswith("tree.")]:
            if row.pop(key) != shell_tree[0]:
                raise RuntimeError(f"the {key[5:]} resume's repository differs from the shell's")
        return row
    finally:
        shutil.rmtree(base, ignore_errors=True)


def bench_big(
    scratch: Path,
    env_a: dict[str, str],
    env_b: dict[str, str],
    *,
    commits: int,
    blob_mib: int,
    reps: int,
    vs: Side | None,
) -> dict[str, Any]:
    template = scratch / "template" / "big"
    say(f"building a repository of {commits} commits and a {blob_mib} MiB blob")
    build_s, shape = timed(lambda: build_big_repo(template, env_a, commits, blob_mib))
    shape["buildMs"] = round(build_s * 1000.0)
    runs = []
    for rep in range(reps):
        say(f"issue 13's repository, pair {rep + 1}/{reps}: cut, capture, restore, resume")
        runs.append(big_once(scratch, env_a, env_b, template, rep, vs))
    doc: dict[str, Any] = {
        "repo": shape,
        "pairs": reps,
        "walls": {k: spread([r[k] * 1000.0 for r in runs], 1) for k in runs[0]},
        "cutRatio": spread([r["cutS"] / r["shellCaptureS"] for r in runs]),
        # The shell's capture plus what the card's stack costs any CLI before it does anything.
        "cutStackFloor": spread([1 + r["stackStartS"] / r["shellCaptureS"] for r in runs]),
        "cutRatioWithStack": spread(
            [r["cutS"] / (r["shellCaptureS"] + r["stackStartS"]) for r in runs]
        ),
        "resumeRatio": spread(
            [r["resumeS.this"] / (r["shellRestoreS"] + r["harnessStartS"]) for r in runs]
        ),
        "resumeStackFloor": spread(
            [1 + r["resumeStackStartS"] / (r["shellRestoreS"] + r["harnessStartS"]) for r in runs]
        ),
        "resumeRatioWithStack": spread(
            [
                r["resumeS.this"]
                / (r["shellRestoreS"] + r["harnessStartS"] + r["resumeStackStartS"])
                for r in runs
            ]
        ),
        "runs": runs,
    }
    if vs is not None:
        doc["resumeVs"] = spread([r["resumeS.this"] / r[f"resumeS.{vs.label}"] for r in runs])
    return doc


# -- 3. a carried inbox -------------------------------------------------------------------------


def bench_inbox(
    scratch: Path,
    env_a: dict[str, str],
    env_b: dict[str, str],
    messages: int,
    reps: int,
    vs: Side | None,
) -> dict[str, Any]:
    kept: dict[int, Path] = {}
    cases: dict[int, dict[str, Any]] = {}
    with shared_broker(scratch, env_a) as broker:
        for n in (messages, 0):
            say(f"inbox: the case of {n} queued messages, cut once")
            row = inbox_bench.one_case(scratch, env_a, broker, n, 200, keep=scratch / f"kept-{n}")
            kept[n] = Path(row.pop("keptAttempt"))
            cases[n] = row

    def resume(side: Side, n: int, rep: int, run: dict[str, float]) -> Callable[[], None]:
        def step() -> None:
            parent = scratch / f"inbox-b-{side.label}-{n}-r{rep}"
            wall, root = resume_fresh(side, parent, env_b, kept[n], 1, inbox=n)
            run[f"{n}.{side.label}"] = wall
            finish(root, env_b, [])

        return step

    runs: list[dict[str, float]] = []
    for rep in range(reps):
        say(f"inbox: pair {rep + 1}/{reps}: resumes carrying {messages} and 0 messages")
        run: dict[str, float] = {}
        sides = [OURS, *([vs] if vs else [])]
        in_order(rep, *(resume(side, n, rep, run) for side in sides for n in (messages, 0)))
        runs.append(run)
    doc: dict[str, Any] = {
        "messages": messages,
        "pairs": reps,
        "walls": {k: spread([r[k] * 1000.0 for r in runs], 1) for k in runs[0]},
        "ratio": spread([r[f"{messages}.this"] / r["0.this"] for r in runs]),
        "cases": {str(k): v for k, v in cases.items()},
        "runs": runs,
    }
    if vs is not None:
        doc["resumeVs"] = spread(
            [r[f"{messages}.this"] / r[f"{messages}.{vs.label}"] for r in runs]
        )
    return doc


# -- the table ----------------------------------------------------------------------------------


def verdict(s: dict[str, Any], goal: float) -> tuple[str, str]:
    """Met or not on the median; and whether the pairs' spread straddles the goal."""
    met = "yes" if s["median"] <= goal else "NO"
    noise = "within noise" if s["min"] <= goal <= s["max"] else "separated"
    return met, noise


def goal_rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    fan, big, inbox = doc["fanOut"], doc["bigRepo"], doc["inbox"]
    rows: list[dict[str, Any]] = []

    def add(key: str, figure: str, s: dict[str, Any], shown: str, unit: str = "x") -> None:
        goal = GOALS.get(key)
        met, noise = verdict(s, goal if goal is not None else 1.0)
        rows.append(
            {
                "key": key,
                "figure": figure,
                "median": s["median"],
                "min": s["min"],
                "max": s["max"],
                "measured": f"{s['median']:.2f}{unit} [{s['min']:.2f}-{s['max']:.2f}] {shown}",
                "goal": f"<= {goal}{unit}" if goal is not None else "(vs)",
                "met": met if goal is not None else ("faster" if met == "yes" else "slower"),
                "noise": noise,
            }
        )

    n = fan["seats"]
    add(
        "cutPerSeat",
        f"cut per added seat ({n} vs 1) / floor's",
        fan["cutRatio"],
        f"({fan['cutPerSeatMs']['median']:.1f} / {fan['cutFloorPerSeatMs']['median']:.1f} ms)",
    )
    add(
        "cutPerSeat",
        "  the same / (floor's + the broker's exit)",
        fan["cutRatioWithBroker"],
        f"({fan['cutPerSeatMs']['median']:.1f} / {fan['cutFloorPerSeatMs']['median']:.1f}"
        f" + {fan['brokerExitPerSeatMs']['median']:.1f} ms)",
    )
    add(
        "resumePerSeat",
        f"resume per added seat ({n} vs 1) / floor's",
        fan["resumeRatio"],
        f"({fan['resumePerSeatMs']['median']:.1f} / "
        f"{fan['resumeFloorPerSeatMs']['median']:.1f} ms)",
    )
    w = big["walls"]
    add(
        "cutVsShell",
        "whole cut of issue 13's repository / shell capture",
        big["cutRatio"],
        f"({w['cutS']['median'] / 1000:.2f} / {w['shellCaptureS']['median'] / 1000:.2f} s)",
    )
    add(
        "cutVsShell",
        "  the same / (shell capture + the stack's start)",
        big["cutRatioWithStack"],
        f"({w['stackStartS']['median']:.0f} ms of the card's imports)",
    )
    add(
        "cutVsShell",
        "  that floor alone / shell capture",
        big["cutStackFloor"],
        "",
    )
    add(
        "resumeVsFloor",
        "whole up --restore of it / shell restore + 1 harness",
        big["resumeRatio"],
        f"({w['resumeS.this']['median'] / 1000:.2f} / {w['shellRestoreS']['median'] / 1000:.2f}"
        f" + {w['harnessStartS']['median'] / 1000:.2f} s)",
    )
    add(
        "resumeVsFloor",
        "  the same / (that floor + the stack's start)",
        big["resumeRatioWithStack"],
        f"({w['resumeStackStartS']['median']:.0f} ms of the card's imports, nats, cryptography)",
    )
    add(
        "resumeVsFloor",
        "  that floor alone / shell restore + 1 harness",
        big["resumeStackFloor"],
        "",
    )
    iw = inbox["walls"]
    m = inbox["messages"]
    add(
        "inboxResume",
        f"resume carrying {m:,} messages / empty inbox",
        inbox["ratio"],
        f"({iw[f'{m}.this']['median'] / 1000:.2f} / {iw['0.this']['median'] / 1000:.2f} s)",
    )
    add("managerRssMB", f"manager RSS, {n} idle seats", fan["managerRssMB"], "", " MB")
    add("psP50Ms", f"ps p50 in process, {n} seats", fan["psP50Ms"], "", " ms")
    for label, s in (
        (f"resume per added seat, this / --vs ({n} seats)", fan.get("resumeVs")),
        (f"whole resume of {n} seats, this / --vs", fan.get("resumeWallVs")),
        ("whole resume of issue 13's repository, this / --vs", big.get("resumeVs")),
        (f"resume carrying {m:,} messages, this / --vs", inbox.get("resumeVs")),
    ):
        if s is not None:
            add("vs", label, s, "")
    return rows


def print_table(doc: dict[str, Any]) -> None:
    m = doc["machine"]
    out = sys.stdout.write
    out(f"cotal goals (issue 27), {m['date']}\n")
    out(
        f"machine: nproc {m['nproc']}, {m['cpuModel']}, {m['memGiB']} GiB, Linux {m['kernel']}, "
        f"Python {m['python']}, {m['git']}\n"
        f"load {' '.join(map(str, m['loadAvgAtStart']))} at start, "
        + ", ".join(f"{' '.join(map(str, v))} at {k}" for k, v in doc["loadAvgByPhase"].items())
        + f", {' '.join(map(str, doc['loadAvgAtEnd']))} at end; {doc['totalS']} s in all\n"
        f"command: {doc['command']}\n\n"
    )
    rows = doc["goals"]
    cols = ("figure", "measured", "goal", "met", "noise")
    width = {c: max(len(c), *(len(str(r[c])) for r in rows)) for c in cols}
    out("  " + " | ".join(f"{c:<{width[c]}}" for c in cols) + "\n")
    out("  " + "-+-".join("-" * width[c] for c in cols) + "\n")
    for r in rows:
        out("  " + " | ".join(f"{str(r[c]):<{width[c]}}" for c in cols) + "\n")
    out(
        "  Each figure: the median of its pairs' ratios [min-max]; 'within noise' when that\n"
        "  spread straddles the goal (or 1.0 for a --vs row). MB = 10^6 bytes.\n\n"
    )
    fan = doc["fanOut"]
    out(f"Per added seat ({fan['pairs']} pairs; medians, ms):\n")
    for n in (1, fan["seats"]):
        walls = doc["fanOut"][f"wall{n}"]
        out(
            f"  {n:>3} seat(s): "
            + ", ".join(
                f"{k} {v['median']:.0f} [{v['min']:.0f}-{v['max']:.0f}]" for k, v in walls.items()
            )
            + "\n"
        )
    big = doc["bigRepo"]
    shape = big["repo"]
    out(
        f"Issue 13's repository: {shape['commits']} commits, {shape['blobMiB']} MiB blob, "
        f"{shape['objectBytes'] / 1e6:.1f} MB of objects; {big['pairs']} pairs (ms):\n  "
        + ", ".join(
            f"{k} {v['median']:.0f} [{v['min']:.0f}-{v['max']:.0f}]"
            for k, v in big["walls"].items()
        )
        + "\n"
    )
    inbox = doc["inbox"]
    out(
        f"Inbox ({inbox['pairs']} pairs, ms): "
        + ", ".join(
            f"{k} {v['median']:.0f} [{v['min']:.0f}-{v['max']:.0f}]"
            for k, v in inbox["walls"].items()
        )
        + "\n"
    )


# -- main ---------------------------------------------------------------------------------------


def vs_side(tree: str) -> Side:
    path = Path(tree).resolve()
    python = path / ".venv" / "bin" / "python"
    if not (path / "manager" / "cli").is_dir() or not python.exists():
        raise SystemExit(f"--vs {tree}: not a cotal checkout with its own .venv")
    private = next((t for t in isolate.SYSTEM_WRITE if path.is_relative_to(t)), None)
    if private is not None:
        # Found out otherwise only by the first resume's seat, which cannot exec the launcher.
        raise SystemExit(
            f"--vs {tree}: a seat's sandbox gives it a private {private}, so it could not run this "
            "checkout's interpreter; put the checkout elsewhere"
        )
    return Side("vs", str(python), path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("--quick", action="store_true", help="10 seats, 300 commits, 1,000 msgs, 3x")
    p.add_argument("--json", action="store_true", help="one JSON document instead of the table")
    p.add_argument("--save", metavar="FILE", help="also write the JSON document to FILE")
    p.add_argument("--vs", metavar="DIR", help="also run every resume by the checkout DIR")
    p.add_argument("--seats", type=int, help="the large size (default 50; quick 10)")
    p.add_argument("--commits", type=int, help="history of the real repository (default 2000)")
    p.add_argument("--blob-mib", type=int, help="its binary blob in MiB (default 32)")
    p.add_argument("--pairs", type=int, help="interleaved pairs of each figure (default 5)")
    p.add_argument("--inbox", type=int, help="messages queued for the inbox case (default 10000)")
    p.add_argument(
        "--only", choices=("fan", "big", "inbox"), action="append", help="only these parts"
    )
    args = p.parse_args(argv)
    quick = args.quick
    large = args.seats or (10 if quick else 50)
    if not 2 <= large <= 50:
        p.error("--seats is between 2 and 50: a manager runs at most 50 seats")
    commits = args.commits or (300 if quick else 2000)
    blob_mib = args.blob_mib or (4 if quick else 32)
    reps = args.pairs or (3 if quick else 5)
    messages = args.inbox or (1000 if quick else 10_000)
    parts = set(args.only or ("fan", "big", "inbox"))
    vs = vs_side(args.vs) if args.vs else None

    logs.quiet()
    # `pip install` of the wheel byte-compiles cotal; a checkout must have the same caches, or
    # every whole-process figure includes compiling the modules a run changed.
    for tree in {REPO, *([vs.tree] if vs else [])}:
        for package in ("protocol", "connectors", "manager"):
            compileall.compile_dir(tree / package, quiet=1)
    t0 = time.perf_counter()
    with temp_tree("cotal-bench-goals-") as scratch:
        jobs = {"COTAL_JOBS": os.environ["COTAL_JOBS"]} if "COTAL_JOBS" in os.environ else {}
        env_a = bench_env(fresh_dir(scratch, "home-a"), jobs)
        env_b = bench_env(fresh_dir(scratch, "home-b"), jobs)
        # In-process calls (admission, the inbox's export and import) read HOME: host A's.
        saved = {k: os.environ.get(k) for k in ("HOME", "XDG_CONFIG_HOME")}
        os.environ["HOME"] = env_a["HOME"]
        os.environ.pop("XDG_CONFIG_HOME", None)
        try:
            doc: dict[str, Any] = {
                "machine": machine_info(scratch),
                "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
                "goalsSet": GOALS,
                "vs": str(vs.tree) if vs else None,
            }
            load = doc["loadAvgByPhase"] = {}
            if "big" in parts:
                load["bigRepo"] = loadavg()
                doc["bigRepo"] = bench_big(
                    scratch, env_a, env_b, commits=commits, blob_mib=blob_mib, reps=reps, vs=vs
                )
            if "fan" in parts:
                load["fanOut"] = loadavg()
                doc["fanOut"] = bench_fan_out(scratch, env_a, env_b, large, reps, vs)
            if "inbox" in parts:
                load["inbox"] = loadavg()
                doc["inbox"] = bench_inbox(scratch, env_a, env_b, messages, reps, vs)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    doc["totalS"] = round(time.perf_counter() - t0, 1)
    doc["loadAvgAtEnd"] = loadavg()
    if parts == {"fan", "big", "inbox"}:
        doc["goals"] = goal_rows(doc)
    if args.save:
        Path(args.save).write_text(json.dumps(doc, sort_keys=True, indent=1, default=str) + "\n")
    if args.json:
        sys.stdout.write(json.dumps(doc, sort_keys=True, default=str) + "\n")
    elif "goals" in doc:
        print_table(doc)
    else:
        sys.stdout.write(json.dumps(doc, sort_keys=True, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
