"""Shared helpers for the benchmarks: repositories, timing, the machine, the real CLI and a mesh.

Nothing here is imported by the tests; benchmarks measure, tests assert.
Everything a benchmark starts runs under one temporary tree with a private HOME, so the
operator's git config cannot change what is measured, and everything it starts is ended by
pid (recorded by cotal itself in `.cotal/mesh.json`, or found by the seat's lifecycle uid).
"""

from __future__ import annotations

import json
import os
import platform
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parent.parent
T = TypeVar("T")

# A fixed identity and clock make the built repositories identical run to run.
_IDENTITY = {
    "GIT_AUTHOR_NAME": "Bench",
    "GIT_AUTHOR_EMAIL": "bench@example.invalid",
    "GIT_COMMITTER_NAME": "Bench",
    "GIT_COMMITTER_EMAIL": "bench@example.invalid",
}
EPOCH = 1_700_000_000


def say(text: str) -> None:
    """Progress goes to stderr so `--json` keeps stdout to the one document."""
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


# -- timing -------------------------------------------------------------------------------------


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    t0 = time.perf_counter()
    result = fn()
    return time.perf_counter() - t0, result


def ms(seconds: float) -> float:
    return round(seconds * 1000.0, 1)


def summarize(samples_s: Sequence[float]) -> dict[str, Any]:
    """Median, min and max in milliseconds, and every sample, so a reader can judge the spread."""
    return {
        "medianMs": ms(statistics.median(samples_s)),
        "minMs": ms(min(samples_s)),
        "maxMs": ms(max(samples_s)),
        "n": len(samples_s),
        "samplesMs": [ms(s) for s in samples_s],
    }


# -- the machine --------------------------------------------------------------------------------


def _first(cmd: Sequence[str]) -> str:
    try:
        out = subprocess.run(list(cmd), capture_output=True, text=True, check=False, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    lines = out.stdout.strip().splitlines()
    return lines[-1].strip() if lines else "?"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def mem_total_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / (1024 * 1024), 1)
    except (OSError, ValueError):
        pass
    return None


def machine_info(scratch: Path) -> dict[str, Any]:
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "nproc": len(os.sched_getaffinity(0)),
        "cpuModel": cpu_model(),
        "memGiB": mem_total_gib(),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "git": _first(["git", "--version"]),
        "tar": _tar_version(),
        "scratchFs": _first(["df", "--output=fstype", str(scratch)]),
        # Another workload on a 2-core box moves every number here; the load says whether one ran.
        "loadAvgAtStart": [round(x, 2) for x in os.getloadavg()],
    }


