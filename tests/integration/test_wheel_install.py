"""cotal installed from a wheel, as an operator gets it: built from the sources, installed into a
fresh virtual environment outside the checkout, and run from a directory and a root that are not
the checkout, with the checkout on neither sys.path nor PYTHONPATH. The harness pins must come
from the package data and pi from the tools directory; a scribe seat must remember a phrase.

The pinned harnesses are not installed again: COTAL_TOOLS_DIR points at the tools directory this
test run already uses (no npm needed). The Python dependencies come from pip's usual index and
cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from connectors.harnesses import installed_version, load_pins, tools_dir
from tests.conftest import REPO

PHRASE = "juniper-ledger-41"
PI = load_pins()["pi"]

pytestmark = [
    pytest.mark.pi,
    pytest.mark.skipif(
        installed_version(PI) != PI.version,
        reason=f"pi is not installed under {tools_dir()} (make harnesses)",
    ),
]


def run(argv: list[str], *, cwd: Path, env: dict[str, str], timeout: float = 120) -> str:
    proc = subprocess.run(
        argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert proc.returncode == 0, f"{argv} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture
def venv(tmp_path: Path) -> Path:
    """A fresh venv holding cotal from a wheel of the sources, built from a copy of them so no
    build artefact lands in the checkout and none left there can leak into the wheel."""
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy2(REPO / "pyproject.toml", src)
    for package in ("protocol", "connectors", "manager"):
        shutil.copytree(
            REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
        )
    wheels = tmp_path / "wheels"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_REQUIRE_VIRTUALENV")}
    run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(wheels), str(src)],
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    [wheel] = wheels.glob("cotal-*.whl")
    venv = tmp_path / "venv"
    # The venv gets no pip of its own (ensurepip was a quarter of this set-up's CPU): this
    # run's pip installs into it (`--python`). --no-compile: the bytecode of every dependency
    # (textual's among them) was another third, and an interpreter compiles what it imports.
    run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path, env=env)
    run(
        [
            *(sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python")),
            *("install", "-q", "--no-compile", str(wheel)),
        ],
        cwd=tmp_path,
        env=env,
        timeout=300,
    )
    return venv


def test_an_installed_wheel_runs_outside_the_checkout(venv: Path, tmp_path: Path) -> None:
    cwd, root, home = tmp_path / "elsewhere", tmp_path / "ws", tmp_path / "home"
    for d in (cwd, root, home):
        d.mkdir()
    tools = tools_dir().resolve()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("COTAL_", "PYTHON", "XDG_")) and k != "VIRTUAL_ENV"
    }
    env |= {"HOME": str(home), "COTAL_TOOLS_DIR": str(tools)}
    bin_ = venv / "bin"
    python, cotal = str(bin_ / "python"), str(bin_ / "cotal")

    where = json.loads(
        run(
            [
                python,
                "-c",
                "import json, sys, manager, connectors.harnesses as h; print(json.dumps("
                "{'manager': manager.__file__, 'path': sys.path, 'pins': str(h.pin_file())}))",
            ],
            cwd=cwd,
            env=env,
        )
    )
    site = venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    site /= "site-packages"
    assert Path(where["manager"]) == site / "manager" / "__init__.py"
    assert Path(where["pins"]) == site / "connectors" / "harnesses.json"
    assert not any(p and Path(p).resolve() == REPO for p in where["path"])

    # Without COTAL_TOOLS_DIR an installed cotal keeps harnesses in the user's data directory.
    default = run(
        [python, "-m", "manager.cli.tools", "dir"],
        cwd=cwd,
        env={k: v for k, v in env.items() if k != "COTAL_TOOLS_DIR"},
    )
    assert default.strip() == str(home / ".local" / "share" / "cotal" / "tools")
    assert run([python, "-m", "manager.cli.tools", "dir"], cwd=cwd, env=env).strip() == str(tools)
    # The installer finds the pins in the package data and the pinned pi already in place.
    assert run([cotal, "tools", "install", "pi"], cwd=cwd, env=env) == (
        f"pi: {PI.package}@{PI.version} already installed in {tools / 'pi'}\n"
    )

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert run([cotal, "--version"], cwd=cwd, env=env) == f"cotal {version}\n"

    doctor = {
        r["name"]: r
        for r in map(
            json.loads,
            run([cotal, "doctor", "--json", "--root", str(root)], cwd=cwd, env=env).splitlines(),
        )
    }
    pi = doctor["pi"]
    assert (pi["installed"], pi["usable"], pi["version"]) == (True, True, PI.version)
    assert Path(pi["path"]).is_relative_to(tools / "pi")
    scribe = doctor["scribe"]
    assert scribe["ready"] and scribe["path"] == f"{bin_ / 'python'} -I -m connectors.scribe"

    up = ["--root", str(root)]
    run([cotal, "up", "--detach", *up], cwd=cwd, env=env)
    try:
        run(
            [
                cotal,
                "spawn",
                "s1",
                "--agent",
                "scribe",
                "--prompt",
                f"Remember the phrase {PHRASE}.",
                *up,
            ],
            cwd=cwd,
            env=env,
        )
        reply = run([cotal, "send", "s1", "What was the phrase?", "--wait", *up], cwd=cwd, env=env)
        assert PHRASE in reply
        transcript = run([cotal, "logs", "s1", "--transcript", *up], cwd=cwd, env=env)
        assert f"The phrase is {PHRASE}." in transcript
    finally:
        down = subprocess.run(
            [cotal, "down", *up], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
        )
    assert down.returncode == 0 and "cotal is down" in down.stdout, down.stderr
