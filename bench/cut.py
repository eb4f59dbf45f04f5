"""Benchmark the cut: repository capture against the record's shell procedure, then whole cuts.

    .venv/bin/python bench/cut.py            # full size: 3000 commits; 1, 10 and 50 seats
    .venv/bin/python bench/cut.py --quick    # 300 commits; 1 and 5 seats; under a minute
    .venv/bin/python bench/cut.py --json     # one JSON document on stdout (progress on stderr)
    .venv/bin/python bench/cut.py --save F   # the table, and the JSON document written to F

Part 1 builds one repository (history by `git fast-import`, then staged, unstaged and untracked
changes) and times, in the same run and interleaved, `capture_repository` (in process) against
the plain shell procedure of record section 6 step 5 run by `bash -c` under `set -e`. Each
repetition of either writes into a fresh directory. Two diagnostic rows split the gap: ours with
fsync stubbed out, and the shell procedure followed by `sync` of its artifacts.

Part 2 brings up a real mesh per size (`cotal up --detach`, embedded broker, in a temporary root
that is a git repository with one commit), spawns N idle `scribe` seats, each in its own small
repository under `<root>/seats/` (one commit, one staged, one unstaged and one untracked change),
and times `cotal down --preserve-state --json` end to end, next to the `timingsMs` and `wallMs`
it reports. Every process is proven gone afterwards and every temporary directory removed, on
failure too.

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
from pathlib import Path
from typing import Any
from unittest import mock

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import anyio  # noqa: E402

from bench.common import (  # noqa: E402
    Cli,
    Mesh,
    bench_env,
    build_history_repo,
    count_processes,
    dirty_worktree,
    fresh_dir,
    git,
    machine_info,
    make_small_repo,
    ms,
    say,
    summarize,
    temp_tree,
    timed,
)
from manager.checkpoint.gitstate import capture_repository, preflight_repository  # noqa: E402
from protocol.checkpoint import RepositoryRecord  # noqa: E402

# Record section 6 step 5, verbatim but for the artifact directory: the record writes to
# "$ROOT/.." and hashes from there; here $OUT is a fresh directory per repetition.
SHELL_PROCEDURE = r"""set -e
ROOT="$1"
OUT="$2"
cd "$ROOT"
git bundle create "$OUT/ckpt-repo.bundle" --all
git rev-parse HEAD > "$OUT/ckpt-repo.base"
git diff --binary --cached > "$OUT/ckpt-repo.index.diff"
git diff --binary > "$OUT/ckpt-repo.worktree.diff"
git ls-files --others --exclude-standard -z \
  | tar --null --files-from=- -cf "$OUT/ckpt-repo.untracked.tar"
cd "$OUT"
sha256sum ckpt-repo.bundle ckpt-repo.index.diff ckpt-repo.worktree.diff \
  ckpt-repo.untracked.tar > ckpt-repo.sha256
