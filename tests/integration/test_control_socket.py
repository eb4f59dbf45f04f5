"""The control socket refuses every unauthenticated or malformed caller and stays up."""

from __future__ import annotations

import json
import os
import socket
import stat
import struct
import subprocess

from tests.conftest import Cli
from tests.helpers import frame


def _connect(cli: Cli) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(str(cli.root / ".cotal" / "manager.sock"))
    return s


def _token(cli: Cli) -> str:
    return (cli.root / ".cotal" / "auth" / "control.token").read_text().strip()


def _closed_without_reply(s: socket.socket) -> bool:
    return s.recv(65536) == b""


def _read_reply(s: socket.socket) -> dict:
    head = b""
    while len(head) < 4:
        head += s.recv(4 - len(head))
    (n,) = struct.unpack(">I", head)
    body = b""
    while len(body) < n:
        body += s.recv(n - len(body))
    return json.loads(body)


def _hello(s: socket.socket, token: str) -> dict:
    s.sendall(frame(json.dumps({"op": "hello", "token": token}).encode()))
    return _read_reply(s)


def test_socket_and_directories_are_private(mesh: Cli) -> None:
    control = mesh.root / ".cotal"
    assert stat.S_IMODE(os.lstat(control).st_mode) == 0o700
    assert stat.S_IMODE(os.lstat(control / "manager.sock").st_mode) == 0o600
    assert stat.S_IMODE(os.lstat(control / "auth").st_mode) == 0o700
    for f in (control / "auth").iterdir():
        if f.is_file():
            assert stat.S_IMODE(os.lstat(f).st_mode) == 0o600, f


def test_wrong_missing_and_early_frames_are_closed_without_reply(mesh: Cli) -> None:
    with _connect(mesh) as s:
        s.sendall(frame(json.dumps({"op": "hello", "token": "0" * 64}).encode()))
        assert _closed_without_reply(s)
    with _connect(mesh) as s:
        s.sendall(frame(b'{"op":"hello"}'))
        assert _closed_without_reply(s)
    with _connect(mesh) as s:
        s.sendall(frame(b'{"id":1,"op":"ps","args":{}}'))
        assert _closed_without_reply(s)
    with _connect(mesh) as s:
        s.sendall(struct.pack(">I", 64 * 1024 * 1024))
        assert _closed_without_reply(s)
    # The daemon is still up and still answers an authenticated caller.
    assert mesh.json("status")["state"] == "active"


def test_oversized_frame_after_hello_closes_connection(mesh: Cli) -> None:
    with _connect(mesh) as s:
        assert _hello(s, _token(mesh))["ok"] is True
        s.sendall(struct.pack(">I", 2 * 1024 * 1024))
        assert _closed_without_reply(s)
    assert mesh.json("status")["state"] == "active"


def test_unknown_op_and_unknown_field_are_refused_by_name(mesh: Cli) -> None:
    with _connect(mesh) as s:
        assert _hello(s, _token(mesh))["ok"] is True
        s.sendall(frame(b'{"id":7,"op":"format-disk","args":{}}'))
        reply = _read_reply(s)
        assert reply["id"] == 7 and reply["ok"] is False
        assert reply["error"]["code"] == "unknown-op"
        assert "unknown op 'format-disk'" in reply["error"]["message"]
        s.sendall(frame(b'{"id":8,"op":"spawn","args":{"name":"a","sneaky":true}}'))
        reply = _read_reply(s)
        assert reply["ok"] is False and reply["error"]["code"] == "malformed"
        assert "unknown field `sneaky`" in reply["error"]["message"]
        s.sendall(frame(b'{"id":9,"op":"ps","args":{},"extra":1}'))
        reply = _read_reply(s)
        assert reply["ok"] is False and "unknown field `extra`" in reply["error"]["message"]
        # The same connection keeps working after refusals.
        s.sendall(frame(b'{"id":10,"op":"ps","args":{}}'))
        assert _read_reply(s) == {"id": 10, "ok": True, "result": []}


NOBODY_CLIENT = r"""
import json, socket, struct, sys
path, token = sys.argv[1], sys.stdin.read().strip()
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(10)
try:
    s.connect(path)
except PermissionError:
    print("EACCES"); sys.exit(0)
body = json.dumps({"op": "hello", "token": token}).encode()
# The server may close before, during or after our send; all of those are "closed".
try:
    s.sendall(struct.pack(">I", len(body)) + body)
    data = s.recv(65536)
except (BrokenPipeError, ConnectionResetError):
    data = b""
print("CLOSED" if data == b"" else "ANSWERED")
"""


def _as_nobody(cli: Cli) -> str:
    proc = subprocess.run(
        ["/usr/bin/python3", "-c", NOBODY_CLIENT, str(cli.root / ".cotal" / "manager.sock")],
        input=_token(cli),
        capture_output=True,
        text=True,
        timeout=30,
        user="nobody",
        group="nogroup",
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()


def test_another_uid_is_refused_even_with_the_token(mesh: Cli) -> None:
    # With the directory and socket private, another uid cannot even connect.
    assert _as_nobody(mesh) == "EACCES"
    # Loosen the file modes to reach the second lock: SO_PEERCRED refuses a foreign uid even
    # when it presents the right token.
    control = mesh.root / ".cotal"
    sock = control / "manager.sock"
    opened = [mesh.root, *mesh.root.parents]
    modes = {p: stat.S_IMODE(os.lstat(p).st_mode) for p in [*opened, control, sock]}
    try:
        for p in opened:
            os.chmod(p, modes[p] | 0o011)
        os.chmod(control, 0o711)
        os.chmod(sock, 0o666)
        assert _as_nobody(mesh) == "CLOSED"
        log = (control / "logs" / "manager.log").read_text()
        assert '"peer_uid": 65534' in log and "peer uid mismatch" in log
    finally:
        for p, m in modes.items():
            os.chmod(p, m)
    assert mesh.json("status")["state"] == "active"


def test_a_client_gone_before_the_hello_reply_leaves_the_manager_up(mesh: Cli) -> None:
    """A coordinator killed, or a status probe that gave up, right after its hello: the reply
    meets a closed socket, which ends that connection and never the daemon (CI saw a manager
    die of exactly this)."""
    pid = mesh.json("status")["pid"]
    for _ in range(20):
        s = _connect(mesh)
        s.sendall(frame(json.dumps({"op": "hello", "token": _token(mesh)}).encode()))
        s.close()
    status = mesh.json("status")
    assert status["pid"] == pid and status["state"] == "active"
