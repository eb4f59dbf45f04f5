"""The seat launcher: the child side of seat isolation (`connectors/sandbox.py` is the daemon's).

Between `setpriv --pdeathsig KILL --no-new-privs` and the harness, every seat's process runs
`main` here in the daemon's own interpreter in isolated mode, `python -I -S`, before any harness
code: it enters a private mount namespace, gives the seat its own temp directories, hides every
other cotal root and `.cotal` but for the seat's own paths, applies Landlock, drops every
capability and sets `no_new_privs`, then `execvpe`s the harness. `sandbox.py` says what
each step keeps out of a seat's reach and why.

This runs before every seat starts, so it is kept to the standard library's cheapest modules
(`ctypes`, `json`, `os`): an import here is paid once per seat. The daemon runs it as an
imported module, not as a script, so its bytecode is cached; it also still runs as a script
(`python -I -S isolate.py PLAN -- argv...`, or `--probe`) with any Python 3.11.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import stat
import sys

TYPE_CHECKING = False

if TYPE_CHECKING:
    from collections.abc import Callable

# -- the kernel's numbers (x86_64 and the generic syscall table agree on these) ------------------

_SYS_UNSHARE = {"x86_64": 272, "aarch64": 97}
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1

CLONE_NEWNS = 0x00020000
CLONE_NEWUSER = 0x10000000
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
PR_SET_NO_NEW_PRIVS = 38
PR_CAPBSET_DROP = 24
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
O_PATH = 0o10000000

FS_EXECUTE = 1 << 0
FS_WRITE_FILE = 1 << 1
FS_READ_FILE = 1 << 2
FS_READ_DIR = 1 << 3
FS_REMOVE_DIR = 1 << 4
FS_REMOVE_FILE = 1 << 5
FS_MAKE_CHAR = 1 << 6
FS_MAKE_DIR = 1 << 7
FS_MAKE_REG = 1 << 8
FS_MAKE_SOCK = 1 << 9
FS_MAKE_FIFO = 1 << 10
FS_MAKE_BLOCK = 1 << 11
FS_MAKE_SYM = 1 << 12
FS_REFER = 1 << 13
FS_TRUNCATE = 1 << 14
FS_IOCTL_DEV = 1 << 15
SCOPE_ABSTRACT_UNIX_SOCKET = 1 << 0
SCOPE_SIGNAL = 1 << 1

_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV
_READ = FS_EXECUTE | FS_READ_FILE | FS_READ_DIR
# Device nodes are never created, so MAKE_CHAR and MAKE_BLOCK are in no rule.
_WRITE = (
    _READ
    | FS_WRITE_FILE
    | FS_REMOVE_DIR
    | FS_REMOVE_FILE
    | FS_MAKE_DIR
    | FS_MAKE_REG
    | FS_MAKE_SOCK
    | FS_MAKE_FIFO
    | FS_MAKE_SYM
    | FS_REFER
    | FS_TRUNCATE
)
# The pointer's directory of a harness that publishes its own pointer (temp file, rename,
# fsync of the directory): it may create, replace and list there, never read another's file.
_POINTER_DIR = FS_READ_DIR | FS_WRITE_FILE | FS_MAKE_REG | FS_REMOVE_FILE | FS_TRUNCATE

SYSTEM_READ = (
    "/usr",
    "/bin",
    "/sbin",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/etc",
    "/opt",
    "/proc",
    "/sys",
    "/run",
    "/nix",
    "/snap",
)
# Scratch space every harness expects to write. With a mount namespace each is a fresh tmpfs of
# the seat's own (`private_temp`), so what another seat or root keeps there is not in its tree.
SYSTEM_WRITE = ("/tmp", "/var/tmp", "/dev/shm")  # noqa: S108
# A private temp directory's inodes, per MiB of its cap: an empty file costs no bytes, so the
# byte cap alone would not bound what a seat's files cost the kernel.
TEMP_INODES_PER_MIB = 128
TEMP_MIN_INODES = 1024
DEVICES = ("/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty")


def _landlock_handled(abi: int) -> int:
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


# -- the plan ---------------------------------------------------------------------------------


class Plan:
    """The launcher's instructions for one seat. Paths only, never a secret: it travels in
    argv. A plain class, not a dataclass: `dataclasses` imports `inspect`, which would double
    the launcher's start."""

    __slots__ = (
        "control",
        "keep",
        "read",
        "write",
        "pointer_dir",
        "own_prefix",
        "mount",
        "landlock",
        "private_tmp",
        "tmp_mib",
        "fresh",
        "registry",
        "status_fd",
        "fault",
    )

    def __init__(
        self,
        *,
        control: str,
        keep: list[str],
        read: list[str],
        write: list[str],
        pointer_dir: str | None = None,
        own_prefix: str | None = None,
        mount: str | None = None,
        landlock: int = 0,
        private_tmp: list[str] | None = None,
        tmp_mib: int = 0,
        fresh: list[str] | None = None,
        registry: str | None = None,
        status_fd: int | None = None,
        fault: str | None = None,
    ) -> None:
        self.control = control
        self.keep = keep
        self.read = read
        self.write = write
        self.pointer_dir = pointer_dir
        self.own_prefix = own_prefix
        self.mount = mount
        self.landlock = landlock
        # Temp directories replaced by a tmpfs of `tmp_mib` MiB each, the seat's paths beneath
        # them bound back; `fresh` paths (its TMPDIR, its HOME) made empty there.
        self.private_tmp = private_tmp or []
        self.tmp_mib = tmp_mib
        self.fresh = fresh or []
        # The host's registry of cotal roots (manager/workspace/roots.py): every root it names
        # but the seat's own, and the registry itself, become an empty read-only tmpfs. Read
        # here rather than listed in the plan: a plan travels in argv, which is bounded.
        self.registry = registry
        # The write end of the manager's pipe for a set-up failure's one-line report
        # (`report_failure`); closed by the exec, so the harness can never write there.
        self.status_fd = status_fd
        # COTAL_TEST_LAUNCH_FAULT from the manager's own environment (`arm_fault`): set only by
        # the manager, never read from the seat's environment, so a seat cannot fake a failure.
        self.fault = fault

    def fields(self) -> dict[str, object]:
        return {name: getattr(self, name) for name in self.__slots__}

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Plan) and self.fields() == other.fields()

    def __repr__(self) -> str:
        return f"Plan({self.fields()!r})"

    def encode(self) -> str:
        return json.dumps(self.fields(), sort_keys=True)

    @classmethod
    def decode(cls, text: str) -> Plan:
        """Strict: an unknown or missing field, or a field of the wrong type, is a TypeError,
        which the launcher refuses."""
        fields = json.loads(text)
        if not isinstance(fields, dict):
            raise TypeError("a plan is a JSON object")
        for name, value in fields.items():
            kind = _FIELD_KINDS.get(name)
            if kind is not None and not kind[1](value):
                raise TypeError(f"plan field {name!r} is not {kind[0]}")
        return cls(**fields)


