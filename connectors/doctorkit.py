"""What the connectors' `doctor` checks share: the pins as read once, finding a harness's
program (the pinned install or `agents.<name>.binary`), and the quick `--version` run.

A probe runs with an empty private home and only `PATH`, `LANG`, `LC_ALL` and `TMPDIR` of the
operator's environment, so it neither reads nor writes the operator's harness state nor sees a
token or key. `cotal doctor`, a cut (the harness each seat ran), a restore's admission and a
move's probe call these; a launch never does.

A `--version` run that answered is remembered (`probe`, `ProbeMemo`): a Node.js harness's
`--version` costs seconds of CPU (pi 0.73.1: 2.6 s on two cores), and every cut, admission and
move of its seat asked again. The memo is keyed by the command, its environment and the
identity of each file the command names (device, inode, size, mtime, ctime: a reinstall or an
upgrade makes new files), so a changed binary is run again; a failure is never remembered.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from connectors.harnesses import Pin, binary_of, installed_version, load_pins, pin_file, tools_dir
from connectors.privatefs import (
    ensure_private_dir,
    file_identity,
    read_stable,
    write_private_atomic,
)
from protocol.errors import Refusal


@dataclass
class Missing:
    """One reason a harness is not ready here, with its cure."""

    problem: str
    cure: str
    # "program": the harness cannot run at all; "config": it runs, but a seat launch would be
    # refused until the operator supplies a setting (an endpoint, a key).
    kind: str = "program"


@dataclass
class HarnessCheck:
    """What a connector finds of its harness on this host, for `cotal doctor`: where its program
    is and which version, whether it answers a quick run, and each problem with its cure."""

    installed: bool = False
    path: str | None = None
    version: str | None = None
    usable: bool = False
    missing: list[Missing] = field(default_factory=list)


VERSION_TIMEOUT_S = 15.0


@dataclass(frozen=True)
class Pins:
    """The harness pins, read once for every connector's check, or why they could not be."""

    found: Mapping[str, Pin] = field(default_factory=dict)
    problem: Missing | None = None

    @classmethod
    def load(cls) -> Pins:
        try:
            return cls(load_pins())
        except Refusal as exc:
            return cls({}, Missing(exc.message, exc.cure))

    def noted(self, check: HarnessCheck) -> HarnessCheck:
        """`check` of a pinned harness, with the pin file's own problem last when it has one."""
        if self.problem is not None:
            check.missing.append(self.problem)
        return check


def pinned_or_configured(
    check: HarnessCheck,
    name: str,
    binary: str | None,
    pins: Pins,
    *,
    locate: Callable[[Pin], Path] = binary_of,
) -> str | None:
    """The program a seat of `name` would run: `binary` when configured, else the pinned
    install's; None (with the problem recorded) when there is none."""
    if binary:
        if not os.path.isfile(binary):
            check.missing.append(
                Missing(
                    f"agents.{name}.binary {binary} does not exist",
                    f"fix agents.{name}.binary in cotal.toml or remove it to use the pinned "
                    "install",
                )
            )
            return None
        check.installed = True
        check.path = binary
        return binary
    pin = pins.found.get(name)
    if pin is None:
        check.missing.append(
            Missing(
                f"{name} is not pinned in {pin_file()}", "reinstall cotal (the pins ship inside it)"
            )
        )
        return None
    try:
        path = locate(pin)
    except Refusal as exc:
        check.missing.append(
            Missing(exc.message, "run `cotal tools install` (`make harnesses` in a checkout)")
        )
        return None
    check.installed = True
    check.path = str(path)
    check.version = installed_version(pin)
    return str(path)


def version_run(check: HarnessCheck, argv: list[str], env: dict[str, str]) -> None:
    """`argv --version`: usable when it answers; the install's own version record wins, the
    program's answer fills in for a configured binary."""
    ok, detail = probe([*argv, "--version"], env)
    check.usable = ok
    if ok:
        check.version = check.version or detail.splitlines()[0].strip()[:60] or None
    else:
        check.missing.append(
            Missing(
                f"`{check.path} --version` failed: {detail}",
                "reinstall it (`make harnesses` for pinned harnesses) or fix the configured binary",
            )
        )


