"""Seat isolation: what keeps a seat's process tree away from the manager's authority.

This is the daemon's side (the probe, the plan, the launcher's command line); the launcher that
runs in the child is `connectors/isolate.py`.

A seat is an agent that reads untrusted text all day, so the manager's secrets (`.cotal/auth`:
control token, broker credential, signing key), its socket, its environment and the other
seats' stores must be out of its reach by the kernel's own means, not by the seat's good
manners. The daemon runs every seat through the launcher, `connectors/isolate.py`, imported
by the daemon's own interpreter in isolated mode (`python -I -S -c STUB PLAN -- argv...`) inside
the child after `setpriv --pdeathsig KILL`, so it imports nothing but the standard library. It
applies, in this order, then `execvpe`s the harness:

1. A private mount namespace (as root `unshare(CLONE_NEWNS)`; otherwise a user namespace that
   maps only our own uid, when the kernel allows one). `.cotal` is overmounted by an empty
   read-only tmpfs into which only the seat's own paths are bind-mounted back: its store, its
   private home or config dir, and, for a harness that writes its own session pointer, its
   connector's sessions directory (with every other seat's entry already there overmounted).
   The token, the credential, the key, the socket, the logs and the other seats' stores are
   not in the seat's file tree at all.
2. Landlock (ABI >= 1): system paths, the interpreters and the harness install read-only, the
   cwd, the seat's own paths and the temp directories read-write, nothing else; mount and
   umount refused (so the overmount cannot be lifted), ptrace and `/proc/<pid>/{environ,root,
   mem}` of any process outside the seat refused (so `/proc/<manager>/root/...` is no way
   around the mount namespace), and from ABI 6 no signal to, and no abstract socket of, a
   process outside the seat.
3. As root, every capability dropped from the bounding set before the exec, so the harness
   runs as uid 0 with no capability at all (no `CAP_SYS_ADMIN` to unmount, no `CAP_SYS_PTRACE`,
   no `CAP_DAC_OVERRIDE`); `no_new_privs` is set in every case.

What is in force on this host is probed once per daemon (`probe`) by running the launcher
with `--probe` in a throwaway child, and reported by `cotal doctor` and `cotal ps --wide`.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from connectors import isolate
from connectors.isolate import SYSTEM_WRITE, Plan, make_undumpable, within

TYPE_CHECKING = False

if TYPE_CHECKING:
    # What only the manager's side uses (the probe's child, the PATH search) is imported where
    # it is used: `cotal manager serve` starts the probe before its own imports.
    import subprocess

__all__ = ["Isolation", "Plan", "begin_probe", "launcher", "make_undumpable", "plan_for", "probe"]

ISOLATION_ENV = "COTAL_SEAT_ISOLATION"
CONTROL_DIR = ".cotal"
POINTER_ENV = "COTAL_SESSION_STATE"
# The launcher is imported, not run as a script, so its bytecode cache is used: as a script it
# would be compiled again before every seat. Its package directory goes last on the path, so
# nothing there can stand in for a standard module.
_LAUNCHER_STUB = (
    "import sys;sys.path.append(sys.argv.pop(1));"
    "from connectors.isolate import main;sys.exit(main(sys.argv[1:]))"
)


# The directory that holds the `connectors` package: the checkout, or site-packages.
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(isolate.__file__)))


def _launcher_argv() -> list[str]:
    return [sys.executable, "-I", "-S", "-c", _LAUNCHER_STUB, _PACKAGE_PARENT]


def launcher(plan: Plan) -> list[str]:
    """The command line that isolates a seat; the harness's argv follows it."""
    return [*_launcher_argv(), plan.encode(), "--"]


# -- the plan (daemon side) -----------------------------------------------------------------------


@dataclass(frozen=True)
class Isolation:
    """What this host gives a seat: `mount` is "root", "userns" or None; `landlock` the ABI."""

    mount: str | None
    landlock: int
    detail: str = ""

    @property
    def mode(self) -> str:
        parts = (["mount-ns"] if self.mount else []) + (["landlock"] if self.landlock else [])
        return "+".join(parts) or "none"

    @property
    def hides_secrets(self) -> bool:
        return self.mount is not None


_probed: Isolation | None = None
_probing: subprocess.Popen[bytes] | None = None
PROBE_TIMEOUT_S = 20


def begin_probe() -> None:
    """Start the probe's child now, so that it runs while the caller does something else (the
    manager imports its modules); `probe` then reads its answer."""
    global _probing
    if _probed is None and _probing is None and not _turned_off():
        _probing = _spawn_probe()


