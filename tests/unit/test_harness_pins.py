"""A pin's `native` entry: the platform package is found by `{platform}` (npm's name, libc
included) or `{os}-{arch}` (without it), its version is the pin's or the pin's with the platform
appended (Codex's alias), and a `*` in `bin` must match exactly one program. Real files under a
private tools directory; nothing runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from connectors.harnesses import (
    TOOLS_ENV,
    binary_of,
    load_pins,
    npm_os_arch,
    npm_platform,
)
from protocol.errors import Refusal


@pytest.fixture
def tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "tools"
    where.mkdir()
    monkeypatch.setenv(TOOLS_ENV, str(where))
    return where


def pins(tmp_path: Path, entries: dict[str, object]) -> Path:
    path = tmp_path / "harnesses.json"
    path.write_text(json.dumps(entries))
    return path


def package(tools: Path, harness: str, name: str, version: str, **extra: object) -> Path:
    pkg = tools / harness / "node_modules" / name
    pkg.mkdir(parents=True)
    (pkg / "package.json").write_text(json.dumps({"name": name, "version": version, **extra}))
    return pkg


def program(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\nexit 0\n")
    path.chmod(0o755)
    return path


def os_arch() -> str:
    system, arch = npm_os_arch()
    return f"{system}-{arch}"


CODEX = {
    "package": "@openai/codex",
    "version": "0.169.0",
    "bin": "codex",
    "native": {"package": "@openai/codex-{os}-{arch}", "bin": "vendor/*/bin/codex"},
}
CLAUDE = {
    "package": "@anthropic-ai/claude-code",
    "version": "2.1.197",
    "bin": "claude",
    "native": {"package": "@anthropic-ai/claude-code-{platform}", "bin": "claude"},
}


def test_an_aliased_platform_package_versioned_with_its_platform_is_the_program(
    tools: Path, tmp_path: Path
) -> None:
    (pin,) = load_pins(pins(tmp_path, {"codex": CODEX})).values()
    package(tools, "codex", "@openai/codex", "0.169.0", bin={"codex": "bin/codex.js"})
    # npm keeps the alias as the directory name; the package inside names itself the main one.
    platform_pkg = package(tools, "codex", f"@openai/codex-{os_arch()}", f"0.169.0-{os_arch()}")
    found = program(platform_pkg / "vendor" / "x86_64-unknown-linux-musl" / "bin" / "codex")
    assert binary_of(pin) == found

    # A second build target under vendor/ is not one program.
    second = program(platform_pkg / "vendor" / "aarch64-unknown-linux-musl" / "bin" / "codex")
    with pytest.raises(Refusal) as exc:
        binary_of(pin)
    assert exc.value.code == "bad-harness"
    assert exc.value.message == (
        f"harness codex: {platform_pkg / 'vendor/*/bin/codex'} matches {second}, {found}, "
        "not one program"
    )


def test_an_aliased_platform_package_of_another_version_is_not_installed(
    tools: Path, tmp_path: Path
) -> None:
    (pin,) = load_pins(pins(tmp_path, {"codex": CODEX})).values()
    package(tools, "codex", "@openai/codex", "0.169.0")
    platform_pkg = package(tools, "codex", f"@openai/codex-{os_arch()}", f"0.168.0-{os_arch()}")
    program(platform_pkg / "vendor" / "x86_64-unknown-linux-musl" / "bin" / "codex")
    with pytest.raises(Refusal) as exc:
        binary_of(pin)
    assert exc.value.code == "not-installed"
    assert exc.value.message.startswith(
        f"harness codex: its native package @openai/codex-{os_arch()}@0.169.0 is not ready "
        f"under {tools / 'codex'}: version 0.168.0-{os_arch()} is installed"
    )


def test_no_match_for_a_pattern_is_a_missing_program(tools: Path, tmp_path: Path) -> None:
    (pin,) = load_pins(pins(tmp_path, {"codex": CODEX})).values()
    package(tools, "codex", "@openai/codex", "0.169.0")
    platform_pkg = package(tools, "codex", f"@openai/codex-{os_arch()}", "0.169.0")
    with pytest.raises(Refusal) as exc:
        binary_of(pin)
    assert (exc.value.code, exc.value.message) == (
        "not-installed",
        f"harness codex binary {platform_pkg / 'vendor/*/bin/codex'} is missing or not executable",
    )


def test_a_platform_package_keeps_npms_platform_name_and_exact_version(
    tools: Path, tmp_path: Path
) -> None:
    (pin,) = load_pins(pins(tmp_path, {"claude": CLAUDE})).values()
    package(tools, "claude", "@anthropic-ai/claude-code", "2.1.197")
    platform_pkg = package(
        tools, "claude", f"@anthropic-ai/claude-code-{npm_platform()}", "2.1.197"
    )
    found = program(platform_pkg / "claude")
    assert binary_of(pin) == found


def test_a_native_package_without_a_platform_placeholder_is_malformed(tmp_path: Path) -> None:
    entry = {**CODEX, "native": {"package": "@openai/codex-linux", "bin": "codex"}}
    with pytest.raises(Refusal) as exc:
        load_pins(pins(tmp_path, {"codex": entry}))
    assert exc.value.code == "malformed"
    assert exc.value.message.endswith(
        "native needs string fields package (with {platform} or {os}-{arch}) and bin"
    )
