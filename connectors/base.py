"""The connector contract.

A connector turns launch options into a `LaunchSpec` (argv, a minimal environment, where the
harness writes its session pointer and which files make up its session store) and drives the
running harness over its stdio with a `Driver`. The continuity class is derived from the
declared capability flags only: never from a connector's name, never from probing a live host.

A connector also owns what is known about its harness: its configuration (`config_type`, the
`[agents.<name>]` table of cotal.toml as one strict struct) and what `cotal doctor` says of the
harness on this host (`doctor`).

What the connectors share beyond the contract lives beside it: `launchkit` (launch options and
the seat's files), `driverkit` (stdio driver plumbing), `doctorkit` (the doctor's probes) and
`privatefs` (private files).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec
from anyio import TASK_STATUS_IGNORED
from anyio.abc import TaskStatus

from protocol.errors import Refusal
from protocol.move import harness_version_key
from protocol.refusals import Code

if TYPE_CHECKING:
    # The doctor's report and pins live with its probes; only named here, in a signature.
    from connectors.doctorkit import HarnessCheck, Pins

ContinuityClass = Literal["exact", "fork", "fresh", "drain-only"]
Anchor = Literal["cwd", "workspace-root", "home"]
TurnStatus = Literal["ok", "error", "aborted", "unknown", "provider-unavailable"]
# The status of a turn that reached no answer because the harness's model provider could not be
# reached or would not serve (`TurnOutcome` says what it promises).
PROVIDER_UNAVAILABLE: TurnStatus = "provider-unavailable"


@dataclass(frozen=True)
class Capabilities:
    supports_resume: bool = False
    supports_session_continuation: bool = False
    supports_fresh_start: bool = False
    supports_prompt: bool = False
    # Whether the harness can call the mesh (a tool its model is given, or calls its driver
    # carries): a seat of one that cannot is refused `--allow-send` and `--allow-post` at the
    # spawn, since a permission it can never use would only look like one.
    mesh_tool: bool = True


def refuse_mesh_without_tool(
    agent: str, caps: Capabilities, allow_send: Sequence[str], allow_post: Sequence[str]
) -> None:
    if caps.mesh_tool or not (allow_send or allow_post):
        return
    given = (("--allow-send", allow_send), ("--allow-post", allow_post))
    flags = [flag for flag, values in given if values]
    raise Refusal(
        Code.UNSUPPORTED,
        f"agent {agent!r} has no mesh tool, so its seat could never use {' or '.join(flags)}",
        f"spawn it without {' and '.join(flags)}, or use an agent that has one (docs/mesh.md)",
    )


def continuity_class(caps: Capabilities) -> ContinuityClass:
    """First match wins: continuation -> exact, resume -> fork, fresh start -> fresh."""
    if caps.supports_session_continuation:
        return "exact"
    if caps.supports_resume:
        return "fork"
    if caps.supports_fresh_start:
        return "fresh"
    return "drain-only"


@dataclass(frozen=True)
class StoreDecl:
    """A session-store location the cut must capture, as an anchor plus a relative path.

    Anchors keep a checkpoint portable: the destination resolves `relpath` against its own
    cwd, workspace root or home, never against an absolute path of the source host.
    """

    anchor: Anchor
    relpath: str


def store_scratch(connector: object) -> frozenset[str]:
    """The top-level entries of each of the connector's session stores that the harness keeps
    only for the run in progress (its `store_scratch` class attribute, default none).

    The cut never carries them and never looks inside them, so a harness's links to its own
    binary or its lock files there neither refuse the cut nor travel; every other entry of the
    store is walked, and a symlink refused, as before."""
    names: tuple[str, ...] = getattr(connector, "store_scratch", ())
    for name in names:
        # One component of the store's own listing: a deeper or an escaping name would hide
        # what lies below or beside it from the cut's symlink check.
        if not name or name in (".", "..") or "/" in name or "\x00" in name:
            raise ValueError(
                f"connector {getattr(connector, 'name', connector)!r} declares the scratch "
                f"entry {name!r}, which is not one name of its store's top level"
            )
    return frozenset(names)


@dataclass(frozen=True)
class LaunchOpts:
    space: str
    name: str
    lifecycle_uid: str
    workspace_root: Path
    cwd: Path
    session_pointer_path: Path
    prompt: str | None = None
    model: str | None = None
    # Reopen exactly this session (crash restart or exact resume); set only by the manager.
    continue_session: str | None = None
    # Fork from this session id: a new session carrying the history; the source is untouched.
    resume: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)
    # Where the manager serves this seat's mesh socket (`COTAL_MESH_DIR`); None outside a
    # manager (a connector's own tests), where no tool has a mesh to call.
    mesh_dir: Path | None = None


@dataclass(frozen=True)
class LaunchSpec:
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    session_pointer_path: Path | None = None
    session_store: tuple[StoreDecl, ...] = ()
    # Session id the manager expects the harness to report (exact continuation proof).
    expected_session_id: str | None = None
    # A first prompt the driver delivers as turn 0, for harnesses that cannot take one in argv.
    initial_prompt: str | None = None
    # Names of env variables whose values are secrets: never logged, never persisted.
    secret_env: tuple[str, ...] = ()


@dataclass(frozen=True)
class TurnOutcome:
    """How one delivered prompt ended. Only `ok` is a clean terminal boundary worth an ack.

    `provider-unavailable` is a terminal boundary too, with no reply: the harness's model
    provider was unreachable (connection refused, reset, timed out) or would not serve for now
    (rate limited, overloaded, a gateway down: HTTP 408, 429, 502, 503, 504, 529), after the
    harness's own retries if it has any. The turn did not fail by itself and no provider call of
    it is live, so the harness needs no restart and the manager hands it the same message again
    after a backoff, without counting it against the message's delivery cap. A driver reports
    it only for an end its harness attributes to the provider (`driverkit.unavailable_outcome`);
    any other failure stays `error`, which does count."""

    status: TurnStatus
    reply: str = ""
    detail: str = ""
    # What the harness reported its model calls of this turn used, when it reports it; None
    # when it said nothing. Not part of the outcome's identity: two turns that ended alike are
    # equal whatever they cost.
    usage: TurnUsage | None = field(default=None, compare=False)


@dataclass(frozen=True)
class TurnUsage:
    """The tokens one turn's model calls used, as the harness reported them (summed over the
    turn's calls): uncached input, output, and the input read from or written to the provider's
    prompt cache where the harness reports those (0 where it does not). `model` is the model
    the harness named for the turn, when it named one. Counts are the harness's own; cotal
    never estimates a token."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    model: str | None = None

    def plus(self, other: TurnUsage) -> TurnUsage:
        """Both calls' tokens; the later call's model when it names one."""
        return TurnUsage(
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cache_read_tokens + other.cache_read_tokens,
            self.cache_write_tokens + other.cache_write_tokens,
            other.model or self.model,
        )


