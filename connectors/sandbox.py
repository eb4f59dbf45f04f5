"""Seat isolation: what keeps a seat's process tree away from the manager's authority.

This is the daemon's side (the probe, the plan, the launcher's command line); the launcher that
runs in the child is `connectors/isolate.py`.

A seat is an agent that reads untrusted text all day, so the manager's secrets (`.cotal/auth`:
control token, broker credential, signing key), its socket, its environment and the other
seats' stores must be out of its reach by the kernel's own means, not by the seat's good
manners. The daemon runs every seat through the launcher, `connectors/isolate.py`, imported
by the daemon's own interpreter in isolated mode (`python -I -S -c STUB PLAN -- argv...`) inside
the child after `setpriv --pdeathsig KILL --no-new-privs`, so it imports nothing but the
standard library. It applies, in this order, then `execvpe`s the harness:

1. A private mount namespace (as root `unshare(CLONE_NEWNS)`; otherwise a user namespace that
   maps only our own uid, when the kernel allows one), in which:
   - `/tmp`, `/var/tmp` and `/dev/shm` are each a fresh tmpfs of the seat's own, capped at
     `COTAL_SEAT_TMP_MIB` MiB (default `TMP_MIB_DEFAULT`), and the seat's own paths beneath
     them (its cwd tree, its `.cotal` paths, what it reads) are bound back at the same path;
     its `TMPDIR` and `HOME`, when they lie there, are made fresh and empty. Another seat's
     cwd, another root kept under /tmp, an agent socket there: not in the seat's tree.
   - every other cotal root the host's registry names (`manager/workspace/roots.py`; the
     daemon passes its path, the launcher reads it, since a plan in argv cannot grow with the
     host) is overmounted by an empty read-only tmpfs: the whole root when no path of the seat
     lies inside it, else its `.cotal` only; and so is the registry.
   - `.cotal` is overmounted by an empty read-only tmpfs into which only the seat's own paths
     are bind-mounted back: its store, its private home or config dir, and, for a harness that
     writes its own session pointer, its connector's sessions directory (with every other
     seat's entry already there overmounted). The token, the credential, the key, the socket,
     the logs and the other seats' stores are not in the seat's file tree at all.
2. Landlock (ABI >= 1): system paths, the interpreters and the harness install read-only, the
   cwd, the seat's own paths and the temp directories read-write, nothing else; mount and
   umount refused (so the overmount cannot be lifted), ptrace and `/proc/<pid>/{environ,root,
   mem}` of any process outside the seat refused (so `/proc/<manager>/root/...` is no way
   around the mount namespace), and from ABI 6 no signal to, and no abstract socket of, a
   process outside the seat.
3. As root, every capability dropped from the bounding set before the exec, so the harness
   runs as uid 0 with no capability at all (no `CAP_SYS_ADMIN` to unmount, no `CAP_SYS_PTRACE`,
   no `CAP_DAC_OVERRIDE`); `no_new_privs` is set in every case.

Other roots are hidden by the mount namespace, not by narrowing Landlock's read set: Landlock
does not govern `connect(2)` on a path socket, so only a path that is not there keeps a seat
from another root's `manager.sock`.

The seat mark: every seat runs under `no_new_privs` (`setpriv --no-new-privs` before the
launcher, whatever the isolation), which the kernel keeps across fork and exec and no process
can clear. `carries_seat_mark` reads it (`NoNewPrivs: 1` in `/proc/<pid>/status`), and every
cotal manager's control socket refuses a peer that carries it, a seat of any root on the host.

What is in force on this host is probed once per daemon (`probe`) by running the launcher
with `--probe` in a throwaway child, and reported by `cotal doctor` and `cotal ps --wide`.

A launch the launcher cannot set up exits 126 (127 when the exec fails) after one JSON line to
a pipe the daemon passes it (`Plan.status_fd`, closed by the exec): the step (`STEPS`), the
errno's name, the path. The daemon turns it into `seat-start-failed` and tries a transient
errno again within the seat's restart budget (`manager/daemon/incarnation.py`).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from connectors import isolate
from connectors.isolate import FAULT_ENV, STEPS, SYSTEM_WRITE, Plan, make_undumpable, within

TYPE_CHECKING = False

if TYPE_CHECKING:
    # What only the manager's side uses (the probe's child, the PATH search) is imported where
    # it is used: `cotal manager serve` starts the probe before its own imports.
    import subprocess

__all__ = [
    "FAULT_ENV",
    "STEPS",
    "Isolation",
    "Plan",
    "begin_probe",
    "carries_seat_mark",
    "launch_fault_hook",
    "launcher",
    "make_undumpable",
    "missing_from",
    "plan_for",
    "probe",
    "tmp_mib",
]

ISOLATION_ENV = "COTAL_SEAT_ISOLATION"
TMP_MIB_ENV = "COTAL_SEAT_TMP_MIB"
# Each private temp directory's cap: room for a harness's scratch files and a build's, not for
# filling the host's memory (tmpfs lives in RAM and swap).
TMP_MIB_DEFAULT = 512
TMP_MIB_MAX = 1 << 20
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

    @property
    def missing(self) -> list[str]:
        return missing_from(self.mode)


# What a seat can reach when a confinement is not in force, by what is missing.
_MISSING = {
    "mount-ns": "no mount namespace: the seat reads its own root's .cotal/auth (control token, "
    "broker credential, signing key) wherever Landlock grants its cwd, every other cotal root its "
    "uid can read, and other roots' manager.sock (only their seat mark check refuses it); /tmp, "
    "/var/tmp and /dev/shm are shared with every process of the host and not capped",
    "landlock": "no Landlock: outside the hidden paths the seat reads and writes whatever its uid "
    "may, and reaches /proc/<pid>/root of other processes of its uid",
}


def missing_from(mode: str | None) -> list[str]:
    """What an isolation mode (`Isolation.mode`, a seat's `isolation`) lacks, each said with
    what it means; empty for `mount-ns+landlock`."""
    if not mode:
        return []
    parts = mode.split("+")
    return [f"missing {part}: {text}" for part, text in _MISSING.items() if part not in parts]


def tmp_mib() -> int:
    """Each private temp directory's cap in MiB: `COTAL_SEAT_TMP_MIB` in the manager's
    environment, else `TMP_MIB_DEFAULT`; a value that is not a whole number from 1 to
    `TMP_MIB_MAX` is taken as the default."""
    text = os.environ.get(TMP_MIB_ENV, "")
    if text.isascii() and text.isdigit() and 0 < int(text) <= TMP_MIB_MAX:
        return int(text)
    return TMP_MIB_DEFAULT


def launch_fault_hook() -> str | None:
    """The test fault hook, `COTAL_TEST_LAUNCH_FAULT` (`isolate.arm_fault`), from this manager's
    own environment and nowhere else: the manager puts it in the plan it writes itself, and the
    launcher never reads its own environment for it, so neither a seat's launch nor a
    checkpoint's recorded launch can carry it to a seat."""
    return os.environ.get(FAULT_ENV) or None


SEAT_MARK = "NoNewPrivs"


def carries_seat_mark(pid: int | str) -> bool:
    """Whether process `pid` ("self" for this one) runs under `no_new_privs`, the mark every
    seat carries; OSError when its status cannot be read."""
    with open(f"/proc/{pid}/status", "rb") as f:
        status = f.read()
    for line in status.splitlines():
        if line.startswith(SEAT_MARK.encode() + b":"):
            return line.split(b":", 1)[1].strip() == b"1"
    # A kernel older than 4.10 does not show the field: no process there carries the mark.
    return False


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
    registry: Path | None = None,
    temp_mib: int | None = None,
) -> Plan:
    """Which `.cotal` paths are the seat's own, which paths Landlock grants it, which temp
    directories are its own, and where the registry of the roots hidden from it is."""
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
    tmp = [os.path.normpath(env["TMPDIR"])] if env.get("TMPDIR", "").startswith("/") else []
    home = [os.path.normpath(env["HOME"])] if env.get("HOME", "").startswith("/") else []
    plan = Plan(
        control=str(control),
        keep=sorted({str(p) for p in keep}),
        read=_read_dirs(argv, env, read_only),
        write=[os.path.normpath(cwd), *SYSTEM_WRITE, *tmp],
        pointer_dir=pointer_dir,
        own_prefix=own_prefix,
        mount=mount,
        landlock=landlock,
    )
    if mount is not None:
        plan.private_tmp = list(SYSTEM_WRITE)
        plan.tmp_mib = temp_mib if temp_mib is not None else tmp_mib()
        plan.fresh = [*tmp, *home]
        plan.registry = os.path.normpath(registry) if registry is not None else None
    return plan
