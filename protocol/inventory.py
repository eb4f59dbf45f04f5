"""The resume inventory: what the cut records about every seat so a resume can re-adopt it.

It carries no secret and no prompt, and one parser serves both ends, so an inventory a resume
would refuse fails at prepare (docs/design.md, "The core modules, in detail").
"""

from __future__ import annotations

import hashlib
import posixpath
from typing import Annotated, Final, Literal, NamedTuple, TypeVar

import msgspec

from protocol.codec import encode_json
from protocol.errors import DecodeError, Refusal
from protocol.meshcall import AllowSend, Channels
from protocol.names import (
    MAX_SEATS,
    AttemptIdField,
    DependencyKindField,
    InstanceIdField,
    LabelField,
    LifecycleUidField,
    SeatNameField,
    Sha256Field,
    SpaceField,
    WordField,
    check_attempt_id,
    check_new_seat_name,
)
from protocol.refusals import Code

INVENTORY_V1: Final = "cotal-manager-resume/v1"
INVENTORY_V2: Final = "cotal-manager-resume/v2"
SUPPORTED_VERSIONS = (INVENTORY_V1, INVENTORY_V2)
INVENTORY_CAP = 512 * 1024
MAX_DEPENDENCIES = 16
MAX_SESSION_STORES = 64
MAX_OPTION_KEYS = 64
# The seat-level capacity is the manager's: an inventory the manager could not hold is refused
# before any seat is looked at.
MAX_INVENTORY_SEATS = MAX_SEATS

_WHAT = "resume inventory"
_CURE_SHAPE = "re-run the cut so the manager writes the inventory; never edit it by hand"

# The token rules are `protocol.names`'s; the names here are the ones the records use.
Label = LabelField
Token = WordField
SeatName = SeatNameField
Space = SpaceField
AttemptId = AttemptIdField
LifecycleUid = LifecycleUidField
InstanceId = InstanceIdField
Digest = Sha256Field
Short = Annotated[str, msgspec.Meta(min_length=1, max_length=512)]
LongText = Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
Instant = Annotated[str, msgspec.Meta(min_length=1, max_length=64)]
# A path, not a token: any byte but NUL may be in one (a newline too); normalization is
# checked in __post_init__ because a regex cannot say it.
AbsPath = Annotated[str, msgspec.Meta(pattern=r"^/[^\x00]{0,4095}\Z")]
DependencyKind = DependencyKindField

DEPENDENCY_PROFILE = "profile"


def _check_normal_path(field: str, path: str) -> None:
    # A path with `..`, `.` or doubled slashes names the same file in a way a reviewer and a
    # digest comparison can disagree about; the cut writes normalized paths, so refuse others.
    if posixpath.normpath(path) != path or path.startswith("//"):
        raise ValueError(f"{field} must be a normalized absolute path, got {path!r}")


class FileRef(msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True):
    """A file the seat needs, by absolute path and the digest it had at the cut."""

    kind: Literal["file"]
    path: AbsPath
    sha256: Digest

    def __post_init__(self) -> None:
        _check_normal_path("path", self.path)


class Identity(
    msgspec.Struct,
    forbid_unknown_fields=True,
    rename="camel",
    frozen=True,
    kw_only=True,
    omit_defaults=True,
):
    """Who the seat is at the broker. `lifecycleUid` is recovered on resume, never re-minted:
    the seat's durables are keyed by it, so a fresh uid would orphan its inbox."""

    mode: Literal["open", "static"]
    lifecycle_uid: LifecycleUid
    owner: Token
    credential: FileRef | None = None

    def __post_init__(self) -> None:
        if self.mode == "static" and self.credential is None:
            raise ValueError("a static identity must carry its credential reference")
        if self.mode == "open" and self.credential is not None:
            raise ValueError("an open identity carries no credential")


