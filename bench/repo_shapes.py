"""Benchmark the capture of two large repository shapes (issue 42, "Tests") against the record's
raw procedure for the same content.

    .venv/bin/python bench/repo_shapes.py             # 7 interleaved repetitions per shape
    .venv/bin/python bench/repo_shapes.py --json      # one JSON document on stdout
    .venv/bin/python bench/repo_shapes.py --only sparse-100k --reps 3

The shapes, built once each by `git fast-import` into a scratch directory under a private HOME:

- `submodules-20`: a superproject of 300 files and 200 commits with 20 submodules (each 60
  files, 40 commits of its own, cloned from an origin that is then deleted); each submodule and
  the superproject with a staged, an unstaged and an untracked change.
- `sparse-100k`: one repository of 100,000 files in 1,000 directories (one commit of the tree,
  then 20 small ones) checked out as a cone of 10 directories (1,000 files present, 99,000
  skip-worktree entries), with a staged, an unstaged and an untracked change inside the cone.

Then, interleaved, `capture_repository` (in process, what a cut runs per seat) against the
shell procedure of record section 6 step 5 (`bench/cut.py`'s) for the same content: for the
superproject, run in the superproject and in each submodule (the repositories named to it,
not discovered), each into a directory of its own. Wall time, and the bytes each writes. The
goal (issue 42): ours within 1.3x the raw procedure's wall. Also timed, as a third case: the
capture right after `preflight_repository` (untimed), which is what a cut's commit runs once
its prepare preflighted the seat (the capture reuses the index scan it proves unchanged); and,
after the repetitions, where one capture's time goes (`phases`: as many captures again, each
step's wall measured inside it).

Not a test: nothing here runs in CI; the figures are recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (  # noqa: E402
    EPOCH,
    bench_env,
    build_history_repo,
    dirty_worktree,
    fresh_dir,
    git,
    machine_info,
    say,
    temp_tree,
    timed,
)
from bench.cut import SHELL_PROCEDURE, run_ours  # noqa: E402
from manager.checkpoint import gitstate  # noqa: E402
from protocol.checkpoint import RepositoryRecord  # noqa: E402

GOAL_RATIO = 1.3
SUBMODULES = 20
SPARSE_FILES = 100_000
SPARSE_DIRS = 1_000
CONE_DIRS = 10

# The raw procedure once per repository, each into its own directory: what the record's
# procedure costs for a superproject and its submodules' content.
PER_REPOSITORY = r"""set -e
OUT="$1"; shift
n=0
for dir in "$@"; do
  n=$((n+1)); mkdir "$OUT/r$n"
  bash -c "$SHELL_PROCEDURE" bash "$dir" "$OUT/r$n"
