"""Benchmark the resume: admission and repository restore against the record's shell procedure,
then whole resumes of 1, 10 and 50 seats.

    .venv/bin/python bench/resume.py            # full size: 3000 commits; 1, 10 and 50 seats
    .venv/bin/python bench/resume.py --quick    # 300 commits; 1 and 5 seats; well under a minute
    .venv/bin/python bench/resume.py --json     # one JSON document on stdout (progress on stderr)
    .venv/bin/python bench/resume.py --save F   # the table, and the JSON document written to F

Everything runs against one shared broker (`cotal broker serve --store-dir D --json`), as two
hosts would share one.

Part 1 builds the repository of bench/cut.py (history by `git fast-import`; 20 staged, 20
unstaged and 300 untracked changes) as the cwd of one `scribe` seat, cuts that seat through the
real CLI (`cotal up --detach --server`, `cotal spawn`, `cotal down --preserve-state`) and copies
the sealed attempt out. On that one checkpoint it then times, interleaved and in the same run:

- ours: the admission gates (`admit.integrity`, `admit.identity` with `live_uids=set()` and the
  root's real settings, `admit.recency`), `restore_repository` into a fresh target at a scratch
  path, and the placement of the seat's session files; all called in process;
- shell: record section 6 step 7 under `bash -c` and `set -e` (sha256sum -c, clone, rev-parse
  --verify, checkout --detach, the two applies, tar -xf, mv) on the same artifacts, hard-linked
  under the record's `ckpt-repo.*` names beside a basenames `ckpt-repo.sha256` and
  `ckpt-repo.base` written from the checkpoint's recorded digests and base;

plus diagnostic rows that split the gap. Both results are checked once to show the recorded git
status and the same tree bytes.

Part 2, per size N: a fresh workspace root with N small repositories (as bench/cut.py), `cotal
up --detach --server`, N idle scribe seats, `cotal down --preserve-state`; the attempt is copied
out, the root is taken away and recreated empty ("host A is gone"), and `cotal up --restore DIR
--server URL --creds F --json` is timed as a subprocess, next to the `wallMs` it reports and a
phase split read from its progress lines, the manager's log and `mesh.json`. Every seat must come
back with the same uid and session and the recorded git status; then `cotal down`, and every
process is proven gone. Every process and temporary directory is removed, on failure too.

Not a test: nothing here runs in CI, and the numbers are recorded in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
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
    run_stamped,
    say,
    shared_broker,
    summarize,
    temp_tree,
    timed,
    tree_digest,
)
from manager import logs, registry  # noqa: E402
from manager.broker.connection import LazyConnection  # noqa: E402
from manager.broker.presence import live_uids as read_live_uids  # noqa: E402
from manager.checkpoint import admit  # noqa: E402
from manager.checkpoint.clock import ClockReading  # noqa: E402
from manager.checkpoint.confine import place_session_file, session_destination  # noqa: E402
from manager.checkpoint.gitstate import STATUS_ARGS, run_git  # noqa: E402
from manager.checkpoint.reader import read_manifest, verify_file  # noqa: E402
from manager.checkpoint.restore import restore_repository  # noqa: E402
from manager.coord.admission import agent_settings  # noqa: E402
from manager.workspace.layout import Layout  # noqa: E402
from protocol.checkpoint import SeatCheckpoint  # noqa: E402

# Record section 6 step 7, verbatim but for the first line, which takes $ROOT as an argument.
SHELL_PROCEDURE = r"""set -e
ROOT="$1"
cd "$(dirname "$ROOT")"
sha256sum -c ckpt-repo.sha256
if [ -e "$ROOT.incoming" ]; then
  echo "refusing: $ROOT.incoming already exists" >&2
  exit 1