class Launch(
    msgspec.Struct,
    forbid_unknown_fields=True,
    rename="camel",
    frozen=True,
    kw_only=True,
    omit_defaults=True,
):
    """What a destination needs to start the same harness in the same tree (v2).

    `allow_send` is the seat's `--allow-send`, part of its profile (`profile_sha256` covers it),
    so the destination runs the seat with exactly this list and never its own `cotal.toml`'s;
    an entry written before the field existed names none. `subscribe` and `allow_post` (its
    `--subscribe` and `--allow-post`) are part of the profile the same way."""

    connector: Label
    cwd: AbsPath
    # Keys only: opaque launch options may be secrets and have no durable source, so a seat
    # that has any cannot be checkpointed (see `reference_rule_errors`).
    unresolved_launch_option_keys: Annotated[list[Label], msgspec.Meta(max_length=MAX_OPTION_KEYS)]
    profile_sha256: Digest
    session_stores: Annotated[list[AbsPath], msgspec.Meta(max_length=MAX_SESSION_STORES)]
    model: Short | None = None
    session_id: LongText | None = None
    fork_source: LongText | None = None
    allow_send: AllowSend = []
    subscribe: Channels = []
    allow_post: Channels = []

    def __post_init__(self) -> None:
        _check_normal_path("cwd", self.cwd)
        for store in self.session_stores:
            _check_normal_path("sessionStores[]", store)
        if len(set(self.session_stores)) != len(self.session_stores):
            raise ValueError("sessionStores lists a directory twice")


class Dependency(
    msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True, omit_defaults=True
):
    kind: DependencyKind
    path: AbsPath
    sha256: Digest | None = None

    def __post_init__(self) -> None:
        _check_normal_path("path", self.path)


class Agent(
    msgspec.Struct,
    forbid_unknown_fields=True,
    rename="camel",
    frozen=True,
    kw_only=True,
    omit_defaults=True,
):
    """One retained seat (v2)."""

    name: SeatName
    space: Space
    identity: Identity
    launch: Launch
    dependencies: Annotated[list[Dependency], msgspec.Meta(max_length=MAX_DEPENDENCIES)]
    # The writer generation custody was cut at; a destination claims generation + 1.
    generation: Annotated[int, msgspec.Meta(ge=0)]
    started_at: Instant
    role: Label | None = None


class Inventory(
    msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True, kw_only=True
):
    """The whole inventory (v2). `instanceId` is null only for an upgraded v1 inventory."""

    version: Literal["cotal-manager-resume/v2"]
    space: Space
    attempt_id: AttemptId
    instance_id: InstanceId | None
    created_at: Instant
    agents: list[Agent]


# -- v1: the wire shape of the same-host inventory, frozen as it was -----------------------------


class _LaunchV1(
    msgspec.Struct,
    forbid_unknown_fields=True,
    rename="camel",
    frozen=True,
    kw_only=True,
    omit_defaults=True,
):
    connector: Label
    cwd: AbsPath
    unresolved_launch_option_keys: Annotated[list[Label], msgspec.Meta(max_length=MAX_OPTION_KEYS)]
    profile_sha256: Digest
    model: Short | None = None
    session_id: LongText | None = None
    fork_source: LongText | None = None

    def __post_init__(self) -> None:
        _check_normal_path("cwd", self.cwd)


class _AgentV1(
    msgspec.Struct,
    forbid_unknown_fields=True,
    rename="camel",
    frozen=True,
    kw_only=True,
    omit_defaults=True,
):
    name: SeatName
    space: Space
    identity: Identity
    launch: _LaunchV1
    dependencies: Annotated[list[Dependency], msgspec.Meta(max_length=MAX_DEPENDENCIES)]
    started_at: Instant
    role: Label | None = None


class _InventoryV1(
    msgspec.Struct, forbid_unknown_fields=True, rename="camel", frozen=True, kw_only=True
):
    version: Literal["cotal-manager-resume/v1"]
    space: Space
    created_at: Instant
    agents: list[_AgentV1]


