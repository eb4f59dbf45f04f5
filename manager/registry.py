"""Which connectors a daemon can launch, with their operator configuration."""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from protocol import deadletter as dl
from protocol import meshcall, names
from protocol.checkpoint import check_carry_pattern
from protocol.deadletter import DEFAULT_MAX_DELIVERIES, MAX_DELIVERIES_LIMIT
from protocol.errors import Refusal
from protocol.refusals import Code

if TYPE_CHECKING:
    # A type only: the connector modules load by name when a seat needs one.
    from connectors.base import Connector

CONFIG_NAME = "cotal.toml"
CONFIG_CAP = 64 * 1024
DEFAULT_HORIZON_S = 24 * 60 * 60
MAX_HORIZON_S = 366 * 24 * 60 * 60
DEFAULT_SKEW_S = 60
MAX_SKEW_S = 60 * 60
DEFAULT_CHANNEL_HISTORY = 100
MAX_CHANNEL_HISTORY = 100_000
DEFAULT_CHANNEL_MAX_AGE_S = 7 * 24 * 60 * 60
DEFAULT_READY_TIMEOUT_S = 30.0
READY_TIMEOUT_MIN_S = 1.0
# The CLI waits a little longer than this for a spawn, start or restart (manager/cli/seats.py),
# so the manager's refusal, which names the seat's log, is what the operator reads.
READY_TIMEOUT_LIMIT_S = 120.0

# Module and class per agent name; imported lazily so a broken optional harness does not stop
# the daemon from running the others. Every list of harnesses (`cotal doctor`, `spawn --help`,
# the `[agents.<name>]` tables cotal.toml may hold) is this one, in this order.
KNOWN: dict[str, tuple[str, str]] = {
    "scribe": ("connectors.scribe.connector", "ScribeConnector"),
    "pi": ("connectors.pi", "PiConnector"),
    "claude": ("connectors.claude_code", "ClaudeCodeConnector"),
    "jcode": ("connectors.jcode", "JcodeConnector"),
    "codex": ("connectors.codex", "CodexConnector"),
    "opencode": ("connectors.opencode", "OpenCodeConnector"),
    "gemini": ("connectors.gemini", "GeminiConnector"),
    "scribe-fork": ("connectors.scribe.connector", "ScribeForkConnector"),
}
# What `cotal spawn` runs without `--agent` (protocol/control.py's SpawnArgs says the same).
DEFAULT_AGENT = "scribe"


def load_connector(agent: str) -> Connector:
    entry = KNOWN.get(agent)
    if entry is None:
        raise Refusal(
            Code.UNKNOWN_AGENT,
            f"unknown agent {agent!r}",
            "use one of: " + ", ".join(sorted(KNOWN)),
        )
    module, cls = entry
    try:
        connector: Connector = getattr(importlib.import_module(module), cls)()
    except (ImportError, AttributeError) as exc:
        raise Refusal(
            Code.AGENT_UNAVAILABLE,
            f"agent {agent!r} is not available in this build ({exc})",
            "run `cotal doctor` to see which harnesses are usable",
        ) from None
    return connector


class CarryConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """`[carry]`: ignored paths a checkpoint carries anyway (record open point 8). Each is a
    relative path or simple glob under the seat's repository, such as `.env`."""

    include: list[str] = []


class RecencyConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """`[recency]`: the deployment's freshness promise (record 2.2, gate 3). The source's
    horizon is recorded in every checkpoint it cuts, so source and destination cannot disagree
    about it; the skew is the destination's own allowance for a source clock ahead of its own."""

    horizon_s: Annotated[int, msgspec.Meta(ge=1, le=MAX_HORIZON_S)] = DEFAULT_HORIZON_S
    skew_s: Annotated[int, msgspec.Meta(ge=0, le=MAX_SKEW_S)] = DEFAULT_SKEW_S
    # Who vouches for this host's clock: the kernel (a time daemon keeps it in step), or the
    # operator, for a host that cannot run one (a container), with why in `clock_reason`. A
    # declaration is never silent: every admission it decides journals it and prints it, and
    # `status` and `doctor` show it.
    clock: Literal["kernel", "trusted"] = "kernel"
    clock_reason: Annotated[str, msgspec.Meta(max_length=500)] = ""

    def __post_init__(self) -> None:
        if self.clock == "trusted" and not self.clock_reason.strip():
            raise ValueError(
                '[recency] clock = "trusted" needs clock_reason: why this host\'s clock may be '
                "trusted without a time daemon (it is printed and journaled with every admission)"
            )
        if self.clock == "kernel" and self.clock_reason:
            raise ValueError('[recency] clock_reason is only read with clock = "trusted"')