def _name(value: object) -> bool:
    return isinstance(value, str)


def _paths(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(item, str) for item in value)


def _optional_name(value: object) -> bool:
    return value is None or isinstance(value, str)


def _number(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _optional_number(value: object) -> bool:
    return value is None or _number(value)


# What each field of a plan must be, said as a refusal says it, and the check.
_FIELD_KINDS: dict[str, tuple[str, Callable[[object], bool]]] = {
    "control": ("a string", _name),
    "keep": ("a list of strings", _paths),
    "read": ("a list of strings", _paths),
    "write": ("a list of strings", _paths),
    "pointer_dir": ("a string or null", _optional_name),
    "own_prefix": ("a string or null", _optional_name),
    "mount": ("a string or null", _optional_name),
    "landlock": ("a whole number", _number),
    "private_tmp": ("a list of strings", _paths),
    "tmp_mib": ("a whole number", _number),
    "fresh": ("a list of strings", _paths),
    "registry": ("a string or null", _optional_name),
    "status_fd": ("a whole number or null", _optional_number),
    "fault": ("a string or null", _optional_name),
}


def within(path: str, parent: str) -> bool:
    """Lexically: `path` is `parent` or below it (both normalized, absolute)."""
    return path == parent or path.startswith(parent.rstrip("/") + "/")


# -- the launcher (child side) --------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_libc.mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
_libc.prctl.argtypes = [
    ctypes.c_int,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
    ctypes.c_ulong,
]


class SandboxError(OSError):
    """A set-up call the kernel refused; `path` is what it was about, if anything. Kept apart
    from OSError's filename so the message the seat's log shows stays as it was."""

    def __init__(self, err: int, text: str, path: str | None = None) -> None:
        super().__init__(err, text)
        self.path = path


# The steps of a launch, in order, as a set-up failure names them to the manager: entering the
# mount namespace, the private temp mounts, hiding the other roots and `.cotal`, Landlock,
# dropping capabilities and `no_new_privs`, and the exec of the harness.
STEPS = ("namespace", "mount", "hide", "landlock", "capabilities", "exec")
# The step running now, named in a failure's report.
_step = "namespace"
# The test fault armed for this launch (`arm_fault`): its step and errno.
_armed: tuple[str, int] | None = None


def _fire(what: str, path: str | None) -> None:
    global _armed
    assert _armed is not None
    err, _armed = _armed[1], None
    raise SandboxError(err, f"{what}: {os.strerror(err)} (COTAL_TEST_LAUNCH_FAULT)", path)


def _check(ret: int, what: str, path: str | None = None) -> int:
    if ret < 0:
        err = ctypes.get_errno()
        raise SandboxError(err, f"{what}: {os.strerror(err)}", path)
    if _armed is not None and _armed[0] == _step:
        # The test fault fails the step's first kernel call, so its report names the path a
        # real failure there would name.
        _fire(what, path)
    return ret


def _b(path: str | None) -> bytes | None:
    return None if path is None else os.fsencode(path)


def _mount(
    src: str | None, target: str | None, fstype: str | None, flags: int, data: str = ""
) -> None:
    _check(
        _libc.mount(_b(src), _b(target), _b(fstype), flags, data.encode() if data else None),
        f"mount {target}",
        target,
    )


def _unshare(flags: int) -> None:
    nr = _SYS_UNSHARE.get(os.uname().machine)
    if nr is None:
        raise SandboxError(errno.ENOSYS, f"unshare: unknown machine {os.uname().machine}")
    _check(_libc.syscall(nr, ctypes.c_int(flags)), "unshare")


def landlock_abi() -> int:
    ret = _libc.syscall(
        _SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), _LANDLOCK_CREATE_RULESET_VERSION
    )
    return max(int(ret), 0)