_S = TypeVar("_S", bound=msgspec.Struct)


class _VersionProbe(msgspec.Struct):
    """Reads only `version`, so an unknown version is named before its shape is judged."""

    version: str


def _upgrade_v1(old: _InventoryV1, attempt_id: str) -> Inventory:
    agents = [
        Agent(
            name=a.name,
            space=a.space,
            identity=a.identity,
            launch=Launch(
                connector=a.launch.connector,
                cwd=a.launch.cwd,
                unresolved_launch_option_keys=list(a.launch.unresolved_launch_option_keys),
                profile_sha256=a.launch.profile_sha256,
                session_stores=[],
                model=a.launch.model,
                session_id=a.launch.session_id,
                fork_source=a.launch.fork_source,
            ),
            dependencies=list(a.dependencies),
            generation=0,
            started_at=a.started_at,
            role=a.role,
        )
        for a in old.agents
    ]
    return Inventory(
        version=INVENTORY_V2,
        space=old.space,
        attempt_id=attempt_id,
        instance_id=None,
        created_at=old.created_at,
        agents=agents,
    )


# -- the parser ----------------------------------------------------------------------------------


def _decode_strict(data: bytes, kind: type[_S]) -> _S:
    try:
        return msgspec.json.decode(data, type=kind, strict=True)
    except msgspec.ValidationError as exc:
        raise DecodeError(_WHAT, str(exc), _CURE_SHAPE) from None
    except msgspec.DecodeError as exc:
        raise DecodeError(_WHAT, f"not valid JSON ({exc})", _CURE_SHAPE) from None


def inventory_version(data: bytes) -> str:
    """The declared version, refusing anything this cotal cannot read, before the shape."""
    if len(data) > INVENTORY_CAP:
        raise Refusal(
            Code.TOO_LARGE,
            f"resume-preserved args exceed {INVENTORY_CAP} bytes ({len(data)} bytes)",
            f"a cut holds at most {MAX_INVENTORY_SEATS} seats in {INVENTORY_CAP} bytes; split the "
            "space",
        )
    probe = _decode_strict(data, _VersionProbe)
    if probe.version not in SUPPORTED_VERSIONS:
        raise Refusal(
            Code.UNSUPPORTED_VERSION,
            f"unsupported manager resume inventory version {probe.version!r}",
            "resume with the cotal that cut it, or upgrade this one (it reads "
            + " and ".join(SUPPORTED_VERSIONS)
            + ")",
        )
    return probe.version


def decode_inventory(data: bytes, *, attempt_id: str | None = None) -> Inventory:
    """Cap, version, shape, then the seat rules. A v1 inventory needs `attempt_id` to bind to."""
    version = inventory_version(data)
    if version == INVENTORY_V1:
        if attempt_id is None:
            raise Refusal(
                Code.UNBOUND_V1,
                f"a {INVENTORY_V1} inventory carries no attempt binding",
                "hand it over through resume-preserved with the attempt id it belongs to",
            )
        inventory = _upgrade_v1(_decode_strict(data, _InventoryV1), attempt_id)
    else:
        inventory = _decode_strict(data, Inventory)
    check_seats(inventory)
    return inventory


def parse_resume_args(
    attempt_id: str, inventory_bytes: bytes, *, space: str | None = None
) -> Inventory:
    """The resume parser: the same function at prepare time (round trip) and at resume.

    `space`, when given, is the manager's own space; an inventory for another space is refused.
    """
    check_attempt_id(attempt_id)
    inventory = decode_inventory(bytes(inventory_bytes), attempt_id=attempt_id)
    if space is not None:
        check_inventory_space(inventory, space)
    return inventory


def check_inventory_space(inventory: Inventory, space: str) -> None:
    if inventory.space != space:
        raise Refusal(
            Code.SPACE_MISMATCH,
            f'resume inventory belongs to space "{inventory.space}", not "{space}"',
            f"resume it with --space {inventory.space}",
        )


