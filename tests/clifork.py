"""The test suite's CLI calls, forked from an interpreter that has already imported cotal.

Why: the suite is CPU-bound on two cores, and most of its CPU went to Python starting and
importing cotal again for each of the thousands of `cotal ...` calls the tests make (measured:
two thirds of every sampled Python stack in a test run was inside an import). A call forked
from a warm interpreter skips that and nothing else: the child is a real process of its own,
with the test's argv, environment, working directory and pipes, that runs `manager.cli` the
way `python -m manager.cli` does (`runpy`, `__main__`) and leaves through the interpreter's
own exit (atexit, thread joins, flushes), so its exit status and output are what the exec'd
command's would be. What it does not exercise is the interpreter's start and cotal's imports;
`tests/integration/test_cli_conventions.py`, the wheel install test and every test that runs
`python -m manager.cli` itself (a `Popen` it signals, `-I`, `prlimit`) still start it cold,
and every process cotal starts (managers, seats, brokers) is exec'd as in production.

One server per pytest worker (`python -m tests.clifork SOCKET`), started on first use and gone
with the worker (it exits when its stdin, a pipe the worker holds, closes). A call is one
SOCK_SEQPACKET connection: the request (argv, environment, cwd) with the child's stdin, stdout
and stderr as passed descriptors; the server answers the child's pid, then its exit status
once it has reaped it (a pidfd per child in the same select loop: no threads, so forking
stays safe). `COTAL_TEST_CLI=exec` turns it off for a whole run.
"""

from __future__ import annotations

import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from manager import lean

MAX_REQUEST = 1 << 20
# What the CLI imports on its own, one command or another: loaded once here, before any fork.
PRELOAD = (
    "manager.cli.main",
    "manager.coord.cut",
    "manager.coord.restore",
    "manager.coord.mesh",
    "manager.coord.move",
    "manager.coord.verify",
    "manager.checkpoint.gitstate",
    "manager.broker.connection",
    "nats",
    "structlog",
)


# -- the server --------------------------------------------------------------------------------


def _serve(path: str) -> dict[str, Any]:
    """Answer calls until stdin closes; return only in a forked child, with its request."""
    # As each CLI process does before its command's imports (the console undoes it in its child).
    lean.without_console_libraries()
    for name in PRELOAD:
        __import__(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, "parent")
    server = os.getpid()
    print("ready", flush=True)
    while True:
        for key, _ in sel.select():
            try:
                request = _event(key, listener, sel)
            except Exception:
                if os.getpid() != server:
                    # A forked child never goes back to serving.
                    traceback.print_exc()
                    os._exit(1)
                # One call's failure is written down and the server goes on serving the rest.
                with open(os.path.join(os.path.dirname(path), "log"), "a") as log:
                    log.write(traceback.format_exc())
                continue
            if request is not None:
                return request


def _event(
    key: selectors.SelectorKey, listener: socket.socket, sel: selectors.BaseSelector
) -> dict[str, Any] | None:
    """One ready descriptor: the worker gone, a call to fork, or a child to reap."""
    if key.data == "parent":
        os._exit(0)
    if key.data == "accept":
        conn, _ = listener.accept()
        request = _fork(conn, sel)
        if request is not None:
            # The child keeps none of the server's descriptors: another call's
            # connection held open by a daemon this command starts would hold that
            # call's answer back.
            for other in list(sel.get_map().values()):
                if isinstance(other.data, tuple):
                    os.close(other.fd)
                    other.data[1].close()
            sel.close()
            listener.close()
            return request
        return None
    pid, conn = key.data
    sel.unregister(key.fileobj)
    os.close(key.fd)
    _, status = os.waitpid(pid, 0)
    try:
        conn.send(json.dumps({"status": os.waitstatus_to_exitcode(status)}).encode())
    except OSError:
        pass
    conn.close()
    return None


def _fork(conn: socket.socket, sel: selectors.BaseSelector) -> dict[str, Any] | None:
    msg, fds, _, _ = socket.recv_fds(conn, MAX_REQUEST, 3)
    if len(fds) != 3:
        for fd in fds:
            os.close(fd)
        conn.close()
        return None
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        conn.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        request: dict[str, Any] = json.loads(msg)
        return request
    for fd in fds:
        os.close(fd)
    conn.send(json.dumps({"pid": pid}).encode())
    sel.register(os.pidfd_open(pid), selectors.EVENT_READ, (pid, conn))
    return None


