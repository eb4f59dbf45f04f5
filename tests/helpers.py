"""Test helpers that talk to the real broker and the real /proc."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import nats
from nats.js import JetStreamContext


@asynccontextmanager
async def broker_at(url: str, creds: str) -> AsyncIterator[JetStreamContext]:
    nc = await nats.connect(url, nkeys_seed=creds)
    try:
        yield nc.jetstream()
    finally:
        await nc.close()


@asynccontextmanager
async def broker(root: Path) -> AsyncIterator[JetStreamContext]:
    """A JetStream handle on the broker a root's mesh uses, with the root's own credential."""
    record = json.loads((root / ".cotal" / "mesh.json").read_text())
    async with broker_at(record["server"], record["creds"]) as js:
        yield js


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    return data[data.rindex(b")") + 2 :].split()[0] != b"Z"


# The default poll starts at 50 ms and backs off to 400 ms: most predicates run a `cotal` call
# (a fork, a control-socket or broker round trip, the manager's own work to answer), and the
# suite is CPU-bound on two cores, so a fast poll of a slow condition (a lease lapsing, a standby
# taking over) took CPU from the very processes it waited for (measured: 246 `ps --fleet` calls
# in tests/e2e/test_takeover.py alone).
_POLL_FIRST_S = 0.05
_POLL_MAX_S = 0.4


async def wait_until(
    predicate: Callable[[], bool], timeout: float = 10.0, every: float | None = None
) -> None:
    """Poll a condition under a deadline: the test fails with TimeoutError, never hangs.
    `every` fixes the interval (a test timing a narrow window); without it the poll backs off."""
    pause = every if every is not None else _POLL_FIRST_S
    with anyio.fail_after(timeout):
        while True:
            if predicate():
                return
            await anyio.sleep(pause)
            if every is None:
                pause = min(pause * 1.5, _POLL_MAX_S)


async def wait_gone(pids: list[int], timeout: float = 10.0) -> None:
    await wait_until(lambda: not any(pid_alive(p) for p in pids), timeout)


def processes_mentioning(text: str) -> list[int]:
    """Live pids whose command line or environment names `text` (a workspace root)."""
    found = []
    needle = text.encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read()
            with open(f"/proc/{entry}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if (needle in cmd or needle in env) and pid_alive(int(entry)):
            found.append(int(entry))
    return found


def frame(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def signer_key(root: Path) -> str:
    """The source manager's public signing key: what `cotal status` shows the operator to carry."""
    [identity] = (root / ".cotal" / "auth").glob("manager-instance.*.json")
    key = json.loads(identity.read_text())["publicKey"]
    assert isinstance(key, str)
    return key


def carry_to_new_host(root: Path, attempt_dir: Path, dest: Path, *, trust: bool = True) -> Path:
    """Copy the sealed attempt out and remove the whole source tree: host A is gone. With
    `trust`, the operator has carried host A's key over and trusted it on the new host."""
    from tests.conftest import cotal_env, run_cli

    key = signer_key(root)
    copy = dest / attempt_dir.name
    shutil.copytree(attempt_dir, copy, symlinks=True)
    shutil.rmtree(root)
    root.mkdir()
    if trust:
        args = ["trust", "add", key, "--name", "host-a", "--root", str(root)]
        added = run_cli(args, timeout=60, env=cotal_env(), cwd=root)
        assert added.returncode == 0, added.stderr
    return copy


def trusting(checkpoint: Path) -> list[str]:
    """`--trust-signer KEY` for the key that sealed `checkpoint`: a test whose subject is not
    trust pins the signer for the one run, leaving the destination's trust store untouched."""
    manifest = json.loads((Path(checkpoint) / "manifest.json").read_text())
    return ["--trust-signer", manifest["signer"]["publicKey"]]


def refused(out: subprocess.CompletedProcess[str], code: str) -> str:
    """A CLI refusal: exit 2, `code` on stderr's last line (`--json`), no traceback anywhere;
    its message."""
    import json

    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr + out.stdout and "internal error" not in out.stderr
    error = json.loads(out.stderr.strip().splitlines()[-1])
    assert error["code"] == code, out.stderr
    text: str = error["error"]
    return text


# -- the mesh, as a test of it reads it -----------------------------------------------------------


def ask(cli: Any, seat: str, text: str, timeout: float = 90) -> str:
    """The reply of `seat`'s turn on `text`, sent by the operator and waited for."""
    reply: str = cli.json("send", seat, text, "--wait", "--timeout", f"{timeout:g}")["reply"]
    return reply


def ps_row(cli: Any, name: str) -> dict[str, Any]:
    """The seat's row of `cotal ps --json`."""
    [row] = [r for r in cli.ps() if r["name"] == name]
    return dict(row)


def manager_log_events(cli: Any, event: str, seat: str) -> list[dict[str, Any]]:
    """The manager log's events named `event` of `seat`, read straight from the file."""
    log = (cli.root / ".cotal" / "logs" / "manager.log").read_text()
    found = [json.loads(line) for line in log.splitlines() if f'"{event}"' in line]
    return [e for e in found if e["event"] == event and e.get("seat") == seat]


def seat_events(cli: Any, seat: str, event: str) -> list[dict[str, Any]]:
    """The manager's events of `seat` named `event`, as `cotal logs SEAT --json` shows them."""
    found = []
    for line in cli.run("logs", seat, "--json").stdout.splitlines():
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and obj.get("event") == event:
            found.append(obj)
    return found


def inbox_subject(to: str, sender: str, space: str = "main") -> str:
    return f"cotal.{space}.inst.local.{to}.local.{sender}"


async def stream_messages(
    cli: Any, stream: str, subject: str
) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """Every message `stream` holds on `subject`, in order: its body and its headers."""
    out: list[tuple[dict[str, Any], dict[str, str]]] = []
    async with broker(cli.root) as js:
        info = await js.stream_info(stream)
        for seq in range(info.state.first_seq, info.state.last_seq + 1):
            try:
                msg = await js.get_msg(stream, seq)
            except Exception:
                continue  # trimmed or discarded
            if msg.subject == subject:
                out.append((json.loads(msg.data or b"{}"), dict(msg.headers or {})))
    return out


async def dm_messages(
    cli: Any, to: str, sender: str, space: str = "main"
) -> list[tuple[dict[str, Any], dict[str, str]]]:
    """Every message the DM stream holds in `to`'s inbox from `sender`: body and headers."""
    return await stream_messages(cli, f"DM_{space}", inbox_subject(to, sender, space))


def post_turns_acked(cli: Any, seat: str) -> int:
    """How many of the seat's turns for channel posts (`cotal logs SEAT --json`) were
    acknowledged."""
    events = [json.loads(line) for line in cli.run("logs", seat, "--json").stdout.splitlines()]
    turns = {e["id"] for e in events if e.get("event") == "delivery.received" and e.get("channel")}
    return sum(1 for e in events if e.get("event") == "delivery.acked" and e["id"] in turns)


def stop_broker(proc: subprocess.Popen[Any]) -> None:
    """A `cotal broker serve` a test started: asked to stop (SIGTERM), killed if it will not
    within 15 s, and reaped either way."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