def check_seats(inventory: Inventory) -> None:
    """Capacity, then per seat in order: its space, a duplicate name, a duplicate uid."""
    if len(inventory.agents) > MAX_INVENTORY_SEATS:
        raise Refusal(
            Code.CAPACITY,
            f"resume inventory would exceed manager capacity ({MAX_INVENTORY_SEATS}); it holds "
            f"{len(inventory.agents)} seats",
            f"a manager holds at most {MAX_INVENTORY_SEATS} seats; cut the space in smaller groups",
        )
    names: set[str] = set()
    uids: set[str] = set()
    for agent in inventory.agents:
        if agent.space != inventory.space:
            raise Refusal(
                Code.SPACE_MISMATCH,
                f'retained agent "{agent.name}" belongs to space "{agent.space}", the inventory '
                f'to "{inventory.space}"',
                _CURE_SHAPE,
            )
        check_new_seat_name(agent.name)
        if agent.name in names:
            raise Refusal(
                Code.DUPLICATE_NAME,
                f'resume inventory contains duplicate agent name "{agent.name}"',
                _CURE_SHAPE,
            )
        names.add(agent.name)
        # Two seats with one uid would bind one inbox twice: both would be the same writer.
        uid = agent.identity.lifecycle_uid
        if uid in uids:
            raise Refusal(
                Code.DUPLICATE_UID,
                f'resume inventory contains duplicate lifecycle uid {uid} (seat "{agent.name}")',
                _CURE_SHAPE,
            )
        uids.add(uid)


def encode_inventory(inventory: Inventory) -> bytes:
    """Normalized bytes: equal inventories have equal bytes, so a digest binds the content."""
    return encode_json(inventory)


def inventory_digest(inventory: Inventory) -> str:
    return hashlib.sha256(encode_inventory(inventory)).hexdigest()


# -- reference rules (pure halves; the manager performs the file checks) ---------------------------


class Reference(NamedTuple):
    """A file a retained seat depends on, as the manager's preflight must verify it."""

    what: Literal["credential", "dependency"]
    path: str
    sha256: str | None
    # Identity secrets must stay 0600; an ordinary dependency only has to be a real file.
    private: bool


def references(agent: Agent) -> list[Reference]:
    refs: list[Reference] = []
    if agent.identity.credential is not None:
        cred = agent.identity.credential
        refs.append(Reference("credential", cred.path, cred.sha256, True))
    refs.extend(Reference("dependency", d.path, d.sha256, False) for d in agent.dependencies)
    return refs


CURE_OPTIONS = (
    "relaunch the seat from a profile whose options have a durable, non-secret source before the "
    "cut; a seat started with imperative launch options cannot be checkpointed"
)
CURE_REFERENCE = (
    "put back the file the cut recorded (same path, same bytes), or re-run the cut so the "
    "inventory records the file as it is now"
)


def reference_rule_errors(agent: Agent) -> list[str]:
    """The rules that need no file access, in the order the preflight reports them."""
    errors: list[str] = []
    keys = agent.launch.unresolved_launch_option_keys
    if keys:
        errors.append(
            "imperative launch options have no non-secret durable source (" + ", ".join(keys) + ")"
        )
    seen: set[str] = set()
    for dep in agent.dependencies:
        if dep.path in seen:
            errors.append(f"retained dependency is declared twice: {dep.path}")
        seen.add(dep.path)
    return errors


def msg_not_regular(path: str) -> str:
    return f"retained reference is not a regular non-symlink file: {path}"


def msg_unavailable(path: str, detail: str) -> str:
    return f"retained reference unavailable: {path} ({detail})"


def msg_not_private(path: str) -> str:
    return f"retained identity file is not private (expected 0600): {path}"


def msg_changed(ref: Reference) -> str:
    if ref.what == "credential":
        return f"retained credential changed after the cut: {ref.path}"
    return f"retained dependency changed since the cut: {ref.path}"
