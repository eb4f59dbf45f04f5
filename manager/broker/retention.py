"""What the DM stream keeps: the mail its readers have not acknowledged, and little besides.

`DM_<space>` keeps limits retention (docs/design.md decision 16), so the broker never removes
a message on its own; the manager removes what every reader has acknowledged, by rules that
never take what someone still needs:

- A subject's last message stays. The writer fence expects the last sequence on a seat's
  outbound filter, which is the last message of one of that filter's subjects; removing it
  would make the broker refuse the seat's own next write.
- On a subject some consumer reads, only what lies below every such consumer's ack floor goes.
  The floor is contiguous, so each of those messages was acknowledged, or is older than the
  consumer (nobody's mail).
- A seat inbox no consumer reads stays whole: a resume republishes a seat's carried mail
  before it creates the durable that reads it.
- Mail to the operator (each reply is handed over in the daemon, never read from the stream)
  and fence markers have no reader by design: all but their last go.

So the stream holds its unacknowledged mail, one message per subject, and mail waiting for a
seat that has no durable; the limits bound that. Interest retention would do it in the broker,
but it drops at once every publish no filter matches, which is every reply and fence marker:
the fence would refuse each seat's second reply (`wrong last sequence`, measured on the pinned
nats-server), and a republished inbox would be gone before its durable existed.

The trim runs where a manager starts (`ensure_dm_stream`, the stream a quarter full), every
eighth of the limit in sequences on the publish path, and when a publish finds the stream
full; a publish still refused after it is `dm-stream-full`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, TypeVar

import anyio
import structlog
from nats.js import JetStreamContext, api
from nats.js.errors import APIError, NotFoundError

from manager.broker.bounds import DM_MAX_BYTES as DM_MAX_BYTES
from manager.broker.bounds import DM_MAX_MSGS as DM_MAX_MSGS
from manager.broker.bounds import MAX_BYTES_ENV, MAX_MSGS_ENV
from manager.broker.bounds import DmLimits as DmLimits
from manager.broker.bounds import dm_limits as dm_limits
from manager.broker.retry import STORE_REFUSED, riding_elections
from protocol import names
from protocol.errors import Refusal
from protocol.refusals import Code

log = structlog.get_logger("cotal.broker")

T = TypeVar("T")

# Of the store's refusals (STORE_REFUSED), only these two texts mean "full".
_FULL = ("maximum messages exceeded", "maximum bytes exceeded")
# The broker lists at most this many consumers per request.
_LIST_PAGE: Final = 256
# Fence markers are `<prefix>.inst._custody.g<N>.<owner>.<seat>` (manager/broker/fence.py).
MARKER_TOKEN: Final = "_custody"


def trim_due(info: api.StreamInfo) -> bool:
    """A quarter of either of the stream's own bounds is used."""
    config, state = info.config, info.state
    return any(
        bound is not None and bound > 0 and used * 4 >= bound
        for used, bound in ((state.messages, config.max_msgs), (state.bytes, config.max_bytes))
    )


def stream_full(exc: BaseException) -> bool:
    return (
        isinstance(exc, APIError)
        and getattr(exc, "err_code", None) == STORE_REFUSED
        and any(text in (exc.description or "") for text in _FULL)
    )


# -- the trim -----------------------------------------------------------------------------------


def _matches(pattern: list[str], subject: list[str]) -> bool:
    """NATS subject matching of a concrete subject against a filter (`*` one token, `>` rest)."""
    for i, token in enumerate(pattern):
        if token == ">":
            return len(subject) > i
        if i >= len(subject) or (token != "*" and token != subject[i]):
            return False
    return len(pattern) == len(subject)


@dataclass(frozen=True)
class _Reader:
    filters: list[list[str]]
    ack_floor: int


async def _readers(js: JetStreamContext, stream: str) -> list[_Reader]:
    out: list[_Reader] = []
    offset = 0
    while True:

        async def page_at(at: int = offset) -> list[api.ConsumerInfo]:
            return await js.consumers_info(stream, offset=at)

        page = await riding_elections(f"consumers of {stream}", page_at)
        for info in page:
            config = info.config
            filters = list(config.filter_subjects or []) or [config.filter_subject or ">"]
            floor = info.ack_floor.stream_seq if info.ack_floor else 0
            out.append(_Reader([f.split(".") for f in filters], floor or 0))
        if len(page) < _LIST_PAGE:
            return out
        offset += len(page)