done
"""


def _work(env: dict[str, str], repo: Path) -> None:
    """One staged, one unstaged and one untracked change."""
    dirty_worktree(repo, env, staged=1, unstaged=1, untracked=1)


def build_submodules(env: dict[str, str], scratch: Path) -> tuple[Path, list[Path]]:
    top = scratch / "super"
    build_history_repo(top, env, commits=200, files=300)
    origins = fresh_dir(scratch, "origins")
    for n in range(SUBMODULES):
        origin = origins / f"lib{n:02d}"
        build_history_repo(origin, env, commits=40, files=60, seed=100 + n)
        git(top, env, "-c", "protocol.file.allow=always", "submodule", "add", "-q",
            str(origin), f"libs/lib{n:02d}")  # fmt: skip
    git(top, env, "commit", "-q", "-m", f"{SUBMODULES} submodules")
    shutil.rmtree(origins)
    subs = [top / "libs" / f"lib{n:02d}" for n in range(SUBMODULES)]
    for repo in [top, *subs]:
        _work(env, repo)
    return top, subs


def build_sparse(env: dict[str, str], scratch: Path) -> Path:
    repo = scratch / "sparse"
    repo.mkdir()
    git(repo, env, "init", "-q", "-b", "main")
    chunks: list[bytes] = []
    per_dir = SPARSE_FILES // SPARSE_DIRS
    for c in range(21):
        stamp = f"{EPOCH + c * 60} +0000"
        chunks.append(b"commit refs/heads/main\nmark :%d\n" % (c + 1))
        chunks.append(f"author Bench <b@example.invalid> {stamp}\n".encode())
        chunks.append(f"committer Bench <b@example.invalid> {stamp}\n".encode())
        msg = b"tree\n" if c == 0 else b"change %d\n" % c
        chunks.append(b"data %d\n%s\n" % (len(msg), msg))
        if c:
            chunks.append(b"from :%d\n" % c)
        names = (
            [(d, f) for d in range(SPARSE_DIRS) for f in range(per_dir)]
            if c == 0
            else [(c * 37 % SPARSE_DIRS, c % per_dir)]
        )
        for d, f in names:
            body = b"file %d of dir %d, version %d\n" % (f, d, c)
            chunks.append(
                b"M 100644 inline d%04d/f%03d.txt\ndata %d\n%s\n" % (d, f, len(body), body)
            )
        chunks.append(b"\n")
    git(repo, env, "fast-import", "--quiet", stdin=b"".join(chunks))
    git(repo, env, "sparse-checkout", "set", "--cone", *(f"d{d:04d}" for d in range(CONE_DIRS)))
    git(repo, env, "checkout", "-q", "main")
    # Inside the cone: `dirty_worktree` would pick among the 99,000 files left out.
    (repo / "d0000" / "f000.txt").write_text("staged\n")
    git(repo, env, "add", "d0000/f000.txt")
    (repo / "d0001" / "f001.txt").write_text("unstaged\n")
    (repo / "d0002" / "note.txt").write_text("untracked\n")
    return repo


def _shell(dirs: list[Path], out: Path, env: dict[str, str]) -> int:
    proc = subprocess.run(
        ["bash", "-c", PER_REPOSITORY, "bash", str(out), *map(str, dirs)],
        env={**env, "SHELL_PROCEDURE": SHELL_PROCEDURE},
        capture_output=True,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"raw procedure failed: {proc.stderr.decode(errors='replace')}")
    return sum(f.stat().st_size for f in out.rglob("*") if f.is_file() and f.suffix != ".sha256")


def _record_bytes(rec: RepositoryRecord) -> int:
    """Every artifact the record names, its submodules' included."""
    return sum(ref.bytes for ref in rec.files())


# The steps of one capture `phases` times inside it, by the module functions that run them.
PHASES = ("_facts", "_scan_index", "_capture_bundle", "_capture_tree", "_capture_submodules")


def phases(top: Path, out: Path, reps: int) -> dict[str, float]:
    """Where one capture's time goes: `capture_repository` run `reps` times more with the
    functions of its steps wrapped, each call's wall summed per capture (medians of `reps`).
    `inspectBeforeMs` is the first inspection (`_facts`, its submodules' included) and
    `inspectAfterMs` the after-capture one, which reuses the index scan; `indexScanMs` is the
    seat's repository's `ls-files --stage` run and its parse within the first; its bundle
    (`bundleMs`) runs beside its tree's other artifacts (`treeArtifactsMs`), and
    `submodulesMs` captures the submodules after both."""
    names = {
        "_scan_index": "indexScanMs",
        "_capture_bundle": "bundleMs",
        "_capture_tree": "treeArtifactsMs",
        "_capture_submodules": "submodulesMs",
    }
    current: dict[str, float] = {}
    started: set[str] = set()
    facts_calls: list[float] = []
    originals = {name: getattr(gitstate, name) for name in PHASES}

    def wrap(name: str) -> Callable[..., Any]:
        inner = originals[name]

        async def timed_step(*args: Any, **kwargs: Any) -> Any:
            # The seat's repository's own call of each step is the first to start (its
            # submodules' run inside or after it); only it is counted.
            first = name not in started
            started.add(name)
            t0 = time.perf_counter()
            try:
                return await inner(*args, **kwargs)
            finally:
                spent = time.perf_counter() - t0
                if name == "_facts" and kwargs.get("prefix", "") == "":
                    facts_calls.append(spent)
                elif name != "_facts" and first:
                    current[names[name]] = spent

        return timed_step

    samples: dict[str, list[float]] = {}
    try:
        for name in PHASES:
            setattr(gitstate, name, wrap(name))
        for n in range(reps):
            current.clear()
            started.clear()
            facts_calls.clear()
            d = fresh_dir(out, f"{top.name}-phases-{n:03d}")
            t0 = time.perf_counter()
            run_ours(top, d)
            wall = time.perf_counter() - t0
            shutil.rmtree(d)
            # Submodule inspections call `_facts` with a prefix: counted in their parent's.
            current["inspectBeforeMs"], current["inspectAfterMs"] = facts_calls
            current["wallMs"] = wall
            for key, value in current.items():
                samples.setdefault(key, []).append(value)
    finally:
        for name, original in originals.items():
            setattr(gitstate, name, original)
    return {k: round(statistics.median(v) * 1000, 1) for k, v in samples.items()}