def enter_mount_namespace() -> str:
    """A private mount namespace: as root directly, otherwise inside a user namespace that maps
    only our own ids. Returns which of the two."""
    if os.geteuid() == 0:
        _unshare(CLONE_NEWNS)
        kind = "root"
    else:
        uid, gid = os.geteuid(), os.getegid()
        _unshare(CLONE_NEWUSER | CLONE_NEWNS)
        for name, text in (
            ("setgroups", "deny"),
            ("uid_map", f"{uid} {uid} 1"),
            ("gid_map", f"{gid} {gid} 1"),
        ):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
        kind = "userns"
    # Nothing mounted here may leak back into the manager's namespace.
    _mount(None, "/", None, MS_REC | MS_PRIVATE)
    return kind


def _placeholder(target: str, is_dir: bool) -> None:
    os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
    if is_dir:
        os.makedirs(target, mode=0o700, exist_ok=True)
    elif not os.path.exists(target):
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o600))


def _outermost(paths: list[str]) -> list[str]:
    """A path inside another of `paths` comes along with it."""
    unique = sorted(set(paths))
    return [p for p in unique if not any(p != o and within(p, o) for o in unique)]


def make_own_dirs(plan: Plan) -> None:
    """The seat's own directories under `.cotal`, named by its launch and not made yet, are made
    on the real disk before anything is overmounted, so they outlive the seat."""
    if not os.path.isdir(plan.control):
        return
    for path in plan.keep:
        if not os.path.lexists(path):
            os.makedirs(path, mode=0o700, exist_ok=True)


