"""`make demo`: record section 6 end to end on one machine, with readable output.

Host A and host B are one absolute path used twice: the cut happens on host A, the checkpoint
is copied out, host A's tree is taken away entirely, and host B is laid down in its place.
Both reach one shared broker (`cotal broker serve`), as two hosts would. Prints every command
with its output, then a PASS/FAIL table of the three continuity observations plus the
repository checks; exits non-zero on any FAIL.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PHRASE = "juniper-ledger-41"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "demo",
    "GIT_AUTHOR_EMAIL": "demo@example.invalid",
    "GIT_COMMITTER_NAME": "demo",
    "GIT_COMMITTER_EMAIL": "demo@example.invalid",
}


def env() -> dict[str, str]:
    return {**os.environ, **GIT_ENV, "PYTHONPATH": str(REPO)}


def cotal(
    root: Path, *args: str, check: bool = True, show: bool = True
) -> subprocess.CompletedProcess[str]:
    if show:
        print(f"\n$ cotal {' '.join(args)}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "manager.cli", *args, "--root", str(root)],
        cwd=root,
        env=env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    if show:
        out = (proc.stdout + proc.stderr).rstrip()
        if out:
            print("  " + out.replace("\n", "\n  "))
        print(f"  ({time.monotonic() - t0:.2f}s, exit {proc.returncode})", flush=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"demo failed at: cotal {' '.join(args)}")
    return proc


def git(repo: Path, *args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=repo, env=env(), check=True, capture_output=True, text=True
    ).stdout


def porcelain(repo: Path) -> str:
    # The record's selection rule: the control directory is never part of the seat's tree.
    return git(repo, "status", "--porcelain", "--", ".", ":(exclude).cotal")


def tree_bytes(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, dirnames, files in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in (".git", ".cotal")]
        for f in files:
            p = Path(dirpath) / f
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def make_workspace(root: Path) -> None:
    git(root, "init", "-q", "-b", "main")
    (root / "README.md").write_text("# demo project\n")
    (root / "app.py").write_text("print('v1')\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "first")
    (root / "app.py").write_text("print('v2, staged')\n")
    git(root, "add", "app.py")
    (root / "app.py").write_text("print('v3, unstaged on top')\n")
    (root / "notes.txt").write_text("untracked notes\n")


def main() -> int:
    base = REPO / ".demo"
    if base.exists():
        shutil.rmtree(base)
    root = base / "host" / "workspace"
    root.mkdir(parents=True)
    outside = base / "carried"
    outside.mkdir()
    print("== a shared broker, reachable from both hosts", flush=True)
    broker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "manager.cli",
            "broker",
            "serve",
            "--store-dir",
            str(base / "broker"),
            "--json",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env=env(),
    )
    assert broker.stdout is not None
    info = json.loads(broker.stdout.readline())
    server, creds = info["url"], info["creds"]
    print(f"  broker {server}  creds {creds}")
    checks: list[tuple[str, bool]] = []
    try:
        print(
            "\n== host A: a git workspace with staged, unstaged and untracked changes", flush=True
        )
        make_workspace(root)
        status_before, bytes_before = porcelain(root), tree_bytes(root)
        print("  " + status_before.rstrip().replace("\n", "\n  "))
        cotal(root, "up", "--detach", "--server", server, "--creds", creds)
        spawned = json.loads(
            cotal(
                root,
                "spawn",
                "default",
                "--agent",
                "scribe",
                "--json",
                "--prompt",
                f"Remember the phrase {PHRASE}. Reply with it.",
            ).stdout
        )
        cotal(root, "ps", "--wide")
        cut = json.loads(cotal(root, "down", "--preserve-state", "--json").stdout)
        # What the operator carries to host B besides the checkpoint: host A's signing key,
        # read on host A, trusted on host B before anything is admitted.
        key = json.loads(cotal(root, "status", "--json").stdout)["manager"]["publicKey"]
        print(f"  host A's signing key {key}")
        checkpoint = outside / Path(cut["checkpointDir"]).name
        print(
            "\n== copy the sealed checkpoint out, then take host A away\n  cp -a "
            f"{cut['checkpointDir']} {checkpoint}"
        )
        shutil.copytree(cut["checkpointDir"], checkpoint, symlinks=True)
        shutil.rmtree(root)
        root.mkdir()
        print(f"  rm -rf {root}  (host A is gone)")
        print(
            "\n== host B: the same path, admitted and restored from the checkpoint alone",
            flush=True,
        )
        cotal(root, "trust", "add", key, "--name", "host-a")
        cotal(root, "checkpoint", "verify", str(checkpoint), "--server", server, "--creds", creds)
        resumed = json.loads(
            cotal(
                root,
                "up",
                "--restore",
                str(checkpoint),
                "--server",
                server,
                "--creds",
                creds,
                "--json",
            ).stdout
        )
        [seat] = resumed["seats"]
        cotal(root, "ps", "--wide")
        reply = cotal(root, "send", "default", "What was the phrase?", "--wait").stdout.strip()
        print("\n== continuity observations (record 6 step 9)")
        print(f"  session id   {seat['sessionBefore']} -> {seat['sessionAfter']}")
        print(f"  lifecycle    {seat['uidBefore']} -> {seat['uidAfter']}")
        print(f"  phrase       {reply!r}")
        checks += [
            (
                "1. same session id",
                seat["sessionBefore"] == spawned["sessionId"] == seat["sessionAfter"],
            ),
            (
                "2. same lifecycle uid",
                seat["uidBefore"] == spawned["lifecycleUid"] == seat["uidAfter"],
            ),
            ("3. the phrase is answered through send --wait", PHRASE in reply),
            ("porcelain identical", porcelain(root) == status_before),
            ("worktree bytes identical", tree_bytes(root) == bytes_before),
        ]
    finally:
        if (root / ".cotal" / "mesh.json").exists():
            cotal(root, "down", check=False)
        broker.send_signal(signal.SIGTERM)
        broker.wait(timeout=30)
    print("\nRESULT")
    for name, ok in checks:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    if not checks:
        print("  FAIL  the demo did not reach its observations")
    return 0 if checks and all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