def bench_shape(
    env: dict[str, str], top: Path, dirs: list[Path], out: Path, reps: int
) -> dict[str, Any]:
    sizes: dict[str, int] = {}
    count = [0]

    def fresh(kind: str) -> Path:
        count[0] += 1
        return fresh_dir(out, f"{top.name}-{kind}-{count[0]:03d}")

    def ours() -> float:
        d = fresh("ours")
        t, rec = timed(lambda: run_ours(top, d))
        sizes["ours"] = _record_bytes(rec)
        shutil.rmtree(d)
        return t

    def after_preflight() -> float:
        anyio.run(gitstate.preflight_repository, top, backend="asyncio")
        d = fresh("ours-pf")
        t, _ = timed(lambda: run_ours(top, d))
        shutil.rmtree(d)
        return t

    def raw() -> float:
        d = fresh("raw")
        t, sizes["raw"] = timed(lambda: _shell(dirs, d, env))
        shutil.rmtree(d)
        return t

    cases: dict[str, Callable[[], float]] = {
        "ours": ours,
        "oursAfterPreflight": after_preflight,
        "raw": raw,
    }
    for fn in cases.values():
        fn()
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for rep in range(reps):
        order = list(cases) if rep % 2 == 0 else list(reversed(cases))
        for key in order:
            samples[key].append(cases[key]())
    ours_ms = statistics.median(samples["ours"]) * 1000
    pf_ms = statistics.median(samples["oursAfterPreflight"]) * 1000
    raw_ms = statistics.median(samples["raw"]) * 1000
    return {
        "oursMs": round(ours_ms, 1),
        "oursAfterPreflightMs": round(pf_ms, 1),
        "rawMs": round(raw_ms, 1),
        "ratio": round(ours_ms / raw_ms, 2),
        "ratioAfterPreflight": round(pf_ms / raw_ms, 2),
        "samplesMs": {k: [round(v * 1000, 1) for v in s] for k, s in samples.items()},
        "bytes": sizes,
        "repositories": len(dirs),
        "phasesMs": phases(top, out, reps),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--json", action="store_true")
    p.add_argument("--only", choices=("submodules-20", "sparse-100k"))
    args = p.parse_args(argv)
    with temp_tree("cotal-repo-shapes-") as scratch:
        home = fresh_dir(scratch, "home")
        env = bench_env(home)
        # capture_repository runs in this process and passes HOME to git: the same private
        # HOME the raw procedure gets (as bench/cut.py does).
        os.environ["HOME"] = str(home)
        os.environ.pop("XDG_CONFIG_HOME", None)
        doc: dict[str, Any] = {"machine": machine_info(scratch), "reps": args.reps, "shapes": {}}
        repos = fresh_dir(scratch, "repos")
        out = fresh_dir(scratch, "out")
        shapes: dict[str, tuple[Path, list[Path]]] = {}
        if args.only in (None, "submodules-20"):
            say(f"building a superproject with {SUBMODULES} submodules")
            top, subs = build_submodules(env, repos)
            shapes["submodules-20"] = (top, [top, *subs])
        if args.only in (None, "sparse-100k"):
            say(f"building a {SPARSE_FILES}-file repository checked out sparse")
            sparse = build_sparse(env, repos)
            shapes["sparse-100k"] = (sparse, [sparse])
        for name, (top, dirs) in shapes.items():
            say(f"{name}: {args.reps} interleaved repetitions")
            doc["shapes"][name] = bench_shape(env, top, dirs, out, args.reps)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    print(
        f"{'shape':<16} {'repos':>5} {'ours ms':>8} {'pf ms':>8} {'raw ms':>8} {'ratio':>6} "
        f"{'pf/raw':>6}  bytes ours/raw"
    )
    for name, row in doc["shapes"].items():
        met = "" if row["ratio"] <= GOAL_RATIO else "  (over 1.3x)"
        print(
            f"{name:<16} {row['repositories']:>5} {row['oursMs']:>8} "
            f"{row['oursAfterPreflightMs']:>8} {row['rawMs']:>8} {row['ratio']:>6} "
            f"{row['ratioAfterPreflight']:>6}  {row['bytes']['ours']}/{row['bytes']['raw']}{met}"
        )
        print("    phases (ms): " + ", ".join(f"{k} {v}" for k, v in row["phasesMs"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