fi
git clone ckpt-repo.bundle "$ROOT.incoming"
cd "$ROOT.incoming"
git rev-parse --verify "$(cat ../ckpt-repo.base)^{commit}"
git checkout --detach "$(cat ../ckpt-repo.base)"
git apply --binary --allow-empty --index ../ckpt-repo.index.diff
git apply --binary --allow-empty ../ckpt-repo.worktree.diff
tar -xf ../ckpt-repo.untracked.tar
cd "$(dirname "$ROOT")"
test ! -e "$ROOT" || mv "$ROOT" "$ROOT.superseded.$(date -u +%Y%m%dT%H%M%SZ)"
mv "$ROOT.incoming" "$ROOT"
"""
# Diagnostic only: the same procedure traced, each command stamped by bash as it starts; a last
# no-op marks the end of the final `mv`.
SHELL_TRACED = "PS4='+ $EPOCHREALTIME '\nset -x\n" + SHELL_PROCEDURE + ": end\n"
_TRACE_RE = re.compile(r"^\++ (\d+\.\d+) (.*)$")
# Diagnostic only: the digest check of the same procedure, alone.
SHELL_SHA256 = 'set -e\ncd "$(dirname "$1")"\nsha256sum -c ckpt-repo.sha256\n'

# The record's artifact names, and which field of the repository record each one is.
SHELL_NAMES = (
    ("ckpt-repo.bundle", "bundle"),
    ("ckpt-repo.index.diff", "index_diff"),
    ("ckpt-repo.worktree.diff", "worktree_diff"),
    ("ckpt-repo.untracked.tar", "untracked"),
)
STAMP = "bench"

# Source and destination share this machine's clock: the gate's cost is what is timed.
SHARED_CLOCK = ClockReading(True, "bench", "one clock for source and destination")


def porcelain(repo: Path) -> str:
    return anyio.run(lambda: run_git(repo, *STATUS_ARGS), backend="asyncio").stdout.decode(
        "utf-8", "replace"
    )


def make_root(root: Path, env: dict[str, str]) -> None:
    """A workspace root as bench/cut.py makes it: a git repository with one commit that ignores
    `.cotal/` and `seats/`."""
    root.mkdir()
    git(root, env, "init", "-q", "-b", "main")
    (root / ".gitignore").write_text(".cotal/\nseats/\n")
    (root / "README.md").write_text("resume benchmark root\n")
    git(root, env, "add", "-A")
    git(root, env, "commit", "-q", "-m", "one")


def cut_seats(
    cli: Cli, mesh: Mesh, broker: dict[str, Any], repos: list[Path]
) -> tuple[dict[str, Any], dict[str, float]]:
    """up, spawn one scribe seat per repository, `down --preserve-state`; the result and timings."""
    up_s, _ = timed(
        lambda: cli.run("up", "--detach", "--server", broker["url"], "--creds", broker["creds"])
    )
    spawn_s, _ = timed(
        lambda: [mesh.spawn(f"s{i:02d}", "--cwd", str(r)) for i, r in enumerate(repos)]
    )
    down_s, proc = timed(lambda: cli.run("down", "--preserve-state", "--json", timeout=900.0))
    result = json.loads(proc.stdout)
    if (
        result.get("failures")
        or result.get("journal") != "ready"
        or len(result.get("seats", [])) != len(repos)
    ):
        raise RuntimeError(
            f"cut of {len(repos)} seat(s) did not seal cleanly: {proc.stdout}\n{proc.stderr}"
        )
    return result, {"upMs": ms(up_s), "spawnAllMs": ms(spawn_s), "cutWallMs": ms(down_s)}


def copy_out(attempt_dir: Path, dest_parent: Path) -> Path:
    """What an operator carries to the destination: the whole sealed attempt directory."""
    dest_parent.mkdir(parents=True, exist_ok=True)
    copy = dest_parent / attempt_dir.name
    shutil.copytree(attempt_dir, copy, symlinks=True)
    return copy


def seat_dir_of(adm: admit.Admission, name: str) -> Path:
    return adm.attempt_dir / next(s.dir for s in adm.manifest.seats if s.name == name)


# -- part 1: admission + restore against the shell procedure ------------------------------------


def prepare_shell_dir(parent: Path, seat_dir: Path, record: SeatCheckpoint) -> Path:
    """The record's artifact directory: the checkpoint's four artifacts hard-linked under the
    record's names, `ckpt-repo.base`, and a basenames `ckpt-repo.sha256` from the recorded digests.
    Returns $ROOT (not created: the fresh-destination case)."""
    parent.mkdir()
    repo = record.repository
    lines = []
    for name, field in SHELL_NAMES:
        ref = getattr(repo, field)
        os.link(seat_dir / ref.file, parent / name)
        lines.append(f"{ref.sha256}  {name}\n")
    (parent / "ckpt-repo.base").write_text(f"{repo.base}\n")
    (parent / "ckpt-repo.sha256").write_text("".join(lines))
    return parent / "repo"


def run_shell(script: str, root: Path, env: dict[str, str]) -> bytes:
    proc = subprocess.run(
        ["bash", "-c", script, "bash", str(root)], env=env, capture_output=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"shell procedure failed ({proc.returncode}): {proc.stderr.decode(errors='replace')}"
        )
    return proc.stderr


def shell_steps(trace: bytes) -> dict[str, float]:
    """Seconds per command of the traced shell procedure, from one stamp to the next."""
    stamps = []
    for line in trace.decode("utf-8", "replace").splitlines():
        m = _TRACE_RE.match(line)
        if m:
            words = m.group(2).split()
            label = " ".join(words[:2]) if words[0] == "git" else words[0]
            if label == "git apply":
                label = "git apply --index" if "--index" in words else "git apply (worktree)"
            if label not in ("sha256sum", "tar", "mv") and not label.startswith("git "):
                label = "other (cd, test, cat, date)"
            stamps.append((float(m.group(1)), label))
    steps: dict[str, float] = {}
    for (start, label), (end, _) in zip(stamps, stamps[1:], strict=False):
        steps[label] = steps.get(label, 0.0) + end - start
    return steps


_REF_COMMANDS = ("remote", "for-each-ref", "update-ref", "symbolic-ref")


def ours_steps(restore: Any) -> tuple[float, dict[str, float]]:
    """Run `restore()` (one restore_repository) with its git calls, digest checks, untracked
    extraction and promotion timed one by one; returns the total and seconds per step."""
    import manager.checkpoint.restore as mod

    steps: dict[str, float] = {}
    seen: dict[str, int] = {}

    def add(label: str, seconds: float) -> None:
        steps[label] = steps.get(label, 0.0) + seconds

    # The restore module's own bindings, the names this patches (two are imported there).
    real_git, real_extract, real_verify, real_promote = (
        vars(mod)["run_git"],
        mod._extract_untracked,
        vars(mod)["verify_file"],
        mod._promote,
    )

    async def run_git_timed(cwd: Path, *args: str, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return await real_git(cwd, *args, **kw)
        finally:
            cmd = args[0]
            seen[cmd] = seen.get(cmd, 0) + 1
            if cmd in _REF_COMMANDS:
                label = "git refs (remote, for-each-ref x2, update-ref, symbolic-ref)"
            elif cmd == "apply":
                label = "git apply --index" if seen[cmd] == 1 else "git apply (worktree)"
            elif cmd == "status":
                label = "git status (staged)" if seen[cmd] == 1 else "git status (in place)"
            else:
                label = f"git {cmd}"
            add(label, time.perf_counter() - t)

    def wrap(label: str, fn: Any) -> Any:
        def timed_fn(*a: Any, **k: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                add(label, time.perf_counter() - t)

        return timed_fn

    with (
        mock.patch.object(mod, "run_git", run_git_timed),
        mock.patch.object(
            mod, "_extract_untracked", wrap("untracked extraction (tarfile)", real_extract)
        ),
        mock.patch.object(mod, "verify_file", wrap("digest re-check", real_verify)),
        mock.patch.object(mod, "_promote", wrap("promotion", real_promote)),
    ):
        total, _ = timed(restore)
    add("other (Python, staging, refs.txt parse)", total - sum(steps.values()))
    return total, steps


def bench_restore(
    scratch: Path, env: dict[str, str], broker: dict[str, Any], *, commits: int, reps: int
) -> dict[str, Any]:
    root = scratch / "source"
    make_root(root, env)
    repo = root / "seats" / "big"
    say(f"building a repository of {commits} commits with git fast-import")
    build_s, shape = timed(lambda: build_history_repo(repo, env, commits=commits))
    shape.update(dirty_worktree(repo, env, staged=20, unstaged=20, untracked=300))
    shape["buildMs"] = ms(build_s)
    shape["packBytes"] = sum(
        p.stat().st_size for p in (repo / ".git" / "objects" / "pack").glob("*.pack")
    )
    status_before = porcelain(repo)
    shape["statusEntries"] = status_before.count("\0")
    cli = Cli(root, env)
    say("cutting one scribe seat in it through the CLI")
    with Mesh(cli) as mesh:
        cut, cut_times = cut_seats(cli, mesh, broker, [repo])
    carried = copy_out(Path(cut["checkpointDir"]), scratch / "carried-1")
    settings_root = Layout.at(root)
    # The benchmark resumes the source's own cut, so the source's own key is the trusted one.
    signer = read_manifest(carried).signer
    assert signer is not None
    trusted = [signer.public_key]
    adm0 = admit.integrity(carried, trusted_keys=trusted)
    [name] = list(adm0.records)
    record = adm0.records[name]
    seat_dir = seat_dir_of(adm0, name)
    recorded_root = Path(record.workspace_root or "")
    session_entries = ([record.session.pointer] if record.session.pointer else []) + list(
        record.session.store
    )
    checkpoint_bytes = sum(p.stat().st_size for p in carried.rglob("*") if p.is_file())
    home = Path(env["HOME"])

    outputs = fresh_dir(scratch, "out")
    counter = [0]

    def next_dir(kind: str) -> Path:
        counter[0] += 1
        return outputs / f"{kind}-{counter[0]:03d}"

    phases: dict[str, list[float]] = {
        k: [] for k in ("integrity", "identity", "recency", "restore", "sessions")
    }

    step_samples: dict[str, dict[str, list[float]]] = {"ours": {}, "shell": {}}

    def add_steps(side: str, steps: dict[str, float]) -> None:
        for label, seconds in steps.items():
            step_samples[side].setdefault(label, []).append(seconds)

    def ours_once(parent: Path, record_phases: bool, trace_steps: bool = False) -> Path:
        ws = parent / "ws"
        target = ws / "repo"
        t0 = time.perf_counter()
        adm = admit.integrity(carried, trusted_keys=trusted)
        t1 = time.perf_counter()
        admit.identity(
            adm,
            space=adm.manifest.space,
            root=recorded_root,
            live_uids=set(),
            held_uids=set(),
            settings_for=agent_settings(registry.load_config(settings_root.root)),
        )
        t2 = time.perf_counter()
        admit.recency(adm, now=datetime.now(UTC), clock=SHARED_CLOCK, accept_stale=False)
        t3 = time.perf_counter()
        rec = adm.records[name]
        sd = seat_dir_of(adm, name)

        async def restore() -> Any:
            return await restore_repository(sd, rec.repository, target, stamp=STAMP, keep_paths=())

        if trace_steps:
            _, steps = ours_steps(lambda: anyio.run(restore, backend="asyncio"))
            add_steps("ours", steps)
        else:
            anyio.run(restore, backend="asyncio")
        t4 = time.perf_counter()
        for entry in session_entries:
            dest = session_destination(entry, cwd=target, workspace_root=ws, home=home)
            place_session_file(sd / entry.file.file, dest, expected_sha256=entry.file.sha256)
        t5 = time.perf_counter()
        if record_phases:
            for key, value in zip(
                phases, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4), strict=True
            ):
                phases[key].append(value)
        return target

    # Each case times only the procedure: preparing its fresh directory before and removing
    # what it wrote after stay outside the clock.
    def ours() -> float:
        parent = next_dir("ours")
        t, _ = timed(lambda: ours_once(parent, True))
        shutil.rmtree(parent)
        return t

    def ours_nofsync() -> float:
        parent = next_dir("ours-nofsync")
        with mock.patch("os.fsync", lambda _fd: None):
            t, _ = timed(lambda: ours_once(parent, False))
        shutil.rmtree(parent)
        return t

    def shell() -> float:
        parent = next_dir("shell")
        target = prepare_shell_dir(parent, seat_dir, record)
        t, _ = timed(lambda: run_shell(SHELL_PROCEDURE, target, env))
        shutil.rmtree(parent)
        return t

    def ours_traced() -> float:
        parent = next_dir("ours-steps")
        t, _ = timed(lambda: ours_once(parent, False, trace_steps=True))
        shutil.rmtree(parent)
        return t

    def shell_traced() -> float:
        parent = next_dir("shell-steps")
        target = prepare_shell_dir(parent, seat_dir, record)
        t, trace = timed(lambda: run_shell(SHELL_TRACED, target, env))
        add_steps("shell", shell_steps(trace))
        shutil.rmtree(parent)
        return t

    probe_shell = prepare_shell_dir(next_dir("probe-shell"), seat_dir, record)

    def shell_sha256() -> float:
        return timed(lambda: run_shell(SHELL_SHA256, probe_shell, env))[0]

    def rehash() -> float:
        refs = [
            r
            for r in (
                record.repository.bundle,
                record.repository.index_diff,
                record.repository.worktree_diff,
                record.repository.untracked,
                record.repository.refs,
            )
            if r is not None
        ]

        def verify_all() -> None:
            for r in refs:
                verify_file(seat_dir, r)

        return timed(verify_all)[0]

    say("checking once that both procedures reproduce the recorded state")
    ours_probe = ours_once(next_dir("probe-ours"), False)
    shell_root = prepare_shell_dir(next_dir("probe-shell-run"), seat_dir, record)
    run_shell(SHELL_PROCEDURE, shell_root, env)
    check = {
        "oursStatusMatchesRecord": porcelain(ours_probe)
        == record.repository.status
        == status_before,
        "shellStatusMatchesRecord": porcelain(shell_root) == record.repository.status,
        "sameTreeBytes": tree_digest(ours_probe) == tree_digest(shell_root) == tree_digest(repo),
    }
    if not all(check.values()):
        raise RuntimeError(f"the restored trees do not match the recorded state: {check}")
    git_procs, _ = count_processes(lambda: ours_once(next_dir("count"), False))

    def create_files() -> float:
        """Calibration of this machine's filesystem: 300 files of 2 KiB in 10 new directories."""
        parent = next_dir("create")
        data = b"x" * 2048

        def write_all() -> None:
            for i in range(300):
                sub = parent / f"dir{i % 10}"
                sub.mkdir(parents=True, exist_ok=True)
                (sub / f"f{i:04d}.txt").write_bytes(data)

        t, _ = timed(write_all)
        shutil.rmtree(parent)
        return t

    def status() -> float:
        return timed(lambda: porcelain(ours_probe))[0]

    def verify_cli() -> float:
        return timed(
            lambda: cli.run(
                "checkpoint",
                "verify",
                str(carried),
                "--server",
                broker["url"],
                "--creds",
                broker["creds"],
                "--json",
            )
        )[0]

    async def roster() -> Any:
        # Connect, read, close: what one admission pays for its roster read.
        conn = LazyConnection(broker["url"], Path(broker["creds"]), name="cotal-admission")
        async with conn:
            return await read_live_uids(await conn.jetstream(), record.space)

    def live_uids() -> float:
        return timed(lambda: anyio.run(roster, backend="asyncio"))[0]

    cases = {
        "ours": ours,
        "shell": shell,
        "oursNoFsync": ours_nofsync,
        "shellSha256": shell_sha256,
        "rehash": rehash,
        "status": status,
        "liveUids": live_uids,
        "verifyCli": verify_cli,
        "oursSteps": ours_traced,
        "shellSteps": shell_traced,
        "createFiles": create_files,
    }
    samples: dict[str, list[float]] = {k: [] for k in cases}
    say("warming up (one untimed run of each)")
    for fn in cases.values():
        fn()
    for values in phases.values():
        values.clear()
    step_samples["ours"].clear()
    step_samples["shell"].clear()
    say(f"timing {reps} interleaved repetitions of each")
    order = list(cases)
    for rep in range(reps):
        for key in order[rep % len(order) :] + order[: rep % len(order)]:
            # Outside the clock: write back what earlier repetitions left dirty (and their
            # deletions), so no repetition pays for another's writeback at its first fsync.
            os.sync()
            samples[key].append(cases[key]())
    result: dict[str, Any] = {
        "repo": shape,
        "reps": reps,
        "cut": cut_times,
        "checkpointBytes": checkpoint_bytes,
        "artifactBytes": sum(getattr(record.repository, f).bytes for _, f in SHELL_NAMES),
        "sessionFiles": len(session_entries),
        "gitProcessesOurs": git_procs,
        "check": check,
        "phases": {k: summarize(v) for k, v in phases.items()},
        # Medians per step over the traced repetitions (restore_repository alone on our side).
        "stepsMs": {
            side: {label: ms(statistics.median(v)) for label, v in steps.items()}
            for side, steps in step_samples.items()
        },
    }
    for key, values in samples.items():
        result[key] = summarize(values)
    result["ratioOursOverShell"] = round(
        result["ours"]["medianMs"] / result["shell"]["medianMs"], 2
    )
    shutil.rmtree(root, ignore_errors=True)
    return result


