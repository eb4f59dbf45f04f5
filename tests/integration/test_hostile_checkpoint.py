"""A checkpoint is a directory that came over the network: hostile until the gates say otherwise.

Every checkpoint here starts as a real cut (scribe seat, real git root, real nats-server) and is
then altered and re-signed, either by a key the destination never trusted or by the source's
own key (a trusted signer gone bad). Each must be refused by name at admission, before the
journal, custody or a single file moves: the destination tree, the temp HOME and custody at the
broker are compared before and after.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest

from manager import registry
from manager.checkpoint import admit
from manager.checkpoint.confine import SessionTarget, place_session_file
from manager.checkpoint.reader import read_seat_checkpoint
from manager.workspace.layout import Layout
from manager.workspace.trust import fingerprint, trusted_keys_for
from protocol.checkpoint import SeatCheckpoint, SessionFile
from protocol.errors import Refusal
from tests.ckpt import (
    Cut,
    broker_args,
    custody,
    file_ref,
    foreign_identity,
    make_cut,
    move_source_away,
    replace_agent,
    reseal,
    snapshot,
    source_identity,
)
from tests.conftest import Cli, SharedBroker
from tests.gitrepo import git, init_repo, write

pytestmark = [pytest.mark.anyio, pytest.mark.usefixtures("isolated_home")]

SEAT = "scribe1"
JOURNAL = Path(".cotal/maintenance/v1/journal.json")


@pytest.fixture
def cut(cli: Cli, shared_broker: SharedBroker, tmp_path: Path) -> Cut:
    c = make_cut(cli, shared_broker, tmp_path / "ckpt")
    move_source_away(c)
    return c


def home() -> Path:
    return Path(os.environ["HOME"])


def admit_here(root: Path, ckpt: Path, *, pins: Sequence[str] = ()) -> admit.Admission:
    """Integrity and identity exactly as a destination runs them, with no broker-side facts
    (no uid is live), against this root's trust."""
    layout = Layout.at(root)
    adm = admit.integrity(ckpt, trusted_keys=trusted_keys_for(layout, "main", pins))
    config = registry.load_config(layout.root)
    admit.identity(
        adm,
        space="main",
        root=layout.root,
        live_uids=set(),
        held_uids=set(),
        settings_for={a: registry.agent_settings(config, a) for a in registry.KNOWN},
        home=home(),
    )
    return adm


async def unchanged_everywhere(
    cut: Cut, act: Callable[[], Any], code: str, *contains: str
) -> Refusal:
    """`act` refuses with `code`, and the destination, HOME, the journal and custody are as they
    were (byte-identical trees, inode and mtime included)."""
    root_before, home_before = snapshot(cut.root), snapshot(home())
    with pytest.raises(Refusal) as err:
        act()
    assert err.value.code == code, err.value.text
    for text in contains:
        assert text in err.value.text, f"{text!r} not in {err.value.text!r}"
    assert snapshot(cut.root) == root_before
    assert snapshot(home()) == home_before
    assert not (cut.root / JOURNAL).exists()
    record, attempt = await custody(cut.broker, SEAT, cut.uid(), cut.attempt_id)
    assert record is not None and record["generation"] == 0 and "attemptId" not in record
    assert attempt is None
    return err.value


def store_entry(anchor: str, relpath: str) -> Callable[[SeatCheckpoint], SeatCheckpoint]:
    """The seat's first store file, re-aimed at `anchor`/`relpath`."""

    def edit(record: SeatCheckpoint) -> SeatCheckpoint:
        first = record.session.store[0]
        aimed = SessionFile(anchor=anchor, relpath=relpath, file=first.file)  # type: ignore[arg-type]
        session = msgspec.structs.replace(record.session, store=[aimed, *record.session.store[1:]])
        return msgspec.structs.replace(record, session=session)

    return edit


# -- the signer --------------------------------------------------------------------------------