def _tar_version() -> str:
    try:
        out = subprocess.run(
            ["tar", "--version"], capture_output=True, text=True, check=False, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    lines = out.stdout.splitlines()
    return lines[0].strip() if lines else "?"


# -- environment and git ------------------------------------------------------------------------


def bench_env(home: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of every process a benchmark starts: private HOME, no COTAL_/GIT_ leaks."""
    env = {
        k: v
        for k, v in os.environ.items()
        # Bytecode is cached as a wheel install caches it: a shell that forbids it would time
        # the compiler on every interpreter start instead of cotal.
        if not k.startswith(("COTAL_", "GIT_"))
        and k not in ("XDG_CONFIG_HOME", "PYTHONDONTWRITEBYTECODE")
    }
    env.update(_IDENTITY)
    env.update(HOME=str(home), PYTHONPATH=str(REPO), GIT_CONFIG_NOSYSTEM="1", LC_ALL="C")
    # Source and destination of a benchmark share this one clock, so its age judgment holds
    # whatever the kernel says of its synchronization.
    env["COTAL_TEST_CLOCK_STATUS"] = "synchronized"
    env.update(extra or {})
    return env


def git(repo: Path, env: dict[str, str], *args: str, stdin: bytes | None = None) -> bytes:
    proc = subprocess.run(
        ["git", *args], cwd=repo, env=env, input=stdin, capture_output=True, check=False
    )
    if proc.returncode != 0:
        raise RuntimeError(
            f"git {' '.join(args)} failed in {repo}: {proc.stderr.decode(errors='replace')}"
        )
    return proc.stdout


def _line(rng: random.Random) -> str:
    words = rng.choices(_WORDS, k=rng.randint(4, 12))
    return "    " + " ".join(words) + "\n"


_WORDS = (
    "let value result index buffer return self config parse write read item count offset token "
    "seat mesh broker commit status error path file entry record frame delta bundle capture"
).split()


def build_history_repo(
    path: Path,
    env: dict[str, str],
    *,
    commits: int,
    files: int = 300,
    lines_per_file: int = 40,
    seed: int = 47,
) -> dict[str, Any]:
    """A repository with `commits` commits built by one `git fast-import` stream.

    The first commit adds `files` text files of `lines_per_file` lines; every later commit
    rewrites 1-4 lines in 1-3 files, so the history deltas like a real project's. The
    working tree is then checked out. Deterministic for a given seed.
    """
    rng = random.Random(seed)
    path.mkdir(parents=True, exist_ok=True)
    git(path, env, "init", "-q", "-b", "main")
    names = [f"src/mod{i // 30:02d}/file{i:04d}.txt" for i in range(files)]
    content = {n: [_line(rng) for _ in range(lines_per_file)] for n in names}
    chunks: list[bytes] = []

    def data(text: str) -> None:
        raw = text.encode()
        chunks.append(b"data %d\n" % len(raw) + raw + b"\n")

    for c in range(commits):
        chunks.append(b"commit refs/heads/main\n")
        chunks.append(b"mark :%d\n" % (c + 1))
        stamp = f"{EPOCH + c * 60} +0000"
        chunks.append(f"author Bench <bench@example.invalid> {stamp}\n".encode())
        chunks.append(f"committer Bench <bench@example.invalid> {stamp}\n".encode())
        if c == 0:
            touched = names
            data("initial import\n")
        else:
            touched = rng.sample(names, rng.randint(1, 3))
            for name in touched:
                lines = content[name]
                for _ in range(rng.randint(1, 4)):
                    lines[rng.randrange(len(lines))] = _line(rng)
            data(f"change {c}: {', '.join(Path(n).name for n in touched)}\n")
        if c > 0:
            chunks.append(b"from :%d\n" % c)
        for name in touched:
            chunks.append(f"M 100644 inline {name}\n".encode())
            data("".join(content[name]))
        chunks.append(b"\n")
    git(path, env, "fast-import", "--quiet", stdin=b"".join(chunks))
    git(path, env, "reset", "-q", "--hard", "main")
    return {"commits": commits, "trackedFiles": files}


def dirty_worktree(
    repo: Path, env: dict[str, str], *, staged: int, unstaged: int, untracked: int, seed: int = 5
) -> dict[str, int]:
    """`staged` tracked files changed and added, `unstaged` others changed only, and
    `untracked` new files of 0.5-4 KiB spread over a few directories."""
    rng = random.Random(seed)
    tracked = sorted(git(repo, env, "ls-files", "-z").decode().split("\0")[:-1])
    picks = rng.sample(tracked, staged + unstaged)
    for name in picks:
        p = repo / name
        p.write_text(p.read_text() + _line(rng) + _line(rng))
    if staged:
        git(repo, env, "add", "--", *picks[:staged])
    for i in range(untracked):
        p = repo / "scratch" / f"dir{i % 10}" / f"note{i:04d}.txt"
        p.parent.mkdir(parents=True, exist_ok=True)
        size = rng.randint(512, 4096)
        p.write_text("".join(_line(rng) for _ in range(size // 40)))
    return {"staged": staged, "unstaged": unstaged, "untracked": untracked}


def make_small_repo(path: Path, env: dict[str, str]) -> None:
    """One commit of three files, then one staged, one unstaged and one untracked change."""
    path.mkdir(parents=True, exist_ok=True)
    git(path, env, "init", "-q", "-b", "main")
    for name in ("a.txt", "b.txt", "c.txt"):
        (path / name).write_text(f"{name}\n" * 20)
    git(path, env, "add", "-A")
    git(path, env, "commit", "-q", "-m", "one")
    (path / "a.txt").write_text("staged\n")
    git(path, env, "add", "a.txt")
    (path / "b.txt").write_text("unstaged\n")
    (path / "new.txt").write_text("untracked\n")


# -- temporary trees ----------------------------------------------------------------------------


@contextmanager
def temp_tree(prefix: str) -> Iterator[Path]:
    """A fresh private directory, removed on the way out whatever happened."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def fresh_dir(parent: Path, name: str) -> Path:
    path = parent / name
    path.mkdir(mode=0o700)
    return path


# -- the CLI and a mesh -------------------------------------------------------------------------


class CliError(RuntimeError):
    pass


class Cli:
    """`cotal` as an operator runs it: a fresh interpreter per command, `--root` explicit."""

    def __init__(self, root: Path, env: dict[str, str]) -> None:
        self.root = root
        self.env = env

    def run(
        self, *args: str, timeout: float = 600.0, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, "-m", "manager.cli", *args, "--root", str(self.root)],
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
            cwd=self.root,
            check=False,
        )
        if check and proc.returncode != 0:
            raise CliError(
                f"cotal {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def json(self, *args: str, timeout: float = 600.0) -> Any:
        return json.loads(self.run(*args, "--json", timeout=timeout).stdout)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


class Mesh:
    """A mesh under `root`, and the guarantee that nothing it started outlives the benchmark.

    On the way out: if `.cotal/mesh.json` is still there (the cut did not finish), a plain
    `cotal down`; if that fails, SIGKILL to the manager and broker pids the record names (only
    while their start time still matches), then to any process carrying a seat's lifecycle uid.
    """

    def __init__(self, cli: Cli) -> None:
        self.cli = cli
        self.uids: list[str] = []

    def up(self) -> Any:
        return self.cli.json("up", "--detach")

    def spawn(self, name: str, *extra: str) -> Any:
        row = self.cli.json("spawn", name, "--agent", "scribe", *extra)
        self.uids.append(row["lifecycleUid"])
        return row

    def survivors(self) -> list[int]:
        from manager.procs import processes_with_env

        return sorted(
            {pid for uid in self.uids for pid in processes_with_env("COTAL_LIFECYCLE_UID", uid)}
        )

    def cleanup(self) -> list[str]:
        """End whatever is still running; returns what it had to do (empty after a clean cut)."""
        from manager.procs import alive
        from protocol.mesh import decode_mesh

        done: list[str] = []
        record_path = self.cli.root / ".cotal" / "mesh.json"
        if record_path.exists():
            try:
                record = decode_mesh(record_path.read_bytes())
            except (OSError, ValueError):
                record = None
            proc = self.cli.run("down", timeout=180.0, check=False)
            done.append(f"cotal down (exit {proc.returncode})")
            if record is not None:
                for ref in (record.manager, record.embedded_broker):
                    if ref is not None and alive(ref):
                        _kill(ref.pid)
                        done.append(f"killed pid {ref.pid}")
        for pid in self.survivors():
            _kill(pid)
            done.append(f"killed seat pid {pid}")
        return done

    def __enter__(self) -> Mesh:
        return self

    def __exit__(self, *exc: object) -> None:
        leftovers = self.cleanup()
        if leftovers:
            say(f"  cleanup under {self.cli.root}: {'; '.join(leftovers)}")


# -- a shared broker, stamped CLI runs, process counts (added for bench/resume.py) ---------------


@contextmanager
def shared_broker(parent: Path, env: dict[str, str]) -> Iterator[dict[str, Any]]:
    """`cotal broker serve --store-dir <parent>/broker --json`: the broker two hosts share.

    Yields its JSON line (`url`, `creds`, `pid`, `monitor`). On the way out, SIGTERM to the
    serve process (which stops its nats-server), then SIGKILL to either if it is still there;
    the nats-server only while the start time recorded at launch still matches.
    """
    from manager.procs import alive, pid_identity

    store = parent / "broker"
    err = open(parent / "broker-serve.err", "wb")  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "manager.cli",
            "broker",
            "serve",
            "--store-dir",
            str(store),
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=err,
        text=True,
        env=env,
        cwd=parent,
    )
    nats = None
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            proc.wait(timeout=15)
            raise RuntimeError(
                f"cotal broker serve exited {proc.returncode}: "
                f"{(parent / 'broker-serve.err').read_text(errors='replace')}"
            )
        info = json.loads(line)
        try:
            nats = pid_identity(int(info["pid"]))
        except ProcessLookupError:
            nats = None
        yield info
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if nats is not None and alive(nats):
            _kill(nats.pid)
            say(f"  cleanup: killed the shared broker's nats-server pid {nats.pid}")
        err.close()


def run_stamped(
    argv: Sequence[str], *, env: dict[str, str], cwd: Path, timeout: float = 900.0
) -> dict[str, Any]:
    """Run a command, stamping each stderr line with the wall clock (time.time()) as it arrives.

    Returns `rc`, `stdout`, `lines` [(epoch seconds, text)], `start` and `end` (epoch seconds)
    and `wallS` (perf_counter). Both pipes are drained by threads, so neither can fill up.
    """
    import threading

    lines: list[tuple[float, str]] = []
    chunks: list[str] = []
    start = time.time()
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd
    )
    assert proc.stdout is not None and proc.stderr is not None
    out_pipe, err_pipe = proc.stdout, proc.stderr

    def read_err() -> None:
        for line in err_pipe:
            lines.append((time.time(), line.rstrip("\n")))

    def read_out() -> None:
        chunks.append(out_pipe.read())

    threads = [
        threading.Thread(target=read_err, daemon=True),
        threading.Thread(target=read_out, daemon=True),
    ]
    for t in threads:
        t.start()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise
    finally:
        for t in threads:
            t.join(timeout=10)
    wall = time.perf_counter() - t0
    return {
        "rc": rc,
        "stdout": "".join(chunks),
        "lines": lines,
        "start": start,
        "end": time.time(),
        "wallS": wall,
    }


