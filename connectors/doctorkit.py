"""What the connectors' `doctor` checks share: the pins as read once, finding a harness's
program (the pinned install or `agents.<name>.binary`), and the quick `--version` run.

A probe runs with an empty private home and only `PATH`, `LANG`, `LC_ALL` and `TMPDIR` of the
operator's environment, so it neither reads nor writes the operator's harness state nor sees a
token or key. Only `cotal doctor` calls these; a launch never does.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from connectors.harnesses import Pin, binary_of, installed_version, load_pins, pin_file
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


def probe(argv: list[str], env: dict[str, str]) -> tuple[bool, str]:
    """Whether `argv` exits 0 within the timeout, and its output or why not."""
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