"""
# Diagnostic only: the same, then `sync FILE...` (coreutils fsyncs each named file).
SHELL_PROCEDURE_SYNC = (
    SHELL_PROCEDURE + "sync ckpt-repo.bundle ckpt-repo.base ckpt-repo.index.diff "
    "ckpt-repo.worktree.diff ckpt-repo.untracked.tar ckpt-repo.sha256 .\n"
)

ARTIFACTS = (
    "ckpt-repo.bundle",
    "ckpt-repo.index.diff",
    "ckpt-repo.worktree.diff",
    "ckpt-repo.untracked.tar",
)


# -- part 1: repository capture -----------------------------------------------------------------


def run_shell(script: str, repo: Path, out: Path, env: dict[str, str]) -> int:
    proc = subprocess.run(
        ["bash", "-c", script, "bash", str(repo), str(out)],
        env=env,
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"shell procedure failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}"
        )
    return sum((out / a).stat().st_size for a in ARTIFACTS)


def run_ours(repo: Path, out: Path) -> RepositoryRecord:
    return anyio.run(capture_repository, repo, out, backend="asyncio")


def record_bytes(rec: RepositoryRecord) -> int:
    parts = (rec.bundle, rec.index_diff, rec.worktree_diff, rec.untracked)
    return sum(r.bytes for r in parts if r is not None)


def count_git_processes(repo: Path, out: Path) -> int:
    """How many git processes one capture starts."""
    return count_processes(lambda: run_ours(repo, out))[0]


def bench_repository(
    scratch: Path, env: dict[str, str], *, commits: int, reps: int
) -> dict[str, Any]:
    repo = scratch / "repo"
    say(f"building a repository of {commits} commits with git fast-import")
    build_s, shape = timed(lambda: build_history_repo(repo, env, commits=commits))
    shape.update(dirty_worktree(repo, env, staged=20, unstaged=20, untracked=300))
    shape["buildMs"] = ms(build_s)
    shape["packBytes"] = sum(
        p.stat().st_size for p in (repo / ".git" / "objects" / "pack").glob("*.pack")
    )
    status = git(repo, env, "status", "--porcelain=v1", "-z", "--untracked-files=all").split(b"\0")
    shape["statusEntries"] = len([s for s in status if s])
    outputs = fresh_dir(scratch, "out")
    counter = [0]

    def out_dir(kind: str) -> Path:
        counter[0] += 1
        return fresh_dir(outputs, f"{kind}-{counter[0]:03d}")

    def clear(path: Path) -> None:
        for child in path.iterdir():
            child.unlink()
        path.rmdir()

    sizes: dict[str, int] = {}

    # Each case times only the procedure: making its fresh directory before and removing the
    # artifacts after stay outside the clock.
    def ours() -> float:
        d = out_dir("ours")
        t, rec = timed(lambda: run_ours(repo, d))
        sizes["ours"] = record_bytes(rec)
        clear(d)
        return t

    def ours_nofsync() -> float:
        d = out_dir("ours-nofsync")
        with mock.patch("os.fsync", lambda _fd: None):
            t, _ = timed(lambda: run_ours(repo, d))
        clear(d)
        return t

    def shell() -> float:
        d = out_dir("shell")
        t, sizes["shell"] = timed(lambda: run_shell(SHELL_PROCEDURE, repo, d, env))
        clear(d)
        return t

    def shell_sync() -> float:
        d = out_dir("shell-sync")
        t, _ = timed(lambda: run_shell(SHELL_PROCEDURE_SYNC, repo, d, env))
        clear(d)
        return t

    def preflight() -> float:
        return timed(lambda: anyio.run(preflight_repository, repo, backend="asyncio"))[0]

    cases = {
        "ours": ours,
        "shell": shell,
        "oursNoFsync": ours_nofsync,
        "shellSync": shell_sync,
        "preflight": preflight,
    }
    samples: dict[str, list[float]] = {k: [] for k in cases}
    say("warming up (one untimed run of each)")
    for fn in cases.values():
        fn()
    say(f"timing {reps} interleaved repetitions of each")
    order = list(cases)
    for rep in range(reps):
        # Rotate the order so no procedure always runs right after the same other one.
        for key in order[rep % len(order) :] + order[: rep % len(order)]:
            samples[key].append(cases[key]())
    git_procs = count_git_processes(repo, out_dir("count"))
    result: dict[str, Any] = {
        "repo": shape,
        "reps": reps,
        "gitProcessesOurs": git_procs,
        "artifactBytes": sizes,
    }
    for key, values in samples.items():
        result[key] = summarize(values)
    result["ratioOursOverShell"] = round(
        result["ours"]["medianMs"] / result["shell"]["medianMs"], 2
    )
    return result


# -- part 2: whole cuts -------------------------------------------------------------------------


def make_root(root: Path, env: dict[str, str], seats: int) -> list[Path]:
    root.mkdir()
    git(root, env, "init", "-q", "-b", "main")
    (root / ".gitignore").write_text(".cotal/\nseats/\n")
    (root / "README.md").write_text("cut benchmark root\n")
    git(root, env, "add", "-A")
    git(root, env, "commit", "-q", "-m", "one")
    repos = []
    for i in range(seats):
        repo = root / "seats" / f"s{i:02d}"
        make_small_repo(repo, env)
        repos.append(repo)
    return repos


def cut_once(scratch: Path, env: dict[str, str], seats: int, rep: int) -> dict[str, Any]:
    root = scratch / f"cut-{seats}-r{rep}"
    try:
        repos = make_root(root, env, seats)
        cli = Cli(root, env)
        with Mesh(cli) as mesh:
            up_s, _ = timed(mesh.up)
            spawn_s, _ = timed(
                lambda: [mesh.spawn(f"s{i:02d}", "--cwd", str(r)) for i, r in enumerate(repos)]
            )
            down_s, proc = timed(
                lambda: cli.run("down", "--preserve-state", "--json", timeout=900.0)
            )
            result = json.loads(proc.stdout)
            if (
                result.get("failures")
                or result.get("journal") != "ready"
                or len(result.get("seats", [])) != seats
            ):
                raise RuntimeError(
                    f"cut of {seats} seat(s) did not seal cleanly: {proc.stdout}\n{proc.stderr}"
                )
            survivors = mesh.survivors()
            mesh_left = (root / ".cotal" / "mesh.json").exists()
            if survivors or mesh_left:
                raise RuntimeError(
                    f"after the cut: seat pids {survivors} alive, mesh.json left={mesh_left}"
                )
        per_seat = sorted(s["timingsMs"]["repository"] for s in result["seats"])
        return {
            "seats": seats,
            "upMs": ms(up_s),
            "spawnAllMs": ms(spawn_s),
            "downWallMs": ms(down_s),
            "wallMs": result["wallMs"],
            "timingsMs": result["timingsMs"],
            # What wallMs holds beyond the daemon's commit: prepare (fence, drain, a preflight of
            # every seat's repository, the resume document), the journal, stopping and proving
            # gone the manager and the embedded broker.
            "restMs": result["wallMs"] - result["timingsMs"]["total"],
            "seatRepositoryMsMedian": per_seat[len(per_seat) // 2],
            "seatRepositoryMsMax": per_seat[-1],
            "checkpointBytes": sum(s["bytes"] for s in result["seats"]),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def bench_cuts(
    scratch: Path, env: dict[str, str], *, sizes: list[int], reps: int
) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        runs = []
        for rep in range(reps):
            say(f"cut of {n} seat(s), repetition {rep + 1}/{reps}")
            runs.append(cut_once(scratch, env, n, rep))

        def med(key: str, sub: str | None = None, data: list[dict[str, Any]] = runs) -> float:
            values = sorted(float(r[key][sub] if sub else r[key]) for r in data)
            return values[len(values) // 2]

        rows.append(
            {
                "seats": n,
                "reps": reps,
                "downWallMs": summarize([r["downWallMs"] / 1000 for r in runs]),
                "wallMsMedian": med("wallMs"),
                "stopMsMedian": med("timingsMs", "stop"),
                "captureMsMedian": med("timingsMs", "capture"),
                "totalMsMedian": med("timingsMs", "total"),
                "restMsMedian": med("restMs"),
                "spawnAllMsMedian": med("spawnAllMs"),
                "upMsMedian": med("upMs"),
                "runs": runs,
            }
        )
    return rows


# -- output -------------------------------------------------------------------------------------


def print_table(doc: dict[str, Any]) -> None:
    m = doc["machine"]
    out = sys.stdout.write
    out(f"cotal cut benchmark, {m['date']}\n")
    out(
        f"machine: nproc {m['nproc']}, {m['cpuModel']}, {m['memGiB']} GiB, Linux {m['kernel']}, "
        f"Python {m['python']}, {m['git']}, {m['tar']}, scratch fs {m['scratchFs']}, "
        f"load {' '.join(map(str, m['loadAvgAtStart']))} at start\n"
    )
    out(f"command: {doc['command']}\n\n")
    r = doc["repository"]
    shape = r["repo"]
    out(
        f"Repository capture: {shape['commits']} commits ({shape['packBytes'] / 1e6:.1f} MB pack, "
        "built in "
        f"{shape['buildMs'] / 1000:.1f} s), {shape['trackedFiles']} tracked files, "
        f"{shape['staged']} staged, "
        f"{shape['unstaged']} unstaged, {shape['untracked']} untracked; {r['reps']} interleaved "
        "repetitions\n"
    )
    rows = [
        ("ours: capture_repository", r["ours"], r["artifactBytes"].get("ours")),
        ("shell: record 6 step 5, bash -c, set -e", r["shell"], r["artifactBytes"].get("shell")),
        ("diagnostic: ours, os.fsync stubbed", r["oursNoFsync"], None),
        ("diagnostic: shell + sync of its files", r["shellSync"], None),
        ("diagnostic: preflight alone (capture runs it 2x)", r["preflight"], None),
    ]
    out(f"  {'procedure':<50} {'median':>9} {'min':>9} {'max':>9} {'artifacts':>11}\n")
    for label, s, size in rows:
        art = f"{size / 1e6:.2f} MB" if size is not None else ""
        out(
            f"  {label:<50} {s['medianMs']:>7.1f}ms {s['minMs']:>7.1f}ms {s['maxMs']:>7.1f}ms "
            f"{art:>11}\n"
        )
    out(
        f"  ratio ours/shell (medians): {r['ratioOursOverShell']:.2f}x; ours starts "
        f"{r['gitProcessesOurs']} git "
        "processes, the shell procedure 5 (plus tar and sha256sum)\n\n"
    )
    out(
        "Cut wall time: idle scribe seats, each in its own small repository; medians over "
        "repetitions\n"
    )
    out(
        f"  {'seats':>5} {'reps':>4} {'down wall':>10} {'wallMs':>8} {'stop':>7} {'capture':>8} "
        f"{'total':>7} "
        f"{'rest':>7} {'capture/seat':>13} {'spawn all':>10}\n"
    )
    for row in doc["cut"]:
        per = row["captureMsMedian"] / row["seats"]
        out(
            f"  {row['seats']:>5} {row['reps']:>4} {row['downWallMs']['medianMs']:>8.0f}ms "
            f"{row['wallMsMedian']:>6.0f}ms "
            f"{row['stopMsMedian']:>5.0f}ms {row['captureMsMedian']:>6.0f}ms "
            f"{row['totalMsMedian']:>5.0f}ms "
            f"{row['restMsMedian']:>5.0f}ms {per:>11.1f}ms {row['spawnAllMsMedian']:>8.0f}ms\n"
        )
    out(
        "  down wall: `cotal down --preserve-state --json` run as a subprocess, end to end "
        "(interpreter start\n"
        "  included). wallMs, stop, capture, total: what that command reports; stop and capture "
        "are the daemon's\n"
        "  commit phases, total adds sealing the manifest. rest = wallMs - total: prepare (fence, "
        "drain, preflight\n"
        "  of every repository, resume document), journal, stopping the manager and broker. "
        "capture/seat =\n"
        "  capture / seats. spawn all: the N `cotal spawn` calls. Each column is its own median.\n"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument(
        "--quick", action="store_true", help="300 commits, seats 1 and 5, fewer repetitions"
    )
    p.add_argument(
        "--json", action="store_true", help="print one JSON document instead of the table"
    )
    p.add_argument("--save", metavar="FILE", help="also write the JSON document to FILE")
    p.add_argument("--commits", type=int, help="override the history size")
    p.add_argument(
        "--seats", type=lambda s: [int(x) for x in s.split(",")], help="override, e.g. 1,10,50"
    )
    p.add_argument("--reps", type=int, help="repetitions of each repository procedure")
    p.add_argument("--cut-reps", type=int, help="repetitions of each cut size")
    args = p.parse_args(argv)
    commits = args.commits or (300 if args.quick else 3000)
    sizes = args.seats or ([1, 5] if args.quick else [1, 10, 50])
    reps = args.reps or (3 if args.quick else 9)
    cut_reps = args.cut_reps or (1 if args.quick else 3)
    if max(sizes) > 50:
        p.error("a manager runs at most 50 seats")

    with temp_tree("cotal-bench-cut-") as scratch:
        home = fresh_dir(scratch, "home")
        env = bench_env(home)
        # capture_repository runs in this process and passes HOME to git: the same private HOME
        # the shell procedure gets, so both read the same (empty) global config.
        saved = {k: os.environ.get(k) for k in ("HOME", "XDG_CONFIG_HOME")}
        os.environ["HOME"] = str(home)
        os.environ.pop("XDG_CONFIG_HOME", None)
        try:
            doc: dict[str, Any] = {
                "machine": machine_info(scratch),
                "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
                "repository": bench_repository(scratch, env, commits=commits, reps=reps),
                "cut": bench_cuts(scratch, env, sizes=sizes, reps=cut_reps),
            }
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    if args.save:
        Path(args.save).write_text(json.dumps(doc, sort_keys=True, indent=1) + "\n")
    if args.json:
        sys.stdout.write(json.dumps(doc, sort_keys=True) + "\n")
    else:
        print_table(doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