def count_processes(fn: Callable[[], T]) -> tuple[int, T]:
    """How many processes `fn` starts through anyio (run_process, open_process), and its result."""
    from unittest import mock

    import anyio

    calls = [0]
    real_run, real_open = anyio.run_process, anyio.open_process

    async def run_process(*a: Any, **k: Any) -> Any:
        calls[0] += 1
        return await real_run(*a, **k)

    async def open_process(*a: Any, **k: Any) -> Any:
        calls[0] += 1
        return await real_open(*a, **k)

    with (
        mock.patch.object(anyio, "run_process", run_process),
        mock.patch.object(anyio, "open_process", open_process),
    ):
        result = fn()
    return calls[0], result


def tree_digest(path: Path, *, skip: Sequence[str] = (".git",)) -> str:
    """sha256 over every path beneath `path` (but the top-level names in `skip`): its relative
    name, its type and mode bits, and its bytes or link target. Equal digests, equal trees."""
    import hashlib

    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(path):
        rel_dir = Path(dirpath).relative_to(path)
        if rel_dir == Path("."):
            dirnames[:] = [d for d in dirnames if d not in skip]
            filenames = [f for f in filenames if f not in skip]
        dirnames.sort()
        for name in sorted(
            filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]
        ):
            full = Path(dirpath) / name
            st = full.lstat()
            digest.update(f"{rel_dir / name}\0{st.st_mode:o}\0".encode())
            digest.update(os.readlink(full).encode() if full.is_symlink() else full.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()