def token_count(value: object) -> int:
    """A token count a harness reported: a non-negative integer, else 0 (a harness that says
    nothing, or something else, is not taken to have used tokens it did not name)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        return 0
    return value


def model_name(value: object) -> str | None:
    """A model name a harness reported, when it is a short non-empty string."""
    if isinstance(value, str) and 0 < len(value) <= MODEL_NAME_MAX and value.isprintable():
        return value
    return None


# The longest model name a usage record keeps (longer is not a model's name).
MODEL_NAME_MAX = 200


def redelivery_notice(delivery: int) -> str:
    """The line a harness's model reads first when a message comes to it again."""
    return (
        f"[cotal: delivery {delivery} of this message; an earlier delivery may already have "
        "acted on it (tool calls, edits, messages sent), so check before acting again]"
    )


def framed_prompt(text: str, delivery: int) -> str:
    """The text a harness is given for delivery `delivery` of a message: from the second on it
    opens with `redelivery_notice`, because pi and Claude Code would otherwise run the turn's
    tool calls again with no word that they may have run. A slash command is left as it is: the
    notice in front would turn it into text for the model."""
    if delivery <= 1 or text.startswith("/"):
        return text
    return f"{redelivery_notice(delivery)}\n\n{text}"


class Driver(Protocol):
    async def run(self, *, task_status: TaskStatus[None] = TASK_STATUS_IGNORED) -> None:
        """Pump the harness's stdout. The caller starts it with `await tg.start(driver.run)` in
        the seat's task group; `started()` is signalled once prompt/get_state may be used."""
        ...

    async def prompt(self, text: str, *, message_id: str, delivery: int = 1) -> TurnOutcome:
        """Deliver `text` as one turn; `delivery` is how many times this message has now been
        delivered (1 the first time), which the driver passes on to the harness."""
        ...

    async def get_state(self) -> str | None:
        """The session id the running harness reports, or None before it has one."""
        ...

    def launch_prompt_running(self) -> bool:
        """Whether the launch's own prompt (`LaunchSpec.initial_prompt`, sent by the driver, not
        through the inbox) is still to be sent or has not reached its turn's end."""
        ...

    async def launch_prompt_settled(self) -> None:
        """Returns once the launch's prompt has ended, or at once when there is none: a cut
        waits here as for an inbox turn, since nothing would bring this prompt back."""
        ...

    async def aclose(self) -> None: ...