# -- part 2: whole resumes ----------------------------------------------------------------------


def _first_line(lines: list[tuple[float, str]], prefix: str) -> float | None:
    return next((t for t, text in lines if text.startswith(prefix)), None)


def _log_event(log: Path, event: str) -> float | None:
    try:
        text = log.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.get("event") == event:
            return datetime.fromisoformat(row["timestamp"].replace("Z", "+00:00")).timestamp()
    return None


def resume_phases(run: dict[str, Any], root: Path) -> dict[str, float | None]:
    """Split the wall of `cotal up --restore` by the marks it leaves, all on this host's clock.

    Progress lines on stderr (stamped as they arrive), the mtime of `.cotal/mesh.json` (written
    once the new manager answers) and the manager log's `resume.activated` / `resume.finalized`.
    """
    lines = run["lines"]
    marks = [
        ("startup", run["start"]),
        ("integrity", _first_line(lines, "admitting ")),
        ("identityRecency", _first_line(lines, "sealed by instance")),
        ("journal", _first_line(lines, "admitted: ")),
        ("custody", _first_line(lines, "claiming custody")),
        ("restore", _first_line(lines, "restoring ")),
        ("daemonStart", _first_line(lines, "starting the manager fenced")),
    ]
    log = root / ".cotal" / "logs" / "manager.log"
    marks.append(("daemonAnswer", _log_event(log, "daemon.ready")))
    try:
        marks.append(("adopt", (root / ".cotal" / "mesh.json").stat().st_mtime))
    except OSError:
        marks.append(("adopt", None))
    marks.append(("commitFinalize", _log_event(log, "resume.activated")))
    marks.append(("tail", _log_event(log, "resume.finalized")))
    marks.append(("end", run["end"]))
    out: dict[str, float | None] = {}
    # Each phase runs from its own mark to the next one: "startup" is interpreter start and
    # imports up to "admitting", "integrity" up to "sealed by", and so on; "tail" is finalized
    # to exit (`ps`, the observations, the output, interpreter exit).
    for (key, start), (_, end) in zip(marks, marks[1:], strict=False):
        out[key] = (
            round((end - start) * 1000.0, 1) if start is not None and end is not None else None
        )
    return out


