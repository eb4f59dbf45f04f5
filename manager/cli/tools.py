"""Pinned harness programs, installed per repository under `.tools/<name>/`.

`harnesses.json` at the repository root pins each npm-distributed harness to an exact version,
so a test run, a demo and a seat all drive the program whose behaviour was measured. Nothing is
installed globally and nothing is resolved from the operator's PATH: a harness binary that
happens to be on PATH may be another version with other flags and another session format.

    python -m manager.cli.tools install [name ...]   install (or confirm) the pinned versions
    python -m manager.cli.tools which <name>         print the binary path of an installed harness
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from protocol.errors import Refusal

REPO_ROOT = Path(__file__).resolve().parents[2]
PIN_FILE = REPO_ROOT / "harnesses.json"
TOOLS_DIR = REPO_ROOT / ".tools"


@dataclass(frozen=True)
class Native:
    """A harness whose runnable program is a native binary in a per-platform optional
    dependency (Claude Code: `@anthropic-ai/claude-code-linux-x64/claude`). The main package's
    `bin` is only a stub that its postinstall script replaces, and installs here run with
    `--ignore-scripts`, so the binary is taken from the platform package directly."""

    package: str  # with `{platform}`, e.g. "@anthropic-ai/claude-code-{platform}"
    bin: str


@dataclass(frozen=True)
class Pin:
    name: str
    package: str
    version: str
    bin: str
    native: Native | None = None

    @property
    def prefix(self) -> Path:
        return TOOLS_DIR / self.name

    @property
    def package_dir(self) -> Path:
        return self.prefix / "node_modules" / self.package


def npm_platform() -> str:
    """This host in npm's optional-dependency naming: `linux-x64`, `linux-arm64-musl`, ..."""
    system = {"linux": "linux", "darwin": "darwin", "win32": "win32"}.get(
        sys.platform, sys.platform
    )
    machine = platform.machine().lower()
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        machine, machine
    )
    musl = system == "linux" and not platform.libc_ver()[0] and any(Path("/lib").glob("ld-musl-*"))
    return f"{system}-{arch}{'-musl' if musl else ''}"


def load_pins(pin_file: Path = PIN_FILE) -> dict[str, Pin]:
    try:
        raw = json.loads(pin_file.read_text())
    except FileNotFoundError:
        raise Refusal(
            "missing", f"harness pin file {pin_file} does not exist", "restore it from git"
        ) from None
    except json.JSONDecodeError as exc:
        raise Refusal(
            "malformed", f"harness pin file {pin_file} is not valid JSON ({exc})", "fix the file"
        ) from None
    if not isinstance(raw, dict):
        raise Refusal(
            "malformed", f"harness pin file {pin_file} must hold an object", "fix the file"
        )
    pins: dict[str, Pin] = {}
    for name, entry in raw.items():
        if not isinstance(entry, dict) or not all(
            isinstance(entry.get(k), str) and entry.get(k) for k in ("package", "version")
        ):
            raise Refusal(
                "malformed",
                f"harness pin {name!r} in {pin_file} needs non-empty string fields package and version",
                "fix the entry",
            )
        native = entry.get("native")
        if native is not None and not (
            isinstance(native, dict)
            and all(isinstance(native.get(k), str) and native.get(k) for k in ("package", "bin"))
            and "{platform}" in native["package"]
        ):
            raise Refusal(
                "malformed",
                f"harness pin {name!r} in {pin_file}: native needs string fields package (with {{platform}}) and bin",
                "fix the entry",
            )
        pins[name] = Pin(
            name,
            entry["package"],
            entry["version"],
            entry.get("bin") or name,
            Native(native["package"], native["bin"]) if native else None,
        )
    return pins


def get_pin(name: str, pin_file: Path = PIN_FILE) -> Pin:
    pins = load_pins(pin_file)
    if name not in pins:
        raise Refusal(
            "unknown-harness",
            f"no harness named {name!r} is pinned in {pin_file} (pinned: {', '.join(sorted(pins)) or 'none'})",
            "add it to harnesses.json or use a pinned name",
        )
    return pins[name]


