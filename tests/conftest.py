"""Shared fixtures: real nats-server, real daemon processes, real sockets, real files."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
from nats.js import JetStreamContext

from connectors.harnesses import tools_dir
from tests import clifork
from tests.fixtures.fake_responses import ResponsesServer

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def no_process_outlives_its_test(tmp_path: Path) -> Iterator[None]:
    """Whatever a test started under its temporary directory (a daemon in a private mount
    namespace, a seat of a failed test) is killed when the test ends, so runs stay isolated."""
    yield
    from tests.helpers import processes_mentioning

    for pid in processes_mentioning(str(tmp_path)):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def anyio_backend() -> str:
    # nats-py is asyncio only.
    return "asyncio"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Spread each directory's files evenly over the run order, each file's tests kept together.

    `--dist worksteal` first hands each worker one contiguous share of the list (a quarter,
    with four workers). In collection order the end-to-end files (the longest tests: real
    managers, brokers and seats, lease TTLs waited out) fill the first share, so one worker
    starts with most of them and the run's tail is whichever of them it reaches last. Ordered by
    each file's place within its own directory, every share holds its part of each kind. A
    file's tests stay together so its module fixtures are built once per worker, as before."""
    files: dict[Path, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(Path(item.path), []).append(item)
    by_dir: dict[Path, list[Path]] = {}
    for path in files:
        by_dir.setdefault(path.parent, []).append(path)
    place = {
        path: (i + 0.5) / len(paths) for paths in by_dir.values() for i, path in enumerate(paths)
    }
    items[:] = [
        item for path in sorted(files, key=lambda p: (place[p], str(p))) for item in files[path]
    ]


@pytest.fixture
async def js(tmp_path: Path) -> AsyncIterator[JetStreamContext]:
    """A JetStream client on an embedded broker of the test's own, stopped with the test."""
    from manager.broker import embedded
    from tests.helpers import broker_at

    info = embedded.start_embedded(tmp_path / "nats", tmp_path / "broker.creds")
    try:
        async with broker_at(info.url, info.creds) as handle:
            yield handle
    finally:
        embedded.stop_embedded(info.identity)


@pytest.fixture
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private HOME, so the operator's global git config cannot leak into what a test measures."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    return home


def cotal_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    # A stray COTAL_ROOT or token would point a test's CLI at another root; the tools dir is
    # where the harnesses are, not state, so it passes.
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("COTAL_") or k == "COTAL_TOOLS_DIR"
    }
    env["PYTHONPATH"] = str(REPO)
    # Source and destination of a test share this one clock; a test of the clock gate itself
    # passes its own reading.
    env["COTAL_TEST_CLOCK_STATUS"] = "synchronized"
    env.update(extra or {})
    return env


def _kernel_view(pid: int) -> str:
    """State, wait channel and kernel stack of `pid` and of each of its children: what a
    process that answers no signal is blocked in."""
    lines = []
    todo = [pid]
    while todo and len(lines) < 200:
        p = todo.pop(0)
        base = Path(f"/proc/{p}")
        try:
            status = dict(
                line.split(":\t", 1) for line in (base / "status").read_text().splitlines()
            )
            raw = (base / "cmdline").read_bytes().replace(b"\0", b" ")
            cmd = raw[:160].decode(errors="replace")
        except (OSError, ValueError):
            continue
        wchan = (base / "wchan").read_text() if (base / "wchan").exists() else "?"
        try:
            stack = (base / "stack").read_text().strip().replace("\n", " | ")
        except OSError:
            stack = "?"
        lines.append(
            f"pid {p} state {status.get('State', '?')} wchan {wchan} sigblk "
            f"{status.get('SigBlk', '?')} cmd {cmd}\n  kernel stack: {stack}"
        )
        for task in (base / "task").iterdir():
            try:
                kids = (task / "children").read_text().split()
            except OSError:
                kids = []
            todo.extend(int(k) for k in kids)
            if task.name != str(p):
                try:
                    tstate = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
                    twchan = (task / "wchan").read_text()
                except OSError:
                    continue
                lines.append(f"  thread {task.name} state {tstate} wchan {twchan}")
    return "\n".join(lines)