def _spawn_probe() -> subprocess.Popen[bytes] | None:
    import subprocess

    try:
        return subprocess.Popen(
            [*_launcher_argv(), "--probe"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )
    except OSError:
        return None


def _turned_off() -> bool:
    return os.environ.get(ISOLATION_ENV, "").lower() in ("none", "off", "0")


def probe() -> Isolation:
    """Try, in a throwaway child, what the launcher does; cached for the life of the process.
    `COTAL_SEAT_ISOLATION=none` in the manager's environment turns isolation off."""
    import subprocess

    global _probed, _probing
    if _probed is not None:
        return _probed
    if _turned_off():
        _probed = Isolation(None, 0, f"turned off by {ISOLATION_ENV}")
        return _probed
    child, _probing = _probing or _spawn_probe(), None
    try:
        if child is None:
            raise OSError("the probe could not be started")
        try:
            stdout, _ = child.communicate(timeout=PROBE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()
            raise
        found = json.loads(stdout)
        _probed = Isolation(found.get("mount"), int(found.get("landlock", 0)), found["detail"])
    except (OSError, ValueError, KeyError, subprocess.TimeoutExpired) as exc:
        _probed = Isolation(None, 0, f"probe failed: {exc}")
    return _probed


def _named_paths(argv: Sequence[str], env: Mapping[str, str], control: Path) -> list[Path]:
    """Every absolute path under `.cotal` that the launch names: the seat's own files. The
    session pointer every launch carries in `COTAL_SESSION_STATE` is not among them: the
    manager writes it unless the harness is handed it in argv."""
    found: list[Path] = []
    named_env = [v for k, v in env.items() if k != POINTER_ENV]
    for value in [*argv, *named_env]:
        if not value.startswith("/") or "\0" in value:
            continue
        p = Path(os.path.normpath(value))
        if p != control and within(str(p), str(control)):
            found.append(p)
    return found


def _read_dirs(argv: Sequence[str], env: Mapping[str, str], extra: Iterable[Path]) -> list[str]:
    """The interpreters, the harness install and every PATH directory, read-only."""
    dirs: list[Path] = [Path(sys.prefix), Path(sys.base_prefix), Path(sys.exec_prefix), *extra]
    import shutil

    program = shutil.which(argv[0], path=env.get("PATH")) if argv else None
    if program:
        dirs.append(Path(os.path.realpath(program)).parent)
        dirs.append(Path(program).parent)
    for entry in env.get("PATH", "").split(os.pathsep):
        if entry.startswith("/"):
            real = Path(os.path.realpath(entry))
            dirs.append(real)
            # A prefix's bin/ needs its lib/ (node's, python's) beside it.
            if real.name in ("bin", "sbin", "shims"):
                dirs.append(real.parent)
    for entry in env.get("PYTHONPATH", "").split(os.pathsep):
        if entry.startswith("/"):
            dirs.append(Path(entry))
    out: list[str] = []
    for d in dirs:
        resolved = os.path.realpath(d)
        if resolved not in out and resolved != "/":
            out.append(resolved)
    return out


def plan_for(
    argv: Sequence[str],
    env: Mapping[str, str],
    cwd: Path,
    *,
    pointer: Path | None,
    read_only: Iterable[Path] = (),
    mount: str | None,
    landlock: int,
) -> Plan:
    """Which `.cotal` paths are the seat's own and which paths Landlock grants it."""
    root = Path(os.path.normpath(env.get("COTAL_WORKSPACE_ROOT") or cwd))
    control = root / CONTROL_DIR
    keep = [p for p in _named_paths(argv, env, control) if p != pointer]
    pointer_dir: str | None = None
    own_prefix: str | None = None
    if pointer is not None and str(pointer) in argv and within(str(pointer), str(control)):
        # The harness publishes its own pointer by rename, so it needs the directory; its own
        # store is the pointer's sibling and shares its stem.
        pointer_dir = str(pointer.parent)
        own_prefix = pointer.stem
    tmp = [env["TMPDIR"]] if env.get("TMPDIR", "").startswith("/") else []
    return Plan(
        control=str(control),
        keep=sorted({str(p) for p in keep}),
        read=_read_dirs(argv, env, read_only),
        write=[os.path.normpath(cwd), *SYSTEM_WRITE, *tmp],
        pointer_dir=pointer_dir,
        own_prefix=own_prefix,
        mount=mount,
        landlock=landlock,
    )