class MeshPort(Protocol):
    """The manager's end of one seat's mesh calls (docs/mesh.md): the call's JSON in, the
    result's JSON out. The manager binds a port to the seat whose channel it serves, so the
    caller is never named by the call itself."""

    async def __call__(self, call: bytes) -> bytes: ...


def attach_mesh(driver: object, port: MeshPort) -> bool:
    """Give a driver that carries mesh calls (its `carries_mesh` is true) the seat's port;
    False for a driver of a harness that has no mesh tool yet."""
    if not getattr(driver, "carries_mesh", False):
        return False
    driver.mesh_port = port  # type: ignore[attr-defined]
    return True


class ByteSend(Protocol):
    async def send(self, item: bytes) -> None: ...

    async def aclose(self) -> None: ...


class ByteReceive(Protocol):
    async def receive(self, max_bytes: int = 65536) -> bytes: ...


# -- the harness versions a connector was measured against ---------------------------------------

_NUMERIC = re.compile(r"\d+(?:\.\d+)*")


def _numeric(key: str) -> tuple[int, ...] | None:
    return tuple(int(p) for p in key.split(".")) if _NUMERIC.fullmatch(key) else None


@dataclass(frozen=True)
class MeasuredVersions:
    """The versions of a harness whose session format its connector was measured against: each
    exact version, and each inclusive range `LOW..HIGH` of plain dotted numbers (a pre-release
    such as `0.74.0-rc1` is admitted only by name)."""

    exact: frozenset[str] = frozenset()
    ranges: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()
    spelled: tuple[str, ...] = ()

    @classmethod
    def of(cls, declared: Sequence[str]) -> MeasuredVersions:
        exact: set[str] = set()
        ranges: list[tuple[tuple[int, ...], tuple[int, ...]]] = []
        for item in declared:
            low, sep, high = item.partition("..")
            if sep:
                lo, hi = _numeric(low.strip()), _numeric(high.strip())
                if lo is None or hi is None or lo > hi:
                    raise ValueError(f"session version range {item!r} is not LOW..HIGH")
                ranges.append((lo, hi))
            else:
                exact.add(harness_version_key(item))
        return cls(frozenset(exact), tuple(ranges), tuple(dict.fromkeys(declared)))

    def admits(self, version: str) -> bool:
        key = harness_version_key(version)
        if key in self.exact:
            return True
        number = _numeric(key)
        return number is not None and any(lo <= number <= hi for lo, hi in self.ranges)

    def __str__(self) -> str:
        return ", ".join(self.spelled)


