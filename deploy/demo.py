"""`make demo`: the main job end to end on this machine, with readable output.

Runs the real CLI against a scratch workspace under `.demo/`: bring the mesh up (embedded
broker + daemon), spawn a scribe seat told a phrase, ask for it through the broker, list the
seats, and take everything down, proving each process gone. Exits non-zero on any failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PHRASE = "juniper-ledger-41"


def cotal(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    cmd = ["cotal", *args]
    print(f"\n$ {' '.join(cmd)}", flush=True)
    env = {**os.environ, "PYTHONPATH": str(REPO), "COTAL_ROOT": str(root)}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "manager.cli", *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=180)
    out = (proc.stdout + proc.stderr).rstrip()
    if out:
        print("  " + out.replace("\n", "\n  "))
    print(f"  ({time.monotonic() - t0:.2f}s, exit {proc.returncode})", flush=True)
    if check and proc.returncode != 0:
        raise SystemExit(f"demo failed at: cotal {' '.join(args)}")
    return proc


def main() -> int:
    base = REPO / ".demo"
    if base.exists():
        shutil.rmtree(base)
    root = base / "workspace"
    root.mkdir(parents=True)
    results: list[tuple[str, bool]] = []
    cotal(root, "up", "--detach")
    try:
        spawned = json.loads(cotal(root, "spawn", "default", "--agent", "scribe", "--json",
                                   "--prompt", f"Remember the phrase {PHRASE}. Reply with it.").stdout)
        reply = cotal(root, "send", "default", "What was the phrase?", "--wait").stdout.strip()
        results.append(("phrase answered through the broker", PHRASE in reply))
        cotal(root, "ps", "--wide")
        rows = [json.loads(line) for line in cotal(root, "ps", "--json").stdout.splitlines()]
        results.append(("ps shows the seat with its lifecycle uid",
                        [r["lifecycleUid"] for r in rows] == [spawned["lifecycleUid"]]))
    finally:
        down = cotal(root, "down", "--json", check=False)
    gone = down.returncode == 0 and json.loads(down.stdout.splitlines()[-1]).get("manager") is not None
    results.append(("down proved manager, broker and seat gone", gone))
    print("\nRESULT")
    for name, ok in results:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    return 0 if all(ok for _, ok in results) else 1


if __name__ == "__main__":
    sys.exit(main())