def run_dumping_on_timeout(
    argv: list[str], *, timeout: float, env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    """`subprocess.run` that, when the command outlasts its timeout, asks it where it waits
    (SIGUSR1: its tasks, SIGUSR2: its threads) before killing it, and fails with that."""
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=cwd
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            kernel = _kernel_view(proc.pid)
            for sig in (signal.SIGUSR1, signal.SIGUSR2):
                proc.send_signal(sig)
                time.sleep(1)
            proc.kill()
            out, err = proc.communicate()
            raise AssertionError(
                f"{' '.join(argv[2:])} timed out after {timeout:g}s; where it waited:\n{err}\n"
                f"the kernel's view:\n{kernel}"
            ) from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def _where_it_waits(pid: int) -> str:
    kernel = _kernel_view(pid)
    for sig in (signal.SIGUSR1, signal.SIGUSR2):
        os.kill(pid, sig)
        time.sleep(1)
    return f"the kernel's view:\n{kernel}"


def run_cli(
    args: list[str], *, timeout: float, env: dict[str, str], cwd: Path
) -> subprocess.CompletedProcess[str]:
    """`cotal ARGS`: forked from a warm interpreter (tests/clifork.py) unless
    `COTAL_TEST_CLI=exec`, and then `python -m manager.cli` started cold."""
    if clifork.enabled():
        return clifork.run(args, env=env, cwd=cwd, timeout=timeout, on_timeout=_where_it_waits)
    return run_dumping_on_timeout(
        [sys.executable, "-m", "manager.cli", *args], timeout=timeout, env=env, cwd=cwd
    )


@dataclass
class Cli:
    root: Path
    # Settings every command of this test runs with (a test's own `env=` wins over them).
    env: dict[str, str] = field(default_factory=dict)

    def run(
        self,
        *args: str,
        check: bool = True,
        timeout: float = 120.0,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        proc = run_cli(
            [*args, "--root", str(self.root)],
            timeout=timeout,
            env=cotal_env({**self.env, **(env or {})}),
            cwd=self.root,
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"cotal {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def json(self, *args: str) -> Any:
        out = self.run(*args, "--json").stdout.strip().splitlines()
        return [json.loads(line) for line in out] if len(out) != 1 else json.loads(out[0])

    def ps(self) -> list[dict[str, Any]]:
        out = self.run("ps", "--json").stdout.strip().splitlines()
        return [json.loads(line) for line in out]


def _kill_leftovers(root: Path) -> None:
    """Whatever a failed test left running under this root dies here, so runs stay isolated."""
    mesh = root / ".cotal" / "mesh.json"
    if not mesh.exists():
        return
    try:
        record = json.loads(mesh.read_text())
    except ValueError:
        return
    for key in ("manager", "embeddedBroker"):
        ref = record.get(key)
        if ref:
            try:
                os.kill(ref["pid"], signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def root(tmp_path: Path) -> Iterator[Path]:
    r = tmp_path / "ws"
    r.mkdir()
    yield r
    _kill_leftovers(r)


@pytest.fixture
def cli(root: Path) -> Cli:
    return Cli(root)


@dataclass
class _LoggingServer:
    """A fake model server process on 127.0.0.1 (tests/fixtures/fake_*.py) and its request log."""

    port: int
    log: Path
    host: str = "127.0.0.1"

    def _logged(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]

    def peers(self) -> list[str]:
        """The address each logged request came from, in the log's order."""
        path = Path(f"{self.log}.peers")
        return path.read_text().splitlines() if path.exists() else []


@dataclass
class FakeServer(_LoggingServer):
    """The fake OpenAI-compatible server; it logs every request body it receives."""

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    def requests(self) -> list[dict[str, Any]]:
        return self._logged()

    def user_texts(self, request: dict[str, Any]) -> list[str]:
        out = []
        for m in request["messages"]:
            if m["role"] == "user":
                c = m["content"]
                out.append(c if isinstance(c, str) else "".join(p.get("text", "") for p in c))
        return out


@dataclass
class AnthropicServer(_LoggingServer):
    """The fake Anthropic Messages server; it logs `{method, path, session, body}` for every
    request, `session` being the X-Claude-Code-Session-Id header."""

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def records(self) -> list[dict[str, Any]]:
        return self._logged()

    def messages(self) -> list[dict[str, Any]]:
        """Logged `POST /v1/messages` requests: `session` header and body."""
        return [
            r
            for r in self.records()
            if r["method"] == "POST" and r["path"].split("?")[0] == "/v1/messages"
        ]

    @staticmethod
    def turns(request: dict[str, Any]) -> list[tuple[str, str]]:
        """(role, text) of the user and assistant messages, reminders stripped by the fake's
        rule."""
        from tests.fixtures.fake_anthropic import message_text

        return [
            (m["role"], message_text(m))
            for m in request["body"]["messages"]
            if m["role"] in ("user", "assistant")
        ]


S = TypeVar("S")


def start_fake_server(
    script: Path,
    log: Path,
    server: Callable[[int, Path, str], S] = FakeServer,  # type: ignore[assignment]
    host: str = "127.0.0.1",
) -> Iterator[S]:
    proc = subprocess.Popen(
        [sys.executable, str(script), "--port", "0", "--log", str(log), "--host", host],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        # No line at all: the server is gone, and its stderr says why.
        why = proc.stderr.read() if not line and proc.stderr else ""
        assert line.strip().isdigit(), f"fake server did not print its port: {line!r} {why}"
        yield server(int(line), log, host)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def fake_openai(tmp_path: Path) -> Iterator[FakeServer]:
    yield from start_fake_server(
        REPO / "tests" / "fixtures" / "fake_openai.py", tmp_path / "openai-requests.jsonl"
    )


@pytest.fixture
def fake_anthropic(tmp_path: Path) -> Iterator[AnthropicServer]:
    yield from start_fake_server(
        REPO / "tests" / "fixtures" / "fake_anthropic.py",
        tmp_path / "anthropic-requests.jsonl",
        AnthropicServer,
    )


@pytest.fixture
def fake_responses(tmp_path: Path) -> Iterator[ResponsesServer]:
    """The fake OpenAI Responses server Codex talks to."""
    yield from start_fake_server(
        REPO / "tests" / "fixtures" / "fake_responses.py",
        tmp_path / "responses-requests.jsonl",
        ResponsesServer,
    )


# Where the pinned pi lands, the same rule the manager uses (COTAL_TOOLS_DIR, else the checkout's
# .tools); it need not exist: tests that need it skip by its absence.
PI_CLI = (
    tools_dir() / "pi" / "node_modules" / "@mariozechner" / "pi-coding-agent" / "dist" / "cli.js"
)


@dataclass
class SharedBroker:
    url: str
    creds: str
    proc: subprocess.Popen[str]
    monitor: str = ""


def _served(tmp_path: Path, *flags: str) -> Iterator[SharedBroker]:
    store = tmp_path / "broker"
    proc = subprocess.Popen(
        [sys.executable, "-m", "manager.cli", "broker", "serve", "--store-dir", str(store)]
        + ["--json", *flags],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # As an operator serving a broker to `--server` roots turns its HTTP monitor on for
        # `--monitor` (off by default).
        env=cotal_env({"COTAL_BROKER_MONITOR": "127.0.0.1:0"}),
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise AssertionError(f"broker serve failed: {proc.stderr.read() if proc.stderr else ''}")
    info = json.loads(line)
    yield SharedBroker(info["url"], info["creds"], proc, info.get("monitor") or "")
    from tests.helpers import stop_broker

    stop_broker(proc)


@pytest.fixture
def shared_broker(tmp_path: Path) -> Iterator[SharedBroker]:
    """`cotal broker serve`: a broker that outlives any one root's mesh, as two hosts share one
    (with grants, as it serves by default; roots given its credential are one host to it)."""
    yield from _served(tmp_path)


@pytest.fixture
def bare_broker(tmp_path: Path) -> Iterator[SharedBroker]:
    """`cotal broker serve --no-grants`: for tests that play several holders through one
    connection, at the JetStream layer, which a broker with grants rightly refuses."""
    yield from _served(tmp_path, "--no-grants")


@pytest.fixture
def mesh(cli: Cli) -> Iterator[Cli]:
    """A mesh brought up with the real CLI: embedded broker + detached daemon."""
    cli.run("up", "--detach")
    yield cli
    if (cli.root / ".cotal" / "mesh.json").exists():
        cli.run("down", check=False)


@pytest.fixture
async def nats_cluster(tmp_path: Path) -> Any:
    """Three nats-server nodes clustered on 127.0.0.1, JetStream on, nkey auth required."""
    from tests.cluster import Cluster

    with Cluster(tmp_path / "cluster") as cluster:
        await cluster.wait_ready()
        yield cluster
