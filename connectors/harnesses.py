"""The harness pins (`harnesses.json`) and where each pinned harness's program is installed.

Nothing is resolved from PATH: a seat drives the exact version whose behaviour was measured
(docs/design.md, "The harness connectors, in detail").
"""

from __future__ import annotations

import json
import os
import platform
import sys
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import platformdirs

from protocol.errors import Refusal
from protocol.refusals import Code

PIN_RESOURCE = "harnesses.json"
TOOLS_ENV = "COTAL_TOOLS_DIR"
# The directory that holds the `connectors`, `manager` and `protocol` packages: the checkout in
# a source tree, site-packages in an installed wheel.
PACKAGES_ROOT = Path(__file__).resolve().parents[1]


def source_checkout() -> Path | None:
    """The checkout cotal runs from, or None for an installed wheel (site-packages holds no
    pyproject.toml)."""
    return PACKAGES_ROOT if (PACKAGES_ROOT / "pyproject.toml").is_file() else None


def tools_dir() -> Path:
    """Where pinned harnesses are installed. Read on every call, not at import: a test or an
    operator may point `COTAL_TOOLS_DIR` elsewhere in a process that already imported this."""
    configured = os.environ.get(TOOLS_ENV)
    if configured:
        return Path(configured).expanduser().resolve()
    checkout = source_checkout()
    if checkout is not None:
        return checkout / ".tools"
    return platformdirs.user_data_path("cotal") / "tools"


def pin_file() -> Path:
    """The pin file as a path, for messages and for callers that want to read it themselves."""
    return Path(str(resources.files("connectors").joinpath(PIN_RESOURCE)))


@dataclass(frozen=True)
class Native:
    """A harness whose runnable program is a native binary in a per-platform optional
    dependency (Claude Code: `@anthropic-ai/claude-code-linux-x64/claude`). The main package's
    `bin` is only a stub that its postinstall script replaces (or a node script that would only
    start the binary as its child), and installs here run with `--ignore-scripts`, so the binary
    is taken from the platform package directly.

    `package` names the platform package with `{platform}` (npm's name for this host, `-musl`
    included: `linux-x64-musl`) or with `{os}-{arch}` (without the libc: Codex ships one static
    Linux build under `@openai/codex-linux-x64`). Its installed version is the pin's, or the
    pin's with the platform appended (Codex installs `@openai/codex@0.169.0-linux-x64` under
    that alias). `bin` may hold a `*` for a directory named per build target
    (`vendor/*/bin/codex`); it must then match exactly one file."""

    package: str
    bin: str


@dataclass(frozen=True)
class Pin:
    name: str
    package: str
    version: str
    bin: str
    native: Native | None = None
    # Packages installed beside the harness, each at an exact version, that the harness would
    # otherwise fetch itself at run time (OpenCode: `@opencode-ai/plugin`, which `opencode acp`
    # installs into its config directory at every start unless it is already there).
    companions: tuple[tuple[str, str], ...] = ()

    @property
    def prefix(self) -> Path:
        return tools_dir() / self.name

    @property
    def package_dir(self) -> Path:
        return self.prefix / "node_modules" / self.package


def npm_os_arch() -> tuple[str, str]:
    """This host's `process.platform` and `process.arch` as node names them: `linux`, `x64`."""
    system = {"linux": "linux", "darwin": "darwin", "win32": "win32"}.get(
        sys.platform, sys.platform
    )
    machine = platform.machine().lower()
    arch = {"x86_64": "x64", "amd64": "x64", "aarch64": "arm64", "arm64": "arm64"}.get(
        machine, machine
    )
    return system, arch


def npm_platform() -> str:
    """This host in npm's optional-dependency naming: `linux-x64`, `linux-arm64-musl`, ..."""
    system, arch = npm_os_arch()
    musl = system == "linux" and not platform.libc_ver()[0] and any(Path("/lib").glob("ld-musl-*"))
    return f"{system}-{arch}{'-musl' if musl else ''}"


def load_pins(source: Path | None = None) -> dict[str, Pin]:
    """The pins of `source`, by default the package's own `harnesses.json`."""
    where = source or pin_file()
    try:
        text = (
            source.read_text()
            if source is not None
            else resources.files("connectors").joinpath(PIN_RESOURCE).read_text()
        )
        raw = json.loads(text)
    except FileNotFoundError:
        raise Refusal(
            Code.MISSING,
            f"harness pin file {where} does not exist",
            "reinstall cotal (the pins ship inside the connectors package)",
        ) from None
    except json.JSONDecodeError as exc:
        raise Refusal(
            Code.MALFORMED, f"harness pin file {where} is not valid JSON ({exc})", "fix the file"
        ) from None
    if not isinstance(raw, dict):
        raise Refusal(
            Code.MALFORMED, f"harness pin file {where} must hold an object", "fix the file"
        )
    pins: dict[str, Pin] = {}
    for name, entry in raw.items():
        if not isinstance(entry, dict) or not all(
            isinstance(entry.get(k), str) and entry.get(k) for k in ("package", "version")
        ):
            raise Refusal(
                Code.MALFORMED,
                f"harness pin {name!r} in {where} needs non-empty string fields package and "
                "version",
                "fix the entry",
            )
        native = entry.get("native")
        if native is not None and not (
            isinstance(native, dict)
            and all(isinstance(native.get(k), str) and native.get(k) for k in ("package", "bin"))
            and ("{platform}" in native["package"] or "{os}-{arch}" in native["package"])
        ):
            raise Refusal(
                Code.MALFORMED,
                f"harness pin {name!r} in {where}: native needs string fields package (with "
                f"{{platform}} or {{os}}-{{arch}}) and bin",
                "fix the entry",
            )
        companions = entry.get("with", {})
        if not isinstance(companions, dict) or not all(
            isinstance(k, str) and k and isinstance(v, str) and v for k, v in companions.items()
        ):
            raise Refusal(
                Code.MALFORMED,
                f"harness pin {name!r} in {where}: with must map package names to exact versions",
                "fix the entry",
            )
        pins[name] = Pin(
            name,
            entry["package"],
            entry["version"],
            entry.get("bin") or name,
            Native(native["package"], native["bin"]) if native else None,
            tuple(sorted(companions.items())),
        )
    return pins