# Under the tools directory (`cotal tools dir`), beside the installs the memos vouch for.
PROBE_MEMO_DIR = ".probed"
# A memo is one `--version` answer: its first 4 KiB are plenty, and a larger file is not one.
_MEMO_CAP = 4096


class ProbeMemo(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A `--version` run that answered: what it printed, for the command `key` names."""

    key: str
    detail: str


def memo_key(argv: list[str], env: Mapping[str, str]) -> str | None:
    """The memo's name for this run, or None when the run may not be remembered (a named
    file is gone or not a regular file). A probe's private home is a new temporary directory
    each time, so its path is spelled `~` wherever the environment names it."""
    files = []
    for arg in argv:
        if not os.path.isabs(arg):
            continue
        try:
            st = os.stat(arg)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        files.append([arg, *file_identity(st)])
    home = env.get("HOME")
    spelled = {k: (v.replace(home, "~") if home else v) for k, v in sorted(env.items())}
    blob = json.dumps([argv, spelled, files], separators=(",", ":")).encode()
    return hashlib.sha256(blob).hexdigest()


def _memo_path(key: str) -> Path:
    return tools_dir() / PROBE_MEMO_DIR / key


def _recalled(key: str) -> str | None:
    """The remembered answer for `key`, or None. A memo that is not a small regular file of
    the right shape for this key is ignored: the probe runs again and writes a good one."""
    try:
        data = read_stable(_memo_path(key), cap=_MEMO_CAP, what="probe memo").data
        memo = msgspec.json.decode(data, type=ProbeMemo)
    except (OSError, Refusal, msgspec.DecodeError):
        return None
    return memo.detail if memo.key == key else None


def _remember(key: str, detail: str) -> None:
    """Write the memo; a tools directory this process cannot write only costs the next probe
    its run, so a failure here is not an error."""
    data = msgspec.json.encode(ProbeMemo(key=key, detail=detail))
    if len(data) > _MEMO_CAP:
        return
    try:
        write_private_atomic(ensure_private_dir(_memo_path(key).parent) / key, data)
    except (OSError, Refusal):
        return


def probe(argv: list[str], env: dict[str, str]) -> tuple[bool, str]:
    """Whether `argv` exits 0 within the timeout, and its output or why not; an answer
    remembered for the same command and files is returned without running it again."""
    key = memo_key(argv, env)
    if key is not None and (recalled := _recalled(key)) is not None:
        return True, recalled
    ok, detail = _run_probe(argv, env)
    if ok and key is not None:
        _remember(key, detail)
    return ok, detail


def _run_probe(argv: list[str], env: dict[str, str]) -> tuple[bool, str]:
    try:
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=VERSION_TIMEOUT_S,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=tempfile.gettempdir(),
        )
    except subprocess.TimeoutExpired:
        return False, f"no answer within {VERSION_TIMEOUT_S:.0f}s"
    except OSError as exc:
        return False, exc.strerror or str(exc)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()
        return False, f"exit code {proc.returncode}" + (f": {tail[-1][:200]}" if tail else "")
    return True, proc.stdout.strip()


def probe_env(home: str | None = None, **extra: str) -> dict[str, str]:
    """Only what a version check needs, `home` as HOME: no token or key of the operator's."""
    env = {k: v for k in ("PATH", "LANG", "LC_ALL", "TMPDIR") if (v := os.environ.get(k))}
    env["HOME"] = home or tempfile.gettempdir()
    env.update(extra)
    return env


def config_problem(check: HarnessCheck, exc: Refusal) -> None:
    """A setting a launch would refuse, as a `config` problem: the harness runs, a seat does not
    until the operator fixes it. Only the refusal's words are kept, never a secret."""
    check.missing.append(Missing(exc.message, exc.cure, "config"))
