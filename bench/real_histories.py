"""Benchmark the capture of real public histories (issue 42, item 8) against the record's shell
procedure for the same tree.

    .venv/bin/python bench/real_histories.py           # 7 interleaved repetitions per shape
    .venv/bin/python bench/real_histories.py --json    # one JSON document on stdout

The repositories are the tests' (tests/data/real: h11 and itsdangerous, each one branch and its
tags, committed as git bundles). Each shape is cloned from its bundle into a scratch directory,
as `tests/e2e/test_real_histories.py` builds it: as cloned, a shallow clone of depth 20 (h11),
and a sparse cone checkout (itsdangerous), each with a stash, a staged and an unstaged change
and an untracked note. Then, interleaved, `capture_repository` (in process, what a cut runs per
seat) against the shell procedure of record section 6 step 5 (`bench/cut.py`'s), each into a
fresh directory: wall time and the bytes each writes (the bundle, the two diffs, the untracked
tar). The goal (issue 42): ours within 1.3x the shell's wall.

Not a test: nothing here runs in CI; the figures are recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import bench_env, fresh_dir, git, machine_info, say, temp_tree, timed  # noqa: E402
from bench.cut import SHELL_PROCEDURE, record_bytes, run_ours, run_shell  # noqa: E402

REAL = Path(__file__).resolve().parent.parent / "tests" / "data" / "real"
BRANCH = {"h11": "master", "itsdangerous": "main"}
GOAL_RATIO = 1.3


def _clone(env: dict[str, str], name: str, into: Path, *extra: str) -> Path:
    git(into.parent, env, "clone", "-q", *extra, "--branch", BRANCH[name],
        str(REAL / f"{name}.bundle"), into.name)  # fmt: skip
    git(into, env, "remote", "remove", "origin")
    return into


def _work(env: dict[str, str], repo: Path, edit: str, readme: str) -> None:
    path = repo / edit
    original = path.read_text()
    path.write_text(original + "# stashed\n")
    git(repo, env, "stash", "push", "-q", "-m", "kept aside")
    path.write_text(original + "# staged\n")
    git(repo, env, "add", edit)
    path.write_text(original + "# staged\n# and then unstaged\n")
    (repo / readme).write_text((repo / readme).read_text() + "\nUnstaged note.\n")
    (repo / "notes").mkdir()
    (repo / "notes" / "todo.txt").write_text("untracked\n")


def _shapes(env: dict[str, str], scratch: Path) -> dict[str, Path]:
    made: dict[str, Path] = {}
    h11 = _clone(env, "h11", scratch / "h11")
    _work(env, h11, "h11/_util.py", "README.rst")
    made["h11"] = h11
    its = _clone(env, "itsdangerous", scratch / "itsdangerous")
    _work(env, its, "src/itsdangerous/signer.py", "README.md")
    made["itsdangerous"] = its
    origin = _clone(env, "h11", scratch / "h11-origin", "--bare")
    git(scratch, env, "clone", "-q", "--depth", "20", f"file://{origin}", "h11-shallow")
    shutil.rmtree(origin)
    shallow = scratch / "h11-shallow"
    git(shallow, env, "remote", "remove", "origin")
    _work(env, shallow, "h11/_util.py", "README.rst")
    made["h11-shallow-20"] = shallow
    sparse = _clone(env, "itsdangerous", scratch / "its-sparse")
    git(sparse, env, "sparse-checkout", "set", "--cone", "src", "docs")
    _work(env, sparse, "src/itsdangerous/signer.py", "README.md")
    made["itsdangerous-sparse"] = sparse
    return made


def bench_shape(env: dict[str, str], repo: Path, out: Path, reps: int) -> dict[str, Any]:
    sizes: dict[str, int] = {}
    count = [0]

    def fresh(kind: str) -> Path:
        count[0] += 1
        return fresh_dir(out, f"{repo.name}-{kind}-{count[0]:03d}")

    def ours() -> float:
        d = fresh("ours")
        t, rec = timed(lambda: run_ours(repo, d))
        sizes["ours"] = record_bytes(rec)
        shutil.rmtree(d)
        return t

    def shell() -> float:
        d = fresh("shell")
        t, sizes["shell"] = timed(lambda: run_shell(SHELL_PROCEDURE, repo, d, env))
        shutil.rmtree(d)
        return t

    cases: dict[str, Callable[[], float]] = {"ours": ours, "shell": shell}
    for fn in cases.values():
        fn()
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for rep in range(reps):
        order = list(cases) if rep % 2 == 0 else list(reversed(cases))
        for key in order:
            samples[key].append(cases[key]())
    ours_ms = statistics.median(samples["ours"]) * 1000
    shell_ms = statistics.median(samples["shell"]) * 1000
    return {
        "oursMs": round(ours_ms, 1),
        "shellMs": round(shell_ms, 1),
        "ratio": round(ours_ms / shell_ms, 2),
        "bytes": sizes,
        "commits": int(git(repo, env, "rev-list", "--count", "--all").decode().strip()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    with temp_tree("cotal-real-histories-") as scratch:
        home = fresh_dir(scratch, "home")
        env = bench_env(home)
        # capture_repository runs in this process and passes HOME to git: the same private
        # HOME the shell procedure gets (as bench/cut.py does).
        os.environ["HOME"] = str(home)
        os.environ.pop("XDG_CONFIG_HOME", None)
        doc: dict[str, Any] = {"machine": machine_info(scratch), "reps": args.reps, "shapes": {}}
        shapes = _shapes(env, fresh_dir(scratch, "repos"))
        out = fresh_dir(scratch, "out")
        for name, repo in shapes.items():
            say(f"{name}: {args.reps} interleaved repetitions")
            doc["shapes"][name] = bench_shape(env, repo, out, args.reps)
    if args.json:
        print(json.dumps(doc, indent=2))
        return 0
    head = f"{'shape':<22} {'commits':>7} {'ours ms':>8} {'shell ms':>9} {'ratio':>6}"
    print(f"{head}  bytes ours/shell")
    for name, row in doc["shapes"].items():
        met = "" if row["ratio"] <= GOAL_RATIO else "  (over 1.3x)"
        print(
            f"{name:<22} {row['commits']:>7} {row['oursMs']:>8} {row['shellMs']:>9} "
            f"{row['ratio']:>6}  {row['bytes']['ours']}/{row['bytes']['shell']}{met}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
