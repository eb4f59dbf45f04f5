"""A resume on a root with no broker store yet starts its embedded broker beside admission
(docs/design.md, decision 23): a refusal must still leave that root exactly as it found it, with
no broker left running, and a root that already has a store must never see its broker started
by a refused resume. Real cuts, a real nats-server and real git."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from manager.checkpoint.reader import read_seat_checkpoint
from tests.ckpt import Cut, make_cut
from tests.conftest import Cli, SharedBroker

pytestmark = [pytest.mark.usefixtures("isolated_home")]

STARTING = "starting the embedded broker from this root's store"


@pytest.fixture
def cut(cli: Cli, shared_broker: SharedBroker, tmp_path: Path) -> Cut:
    return make_cut(cli, shared_broker, tmp_path / "ckpt")


def listing(root: Path) -> dict[str, tuple[int, bytes | None]]:
    """Every path under `root` with its mode and, for a file, its bytes."""
    out: dict[str, tuple[int, bytes | None]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            st = path.lstat()
            data = path.read_bytes() if stat.S_ISREG(st.st_mode) else None
            out[str(path.relative_to(root))] = (st.st_mode, data)
    return out


def processes_naming(needle: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            except OSError:
                continue
            if needle.encode() in cmdline:
                pids.append(int(entry))
    return pids


def flip_store_byte(copy: Path) -> str:
    """One byte of the seat's carried session store changed: gate 1 refuses it by name."""
    seat = copy / "scribe1"
    path = seat / read_seat_checkpoint(seat).session.store[0].file.file
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return str(path)


def new_host(cut: Cut, tmp_path: Path) -> Cli:
    """A new host that trusts the source: a control directory, but no broker store yet."""
    dest = Cli(tmp_path / "dest")
    dest.root.mkdir()
    dest.run("trust", "add", cut.signer_key, "--name", "source")
    return dest


def test_a_refused_admission_takes_back_the_broker_started_beside_it(
    cut: Cut, tmp_path: Path
) -> None:
    dest = new_host(cut, tmp_path)
    before = listing(dest.root)
    tampered = flip_store_byte(cut.copy)

    proc = dest.run("up", "--restore", str(cut.copy), check=False)

    assert proc.returncode == 2, proc.stderr
    assert f"cotal: checkpoint integrity: {tampered} hashes to" in proc.stderr, proc.stderr
    # The broker did start beside admission, and the refusal took it back whole.
    assert proc.stderr.index(STARTING) < proc.stderr.index("checkpoint integrity"), proc.stderr
    assert listing(dest.root) == before
    assert processes_naming(str(dest.root / ".cotal" / "nats")) == []


def test_a_root_with_a_store_keeps_it_untouched_when_admission_refuses(
    cut: Cut, tmp_path: Path
) -> None:
    dest = Cli(tmp_path / "dest")
    dest.root.mkdir()
    dest.run("up", "--detach")
    dest.run("down")
    store = dest.root / ".cotal" / "nats"
    assert store.is_dir()
    before = listing(dest.root)
    tampered = flip_store_byte(cut.copy)

    proc = dest.run("up", "--restore", str(cut.copy), *cut.trust, check=False)

    assert proc.returncode == 2, proc.stderr
    assert f"cotal: checkpoint integrity: {tampered} hashes to" in proc.stderr, proc.stderr
    assert STARTING not in proc.stderr
    assert listing(dest.root) == before
    assert processes_naming(str(store)) == []


def test_an_admitted_resume_on_a_new_host_starts_its_broker_once(cut: Cut, tmp_path: Path) -> None:
    dest = new_host(cut, tmp_path)
    try:
        proc = dest.run("up", "--restore", str(cut.copy))
        assert proc.stderr.count(STARTING) == 1, proc.stderr
        assert proc.stderr.index(STARTING) < proc.stderr.index("sealed by"), proc.stderr
        [row] = dest.ps()
        assert (row["name"], row["state"]) == ("scribe1", "running")
        # One broker on the store, and no grant keeper: its own credential is its one host.
        store = dest.root / ".cotal" / "nats"
        assert len(processes_naming(f"{store}/server.conf")) == 1
        assert processes_naming(f"{store}/grants") == []
    finally:
        dest.run("down", check=False)