def _open_beneath(path: str) -> tuple[int, bool] | None:
    """An O_PATH descriptor of `path` and whether it is a directory; None when it is not there
    or is a symlink (which could name anything: it is never bound anywhere)."""
    try:
        fd = os.open(path, O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return None
    mode = os.fstat(fd).st_mode
    if stat.S_ISLNK(mode):
        os.close(fd)
        return None
    return fd, stat.S_ISDIR(mode)


def private_temp(plan: Plan, cwd: str) -> None:
    """Each temp directory of the plan becomes a fresh, size-capped tmpfs of this seat's own.
    The seat's paths beneath it (its cwd tree, what else it may write, its own `.cotal` paths,
    what it reads) are held
    open first and bound back at the same path, so a root kept under /tmp still works for its
    own seat while every other seat's and root's files there are not in its tree at all."""
    granted = [w for w in plan.write if w not in plan.private_tmp and w not in plan.fresh]
    own = [cwd, *granted, *plan.keep, *plan.read]
    if plan.pointer_dir:
        own.append(plan.pointer_dir)
    if plan.private_tmp and plan.tmp_mib <= 0:
        # A tmpfs of size 0 is unbounded: never what a plan means.
        raise SandboxError(errno.EINVAL, "a private temp directory needs a size cap over 0 MiB")
    inodes = max(TEMP_MIN_INODES, plan.tmp_mib * TEMP_INODES_PER_MIB)
    options = f"mode=1777,size={plan.tmp_mib}m,nr_inodes={inodes}"
    for temp in plan.private_tmp:
        try:
            st = os.lstat(temp)
        except OSError:
            continue
        # A link (/var/tmp -> /tmp) is covered where it points; a seat working in the temp
        # directory itself (or above it) keeps it as it is.
        if not stat.S_ISDIR(st.st_mode) or within(temp, cwd):
            continue
        beneath = _outermost([p for p in own if p != temp and within(p, temp)])
        held = [(p, found) for p in beneath if (found := _open_beneath(p)) is not None]
        try:
            _mount("tmpfs", temp, "tmpfs", MS_NOSUID | MS_NODEV, options)
            for path, (fd, is_dir) in held:
                _placeholder(path, is_dir)
                _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        finally:
            for _, (fd, _is_dir) in held:
                os.close(fd)
        for path in plan.fresh:
            if within(path, temp) and not any(within(path, p) for p, _ in held):
                os.makedirs(path, mode=0o700, exist_ok=True)


# An entry of the registry is a few dozen bytes: `{"version": 1, "root": "/abs/path"}`.
REGISTRY_ENTRY_CAP = 8 * 1024


def registered_roots(registry: str) -> list[str]:
    """The roots the host's registry names. An entry that is not a small regular file holding
    such a record is skipped: the daemon prunes and logs them, the launcher only reads."""
    try:
        names = sorted(os.listdir(registry))
    except FileNotFoundError:
        return []
    found: list[str] = []
    for name in names:
        if name.startswith(".") or not name.endswith(".json"):
            continue
        try:
            fd = os.open(
                os.path.join(registry, name),
                os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK,
            )
        except OSError:
            continue
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                continue
            data = os.read(fd, REGISTRY_ENTRY_CAP + 1)
        finally:
            os.close(fd)
        try:
            entry = json.loads(data) if len(data) <= REGISTRY_ENTRY_CAP else None
        except ValueError:
            continue
        root = entry.get("root") if isinstance(entry, dict) and entry.get("version") == 1 else None
        if isinstance(root, str) and root.startswith("/") and "\0" not in root:
            found.append(os.path.normpath(root))
    return found


def to_hide(plan: Plan, cwd: str) -> list[str]:
    """What of the other roots the seat's tree holds no more: a whole root when none of the
    seat's own paths lies inside it, else (an ancestor of its cwd, of its interpreter) its
    `.cotal` only; and the registry itself, which names them all."""
    if plan.registry is None:
        return []
    own_root = os.path.dirname(plan.control)
    own = [own_root, plan.control, cwd, *plan.keep, *plan.read, *plan.write]
    if plan.pointer_dir:
        own.append(plan.pointer_dir)
    hidden = [plan.registry]
    for other in registered_roots(plan.registry):
        if other == own_root:
            continue
        holds_own = any(within(p, other) for p in own)
        hidden.append(os.path.join(other, ".cotal") if holds_own else other)
    return sorted(set(hidden))


def hide_paths(paths: list[str]) -> None:
    """Every one of `paths` still in the seat's tree becomes an empty read-only directory. The
    target is held by a no-follow descriptor and mounted on through it, so a link put in its
    place is never followed to somewhere else."""
    for path in paths:
        try:
            fd = os.open(path, O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_DIRECTORY)
        except OSError:
            continue
        try:
            _mount(
                "tmpfs",
                f"/proc/self/fd/{fd}",
                "tmpfs",
                MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
                "mode=0555,size=4k",
            )
        finally:
            os.close(fd)


def hide_control_dir(plan: Plan) -> None:
    control = plan.control
    if not os.path.isdir(control):
        return
    keep = list(plan.keep)
    pointer_dir = plan.pointer_dir
    if pointer_dir is not None:
        keep.append(pointer_dir)
    keep = _outermost(keep)
    fds: list[tuple[str, int, bool]] = []
    for path in keep:
        if not os.path.lexists(path):
            os.makedirs(path, mode=0o700, exist_ok=True)
        if os.path.islink(path):
            # A link could name anything, `.cotal/auth` included: it is not brought back, so a
            # harness whose own path is a link fails to start rather than see its target.
            continue
        fd = os.open(path, O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW)
        fds.append((path, fd, os.path.isdir(path)))
    _mount("tmpfs", control, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, "mode=0700,size=64k")
    for path, fd, is_dir in fds:
        _placeholder(path, is_dir)
        _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
        os.close(fd)
    if pointer_dir is not None:
        own = plan.own_prefix or ""
        for entry in os.listdir(pointer_dir):
            full = os.path.join(pointer_dir, entry)
            mine = entry.startswith(own + ".") or entry.startswith(f".{own}.")
            if mine or os.path.islink(full):
                continue
            try:
                if os.path.isdir(full):
                    _mount("tmpfs", full, "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=0")
                elif os.path.isfile(full):
                    _mount("/dev/null", full, None, MS_BIND)
            except SandboxError as exc:
                if exc.errno != errno.ENOENT:
                    raise
                # Another seat starting beside this one replaced its pointer (temp file, rename)
                # between the listing and the mount: that entry is gone, and what replaces it
                # is still unreadable here, since Landlock grants this directory no file reads.
                continue
    _mount(
        None,
        control,
        None,
        MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC,
    )


class _RulesetAttr(ctypes.Structure):
    _fields_ = [
        ("handled_access_fs", ctypes.c_uint64),
        ("handled_access_net", ctypes.c_uint64),
        ("scoped", ctypes.c_uint64),
    ]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def restrict(plan: Plan, abi: int) -> None:
    handled = _landlock_handled(abi)
    attr = _RulesetAttr(handled, 0, SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL if abi >= 6 else 0)
    size = 24 if abi >= 6 else 16 if abi >= 4 else 8
    ruleset = _check(
        _libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0),
        "landlock_create_ruleset",
    )
    try:
        rules: list[tuple[str, int]] = [(p, _READ) for p in SYSTEM_READ]
        rules += [(p, _READ) for p in plan.read]
        rules += [(p, _WRITE) for p in [*plan.write, *plan.keep]]
        rules += [(p, FS_READ_FILE | FS_WRITE_FILE | FS_TRUNCATE | FS_IOCTL_DEV) for p in DEVICES]
        pointer_dir = plan.pointer_dir
        if pointer_dir is not None:
            rules.append((pointer_dir, _POINTER_DIR))
            own = plan.own_prefix or ""
            for entry in os.listdir(pointer_dir):
                if entry.startswith(own + "."):
                    rules.append((os.path.join(pointer_dir, entry), _WRITE))
        for path, rights in rules:
            try:
                fd = os.open(path, O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                if not os.path.isdir(f"/proc/self/fd/{fd}"):
                    rights &= _FILE_RIGHTS
                rule = _PathBeneath(rights & handled, fd)
                _check(
                    _libc.syscall(
                        _SYS_LANDLOCK_ADD_RULE,
                        ruleset,
                        _LANDLOCK_RULE_PATH_BENEATH,
                        ctypes.byref(rule),
                        0,
                    ),
                    f"landlock_add_rule {path}",
                    path,
                )
            finally:
                os.close(fd)
        _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        _check(_libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0), "landlock_restrict_self")
    finally:
        os.close(ruleset)