def _become(request: dict[str, Any]) -> None:
    """In the child: the test's cwd, environment and argv, then `python -m manager.cli`."""
    os.chdir(request["cwd"])
    # `python -m` puts the working directory first on sys.path.
    sys.path[0] = request["cwd"]
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = [str(Path(__file__).resolve().parent.parent / "manager/cli/__main__.py")]
    sys.argv += request["args"]
    runpy.run_module("manager.cli", run_name="__main__", alter_sys=True)


# -- the client --------------------------------------------------------------------------------

# The server's environment: the worker's as it was before any test changed it. Not a test's:
# a test's HOME or root in it would make the server one of the processes that test's clean-up
# kills (tests/helpers.py `processes_mentioning` reads each process's environment).
_BASE_ENV = dict(os.environ)
_lock = threading.Lock()
_server: tuple[subprocess.Popen[bytes], str] | None = None


def enabled() -> bool:
    return os.environ.get("COTAL_TEST_CLI", "fork") != "exec"


def _address() -> str:
    global _server
    with _lock:
        if _server is None or _server[0].poll() is not None:
            path = os.path.join(tempfile.mkdtemp(prefix="clifork-"), "s")
            proc = subprocess.Popen(
                [sys.executable, "-m", "tests.clifork", path],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                env={**_BASE_ENV, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
                cwd=Path(__file__).resolve().parent.parent,
            )
            assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
            _server = (proc, path)
        return _server[1]


def run(
    args: list[str],
    *,
    env: dict[str, str],
    cwd: Path,
    timeout: float,
    on_timeout: Callable[[int], str],
) -> subprocess.CompletedProcess[str]:
    """`cotal ARGS` as a forked child; on timeout, `on_timeout(pid)` says where it waited (it
    is then killed) and this fails with that."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    conn.connect(_address())
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    stdin = os.open(os.devnull, os.O_RDONLY)
    request = {"args": args, "env": env, "cwd": str(cwd)}
    socket.send_fds(conn, [json.dumps(request).encode()], [stdin, out_w, err_w])
    for fd in (stdin, out_w, err_w):
        os.close(fd)
    pid = json.loads(_answer(conn))["pid"]
    deadline = time.monotonic() + timeout
    out, err, expired = _read_both(out_r, err_r, deadline)
    where = ""
    if expired:
        where = on_timeout(pid)
        os.kill(pid, signal.SIGKILL)
        more_out, more_err, _ = _read_both(out_r, err_r, None)
        out, err = out + more_out, err + more_err
    status = json.loads(_answer(conn))["status"]
    conn.close()
    if expired:
        raise AssertionError(
            f"{' '.join(args)} timed out after {timeout:g}s; where it waited:\n"
            f"{err.decode(errors='replace')}\n{where}"
        )
    argv = [sys.executable, "-m", "manager.cli", *args]
    return subprocess.CompletedProcess(
        argv, status, out.decode(errors="replace"), err.decode(errors="replace")
    )


def _answer(conn: socket.socket) -> bytes:
    """The server's next answer; if it has none, what became of the server, for the failure."""
    try:
        data = conn.recv(4096)
    except OSError as exc:
        data, failed = b"", repr(exc)
    else:
        failed = "the connection closed"
    if data:
        return data
    proc, path = _server if _server is not None else (None, "")
    log = Path(os.path.dirname(path), "log")
    raise AssertionError(
        f"the CLI fork server gave no answer ({failed}); server exit status "
        f"{proc.poll() if proc is not None else None}; its log:\n"
        f"{log.read_text()[-4000:] if log.exists() else '(none)'}"
    )


def _read_both(out_r: int, err_r: int, deadline: float | None) -> tuple[bytes, bytes, bool]:
    """Both pipes to their ends, or until the deadline (then True, the pipes left open)."""
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    sel = selectors.DefaultSelector()
    for fd in chunks:
        sel.register(fd, selectors.EVENT_READ)
    open_fds = set(chunks)
    try:
        while open_fds:
            wait = None if deadline is None else deadline - time.monotonic()
            if wait is not None and wait <= 0:
                return b"".join(chunks[out_r]), b"".join(chunks[err_r]), True
            for key, _ in sel.select(wait):
                data = os.read(key.fd, 65536)
                if data:
                    chunks[key.fd].append(data)
                else:
                    sel.unregister(key.fd)
                    os.close(key.fd)
                    open_fds.discard(key.fd)
    finally:
        sel.close()
    return b"".join(chunks[out_r]), b"".join(chunks[err_r]), False


if __name__ == "__main__":
    _become(_serve(sys.argv[1]))
