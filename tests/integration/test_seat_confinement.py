"""The launcher's view of the host, measured from inside a real seat sandbox: its own temp
directories, capped; the roots the registry names hidden (whole, or their `.cotal` where the
seat's own paths lie inside them); its TMPDIR and HOME made fresh. And the registry itself:
private, pruned, and read the same way by the manager and by the launcher.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from connectors import isolate, sandbox
from manager.workspace import roots

# Run as the seat: what it can read, list and write, as errno names or values.
PROBE = r"""
import errno, json, os, sys
def attempt(action, path):
    try:
        return action(path)
    except OSError as exc:
        return errno.errorcode[exc.errno]
def read(p):
    with open(p) as f:
        return f.read()
def write(p):
    with open(p, "x") as f:
        f.write("seat\n")
    return "written"
checks = json.loads(sys.argv[1])
out = {}
for name, (kind, path) in checks.items():
    act = {"read": read, "list": lambda p: sorted(os.listdir(p)), "write": write}[kind]
    out[name] = attempt(act, path)
st = os.statvfs("/tmp")
out["tmp bytes"] = st.f_blocks * st.f_frsize
print(json.dumps(out))
"""


def _seat(
    argv: list[str], env: dict[str, str], cwd: Path, plan: sandbox.Plan
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        sandbox.launcher(plan) + argv,
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_a_seat_sees_its_own_temp_and_none_of_the_roots_the_registry_names(
    tmp_path: Path,
) -> None:
    found = sandbox.probe()
    if found.mount is None:
        pytest.skip(f"no mount namespace on this host ({found.detail})")
    big = tmp_path / "big"  # the seat's cwd; itself a registered root, so an ancestor's case
    own = big / "own"  # the seat's own root
    other = big / "other"  # another root inside the seat's cwd
    for root in (big, own, other):
        (root / ".cotal" / "auth").mkdir(parents=True)
        (root / ".cotal" / "auth" / "control.token").write_text(f"token of {root.name}\n")
    (big / "readme.txt").write_text("shared work\n")
    (other / "work.txt").write_text("the other root's work\n")
    registry = tmp_path / "registry"
    for root in (big, own, other):
        roots.register(root, registry)
    tmpdir, home = tmp_path / "tmpdir", tmp_path / "home"
    tmpdir.mkdir()
    (tmpdir / "hostfile").write_text("on the host\n")
    checks = {
        "ancestor's token": ["read", str(big / ".cotal" / "auth" / "control.token")],
        "ancestor's work": ["read", str(big / "readme.txt")],
        "other's token": ["read", str(other / ".cotal" / "auth" / "control.token")],
        "other's work": ["read", str(other / "work.txt")],
        "other listed": ["list", str(other)],
        "other written": ["write", str(other / "planted")],
        "own token": ["read", str(own / ".cotal" / "auth" / "control.token")],
        "parent listed": ["list", str(tmp_path)],
        "registry listed": ["list", str(registry)],
        "tmpdir listed": ["list", str(tmpdir)],
        "tmpdir written": ["write", str(tmpdir / "mine")],
        "home written": ["write", str(home / "mine")],
    }
    argv = [sys.executable, "-I", "-c", PROBE, json.dumps(checks)]
    env = {
        "PATH": "/usr/bin:/bin",
        "COTAL_WORKSPACE_ROOT": str(own),
        "TMPDIR": str(tmpdir),
        "HOME": str(home),
    }
    plan = sandbox.plan_for(
        argv,
        env,
        big,
        pointer=None,
        mount=found.mount,
        landlock=found.landlock,
        registry=registry,
        temp_mib=3,
    )
    assert plan.private_tmp == list(isolate.SYSTEM_WRITE)
    assert plan.fresh == [str(tmpdir), str(home)]
    assert isolate.to_hide(plan, str(big)) == sorted(
        [str(registry), str(big / ".cotal"), str(other)]
    )
    out = _seat(argv, env, big, plan)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {
        "ancestor's token": "ENOENT",
        "ancestor's work": "shared work\n",
        "other's token": "ENOENT",
        "other's work": "ENOENT",
        "other listed": [],
        "other written": "EROFS",
        "own token": "ENOENT",
        "parent listed": ["big", "home", "tmpdir"],
        "registry listed": "ENOENT",
        "tmpdir listed": [],
        "tmpdir written": "written",
        "home written": "written",
        "tmp bytes": 3 << 20,
    }
    # Nothing the seat wrote in its temp directories reached the host; the host's stayed.
    assert sorted(os.listdir(tmpdir)) == ["hostfile"]
    assert not home.exists()
    assert not (other / "planted").exists()


def test_a_private_temp_without_a_cap_is_refused_before_the_harness_runs(tmp_path: Path) -> None:
    found = sandbox.probe()
    if found.mount is None:
        pytest.skip(f"no mount namespace on this host ({found.detail})")
    marker = tmp_path / "ran"
    argv = ["/bin/sh", "-c", f"echo ran > {marker}"]
    env = {"PATH": "/usr/bin:/bin", "COTAL_WORKSPACE_ROOT": str(tmp_path)}
    plan = sandbox.plan_for(
        argv, env, tmp_path, pointer=None, mount=found.mount, landlock=found.landlock, temp_mib=0
    )
    out = _seat(argv, env, tmp_path, plan)
    assert out.returncode == 126
    assert out.stderr == (
        "cotal sandbox: refusing to start the seat: "
        "[Errno 22] a private temp directory needs a size cap over 0 MiB\n"
    )
    assert not marker.exists()


def test_the_registry_is_private_pruned_and_read_alike_by_manager_and_launcher(
    tmp_path: Path,
) -> None:
    registry = tmp_path / "state" / "roots"
    live, gone = tmp_path / "live", tmp_path / "gone"
    for root in (live, gone):
        (root / ".cotal").mkdir(parents=True)
    entry = roots.register(live, registry)
    gone_entry = roots.register(gone, registry)
    assert stat.S_IMODE(os.lstat(registry).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(registry.parent).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(entry).st_mode) == 0o600
    assert json.loads(entry.read_bytes()) == {"version": 1, "root": str(live)}
    # Entries that are not records are skipped by both readers, never trusted.
    (registry / "link.json").symlink_to(entry)
    (registry / "wrong-version.json").write_text(json.dumps({"version": 2, "root": "/x"}))
    (registry / "not-json.json").write_text("{")
    (registry / "huge.json").write_text(" " * (isolate.REGISTRY_ENTRY_CAP + 1))
    for bad in ("wrong-version.json", "not-json.json", "huge.json"):
        os.chmod(registry / bad, 0o600)
    assert sorted(isolate.registered_roots(str(registry))) == sorted([str(gone), str(live)])
    assert roots.known(registry) == [gone, live]
    # A root whose `.cotal` is gone is dropped from the registry at the next read.
    (gone / ".cotal").rmdir()
    assert roots.known(registry) == [live]
    assert not gone_entry.exists()
    assert isolate.registered_roots(str(registry)) == [str(live)]
    assert isolate.registered_roots(str(tmp_path / "none")) == []


def test_what_a_mode_lacks_is_said_with_what_it_means(monkeypatch: pytest.MonkeyPatch) -> None:
    assert sandbox.missing_from("mount-ns+landlock") == []
    [lacks_mount] = sandbox.missing_from("landlock")
    assert lacks_mount.startswith("missing mount-ns: no mount namespace: the seat reads its own ")
    assert "/tmp, /var/tmp and /dev/shm are shared" in lacks_mount  # noqa: S108
    [lacks_landlock] = sandbox.missing_from("mount-ns")
    assert lacks_landlock.startswith("missing landlock: no Landlock: ")
    assert sandbox.missing_from("none") == [lacks_mount, lacks_landlock]
    monkeypatch.delenv(sandbox.TMP_MIB_ENV, raising=False)
    assert sandbox.tmp_mib() == sandbox.TMP_MIB_DEFAULT == 512
    for text, mib in (
        ("64", 64),
        ("0", 512),
        ("-1", 512),
        ("1e3", 512),
        ("9999999", 512),
        ("\u00b2", 512),
    ):
        monkeypatch.setenv(sandbox.TMP_MIB_ENV, text)
        assert sandbox.tmp_mib() == mib, text