PR_SET_DUMPABLE = 4


def make_undumpable() -> None:
    """The daemon's own `/proc/<pid>/{environ,mem,root}` then need CAP_SYS_PTRACE, even from a
    process of the same uid (and core dumps, which would hold its secrets, are off)."""
    _check(_libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), "prctl(PR_SET_DUMPABLE)")


def drop_capabilities() -> None:
    """Empty the bounding set so the exec hands uid 0 no capability; clear the ambient set."""
    try:
        with open("/proc/sys/kernel/cap_last_cap") as f:
            last = int(f.read())
    except (OSError, ValueError):
        last = 63
    for cap in range(last + 1):
        _libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
    _libc.prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")


def _probe_mounts() -> None:
    """What a seat's launch mounts, each once: a capped tmpfs over /tmp, a path bound back into
    it from a held descriptor, an empty read-only tmpfs mounted through a descriptor. The
    namespace dies with this child, so covering its /tmp harms nothing."""
    if not os.path.isdir("/tmp") or os.path.islink("/tmp"):  # noqa: S108
        _mount("tmpfs", "/", "tmpfs", MS_NOSUID | MS_NODEV, "size=4k")
        return
    fd = os.open("/proc", O_PATH | os.O_CLOEXEC | os.O_DIRECTORY)
    try:
        _mount("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777,size=64k,nr_inodes=16")  # noqa: S108
        os.mkdir("/tmp/kept")  # noqa: S108
        _mount(f"/proc/self/fd/{fd}", "/tmp/kept", None, MS_BIND | MS_REC)  # noqa: S108
    finally:
        os.close(fd)
    fd = os.open("/tmp/kept", O_PATH | os.O_CLOEXEC | os.O_NOFOLLOW | os.O_DIRECTORY)  # noqa: S108
    try:
        _mount("tmpfs", f"/proc/self/fd/{fd}", "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "size=4k")
    finally:
        os.close(fd)


def _probe() -> dict[str, object]:
    """Run in a throwaway child: enter a namespace, overmount a scratch directory, build (and
    apply) a ruleset, so what is reported is what worked here, not what the kernel advertises."""
    found: dict[str, object] = {"mount": None, "landlock": 0}
    notes: list[str] = []
    try:
        kind = enter_mount_namespace()
        _probe_mounts()
        found["mount"] = kind
    except OSError as exc:
        notes.append(f"no mount namespace ({exc.strerror or exc})")
    abi = landlock_abi()
    if abi:
        try:
            restrict(Plan(control="", keep=[], read=[], write=[]), abi)
            found["landlock"] = abi
        except OSError as exc:
            notes.append(f"landlock unusable ({exc.strerror or exc})")
    else:
        notes.append("no landlock in this kernel")
    found["detail"] = "; ".join(notes) or f"landlock ABI {abi}"
    return found


FAULT_ENV = "COTAL_TEST_LAUNCH_FAULT"
# One report line, under PIPE_BUF so the kernel writes it whole.
REPORT_CAP = 4096
_FIELD_CAP = 1024


def arm_fault(spec: str | None) -> None:
    """The test fault hook: `STEP:ERRNO:COUNT:COUNTER` fails STEP with ERRNO for the first COUNT
    launches, counted in the file COUNTER (created, locked while counted), so the count
    survives from one launch to the next. ValueError or OSError for a spec that cannot be
    honoured: the launch is refused as a bad plan rather than run without the fault asked for."""
    global _armed
    if spec is None:
        return
    parts = spec.split(":", 3)
    if len(parts) != 4:
        raise ValueError(f"{FAULT_ENV} {spec!r} is not STEP:ERRNO:COUNT:/counter/file")
    step, name, count, counter = parts
    code = getattr(errno, name, None) if name.startswith("E") and name.isupper() else None
    if step not in STEPS or not isinstance(code, int):
        raise ValueError(f"{FAULT_ENV} {spec!r}: no step {step!r} or no errno {name!r}")
    if not (count.isascii() and count.isdigit()) or not counter.startswith("/"):
        raise ValueError(f"{FAULT_ENV} {spec!r}: COUNT is a whole number, COUNTER a full path")
    import fcntl

    fd = os.open(counter, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        # Seats of one resume start side by side: the count is read and advanced under a lock.
        fcntl.flock(fd, fcntl.LOCK_EX)
        text = os.read(fd, 32).strip()
        done = int(text) if text.isdigit() else 0
        if done >= int(count):
            return
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, str(done + 1).encode())
    finally:
        os.close(fd)
    _armed = (step, code)


def _status_channel(plan: Plan) -> int | None:
    """The report pipe's write end, made close-on-exec: a harness that did start has no way to
    it, so nothing after the exec can pass for the launcher's report."""
    fd = plan.status_fd
    if fd is None:
        return None
    try:
        os.set_inheritable(fd, False)
    except OSError:
        return None
    return fd


def report_failure(fd: int | None, step: str, exc: OSError) -> None:
    """One JSON line for the manager (manager/daemon/incarnation.py decodes it): the step, the
    errno's name and the path the failed call was about."""
    if fd is None:
        return
    path = getattr(exc, "path", None) or exc.filename
    code = exc.errno
    record = {
        "step": step,
        "errno": errno.errorcode.get(code) if isinstance(code, int) else None,
        "path": path[:_FIELD_CAP] if isinstance(path, str) else None,
        "detail": str(exc)[:_FIELD_CAP],
    }
    try:
        os.write(fd, (json.dumps(record) + "\n").encode()[:REPORT_CAP])
    except OSError:
        # The manager is gone or closed its end: the seat's log still has the line.
        pass


def main(args: list[str]) -> int:
    global _step
    if args == ["--probe"]:
        print(json.dumps(_probe()))
        return 0
    if len(args) < 3 or args[1] != "--":
        print("usage: isolate.py PLAN -- argv... | --probe", file=sys.stderr)
        return 2
    try:
        plan = Plan.decode(args[0])
    except (ValueError, TypeError) as exc:
        print(f"cotal sandbox: refusing to start the seat: a bad plan ({exc})", file=sys.stderr)
        return 2
    argv = args[2:]
    status = _status_channel(plan)
    try:
        # Before any mount: the counter may lie under a temp directory the seat's tmpfs covers.
        arm_fault(plan.fault)
    except (ValueError, OSError) as exc:
        print(f"cotal sandbox: refusing to start the seat: a bad plan ({exc})", file=sys.stderr)
        return 2
    try:
        cwd = os.getcwd()
        if plan.mount:
            _step = "namespace"
            enter_mount_namespace()
            _step = "mount"
            make_own_dirs(plan)
            _step = "hide"
            hidden = to_hide(plan, cwd)
            _step = "mount"
            private_temp(plan, cwd)
            _step = "hide"
            hide_paths(hidden)
            hide_control_dir(plan)
            # Entered again through the new mounts: the old working directory is the one
            # beneath them, whose `..` would lead back to what they cover.
            os.chdir(cwd)
        if plan.landlock:
            _step = "landlock"
            restrict(plan, plan.landlock)
        _step = "capabilities"
        if os.geteuid() == 0:
            drop_capabilities()
        else:
            _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
        if _armed is not None and _armed[0] != "exec":
            # A fault for a step this host's plan skips still fails the launch where that step
            # would have run: a test never passes because its fault went unused.
            _step = _armed[0]
            _fire(f"{_step} (not in this plan)", None)
    except OSError as exc:
        # A seat that cannot be isolated as promised does not run unisolated.
        print(f"cotal sandbox: refusing to start the seat: {exc}", file=sys.stderr)
        report_failure(status, _step, exc)
        return 126
    _step = "exec"
    try:
        if _armed is not None:
            err = _armed[1]
            raise OSError(err, f"{os.strerror(err)} (COTAL_TEST_LAUNCH_FAULT)", argv[0])
        os.execvpe(argv[0], argv, dict(os.environ))
    except OSError as exc:
        print(f"cotal sandbox: cannot run {argv[0]}: {exc}", file=sys.stderr)
        report_failure(status, "exec", exc)
        return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