async def test_an_unknown_signer_is_refused_until_the_operator_trusts_it(
    cli: Cli, cut: Cut, tmp_path: Path
) -> None:
    stranger = foreign_identity()
    forged = reseal(cut.copy, tmp_path / "forged", stranger, edit=lambda r: r)
    key = stranger.public_key_b64

    err = await unchanged_everywhere(
        cut,
        lambda: admit_here(cut.root, forged),
        "untrusted-signer",
        f"sealed by manager instance {stranger.instance_id} with key {key}",
        f"(fingerprint {fingerprint(key)})",
        f"`cotal trust add {key} --name {stranger.instance_id}`",
        "verify the key out of band",
        "`cotal status`",
    )
    assert "cotal trust add" in err.cure

    # The same through the CLI: exit 2, one JSON refusal, nothing changed.
    before = snapshot(cut.root)
    proc = cli.run("up", "--restore", str(forged), "--json", *broker_args(cut.broker), check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert json.loads(proc.stderr.splitlines()[-1])["code"] == "untrusted-signer"
    assert snapshot(cut.root) == before

    # The operator compares the fingerprint with the source and trusts the key: admitted.
    cli.run("trust", "add", key, "--name", stranger.instance_id)
    adm = admit_here(cut.root, forged)
    assert adm.manifest.signer is not None and adm.manifest.signer.public_key == key
    assert adm.confined[SEAT].cwd == cut.root.resolve()
    # A pin for one run works as well, and removing the key revokes it.
    cli.run("trust", "remove", stranger.instance_id)
    with pytest.raises(Refusal) as again:
        admit_here(cut.root, forged)
    assert again.value.code == "untrusted-signer"
    assert admit_here(cut.root, forged, pins=[key]).records[SEAT].lifecycle_uid == cut.uid()


async def test_the_genuine_cut_is_admitted_with_every_path_confined(cut: Cut) -> None:
    adm = admit_here(cut.root, cut.copy, pins=[cut.signer_key])
    confined = adm.confined[SEAT]
    root = cut.root.resolve()
    assert confined.cwd == root
    (pointer_entry, pointer), *stores = confined.sessions
    assert pointer == SessionTarget(root, f".cotal/sessions/scribe/{SEAT}-{cut.uid()}.json")
    assert stores and all(
        t.path.is_relative_to(root / ".cotal/sessions/scribe" / f"{SEAT}-{cut.uid()}.store")
        for _, t in stores
    )
    assert pointer_entry == adm.records[SEAT].session.pointer


# -- session files, cwd and stores, sealed by the trusted source key ---------------------------


def _own_key_reseal(cut: Cut, tmp_path: Path, **how: Any) -> Path:
    return reseal(
        cut.copy,
        tmp_path / "hostile",
        source_identity(cut.root.with_name(cut.root.name + ".src")),
        **how,
    )


@pytest.mark.parametrize(
    ("how", "code", "says"),
    [
        pytest.param(
            {"edit": store_entry("home", ".ssh/authorized_keys")},
            "session-outside-store",
            [".ssh/authorized_keys", "which is not a session store the seat declared"],
            id="home-ssh",
        ),
        pytest.param(
            {"edit": store_entry("home", ".bashrc")},
            "session-outside-store",
            [".bashrc"],
            id="home-bashrc",
        ),
        pytest.param(
            {"edit": store_entry("workspace-root", ".cotal/auth/evil.creds")},
            "session-outside-store",
            [".cotal/auth/evil.creds"],
            id="control-auth",
        ),
        pytest.param(
            {"edit": store_entry("workspace-root", ".git/hooks/pre-commit")},
            "unsafe-session-path",
            [".git/hooks/pre-commit", "inside a .git directory"],
            id="git-hook",
        ),
        pytest.param(
            {"edit": store_entry("cwd", "sub/.GIT/config")},
            "unsafe-session-path",
            ["inside a .git directory"],
            id="git-config-any-case",
        ),
        pytest.param(
            {
                "edit": store_entry("home", ".ssh/authorized_keys"),
                "plan": "declare-home-ssh",
            },
            # A store outside the source root has no place here unless the operator maps one.
            "cwd-unmapped",
            ["its session store", ".ssh", "is outside the source root", "no --map covers it"],
            id="home-ssh-declared-as-a-store",
        ),
        pytest.param(
            {
                "edit": store_entry("workspace-root", ".cotal/auth/evil.creds"),
                "plan": "declare-control-auth",
            },
            "unsafe-store",
            ["is inside the control directory but not the seat's own"],
            id="control-auth-declared-as-a-store",
        ),
        pytest.param(
            {"plan": "cwd-elsewhere"},
            "cwd-unmapped",
            ["elsewhere is outside the source root", "no --map covers it", "--map"],
            id="cwd-outside-root",
        ),
        pytest.param(
            {"plan": "cwd-in-control"},
            "cwd-outside-root",
            ["is inside the control directory"],
            id="cwd-in-control-dir",
        ),
        pytest.param(
            {"edit": "pointer-of-another-seat"},
            "session-outside-store",
            ["which is not the seat's pointer"],
            id="pointer-elsewhere",
        ),
    ],
)
async def test_a_trusted_signer_cannot_aim_a_write_outside_the_seat(
    cut: Cut, tmp_path: Path, how: dict[str, Any], code: str, says: list[str]
) -> None:
    root = cut.root.resolve()
    plans = {
        "declare-home-ssh": replace_agent(SEAT, session_stores=[str(home() / ".ssh")]),
        "declare-control-auth": replace_agent(SEAT, session_stores=[str(root / ".cotal/auth")]),
        "cwd-elsewhere": replace_agent(SEAT, cwd=str(tmp_path / "elsewhere")),
        "cwd-in-control": replace_agent(SEAT, cwd=str(root / ".cotal/auth")),
    }
    edits = {
        "pointer-of-another-seat": lambda r: msgspec.structs.replace(
            r,
            session=msgspec.structs.replace(
                r.session,
                pointer=msgspec.structs.replace(
                    r.session.pointer, relpath=".cotal/sessions/scribe/other-seat.json"
                ),
            ),
        )
    }
    kwargs = dict(how)
    if isinstance(kwargs.get("plan"), str):
        kwargs["plan"] = plans[kwargs["plan"]]
    if isinstance(kwargs.get("edit"), str):
        kwargs["edit"] = edits[kwargs["edit"]]
    hostile = _own_key_reseal(cut, tmp_path, **kwargs)
    err = await unchanged_everywhere(
        cut,
        lambda: admit_here(cut.root, hostile, pins=[cut.signer_key]),
        code,
        "admission refused at the identity gate",
        *says,
    )
    if how.get("plan") not in ("cwd-elsewhere", "declare-home-ssh"):
        assert "cotal's cut never records such a path" in err.cure
    else:
        # A path outside the source root is the operator's to place: the cure is a map.
        assert "pass --map OLD=NEW" in err.cure
    assert not (home() / ".ssh").exists() and not (home() / ".bashrc").exists()
    assert not (tmp_path / "elsewhere").exists()


async def test_a_symlink_on_the_way_to_a_session_file_refuses_at_admission(
    cut: Cut, tmp_path: Path
) -> None:
    """Nothing forged: the destination itself has `.cotal/sessions` pointing elsewhere."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (cut.root / ".cotal").mkdir(mode=0o700)
    os.symlink(elsewhere, cut.root / ".cotal/sessions")
    await unchanged_everywhere(
        cut,
        lambda: admit_here(cut.root, cut.copy, pins=[cut.signer_key]),
        "unsafe-session-path",
        f"{cut.root.resolve() / '.cotal/sessions'}, which is a symlink",
    )
    assert list(elsewhere.iterdir()) == []


def test_the_write_walks_without_following_a_symlink_a_restored_tree_carries(
    tmp_path: Path,
) -> None:
    """Checked again at the write: a symlink that appeared after admission (say, one the
    untracked archive restored) is refused, and nothing lands where it points."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "stores").mkdir(parents=True)
    outside.mkdir()
    os.symlink(outside, root / "stores/a")
    src = tmp_path / "store-0000.jsonl"
    src.write_bytes(b"{}\n")
    digest = hashlib.sha256(b"{}\n").hexdigest()
    with pytest.raises(Refusal) as err:
        place_session_file(src, SessionTarget(root, "stores/a/log.jsonl"), expected_sha256=digest)
    assert err.value.code == "unsafe-session-path" and "is a symlink" in err.value.message
    assert list(outside.iterdir()) == []
    # A plain path is walked from / the same way.
    with pytest.raises(Refusal):
        place_session_file(src, root / "stores/a/log.jsonl", expected_sha256=digest)
    assert list(outside.iterdir()) == []
    assert place_session_file(src, SessionTarget(root, "stores/b/log.jsonl")) == "placed"
    assert (root / "stores/b/log.jsonl").read_bytes() == b"{}\n"


# -- the repository half -------------------------------------------------------------------------


def _other_bundle(tmp_path: Path) -> Path:
    repo = tmp_path / "other-repo"
    init_repo(repo)
    write(repo / "evil.txt", "not the seat's history\n")
    git(repo, "add", "evil.txt")
    git(repo, "commit", "-q", "-m", "other")
    out = tmp_path / "other.bundle"
    subprocess.run(["git", "bundle", "create", "-q", str(out), "--all"], cwd=repo, check=True)
    return out


@pytest.mark.parametrize("kind", ["swapped-bundle", "base-not-in-bundle", "head-elsewhere"])
async def test_a_bundle_that_does_not_match_its_record_refuses_at_admission(
    cut: Cut, tmp_path: Path, kind: str
) -> None:
    dst = tmp_path / "hostile"
    edit: Callable[[SeatCheckpoint], SeatCheckpoint]
    if kind == "swapped-bundle":
        other = _other_bundle(tmp_path)

        def edit(r: SeatCheckpoint) -> SeatCheckpoint:
            bundle = dst / SEAT / r.repository.bundle.file
            bundle.write_bytes(other.read_bytes())
            repo = msgspec.structs.replace(r.repository, bundle=file_ref(bundle))
            return msgspec.structs.replace(r, repository=repo)

        code, says = "refs-mismatch", "carries other refs than the checkpoint recorded"
    elif kind == "base-not-in-bundle":

        def edit(r: SeatCheckpoint) -> SeatCheckpoint:
            repo = msgspec.structs.replace(r.repository, base="0123456789" * 4, head=None)
            return msgspec.structs.replace(r, repository=repo)

        code, says = "base-missing", f"does not carry the recorded base commit {'0123456789' * 4}"
    else:

        def edit(r: SeatCheckpoint) -> SeatCheckpoint:
            repo = msgspec.structs.replace(r.repository, base="0123456789" * 4)
            return msgspec.structs.replace(r, repository=repo)

        code, says = "refs-mismatch", "HEAD was on refs/heads/"
    src_key = source_identity(cut.root.with_name(cut.root.name + ".src"))
    reseal(cut.copy, dst, src_key, edit=edit)
    before = read_seat_checkpoint(dst / SEAT)
    assert before.signer is not None and before.signer.public_key == cut.signer_key
    await unchanged_everywhere(
        cut,
        lambda: admit_here(cut.root, dst, pins=[cut.signer_key]),
        code,
        "admission refused at the integrity gate",
        says,
    )


@pytest.mark.parametrize(
    "where",
    ["outside", "in-git", "in-control"],
)
async def test_the_tree_is_written_only_under_the_root_checked_again_at_the_write(
    tmp_path: Path, where: str
) -> None:
    from manager.checkpoint.restore import restore_repository
    from tests.unit.test_checkpoint_record import repository

    root = tmp_path / "root"
    root.mkdir()
    target = {
        "outside": tmp_path / "elsewhere",
        "in-git": root / "sub/.git/hooks",
        "in-control": root / ".cotal/auth",
    }[where]
    before = snapshot(tmp_path)
    with pytest.raises(Refusal) as err:
        await restore_repository(
            tmp_path / "no-checkpoint-needed",
            repository(),
            target,
            stamp="20261129T140000Z",
            confine_to=(root,),
        )
    assert err.value.code == "cwd-outside-root" and str(target) in err.value.message
    assert snapshot(tmp_path) == before


# -- the carried inbox: headers capped in count and bytes, memory bounded ---------------------

# Peak RSS above the same process's run on the genuine cut (an empty inbox). Gate 1 proves an
# inbox a line at a time while it hashes it (a line is at most INBOX_LINE_CAP), so a verify
# holds no more than a few lines whatever the inbox's size; the restore then reads each inbox
# whole and decodes it, holding the file and its messages (about 3x the file's bytes).
VERIFY_BOUND = 8 * 1024 * 1024
RESTORE_BOUND_PER_BYTE = 4

# The CLI runs under a small wrapper that reports its children's peak: a peak read in pytest's
# own child would start from pytest's size at the fork.
_MEASURED = (
    "import resource, subprocess, sys\n"
    "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
    "sys.stdout.write(p.stdout)\n"
    "sys.stderr.write(p.stderr)\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024, file=sys.stderr)\n"
    "sys.exit(p.returncode)\n"
)

_RESTORE_READ = (
    "import json, sys\n"
    "from pathlib import Path\n"
    "from manager.checkpoint import admit\n"
    "from manager.coord.admission import read_inboxes as _read_inboxes\n"
    "from protocol.errors import Refusal\n"
    "try:\n"
    "    adm = admit.integrity(Path(sys.argv[1]), trusted_keys=[sys.argv[2]])\n"
    "    inboxes = _read_inboxes(adm)\n"
    "    out = {'messages': {k: len(v.inbox) for k, v in inboxes.items()},\n"
    "           'headers': {k: sorted({len(m.headers) for m in v.inbox})\n"
    "                       for k, v in inboxes.items()}}\n"
    "except Refusal as exc:\n"
    "    out = {'code': exc.code, 'error': exc.text}\n"
    # VmHWM is this image's own peak; ru_maxrss would include the parent's at the fork.
    "hwm = next(l for l in open('/proc/self/status') if l.startswith('VmHWM:'))\n"
    "out['peak'] = int(hwm.split()[1]) * 1024\n"
    "print(json.dumps(out))\n"
)


def _maximal_headers(seq: int, *, per_message: int, count: int) -> dict[str, str]:
    """`count` headers, Nats-Msg-Id among them, whose JSON in inbox.jsonl is `per_message`
    bytes exactly."""
    from protocol.checkpoint import header_bytes

    headers = {"Nats-Msg-Id": f"m{seq:08d}"}
    headers.update({f"X-Pad-{i:02d}": "" for i in range(count - 1)})
    room = per_message - header_bytes(headers)
    keys = [k for k in headers if k.startswith("X-Pad-")]
    for i, key in enumerate(keys):
        headers[key] = "v" * (room // len(keys) + (1 if i < room % len(keys) else 0))
    assert header_bytes(headers) == per_message and len(headers) == count
    return headers


def carry_inbox(
    dst: Path,
    messages: int,
    *,
    per_message: int = 0,
    headers: Callable[[int], dict[str, str]] | None = None,
) -> Callable[[SeatCheckpoint], SeatCheckpoint]:
    """A record edit: the seat's inbox becomes `messages` messages with those headers, written
    as the cut writes inbox.jsonl, and its space record names them."""
    import base64

    from protocol.checkpoint import INBOX_FILE, CarriedMessage, encode_inbox

    def edit(r: SeatCheckpoint) -> SeatCheckpoint:
        state = r.space_state
        assert state is not None, "the cut carries the seat's space record"
        start = state.durable.start_seq
        prefix = state.durable.filter_subject.removesuffix(">")
        payload = base64.b64encode(b"hi").decode()
        path = dst / SEAT / INBOX_FILE
        with open(path, "wb") as f:
            for i in range(messages):
                line = CarriedMessage(
                    seq=start + i,
                    subject=f"{prefix}local.operator",
                    headers=headers(start + i)
                    if headers is not None
                    else _maximal_headers(start + i, per_message=per_message, count=32),
                    payload=payload,
                )
                f.write(encode_inbox([line]))
        last = max(state.durable.last_seq, start + messages - 1)
        durable = msgspec.structs.replace(state.durable, last_seq=last)
        space = msgspec.structs.replace(
            state,
            durable=durable,
            messages=messages,
            message_bytes=2 * messages,
            inbox=file_ref(path),
        )
        return msgspec.structs.replace(r, space_state=space)

    return edit


def measured_verify(cut: Cut, ckpt: Path) -> tuple[subprocess.CompletedProcess[str], int]:
    """`cotal checkpoint verify` as the operator runs it, and its peak RSS in bytes."""
    import sys

    from tests.conftest import cotal_env

    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            _MEASURED,
            sys.executable,
            "-m",
            "manager.cli",
            "checkpoint",
            "verify",
            str(ckpt),
            "--trust-signer",
            cut.signer_key,
            "--json",
            *broker_args(cut.broker),
            "--root",
            str(cut.root),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=cotal_env(),
        cwd=cut.root,
    )
    *rest, peak = proc.stderr.splitlines()
    proc.stderr = "\n".join(rest)
    return proc, int(peak)


def measured_restore_read(cut: Cut, ckpt: Path) -> dict[str, Any]:
    """Admission and the restore's own inbox read (`_read_inboxes`), in a child of its own."""
    import sys

    from tests.conftest import cotal_env

    proc = subprocess.run(
        [sys.executable, "-c", _RESTORE_READ, str(ckpt), cut.signer_key],
        capture_output=True,
        text=True,
        timeout=300,
        env=cotal_env(),
        cwd=cut.root,
    )
    assert proc.returncode == 0, proc.stderr
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


async def test_carried_headers_are_capped_and_the_inbox_is_read_in_bounded_memory(
    cut: Cut, tmp_path: Path
) -> None:
    from protocol.checkpoint import (
        INBOX_FILE,
        MAX_CARRIED_HEADER_BYTES,
        MAX_CARRIED_HEADERS,
        MAX_HEADER_CHARS,
        MAX_MESSAGE_HEADER_BYTES,
    )

    source = source_identity(cut.root.with_name(cut.root.name + ".src"))
    base_verify, verify_floor = measured_verify(cut, cut.copy)
    assert base_verify.returncode == 0, base_verify.stderr
    restore_floor = measured_restore_read(cut, cut.copy)["peak"]

    # 1,000 messages at the caps (32 headers, 8 KiB of them each): admitted, and read within
    # the bound.
    full = tmp_path / "full"
    reseal(
        cut.copy, full, source, edit=carry_inbox(full, 1000, per_message=MAX_MESSAGE_HEADER_BYTES)
    )
    inbox_bytes = (full / SEAT / INBOX_FILE).stat().st_size
    assert inbox_bytes > 1000 * MAX_MESSAGE_HEADER_BYTES
    proc, peak = measured_verify(cut, full)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["admitted"] is True
    assert peak - verify_floor < VERIFY_BOUND, (peak, verify_floor)
    read = measured_restore_read(cut, full)
    assert read["messages"] == {SEAT: 1000} and read["headers"] == {SEAT: [MAX_CARRIED_HEADERS]}
    assert read["peak"] - restore_floor < RESTORE_BOUND_PER_BYTE * inbox_bytes, (
        read["peak"],
        restore_floor,
        inbox_bytes,
    )

    # One byte more of headers in one message: refused by name, at gate 1, verify and restore.
    over = tmp_path / "over-one"
    reseal(
        cut.copy,
        over,
        source,
        edit=carry_inbox(over, 1000, per_message=MAX_MESSAGE_HEADER_BYTES + 1),
    )
    path = over / SEAT / INBOX_FILE
    proc, peak = measured_verify(cut, over)
    assert proc.returncode == 2, proc.stderr
    doc = json.loads(proc.stderr.splitlines()[-1])
    assert doc["code"] == "inbox-too-large", doc
    assert (
        f"carried inbox {path}: {INBOX_FILE} line 1: message " in doc["error"]
        and f"carries {MAX_MESSAGE_HEADER_BYTES + 1} bytes of headers, more than the "
        f"{MAX_MESSAGE_HEADER_BYTES} a message may"
        in doc["error"]
    ), doc
    read = measured_restore_read(cut, over)
    assert read["code"] == "inbox-too-large" and "line 1:" in read["error"], read

    # The inbox: 1,000 messages of 32 headers at the old per-header cap (4 KiB each,
    # 128 KiB a message, 124 MiB in all). Refused at its first line; verify stays in bound.
    old = tmp_path / "old-caps"
    reseal(
        cut.copy,
        old,
        source,
        edit=carry_inbox(
            old,
            1000,
            headers=lambda seq: {
                "Nats-Msg-Id": f"m{seq:08d}",
                **{
                    f"X-Pad-{i:02d}": "v" * (MAX_HEADER_CHARS - len("X-Pad-00"))
                    for i in range(MAX_CARRIED_HEADERS - 1)
                },
            },
        ),
    )
    assert (old / SEAT / INBOX_FILE).stat().st_size > 120 * 1024 * 1024
    proc, peak = measured_verify(cut, old)
    assert proc.returncode == 2 and "inbox-too-large" in proc.stderr, proc.stderr
    assert "line 1: message" in proc.stderr
    assert peak - verify_floor < VERIFY_BOUND, (peak, verify_floor)
    read = measured_restore_read(cut, old)
    assert read["code"] == "inbox-too-large", read
    assert read["peak"] - restore_floor < VERIFY_BOUND, (read["peak"], restore_floor)

    # Every message within its own cap, but 16 MiB of headers in all reached part-way: refused
    # at the line that passes it, having held no more than a line.
    many = tmp_path / "many"
    n = MAX_CARRIED_HEADER_BYTES // MAX_MESSAGE_HEADER_BYTES + 200
    reseal(cut.copy, many, source, edit=carry_inbox(many, n, per_message=MAX_MESSAGE_HEADER_BYTES))
    proc, peak = measured_verify(cut, many)
    assert proc.returncode == 2, proc.stderr
    doc = json.loads(proc.stderr.splitlines()[-1])
    line = MAX_CARRIED_HEADER_BYTES // MAX_MESSAGE_HEADER_BYTES + 1
    assert doc["code"] == "inbox-too-large", doc
    assert (
        f"{INBOX_FILE} line {line}: the headers of messages up to " in doc["error"]
        and f"are {line * MAX_MESSAGE_HEADER_BYTES} bytes, more than the "
        f"{MAX_CARRIED_HEADER_BYTES} an inbox may carry"
        in doc["error"]
    ), doc
    assert peak - verify_floor < VERIFY_BOUND, (peak, verify_floor)
