"""Pinned harness programs, installed under the tools directory as `<tools>/<name>/`.

The pins, the tools directory and the binary lookup live in `connectors.harnesses` (connectors
find their pinned binary there and may not import the manager); this module installs what they
pin. The tools directory is `$COTAL_TOOLS_DIR`, else `<checkout>/.tools` in a source checkout,
else the user's data directory (`~/.local/share/cotal/tools`); nothing goes to npm's global
prefix.

    python -m manager.cli.tools install [name ...]   install (or confirm) the pinned versions
    python -m manager.cli.tools which <name>         print the binary path of an installed harness
    python -m manager.cli.tools dir                  print the tools directory
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence

from connectors.harnesses import (
    PACKAGES_ROOT,
    TOOLS_ENV,
    Native,
    Pin,
    binary_of,
    companions_ready,
    get_pin,
    installed_version,
    load_pins,
    npm_platform,
    pin_file,
    tools_dir,
    which,
)
from protocol.errors import Refusal
from protocol.refusals import Code

# Callers (the tools command, tests) reach the pins through this module too; a connector's
# doctor reads them through connectors/doctorkit.py.
__all__ = [
    "PACKAGES_ROOT",
    "TOOLS_ENV",
    "Native",
    "Pin",
    "binary_of",
    "check_node",
    "get_pin",
    "install",
    "installed_version",
    "load_pins",
    "main",
    "npm_platform",
    "pin_file",
    "tools_dir",
    "which",
]


def _version_tuple(text: str) -> tuple[int, ...] | None:
    m = re.match(r"^v?(\d+)\.(\d+)\.(\d+)", text.strip())
    return tuple(int(x) for x in m.groups()) if m else None


def check_node(pin: Pin) -> None:
    """Refuse an installed harness whose declared Node floor this host's node does not meet.

    Only the common `>=x.y.z` form is checked; any other range is left to npm's own warning.
    """
    try:
        meta = json.loads((pin.package_dir / "package.json").read_text())
    except (OSError, json.JSONDecodeError):
        return
    wanted = str((meta.get("engines") or {}).get("node") or "")
    floor = _version_tuple(wanted[2:]) if wanted.startswith(">=") else None
    if floor is None:
        return
    node = shutil.which("node")
    if node is None:
        raise Refusal(
            Code.NO_NODE,
            f"{pin.package}@{pin.version} needs node {wanted}, and node is not on PATH",
            "install Node.js",
        )
    out = subprocess.run(
        [node, "--version"], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    have = _version_tuple(out.stdout)
    if have is None or have < floor:
        raise Refusal(
            Code.OLD_NODE,
            f"{pin.package}@{pin.version} needs node {wanted}, this host has "
            f"{out.stdout.strip() or 'an unknown version'}",
            "install a newer Node.js",
        )


def _runnable(pin: Pin) -> bool:
    try:
        binary_of(pin)
    except Refusal:
        return False
    return True


def install(pin: Pin) -> str:
    """Install `pin` under `<tools>/<name>/` unless that exact version is already there."""
    have = installed_version(pin)
    if have == pin.version and _runnable(pin) and companions_ready(pin):
        check_node(pin)
        return f"{pin.name}: {pin.package}@{pin.version} already installed in {pin.prefix}"
    npm = shutil.which("npm")
    if npm is None:
        raise Refusal(
            Code.NO_NPM,
            f"cannot install {pin.package}@{pin.version}: npm is not on PATH",
            "install Node.js >= 20 with npm",
        )
    pin.prefix.mkdir(parents=True, exist_ok=True)
    # --save-exact keeps the prefix's own package.json honest about the pin; --ignore-scripts
    # because no install script is needed for the measured behaviour and none should run from
    # a test setup step (npm 11 already skips the native ones pi ships with).
    cmd = [
        npm,
        "install",
        "--prefix",
        str(pin.prefix),
        "--no-audit",
        "--no-fund",
        "--save-exact",
        "--ignore-scripts",
        f"{pin.package}@{pin.version}",
        # What the harness would otherwise fetch itself when it starts (`Pin.companions`).
        *(f"{package}@{version}" for package, version in pin.companions),
    ]
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise Refusal(
            Code.INSTALL_FAILED,
            f"npm install of {pin.package}@{pin.version} into {pin.prefix} failed with rc "
            f"{proc.returncode}:\n{tail}",
            f"check network access to the npm registry and the pin in {pin_file()}",
        )
    have = installed_version(pin)
    if have != pin.version:
        raise Refusal(
            Code.INSTALL_FAILED,
            f"npm reported success but {pin.package_dir} holds version {have!r}, not {pin.version}",
            f"remove {pin.prefix} and run the install again",
        )
    binary_of(pin)
    if not companions_ready(pin):
        raise Refusal(
            Code.INSTALL_FAILED,
            f"npm reported success but {pin.prefix} lacks "
            + ", ".join(f"{p}@{v}" for p, v in pin.companions),
            f"remove {pin.prefix} and run the install again",
        )
    check_node(pin)
    return f"{pin.name}: installed {pin.package}@{pin.version} in {pin.prefix}"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m manager.cli.tools install [name ...] | which <name> | dir"
    try:
        if args[:1] == ["install"]:
            pins = load_pins()
            names = args[1:] or sorted(pins)
            for name in names:
                print(install(get_pin(name)), flush=True)
            return 0
        if args[:1] == ["which"] and len(args) == 2:
            print(which(args[1]))
            return 0
        if args == ["dir"]:
            print(tools_dir())
            return 0
    except Refusal as exc:
        print(f"cotal tools: {exc.text}", file=sys.stderr)
        return 1
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