def measured_versions(connector: object, pins: Pins) -> MeasuredVersions | None:
    """The harness versions `connector` declares it was measured against: a built-in harness's
    own version (`builtin_version`), else its pinned version in `harnesses.json` (the pin of its
    own name) and any version or range its `session_versions` class attribute adds. None when it
    declares none (no pin, no list: jcode, whose session never travels); a destination then
    compares the two hosts' versions with each other, as a move's probe always did."""
    builtin = getattr(connector, "builtin_version", None)
    if builtin is not None:
        return MeasuredVersions.of([builtin()])
    declared: list[str] = []
    pin = pins.found.get(getattr(connector, "name", ""))
    if pin is not None:
        declared.append(pin.version)
    declared.extend(getattr(connector, "session_versions", ()))
    return MeasuredVersions.of(declared) if declared else None


def harness_check(connector: object, config: Mapping[str, Any], pins: Pins) -> HarnessCheck:
    """The harness as the cut records it and a destination compares it: a built-in one is this
    very cotal, at the version cotal declares for it (`builtin_version`), with nothing to run;
    any other is what its connector's `doctor` finds."""
    from connectors.doctorkit import HarnessCheck

    builtin = getattr(connector, "builtin_version", None)
    if builtin is not None:
        return HarnessCheck(installed=True, path="built-in", version=builtin(), usable=True)
    check: HarnessCheck = connector.doctor(config, pins)  # type: ignore[attr-defined]
    return check


class Connector(Protocol):
    name: str
    capabilities: Capabilities
    # The whole `[agents.<name>]` table: a msgspec struct with forbid_unknown_fields, decoded
    # strictly when cotal.toml is read and again at every launch.
    config_type: type[msgspec.Struct]

    def build_launch(self, opts: LaunchOpts) -> LaunchSpec: ...

    def make_driver(self, stdin: ByteSend, stdout: ByteReceive, spec: LaunchSpec) -> Driver: ...

    def doctor(self, config: Mapping[str, Any], pins: Pins) -> HarnessCheck:
        """Whether this host can run the harness with `config`: a quick `--version` run with an
        empty private home and the harness's offline switches, so the check neither reads nor
        writes the operator's own harness state; never a secret in what it reports."""
        ...


# -- moving a session to another path -------------------------------------------------------------


@dataclass(frozen=True)
class Relocation:
    """A seat resumed at other absolute paths: its cwd and workspace root before and after, and
    the whole prefix map (longest source prefix first) for any other path its session names.

    Paths are lexical and absolute; nothing here touches the disk."""

    old_cwd: Path
    new_cwd: Path
    old_root: Path
    new_root: Path
    pairs: tuple[tuple[Path, Path], ...] = ()

    @property
    def moves(self) -> bool:
        return self.old_cwd != self.new_cwd or self.old_root != self.new_root

    def map(self, path: Path) -> Path | None:
        """`path` carried through the longest prefix that holds it, or None."""
        for old, new in self.pairs:
            if path.is_relative_to(old):
                return new / path.relative_to(old)
        return None


@dataclass(frozen=True)
class FileMove:
    """Where one store file lands, relative to its store, and how its first line is rewritten
    (None: the bytes travel unchanged). A rewrite takes the line without its newline."""

    relpath: str
    head: Callable[[bytes], bytes] | None = None


@dataclass(frozen=True)
class SessionMove:
    """What a connector does to carry a seat's session to a `Relocation`: each store file's
    place and rewrite, and, when the harness cannot continue the session there, the class it can
    honestly promise instead (with why)."""

    files: Mapping[str, FileMove] = field(default_factory=dict)
    continuity: ContinuityClass | None = None
    why: str = ""


class Relocating(Protocol):
    """The optional hook: a connector whose session store names absolute paths."""

    def relocate_session(
        self, files: Sequence[str], reloc: Relocation, session_id: str | None
    ) -> SessionMove:
        """`files` are the store-relative paths of the seat's carried store files."""
        ...


def relocate_session(
    connector: object, files: Sequence[str], reloc: Relocation, session_id: str | None
) -> SessionMove:
    """The connector's move for its session, or no change for a connector whose store names no
    path (scribe) or that has no hook."""
    hook = getattr(connector, "relocate_session", None)
    if hook is None or not reloc.moves:
        return SessionMove()
    move: SessionMove = hook(files, reloc, session_id)
    return move