def installed_version(pin: Pin) -> str | None:
    """The version npm actually put in place, read from the package itself, not from npm's cache."""
    try:
        meta = json.loads((pin.package_dir / "package.json").read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None
    version = meta.get("version")
    return version if isinstance(version, str) else None


def _bin_relpath(pin: Pin) -> str:
    meta = json.loads((pin.package_dir / "package.json").read_text())
    bins = meta.get("bin")
    if isinstance(bins, str):
        return bins
    if isinstance(bins, dict) and isinstance(bins.get(pin.bin), str):
        return str(bins[pin.bin])
    raise Refusal(
        "bad-harness",
        f"{pin.package}@{pin.version} declares no binary named {pin.bin!r}",
        'set the right "bin" for it in harnesses.json',
    )


def which(name: str, pin_file: Path = PIN_FILE) -> Path:
    """The installed harness's entry point.

    The script file itself (its shebang runs `node`), not `node_modules/.bin/<bin>`: that link is
    an npm artefact that `--ignore-scripts`-style installs and copies can leave out. For a pin
    with a `native` entry, the platform package's binary (see `Native`).
    """
    return binary_of(get_pin(name, pin_file))


def binary_of(pin: Pin) -> Path:
    """`which` for a pin already loaded."""
    version = installed_version(pin)
    if version != pin.version:
        found = f"version {version} is installed" if version else "it is not installed"
        raise Refusal(
            "not-installed",
            f"harness {pin.name} ({pin.package}@{pin.version}) is not ready under {pin.prefix}: {found}",
            "run `python -m manager.cli.tools install`",
        )
    if pin.native is not None:
        return _native_binary(pin, pin.native)
    path = (pin.package_dir / _bin_relpath(pin)).resolve()
    if not path.is_file():
        raise Refusal(
            "not-installed",
            f"harness {pin.name} binary {path} is missing",
            "run `python -m manager.cli.tools install`",
        )
    return path


def _native_binary(pin: Pin, native: Native) -> Path:
    package = native.package.replace("{platform}", npm_platform())
    pkg_dir = pin.prefix / "node_modules" / package
    try:
        version = json.loads((pkg_dir / "package.json").read_text()).get("version")
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        version = None
    if version != pin.version:
        found = f"version {version} is installed" if version else "it is not installed"
        raise Refusal(
            "not-installed",
            f"harness {pin.name}: its native package {package}@{pin.version} is not ready under {pin.prefix}: {found}"
            " (npm installs only the platform packages this host can run)",
            "run `python -m manager.cli.tools install`; if this platform has no native package, the harness cannot run here",
        )
    path = pkg_dir / native.bin
    if not path.is_file() or not os.access(path, os.X_OK):
        raise Refusal(
            "not-installed",
            f"harness {pin.name} binary {path} is missing or not executable",
            "run `python -m manager.cli.tools install`",
        )
    return path


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
            "no-node",
            f"{pin.package}@{pin.version} needs node {wanted}, and node is not on PATH",
            "install Node.js",
        )
    out = subprocess.run(
        [node, "--version"], capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    have = _version_tuple(out.stdout)
    if have is None or have < floor:
        raise Refusal(
            "old-node",
            f"{pin.package}@{pin.version} needs node {wanted}, this host has {out.stdout.strip() or 'an unknown version'}",
            "install a newer Node.js",
        )


def _runnable(pin: Pin) -> bool:
    try:
        binary_of(pin)
    except Refusal:
        return False
    return True


def install(pin: Pin) -> str:
    """Install `pin` under `.tools/<name>/` unless that exact version is already there."""
    have = installed_version(pin)
    if have == pin.version and _runnable(pin):
        check_node(pin)
        return f"{pin.name}: {pin.package}@{pin.version} already installed in {pin.prefix}"
    npm = shutil.which("npm")
    if npm is None:
        raise Refusal(
            "no-npm",
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
    ]
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-15:])
        raise Refusal(
            "install-failed",
            f"npm install of {pin.package}@{pin.version} into {pin.prefix} failed with rc {proc.returncode}:\n{tail}",
            "check network access to the npm registry and the pin in harnesses.json",
        )
    have = installed_version(pin)
    if have != pin.version:
        raise Refusal(
            "install-failed",
            f"npm reported success but {pin.package_dir} holds version {have!r}, not {pin.version}",
            f"remove {pin.prefix} and run the install again",
        )
    binary_of(pin)
    check_node(pin)
    return f"{pin.name}: installed {pin.package}@{pin.version} in {pin.prefix}"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    usage = "usage: python -m manager.cli.tools install [name ...] | which <name>"
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
    except Refusal as exc:
        print(f"cotal tools: {exc.text}", file=sys.stderr)
        return 1
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