def _unread_by_design(tokens: list[str]) -> bool:
    recipient = tokens[3:5]
    return recipient == [names.SEAT_OWNER, names.OPERATOR_ACTOR] or tokens[3] == MARKER_TOKEN


async def trim_acknowledged(js: JetStreamContext, space: str) -> int:
    """Remove what every reader of it has acknowledged (the rules above); how many went."""
    stream = names.dm_stream(space)
    # Readers first, so each answer read here can only keep more: a floor read early is lower
    # than the truth, and a consumer made after this list reads only mail published after it (a
    # new durable starts past the frontier; a rebuilt one at its own republished mail, above
    # every floor here, and until it exists its inbox has no reader and is kept whole).
    readers = await _readers(js, stream)
    info = await riding_elections(
        f"stream {stream}",
        lambda: js.stream_info(stream, subjects_filter=names.dm_stream_subjects(space)),
    )
    prefix = names.subject_prefix(space).split(".") + ["inst"]
    started = anyio.current_time()
    for subject, count in sorted((info.state.subjects or {}).items()):
        tokens = subject.split(".")
        # One message is its subject's last, always kept; a subject not of our shape is not ours.
        if count < 2 or len(tokens) != 7 or tokens[:3] != prefix:
            continue
        floors = [r.ack_floor for r in readers if any(_matches(f, tokens) for f in r.filters)]
        if floors:
            below = min(floors) + 1
            if below <= max(info.state.first_seq, 1):
                continue
            last = await _last_seq(js, stream, subject)
            if last is None or min(below, last) <= 1:
                continue
            await _purge(js, stream, subject, seq=min(below, last))
        elif _unread_by_design(tokens):
            await _purge(js, stream, subject, keep=1)
    after = await riding_elections(f"stream {stream}", lambda: js.stream_info(stream))
    removed = max(0, info.state.messages - after.state.messages)
    log.info(
        "stream.trimmed",
        stream=stream,
        removed=removed,
        kept=after.state.messages,
        seconds=round(anyio.current_time() - started, 3),
    )
    return removed


async def _last_seq(js: JetStreamContext, stream: str, subject: str) -> int | None:
    async def last() -> int | None:
        try:
            msg = await js.get_last_msg(stream, subject)
        except NotFoundError:
            return None
        return int(msg.seq or 0)

    return await riding_elections(f"last of {subject}", last)


async def _purge(
    js: JetStreamContext,
    stream: str,
    subject: str,
    *,
    seq: int | None = None,
    keep: int | None = None,
) -> None:
    # `seq` removes what lies below it on the subject; `keep` all but the newest `keep`.
    await riding_elections(
        f"trim {subject}", lambda: js.purge_stream(stream, subject=subject, seq=seq, keep=keep)
    )


# -- the publish path ---------------------------------------------------------------------------


async def full_refusal(js: JetStreamContext, space: str) -> Refusal:
    stream = names.dm_stream(space)
    info = await riding_elections(f"stream {stream}", lambda: js.stream_info(stream))
    config, state = info.config, info.state
    return Refusal(
        Code.DM_STREAM_FULL,
        f"the DM stream {stream} is full: {state.messages} messages, {state.bytes} bytes, against "
        f"its limit of {config.max_msgs} messages and {config.max_bytes} bytes, and what it holds "
        "is mail its seats have not acknowledged yet; nothing was queued",
        "let the seats work through their inboxes (`cotal ps`; a stopped seat's mail waits for "
        "`cotal start`), `cotal rm` a seat whose queued mail is not wanted, or raise "
        f"{MAX_MSGS_ENV} / {MAX_BYTES_ENV} in the manager's environment and restart it",
    )


async def with_room(js: JetStreamContext, space: str, publish: Callable[[], Awaitable[T]]) -> T:
    """Publish; a full stream is trimmed and the publish tried once more, then refused by name."""
    try:
        return await publish()
    except APIError as exc:
        if not stream_full(exc):
            raise
    log.info("stream.full", stream=names.dm_stream(space))
    await trim_acknowledged(js, space)
    try:
        return await publish()
    except APIError as exc:
        if not stream_full(exc):
            raise
    raise await full_refusal(js, space)


async def after_publish(js: JetStreamContext, space: str, seq: int) -> None:
    """Every `cadence` sequences, trim a stream that is a quarter full, so a publish seldom
    meets a full one."""
    if seq % dm_limits().cadence:
        return
    stream = names.dm_stream(space)
    info = await riding_elections(f"stream {stream}", lambda: js.stream_info(stream))
    if trim_due(info):
        await trim_acknowledged(js, space)