def trusted_clock_reason(recency: RecencyConfig) -> str | None:
    """The operator's reason for trusting this host's clock, when `[recency]` declares it."""
    return recency.clock_reason if recency.clock == "trusted" else None


class DeliveryConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """`[delivery]`: how many times one message is handed to a seat before it moves to the
    seat's dead letters, and the backoff for a turn its model provider did not serve, which
    counts toward no cap (docs/operations.md, "Dead letters")."""

    max_deliveries: Annotated[int, msgspec.Meta(ge=1, le=MAX_DELIVERIES_LIMIT)] = (
        DEFAULT_MAX_DELIVERIES
    )
    backoff_initial_s: Annotated[
        float, msgspec.Meta(ge=dl.BACKOFF_MIN_S, le=dl.BACKOFF_LIMIT_S)
    ] = dl.DEFAULT_BACKOFF_INITIAL_S
    backoff_coefficient: Annotated[float, msgspec.Meta(ge=1.0, le=dl.BACKOFF_COEFFICIENT_LIMIT)] = (
        dl.DEFAULT_BACKOFF_COEFFICIENT
    )
    backoff_max_s: Annotated[float, msgspec.Meta(ge=dl.BACKOFF_MIN_S, le=dl.BACKOFF_LIMIT_S)] = (
        dl.DEFAULT_BACKOFF_MAX_S
    )
    backoff_jitter: Annotated[float, msgspec.Meta(ge=0.0, le=1.0)] = dl.DEFAULT_BACKOFF_JITTER

    def __post_init__(self) -> None:
        if self.backoff_max_s < self.backoff_initial_s:
            raise ValueError(
                f"[delivery] backoff_max_s ({self.backoff_max_s:g}) is below backoff_initial_s "
                f"({self.backoff_initial_s:g}): raise backoff_max_s or lower backoff_initial_s"
            )


class LaunchConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """`[launch]`: how long a harness has, from its start, to prove it is ready before the
    start is refused `seat-not-ready`. A harness that starts in five seconds on an idle host
    (OpenCode does) can need several times that on a host whose cores are all busy."""

    ready_timeout_s: Annotated[
        float, msgspec.Meta(ge=READY_TIMEOUT_MIN_S, le=READY_TIMEOUT_LIMIT_S)
    ] = DEFAULT_READY_TIMEOUT_S


class SeatConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """`[seats.NAME]`: what a seat of that name is spawned with when its spawn does not say.
    `allow_send` is the seats it may send to (`*`: every other seat; default none);
    `subscribe` the channels whose posts it gets as turns, `allow_post` those it may post to
    (default none)."""

    allow_send: list[str] = []
    subscribe: list[str] = []
    allow_post: list[str] = []


class ChannelsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """`[channels]`: how much of each channel the broker keeps: at most `history` posts per
    channel, none older than `max_age_s`; the oldest is dropped, a post never refused."""

    history: Annotated[int, msgspec.Meta(ge=1, le=MAX_CHANNEL_HISTORY)] = DEFAULT_CHANNEL_HISTORY
    max_age_s: Annotated[int, msgspec.Meta(ge=1, le=MAX_HORIZON_S)] = DEFAULT_CHANNEL_MAX_AGE_S


FAILOVER_AFTER_MIN_S = 2.0
FAILOVER_AFTER_MAX_S = 3600.0
DEFAULT_FAILOVER_AFTER_S = 30.0


class FailoverConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """`[failover]`: `enabled = true` makes every seat of this root failover-enabled: captured
    at each turn's end (a standing checkpoint), and killed when the manager cannot renew its
    lease at the broker for `after_s` seconds (its own monotonic clock), started again only once
    it has read the broker. `standby = true` makes this root's manager take over the seats of a
    lost host of its space on its own (docs/operations.md, "Failover")."""

    enabled: bool = False
    after_s: float = DEFAULT_FAILOVER_AFTER_S
    standby: bool = False

    def __post_init__(self) -> None:
        if not FAILOVER_AFTER_MIN_S <= self.after_s <= FAILOVER_AFTER_MAX_S:
            raise ValueError(
                f"[failover] after_s = {self.after_s:g} is outside {FAILOVER_AFTER_MIN_S:g} to "
                f"{FAILOVER_AFTER_MAX_S:g} seconds: set it between them (default "
                f"{DEFAULT_FAILOVER_AFTER_S:g}; below {FAILOVER_AFTER_MIN_S:g} s an ordinary "
                "broker hiccup would kill the seats)"
            )


class MetricsConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """`[metrics]`: `listen = "127.0.0.1:PORT"` serves this root's Prometheus metrics over HTTP
    at `GET /metrics` on that loopback address, for the operator's scraper; off when absent
    (`cotal metrics` prints the same text either way). `load_config` refuses an address that
    is not loopback (docs/operations.md, "Monitoring")."""

    listen: Annotated[str, msgspec.Meta(max_length=64)] | None = None


def parse_listen(text: str) -> tuple[str, int]:
    """`HOST:PORT` (`[::1]:PORT` for IPv6) as (host, port): the host an IP literal on loopback
    (127.0.0.0/8 or ::1), the port 1 to 65535. Raises ValueError saying which part is wrong."""
    import ipaddress

    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ValueError(f"{text!r} is not HOST:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"write the IPv6 address in brackets, [{host}]:{port_text}")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ValueError(f"{host!r} is not an IP address") from None
    if not address.is_loopback:
        raise ValueError(f"{host} is not a loopback address")
    port = int(port_text)
    if not 1 <= port <= 65535:
        raise ValueError(f"port {port} is not between 1 and 65535")
    return str(address), port


# The most a price may say, in US dollars per million tokens: far above any model's, low enough
# that a typo of a few zeros is refused rather than believed.
PRICE_MAX_USD = 10_000.0
# The longest model name a price is keyed by (connectors.base.MODEL_NAME_MAX).
PRICE_MODEL_MAX = 200


class PriceConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """`[prices."MODEL"]`: what one model costs, in US dollars per million tokens, for the
    estimate `ps --wide` shows (docs/operations.md, "What each seat costs"). `input` and
    `output` are required; the prompt cache's reads and writes cost `input` unless said."""

    input: Annotated[float, msgspec.Meta(ge=0.0, le=PRICE_MAX_USD)]
    output: Annotated[float, msgspec.Meta(ge=0.0, le=PRICE_MAX_USD)]
    cache_read: Annotated[float, msgspec.Meta(ge=0.0, le=PRICE_MAX_USD)] | None = None
    cache_write: Annotated[float, msgspec.Meta(ge=0.0, le=PRICE_MAX_USD)] | None = None


# The most a budget may allow: far above any day's use, so a typo of a few zeros is refused.
BUDGET_TOKENS_MAX = 10**12
BUDGET_TURNS_MAX = 1_000_000
BUDGET_USD_MAX = 1_000_000.0


class BudgetLimits(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """What a seat (or the root's seats together) may use before its delivery stops: tokens
    in a UTC day, estimated US dollars in a UTC day (at `[prices]`), turns in a clock hour
    (docs/operations.md, "What each seat costs"). Absent: no such limit."""

    tokens_per_day: Annotated[int, msgspec.Meta(ge=1, le=BUDGET_TOKENS_MAX)] | None = None
    usd_per_day: Annotated[float, msgspec.Meta(gt=0, le=BUDGET_USD_MAX)] | None = None
    turns_per_hour: Annotated[int, msgspec.Meta(ge=1, le=BUDGET_TURNS_MAX)] | None = None


class BudgetConfig(BudgetLimits, frozen=True):
    """`[budget]`: the root's limits, over all its seats together, and `[budget.seats.NAME]`,
    one seat's own. Read again while a seat waits at its budget, so a raised limit resumes it."""

    seats: dict[str, BudgetLimits] = {}


class FileConfig(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    # Each `[agents.<name>]` table as written; `load_config` decodes it through its connector's
    # own `config_type`, which alone knows the keys that harness honours.
    agents: dict[str, dict[str, Any]] = {}
    budget: BudgetConfig = BudgetConfig()
    carry: CarryConfig = CarryConfig()
    channels: ChannelsConfig = ChannelsConfig()
    delivery: DeliveryConfig = DeliveryConfig()
    failover: FailoverConfig = FailoverConfig()
    launch: LaunchConfig = LaunchConfig()
    metrics: MetricsConfig = MetricsConfig()
    # Keyed by the model's name as the harness reports it (a seat's usage record names it).
    prices: dict[str, PriceConfig] = {}
    recency: RecencyConfig = RecencyConfig()
    seats: dict[str, SeatConfig] = {}


def seat_allow_send(cfg: FileConfig, name: str, given: Sequence[str]) -> list[str]:
    """A spawn's `--allow-send`, or the root's `[seats.NAME] allow_send` when it gives none."""
    entry = cfg.seats.get(name)
    return meshcall.check_allow_send(given or (entry.allow_send if entry else []))


def seat_channels(
    cfg: FileConfig, name: str, subscribe: Sequence[str], allow_post: Sequence[str]
) -> tuple[list[str], list[str]]:
    """A spawn's `--subscribe` and `--allow-post`, each the root's `[seats.NAME]` list when the
    spawn gives none."""
    entry = cfg.seats.get(name)
    return (
        meshcall.check_channels(subscribe or (entry.subscribe if entry else []), "--subscribe"),
        meshcall.check_channels(allow_post or (entry.allow_post if entry else []), "--allow-post"),
    )


def carry_includes(cfg: FileConfig, extra: Sequence[str] = ()) -> list[str]:
    """The declared ignored paths for one cut: the root's `[carry] include`, then `--include`
    values."""
    return check_includes([*cfg.carry.include, *extra])


def check_includes(include: Sequence[str]) -> list[str]:
    """Each declared ignored path validated, first mention kept."""
    out: list[str] = []
    for pattern in include:
        try:
            check_carry_pattern(pattern)
        except ValueError as exc:
            raise Refusal(
                Code.BAD_INCLUDE,
                str(exc),
                "declare a relative path or simple glob under the repository, such as .env or "
                "config/*.local",
            ) from None
        if pattern not in out:
            out.append(pattern)
    return out


def load_config(root: Path) -> FileConfig:
    """`<root>/cotal.toml`: per-connector settings. Absent means defaults."""
    path = root / CONFIG_NAME
    if not path.exists():
        return FileConfig()
    data = path.read_bytes()
    if len(data) > CONFIG_CAP:
        raise Refusal(Code.BAD_CONFIG, f"{path} is over {CONFIG_CAP} bytes", "trim it")
    try:
        cfg = msgspec.toml.decode(data, type=FileConfig, strict=True)
    except msgspec.ValidationError as exc:
        if "$.prices[" in str(exc):
            raise _price_refusal(path, data) from None
        raise Refusal(
            Code.BAD_CONFIG, f"{path} is malformed: {exc}", "see docs/cli.md (Configuration)"
        ) from None
    except msgspec.DecodeError as exc:
        raise Refusal(
            Code.BAD_CONFIG, f"{path} is not valid TOML: {exc}", "see docs/cli.md (Configuration)"
        ) from None
    for pattern in cfg.carry.include:
        try:
            check_carry_pattern(pattern)
        except ValueError as exc:
            raise Refusal(
                Code.BAD_CONFIG,
                f"{path} [carry] include: {exc}",
                "list relative paths or simple globs under the repository, such as .env",
            ) from None
    if cfg.metrics.listen is not None:
        _check_listen(path, cfg.metrics.listen)
    for name, seat in cfg.seats.items():
        try:
            names.check_seat_name(name)
            meshcall.check_allow_send(seat.allow_send)
            meshcall.check_channels(seat.subscribe, "subscribe")
            meshcall.check_channels(seat.allow_post, "allow_post")
        except Refusal as exc:
            raise Refusal(
                Code.BAD_CONFIG,
                f"{path} [seats.{name}]: {exc.message}",
                "name seats and channels by letters, digits and _, and list seat names or '*' in "
                "allow_send",
            ) from None
    for name in cfg.budget.seats:
        try:
            names.check_seat_name(name)
        except Refusal as exc:
            raise Refusal(
                Code.BAD_CONFIG,
                f"{path} [budget.seats.{name}]: {exc.message}",
                "name the seat by letters, digits and _",
            ) from None
    for model in cfg.prices:
        if not model or len(model) > PRICE_MODEL_MAX or not model.isprintable():
            raise Refusal(
                Code.BAD_CONFIG,
                f"{path} [prices] names the model {model[:PRICE_MODEL_MAX]!r}, which is not a "
                f"model's name (1 to {PRICE_MODEL_MAX} printable characters)",
                "key each price by the model's name as the harness reports it, such as "
                '[prices."claude-sonnet-4-5"] input = 3.0 output = 15.0 (US dollars per '
                "million tokens)",
            )
    unknown = set(cfg.agents) - set(KNOWN)
    if unknown:
        raise Refusal(
            Code.BAD_CONFIG,
            f"{path} configures unknown agents: {', '.join(sorted(unknown))}",
            "use one of: " + ", ".join(sorted(KNOWN)),
        )
    for agent, table in cfg.agents.items():
        check_agent_table(path, agent, table)
    return cfg


PRICE_CURE = (
    'write each price as [prices."MODEL"] with input and output (and optionally cache_read '
    "and cache_write), each in US dollars per million tokens from 0 to "
    f"{PRICE_MAX_USD:g}; see docs/operations.md (What each seat costs)"
)


def _price_refusal(path: Path, data: bytes) -> Refusal:
    """The first `[prices."MODEL"]` entry that does not decode, named by its model (msgspec's
    own path does not name a table's key)."""
    table = msgspec.toml.decode(data).get("prices")
    entries = table.items() if isinstance(table, dict) else []
    for model, entry in entries:
        try:
            msgspec.convert(entry, PriceConfig, strict=True)
        except msgspec.ValidationError as exc:
            return Refusal(
                Code.BAD_CONFIG, f"{path} [prices.{json.dumps(model)}]: {exc}", PRICE_CURE
            )
    return Refusal(Code.BAD_CONFIG, f"{path} [prices] is not a table of models", PRICE_CURE)


def _check_listen(path: Path, listen: str) -> None:
    try:
        parse_listen(listen)
    except ValueError as exc:
        raise Refusal(
            Code.BAD_CONFIG,
            f"{path} [metrics] listen = {listen!r}: {exc}; the metrics are served on loopback "
            "only, for a scraper on this host",
            'listen on a loopback address and a free port, such as listen = "127.0.0.1:9464" '
            'or "[::1]:9464", and scrape it from this host (or remove [metrics] listen; '
            "`cotal metrics` prints the same text)",
        ) from None


def check_agent_table(path: Path, agent: str, table: Mapping[str, Any]) -> None:
    """`[agents.<agent>]` decoded strictly through its connector's config struct. A connector
    this build cannot import is left unchecked: its seats are refused `agent-unavailable` at
    spawn, and the harnesses it does not concern keep running."""
    try:
        config_type = load_connector(agent).config_type
    except Refusal:
        return
    honoured = config_type.__struct_fields__
    unknown = sorted(set(table) - set(honoured))
    if unknown:
        # Every unknown key at once (msgspec names only the first), and what the harness takes.
        raise Refusal(
            Code.BAD_CONFIG,
            f"{path} is malformed: [agents.{agent}] has unknown key(s) {', '.join(unknown)}",
            f"remove them; {agent} honours {', '.join(sorted(honoured))}",
        )
    try:
        msgspec.convert(dict(table), config_type, strict=True)
    except msgspec.ValidationError as exc:
        raise Refusal(
            Code.BAD_CONFIG,
            f"{path} is malformed: [agents.{agent}]: {exc}",
            "see docs/cli.md (Configuration)",
        ) from None


def agent_settings(cfg: FileConfig, agent: str) -> Mapping[str, Any]:
    entry = cfg.agents.get(agent)
    if entry is None:
        return {}
    # Only what the operator set (strict decoding changed no value, so the table as written is
    # what the connector's struct proved at load). An unset key and one set to its default
    # (false, []) are the same setting, and hash the same in the profile digest.
    return {k: v for k, v in entry.items() if v not in (None, [], False)}


# What a seat *is*, as opposed to how this host reaches it. A resumed session must run the same
# harness, model and behaviour flags (its permission mode, OpenCode's tool policy `permission`,
# the scribe test aid), so those are the profile. The binary's path, the endpoint URL and
# provider entry, where the key comes from, a private home and passed-through variables are host
# bindings: each host supplies its own from its own cotal.toml, and they must not make an
# otherwise identical seat refuse to move.
PROFILE_KEYS = frozenset(
    {"model", "permission_mode", "permission", "approval_policy", "sandbox", "ignore_sigterm"}
)


def profile_digest(
    agent: str,
    model: str | None,
    settings: Mapping[str, Any],
    allow_send: Sequence[str] = (),
    subscribe: Sequence[str] = (),
    allow_post: Sequence[str] = (),
) -> str:
    """The launch profile revision: what a destination must match to run the same intent.

    It covers the connector, the model, the intent settings (`PROFILE_KEYS`) and the seat's
    `--allow-send`, `--subscribe` and `--allow-post`, normalized so equal profiles hash equally
    on every host; host bindings are left out on purpose. The permissions are the resume
    entry's own (never a destination's `cotal.toml`), and the signed record pins this digest,
    so an entry whose lists were altered refuses `profile-drift`. A seat with none of them
    hashes as it did before the lists existed, so older checkpoints still match.
    """
    import hashlib

    from protocol.codec import encode_json

    intent = {k: v for k, v in sorted(settings.items()) if k in PROFILE_KEYS}
    body: dict[str, Any] = {"agent": agent, "model": model, "settings": intent}
    if allow_send:
        body["allowSend"] = sorted(allow_send)
    # Each only when given, for the same reason: a checkpoint cut before channels still matches.
    if subscribe:
        body["subscribe"] = sorted(subscribe)
    if allow_post:
        body["allowPost"] = sorted(allow_post)
    return hashlib.sha256(encode_json(body)).hexdigest()
