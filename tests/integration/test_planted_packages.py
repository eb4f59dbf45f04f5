"""No code of the workspace runs in cotal's own interpreters (connectors/interpreter.py).

A seat writes its cwd, the root by default, so it can leave there a `manager/`, `connectors/` or
`protocol/` package that plain `python -m manager.cli` (run with the root as cwd) or `python -m
connectors.scribe` (run in the seat's cwd) would import before cotal's own. The test plants such
packages in the root, in a second seat's cwd, in the directory `cotal doctor` probes scribe from
(its TMPDIR) and on the PYTHONPATH the command hands its children; each planted module leaves a
marker beside itself and fails. Then a real manager, warm (`up --detach`) and in the foreground
(`up`, which runs the manager's own argv), starts real scribe seats in both cwds that must answer,
and `down` ends it all; no marker may exist.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from tests.conftest import REPO, cotal_env
from tests.helpers import processes_mentioning, wait_until

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

PLANTED = (
    "manager/__init__.py",
    "manager/cli/__init__.py",
    "manager/cli/__main__.py",
    "manager/daemon/__init__.py",
    "connectors/__init__.py",
    "connectors/isolate.py",
    "connectors/scribe/__init__.py",
    "connectors/scribe/__main__.py",
    "protocol/__init__.py",
)
# Beside itself: a planted module run inside a seat's sandbox may write only under the seat's
# cwd, and the planted directories are that cwd (or the manager's, which is not confined).
PAYLOAD = """\
import sys
try:
    with open(__file__ + ".ran", "w") as f:
        f.write(repr(sys.argv))
finally:
    raise SystemExit(97)