def resume_once(
    scratch: Path, env: dict[str, str], broker: dict[str, Any], seats: int, rep: int
) -> dict[str, Any]:
    root = scratch / f"resume-{seats}-r{rep}"
    carried_parent = scratch / f"carried-{seats}-r{rep}"
    try:
        make_root(root, env)
        repos = []
        for i in range(seats):
            repo = root / "seats" / f"s{i:02d}"
            make_small_repo(repo, env)
            repos.append(repo)
        before = {r.name: (porcelain(r), tree_digest(r)) for r in repos}
        cli = Cli(root, env)
        with Mesh(cli) as mesh:
            cut, cut_times = cut_seats(cli, mesh, broker, repos)
            if mesh.survivors() or (root / ".cotal" / "mesh.json").exists():
                raise RuntimeError("after the cut a seat process or mesh.json was left")
            carried = copy_out(Path(cut["checkpointDir"]), carried_parent)
            # Host A is gone: the whole tree, then an empty directory at the same path.
            shutil.rmtree(root)
            root.mkdir()
            # The source's own key, pinned for this run: the new root holds no trust list.
            signer = json.loads((carried / "manifest.json").read_text())["signer"]["publicKey"]
            run = run_stamped(
                [
                    sys.executable,
                    "-m",
                    "manager.cli",
                    "up",
                    "--restore",
                    str(carried),
                    "--server",
                    broker["url"],
                    "--creds",
                    broker["creds"],
                    "--trust-signer",
                    signer,
                    "--json",
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
            phases = resume_phases(run, root)
            rows = result.get("seats", [])
            same_uid = sum(1 for s in rows if s["sameUid"])
            same_session = sum(1 for s in rows if s["sameSession"])
            restored_ok = sum(1 for r in repos if (porcelain(r), tree_digest(r)) == before[r.name])
            if (
                not (len(rows) == seats == same_uid == same_session == restored_ok)
                or result.get("state") != "active"
                or result.get("journal") != "retired"
            ):
                raise RuntimeError(
                    f"resume of {seats} seat(s): {len(rows)} seats, sameUid {same_uid}, "
                    "sameSession "
                    f"{same_session}, trees {restored_ok}; {run['stdout'][:2000]}"
                )
            down_s, _ = timed(lambda: cli.run("down", timeout=300.0))
            survivors = mesh.survivors()
            if survivors or (root / ".cotal" / "mesh.json").exists():
                raise RuntimeError(
                    f"after cotal down: seat pids {survivors} alive or mesh.json left"
                )
        return {
            "seats": seats,
            **cut_times,
            "restoreWallMs": ms(run["wallS"]),
            "wallMs": result["wallMs"],
            "phasesMs": phases,
            "sameUid": same_uid,
            "sameSession": same_session,
            "treesRestored": restored_ok,
            "downMs": ms(down_s),
            "checkpointBytes": sum(s["bytes"] for s in cut["seats"]),
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(carried_parent, ignore_errors=True)


def bench_resumes(
    scratch: Path, env: dict[str, str], broker: dict[str, Any], *, sizes: list[int], reps: int
) -> list[dict[str, Any]]:
    rows = []
    for n in sizes:
        runs = []
        for rep in range(reps):
            say(f"resume of {n} seat(s), repetition {rep + 1}/{reps}")
            runs.append(resume_once(scratch, env, broker, n, rep))

        def med(values: list[float]) -> float:
            return sorted(values)[len(values) // 2]

        phase_keys = list(runs[0]["phasesMs"])
        rows.append(
            {
                "seats": n,
                "reps": reps,
                "restoreWallMs": summarize([r["restoreWallMs"] / 1000 for r in runs]),
                "wallMsMedian": med([r["wallMs"] for r in runs]),
                "phasesMsMedian": {
                    k: med(
                        [r["phasesMs"][k] for r in runs if r["phasesMs"][k] is not None] or [-1.0]
                    )
                    for k in phase_keys
                },
                "downMsMedian": med([r["downMs"] for r in runs]),
                "cutWallMsMedian": med([r["cutWallMs"] for r in runs]),
                "spawnAllMsMedian": med([r["spawnAllMs"] for r in runs]),
                "allSameUid": all(r["sameUid"] == n for r in runs),
                "allSameSession": all(r["sameSession"] == n for r in runs),
                "runs": runs,
            }
        )
    return rows


# -- output -------------------------------------------------------------------------------------


def print_table(doc: dict[str, Any]) -> None:
    m = doc["machine"]
    out = sys.stdout.write
    out(f"cotal resume benchmark, {m['date']}\n")
    out(
        f"machine: nproc {m['nproc']}, {m['cpuModel']}, {m['memGiB']} GiB, Linux {m['kernel']}, "
        f"Python {m['python']}, {m['git']}, {m['tar']}, scratch fs {m['scratchFs']}, "
        f"load {' '.join(map(str, m['loadAvgAtStart']))} at start\n"
    )
    out(
        f"command: {doc['command']}; {doc['totalS']} s; load "
        f"{' '.join(map(str, doc['loadAvgAtEnd']))} at end\n\n"
    )
    r = doc["restore"]
    shape = r["repo"]
    out(
        f"Admission + restore: {shape['commits']} commits ({shape['packBytes'] / 1e6:.1f} MB "
        "pack), "
        f"{shape['trackedFiles']} tracked files, {shape['staged']} staged, {shape['unstaged']} "
        "unstaged, "
        f"{shape['untracked']} untracked; checkpoint {r['checkpointBytes'] / 1e6:.2f} MB, "
        "repository artifacts "
        f"{r['artifactBytes'] / 1e6:.2f} MB; {r['reps']} interleaved repetitions\n"
    )
    rows = [
        ("ours: 3 gates + restore_repository + sessions", r["ours"]),
        ("shell: record 6 step 7, bash -c, set -e", r["shell"]),
        ("  ours, phase: admit.integrity", r["phases"]["integrity"]),
        ("  ours, phase: admit.identity (live_uids=set())", r["phases"]["identity"]),
        ("  ours, phase: admit.recency", r["phases"]["recency"]),
        ("  ours, phase: restore_repository", r["phases"]["restore"]),
        ("  ours, phase: session-file placement", r["phases"]["sessions"]),
        ("diagnostic: ours, os.fsync stubbed", r["oursNoFsync"]),
        ("diagnostic: shell sha256sum -c alone", r["shellSha256"]),
        ("diagnostic: restore's re-hash of the repo files", r["rehash"]),
        ("diagnostic: one porcelain status (restore runs 2)", r["status"]),
        ("diagnostic: broker presence read (live_uids)", r["liveUids"]),
        ("diagnostic: cotal checkpoint verify (CLI wall)", r["verifyCli"]),
        ("calibration: write 300 files of 2 KiB (Python)", r["createFiles"]),
    ]
    out(f"  {'procedure':<52} {'median':>9} {'min':>9} {'max':>9}\n")
    for label, s in rows:
        out(f"  {label:<52} {s['medianMs']:>7.1f}ms {s['minMs']:>7.1f}ms {s['maxMs']:>7.1f}ms\n")
    out(
        f"  ratio ours/shell (medians): {r['ratioOursOverShell']:.2f}x; one run of ours starts "
        f"{r['gitProcessesOurs']} git processes, the shell procedure 5 (plus sha256sum, tar, mv)\n"
    )
    out(
        "  where the time goes (traced repetitions, median per step; ours = restore_repository "
        "alone):\n"
    )
    for side in ("ours", "shell"):
        steps = sorted(r["stepsMs"][side].items(), key=lambda kv: -kv[1])
        out(
            f"    {side:<5} "
            + "; ".join(f"{label} {value:.1f}" for label, value in steps)
            + " (ms)\n"
        )
    out("\n")
    out(
        "Resume wall time: idle scribe seats, each in its own small repository; medians over "
        "repetitions\n"
    )
    keys = [
        "startup",
        "integrity",
        "identityRecency",
        "journal",
        "custody",
        "restore",
        "daemonStart",
        "daemonAnswer",
        "adopt",
        "commitFinalize",
        "tail",
    ]
    heads = [
        "start",
        "integ",
        "id+rec",
        "journal",
        "custody",
        "restore",
        "daemon",
        "answer",
        "adopt",
        "commit",
        "tail",
    ]
    out(
        f"  {'seats':>5} {'reps':>4} {'wall':>8} {'wallMs':>7} "
        + " ".join(f"{h:>7}" for h in heads)
        + f" {'same uid/session':>17} {'down':>7}\n"
    )
    for row in doc["resume"]:
        ph = row["phasesMsMedian"]
        out(
            f"  {row['seats']:>5} {row['reps']:>4} {row['restoreWallMs']['medianMs']:>6.0f}ms "
            f"{row['wallMsMedian']:>5.0f}ms "
            + " ".join(f"{ph[k]:>5.0f}ms" for k in keys)
            + f" {str(row['allSameUid']) + '/' + str(row['allSameSession']):>17} "
            + f"{row['downMsMedian']:>5.0f}ms\n"
        )
    out(
        "  wall: `cotal up --restore DIR --server URL --creds F --json` as a subprocess, end to "
        "end. wallMs: what\n"
        "  it reports. Phases run from one mark to the next (progress lines stamped as they "
        "arrive, mesh.json's\n"
        "  mtime, the manager log): start = interpreter and imports; integ = gate 1; id+rec = the "
        "broker presence\n"
        "  read, gates 2 and 3; journal = lock and resume-intent; custody = the claims here and "
        "at the broker;\n"
        "  restore = every repository and session file; daemon = starting the manager until its "
        "log says ready;\n"
        "  answer = until the CLI's status poll (every 0.1 s) reaches it and mesh.json is "
        "written; adopt =\n"
        "  resume-preserved (every seat relaunched and proven); commit = commit-resume and "
        "finalize-resume;\n"
        "  tail = ps, output, exit. down: the plain `cotal down` after. Each column is its own "
        "median.\n"
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
    p.add_argument("--reps", type=int, help="repetitions of each restore procedure")
    p.add_argument("--resume-reps", type=int, help="repetitions of each resume size")
    args = p.parse_args(argv)
    commits = args.commits or (300 if args.quick else 3000)
    sizes = args.seats or ([1, 5] if args.quick else [1, 10, 50])
    reps = args.reps or (3 if args.quick else 9)
    resume_reps = args.resume_reps or (1 if args.quick else 3)
    if max(sizes) > 50:
        p.error("a manager runs at most 50 seats")

    # As the CLI does: in-process broker connections log at info, which would reach stdout.
    logs.quiet()
    with temp_tree("cotal-bench-resume-") as scratch:
        home = fresh_dir(scratch, "home")
        env = bench_env(home)
        # The restore runs git in this process and passes HOME to it: the same private HOME the
        # shell procedure and the CLI get, so all read the same (empty) global config.
        saved = {k: os.environ.get(k) for k in ("HOME", "XDG_CONFIG_HOME")}
        os.environ["HOME"] = str(home)
        os.environ.pop("XDG_CONFIG_HOME", None)
        try:
            doc: dict[str, Any] = {
                "machine": machine_info(scratch),
                "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
            }
            t0 = time.perf_counter()
            with shared_broker(scratch, env) as broker:
                doc["restore"] = bench_restore(scratch, env, broker, commits=commits, reps=reps)
                doc["resume"] = bench_resumes(scratch, env, broker, sizes=sizes, reps=resume_reps)
            doc["totalS"] = round(time.perf_counter() - t0, 1)
            doc["loadAvgAtEnd"] = [round(x, 2) for x in os.getloadavg()]
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