def get_pin(name: str, source: Path | None = None) -> Pin:
    pins = load_pins(source)
    if name not in pins:
        raise Refusal(
            Code.UNKNOWN_HARNESS,
            f"no harness named {name!r} is pinned in {source or pin_file()} (pinned: "
            f"{', '.join(sorted(pins)) or 'none'})",
            "add it to connectors/harnesses.json or use a pinned name",
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


def companion_version(pin: Pin, package: str) -> str | None:
    """The version of a companion package (`Pin.companions`) installed beside the harness."""
    try:
        meta = json.loads((pin.prefix / "node_modules" / package / "package.json").read_text())
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        return None
    version = meta.get("version")
    return version if isinstance(version, str) else None


def companions_ready(pin: Pin) -> bool:
    """Whether every companion of `pin` is installed at its pinned version."""
    return all(companion_version(pin, p) == v for p, v in pin.companions)


def _bin_relpath(pin: Pin) -> str:
    meta = json.loads((pin.package_dir / "package.json").read_text())
    bins = meta.get("bin")
    if isinstance(bins, str):
        return bins
    if isinstance(bins, dict) and isinstance(bins.get(pin.bin), str):
        return str(bins[pin.bin])
    raise Refusal(
        Code.BAD_HARNESS,
        f"{pin.package}@{pin.version} declares no binary named {pin.bin!r}",
        'set the right "bin" for it in harnesses.json',
    )


def which(name: str, source: Path | None = None) -> Path:
    """The installed harness's entry point.

    The script file itself (its shebang runs `node`), not `node_modules/.bin/<bin>`: that link is
    an npm artefact that `--ignore-scripts`-style installs and copies can leave out. For a pin
    with a `native` entry, the platform package's binary (see `Native`).
    """
    return binary_of(get_pin(name, source))


def binary_of(pin: Pin) -> Path:
    """`which` for a pin already loaded."""
    version = installed_version(pin)
    if version != pin.version:
        found = f"version {version} is installed" if version else "it is not installed"
        raise Refusal(
            Code.NOT_INSTALLED,
            f"harness {pin.name} ({pin.package}@{pin.version}) is not ready under {pin.prefix}: "
            f"{found}",
            "run `cotal tools install`",
        )
    if pin.native is not None:
        return _native_binary(pin, pin.native)
    path = (pin.package_dir / _bin_relpath(pin)).resolve()
    if not path.is_file():
        raise Refusal(
            Code.NOT_INSTALLED,
            f"harness {pin.name} binary {path} is missing",
            "run `cotal tools install`",
        )
    return path


def _native_package(native: Native) -> tuple[str, str]:
    """The platform package's name on this host, and the platform as that name spells it."""
    system, arch = npm_os_arch()
    label = npm_platform() if "{platform}" in native.package else f"{system}-{arch}"
    package = (
        native.package.replace("{platform}", label).replace("{os}", system).replace("{arch}", arch)
    )
    return package, label


def _native_binary(pin: Pin, native: Native) -> Path:
    package, label = _native_package(native)
    pkg_dir = pin.prefix / "node_modules" / package
    try:
        version = json.loads((pkg_dir / "package.json").read_text()).get("version")
    except (FileNotFoundError, NotADirectoryError, json.JSONDecodeError):
        version = None
    if version not in (pin.version, f"{pin.version}-{label}"):
        found = f"version {version} is installed" if version else "it is not installed"
        raise Refusal(
            Code.NOT_INSTALLED,
            f"harness {pin.name}: its native package {package}@{pin.version} is not ready under "
            f"{pin.prefix}: {found}"
            " (npm installs only the platform packages this host can run)",
            "run `cotal tools install`; if this platform has no native package, "
            "the harness cannot run here",
        )
    path = pkg_dir / native.bin
    if "*" in native.bin:
        found_bins = sorted(pkg_dir.glob(native.bin))
        if len(found_bins) > 1:
            raise Refusal(
                Code.BAD_HARNESS,
                f"harness {pin.name}: {pkg_dir / native.bin} matches "
                f"{', '.join(map(str, found_bins))}, not one program",
                f"remove {pin.prefix} and run `cotal tools install` again",
            )
        path = found_bins[0] if found_bins else path
    if not path.is_file() or not os.access(path, os.X_OK):
        raise Refusal(
            Code.NOT_INSTALLED,
            f"harness {pin.name} binary {path} is missing or not executable",
            "run `cotal tools install`",
        )
    return path