"""


def plant(base: Path) -> Path:
    for rel in PLANTED:
        path = base / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(PAYLOAD)
    return base


def markers(*bases: Path) -> list[Path]:
    return sorted(m for base in bases for m in base.rglob("*.ran"))


class Planted:
    def __init__(self, tmp_path: Path, root: Path) -> None:
        self.root = plant(root)
        self.service = plant(root / "service")
        self.pythonpath = plant(tmp_path / "pythonpath")
        self.tmpdir = plant(tmp_path / "doctor-tmp")
        self.all = (self.root, self.pythonpath, self.tmpdir)

    def argv(self, *args: str) -> list[str]:
        # The command itself is the operator's `cotal` (a script: its own directory, not the
        # cwd, leads its path); -I stands in for that here, so the PYTHONPATH below is only
        # what it hands its children.
        return [sys.executable, "-I", "-m", "manager.cli", *args, "--root", str(self.root)]

    def env(self, **extra: str) -> dict[str, str]:
        return cotal_env({"PYTHONPATH": str(self.pythonpath), **extra})

    def run(self, *args: str, check: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            self.argv(*args),
            capture_output=True,
            text=True,
            timeout=120,
            env=self.env(**env),
            cwd=self.root,
        )
        if check:
            assert proc.returncode == 0, f"cotal {args} ({proc.returncode}):\n{proc.stderr}"
        return proc

    def json(self, *args: str) -> dict[str, object]:
        out = json.loads(self.run(*args, "--json").stdout)
        assert isinstance(out, dict)
        return out

    def answers(self) -> None:
        """A scribe seat in the root and one in `service/`, each remembering its phrase."""
        for name, extra in (("rooted", []), ("served", ["--cwd", str(self.service)])):
            row = self.json("spawn", name, "--agent", "scribe", *extra)
            assert row["state"] == "running"
            phrase = f"planted-{name}-7"
            reply = self.json("send", name, f"remember the phrase {phrase}", "--wait")["reply"]
            assert reply == f"Noted: {phrase}."
            reply = self.json("send", name, "what was the phrase?", "--wait")["reply"]
            assert reply == f"The phrase is {phrase}."

    def manager_argv(self) -> list[bytes]:
        pid = self.json("status")["pid"]
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]


@pytest.fixture
def planted(tmp_path: Path, root: Path) -> Planted:
    return Planted(tmp_path, root)


async def test_a_warm_manager_and_its_scribe_seats_import_nothing_planted(
    planted: Planted,
) -> None:
    planted.run("up", "--detach")
    try:
        argv = planted.manager_argv()
        assert argv[:3] == [sys.executable.encode(), b"-I", b"-m"]
        assert argv[-4:] == [b"manager", b"warm", b"--root", str(planted.root).encode()]
        planted.answers()
    finally:
        planted.run("down", check=False)
    await wait_until(lambda: processes_mentioning(str(planted.root)) == [], timeout=15)
    assert markers(*planted.all) == []


async def test_a_foreground_manager_imports_nothing_planted(planted: Planted) -> None:
    log = planted.root.parent / "foreground.out"
    with log.open("wb") as out:
        proc = await anyio.open_process(
            planted.argv("up"),
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=planted.env(),
            cwd=planted.root,
        )
    try:
        await wait_until(
            lambda: proc.returncode is not None or planted.json("status")["up"] is True,
            timeout=60,
            every=0.2,
        )
        assert proc.returncode is None, log.read_text()
        argv = planted.manager_argv()
        exe = sys.executable.encode()
        assert argv[:6] == [exe, b"-I", b"-m", b"manager.cli", b"manager", b"serve"]
        planted.answers()
        planted.run("down")
        with anyio.fail_after(30):
            assert await proc.wait() == 0, log.read_text()
    finally:
        if proc.returncode is None:
            proc.kill()
        with anyio.CancelScope(shield=True):
            await proc.wait()
    assert markers(*planted.all) == []


def test_doctors_scribe_probe_imports_nothing_planted(planted: Planted) -> None:
    # The probe runs in the temporary directory: on a shared host, anyone's to write.
    out = planted.run("doctor", "--json", TMPDIR=str(planted.tmpdir)).stdout
    [scribe] = [row for row in map(json.loads, out.splitlines()) if row["name"] == "scribe"]
    assert scribe["path"] == f"{sys.executable} -I -m connectors.scribe"
    assert (scribe["installed"], scribe["usable"], scribe["missing"]) == (True, True, [])
    assert markers(*planted.all) == []


CHILD = """\
import subprocess, sys
from connectors.interpreter import own_python
argv = own_python("userinstalled")
print(argv[1:], flush=True)
sys.exit(subprocess.run(argv, cwd=sys.argv[1]).returncode)
"""


@pytest.mark.parametrize("parent", ["base", "venv"])
def test_a_child_keeps_only_the_user_site_its_parent_has(tmp_path: Path, parent: str) -> None:
    # The base interpreter has a user site ($HOME/.local/...), where `pip install --user` puts
    # cotal: its child must still find it. A venv's has none, and its child gets plain -I.
    python = (
        getattr(sys, "_base_executable", sys.executable) if parent == "base" else sys.executable
    )
    home = tmp_path / "home"
    user_site = home / ".local" / "lib" / f"python{sys.version_info[0]}.{sys.version_info[1]}"
    user_site /= "site-packages"
    user_site.mkdir(parents=True)
    (user_site / "userinstalled.py").write_text("print('from the user site')\n")
    cwd, pythonpath = plant(tmp_path / "cwd"), plant(tmp_path / "pythonpath")
    for base in (cwd, pythonpath):
        (base / "userinstalled.py").write_text(PAYLOAD)
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": f"{REPO}:{pythonpath}"}
    proc = subprocess.run(
        [python, "-c", CHILD, str(cwd)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=tmp_path,
    )
    if parent == "base":
        assert (proc.returncode, proc.stdout) == (
            0,
            "['-E', '-P', '-m', 'userinstalled']\nfrom the user site\n",
        ), proc.stderr
    else:
        assert (proc.returncode, proc.stdout) == (1, "['-I', '-m', 'userinstalled']\n")
        assert proc.stderr.endswith("No module named userinstalled\n"), proc.stderr
    assert markers(cwd, pythonpath) == []
