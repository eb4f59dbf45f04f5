"""A seat's broker footprint, keyed by its lifecycle uid.

The `dm_` durable is the seat's inbox. It is created info-first: an existing durable for this
uid is kept exactly as it is, so its frontier (what was delivered and acknowledged) survives a
crash restart, a cut and a resume. Ordinary teardown deletes exactly that durable; nothing else
does. What the DM stream keeps, and the trim of acknowledged mail, is `retention.py`.
"""

from __future__ import annotations

import structlog
from nats.js import JetStreamContext, api
from nats.js.errors import BadRequestError, BucketNotFoundError, NotFoundError
from nats.js.kv import KeyValue

from manager.broker import retention
from manager.broker.bounds import default_replicas as default_replicas
from manager.broker.retention import DM_MAX_BYTES as DM_MAX_BYTES  # the defaults, kept here too
from manager.broker.retention import DM_MAX_MSGS as DM_MAX_MSGS
from manager.broker.retry import riding_elections
from protocol import names
from protocol.errors import Refusal
from protocol.refusals import Code

log = structlog.get_logger("cotal.broker")


# The floor of the DM stream's duplicate window: what it was before seats sent to seats.
MIN_DUPLICATE_WINDOW_S = 120


def duplicate_window_s(horizon_s: int | None) -> float:
    """The window a turn run again must fall in for its sends to be dropped as duplicates: the
    recency horizon (`[recency] horizon_s`), the longest a checkpoint may wait before its seat
    runs the turn again; the floor alone where no horizon is known."""
    return float(max(MIN_DUPLICATE_WINDOW_S, horizon_s or 0))


def dm_stream_config(
    space: str,
    *,
    replicas: int = 1,
    limits: retention.DmLimits | None = None,
    horizon_s: int | None = None,
) -> api.StreamConfig:
    bounds = limits or retention.dm_limits()
    # No per-subject cap: one sender may queue at least as much as a checkpoint carries.
    return api.StreamConfig(
        name=names.dm_stream(space),
        subjects=[names.dm_stream_subjects(space)],
        retention=api.RetentionPolicy.LIMITS,
        discard=api.DiscardPolicy.NEW,
        storage=api.StorageType.FILE,
        max_msgs_per_subject=-1,
        max_msgs=bounds.msgs,
        max_bytes=bounds.bytes,
        duplicate_window=duplicate_window_s(horizon_s),
        num_replicas=replicas,
    )


def _limits(config: api.StreamConfig) -> tuple[object, ...]:
    return (
        config.discard,
        config.max_msgs_per_subject,
        config.max_msgs,
        config.max_bytes,
        float(config.duplicate_window or 0.0),
    )


async def ensure_dm_stream(
    js: JetStreamContext,
    space: str,
    *,
    replicas: int = 1,
    trim: bool = True,
    horizon_s: int | None = None,
) -> None:
    """Create the stream, or bring an existing one's limits to today's in place; with `trim`
    (a manager's start), remove acknowledged mail from a stream a quarter full.

    The duplicate window covers `horizon_s` (`duplicate_window_s`) and is widened, never
    narrowed: managers of one broker may keep different horizons, and each needs its own."""
    stream = names.dm_stream(space)
    wanted = dm_stream_config(space, replicas=replicas, horizon_s=horizon_s)

    async def ensure() -> api.StreamInfo | None:
        try:
            info = await js.stream_info(stream)
        except NotFoundError:
            await js.add_stream(wanted)
            return None
        kept_by = info.config.retention
        if kept_by is not None and kept_by != api.RetentionPolicy.LIMITS:
            # Anything else removes on the broker's own rules: interest retention drops every
            # reply and fence marker at once, so the fence would refuse each seat's next write.
            raise Refusal(
                Code.DM_STREAM_RETENTION,
                f"the DM stream {stream} has {getattr(kept_by, 'value', kept_by)} retention; "
                "cotal's inbox needs limits retention (docs/design.md decision 16)",
                f"cotal never makes such a stream: whoever made it, remove it (`nats stream rm "
                f"{stream}` drops its queued mail) and start the manager again",
            )
        wanted.duplicate_window = max(
            float(wanted.duplicate_window or 0.0), float(info.config.duplicate_window or 0.0)
        )
        if _limits(info.config) == _limits(wanted):
            return info
        return await _bring_in_line(js, info.config, wanted)

    info = await riding_elections(f"stream {stream}", ensure)
    # A stream an earlier release filled with acknowledged mail is emptied of it here, before
    # the first publish of this manager meets it full.
    if trim and info is not None and retention.trim_due(info):
        await retention.trim_acknowledged(js, space)


async def _bring_in_line(
    js: JetStreamContext, config: api.StreamConfig, wanted: api.StreamConfig
) -> api.StreamInfo:
    """A DM stream made by an earlier release (1,000 per sender and discard old; a duplicate
    window narrower than the horizon; or any other bounds, such as a COTAL_DM_MAX_MSGS since
    changed) brought in line in place: retention, replicas, the messages and the durables are
    kept as the broker holds them. The broker keeps what a lowered bound already exceeds
    (discard new drops nothing)."""
    config.discard = wanted.discard
    config.max_msgs_per_subject = wanted.max_msgs_per_subject
    config.max_msgs = wanted.max_msgs
    config.max_bytes = wanted.max_bytes
    config.duplicate_window = wanted.duplicate_window
    updated: api.StreamInfo = await js.update_stream(config)
    log.info(
        "stream.limits_updated",
        stream=config.name,
        max_msgs=config.max_msgs,
        duplicate_window_s=config.duplicate_window,
    )
    return updated


async def ensure_dm_durable(
    js: JetStreamContext, space: str, owner: str, actor: str, uid: str
) -> api.ConsumerInfo:
    return await ensure_frontier_durable(
        js,
        names.dm_stream(space),
        names.dm_durable(owner, actor, uid),
        names.dm_filter(space, owner, actor),
    )


async def ensure_frontier_durable(
    js: JetStreamContext, stream: str, durable: str, filter_subject: str
) -> api.ConsumerInfo:
    """A lifecycle-keyed durable on `stream` (a seat's inbox, or its frontier in a channel),
    made at the activation moment, or the one the broker already holds, kept as it is."""

    async def ensure() -> api.ConsumerInfo:
        try:
            existing: api.ConsumerInfo = await js.consumer_info(stream, durable)
            return existing
        except NotFoundError:
            pass
        frontier = (await js.stream_info(stream)).state.last_seq
        config = api.ConsumerConfig(
            durable_name=durable,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=names.ACK_WAIT_S,
            filter_subject=filter_subject,
            max_ack_pending=1,
        )
        # The activation moment: nothing published before this seat existed is its mail.
        if frontier == 0:
            config.deliver_policy = api.DeliverPolicy.ALL
        else:
            config.deliver_policy = api.DeliverPolicy.BY_START_SEQUENCE
            config.opt_start_seq = frontier + 1
        try:
            info = await js.add_consumer(stream, config)
        except BadRequestError:
            # A concurrent creator may have won; its durable is this uid's durable.
            info = await js.consumer_info(stream, durable)
        log.info("durable.created", durable=durable, frontier=frontier)
        return info

    return await riding_elections(f"durable {durable}", ensure)


async def confirm_dm_durable(
    js: JetStreamContext, space: str, owner: str, actor: str, uid: str
) -> api.ConsumerInfo:
    """The lifecycle proof: the broker must already hold this uid's durable."""
    durable = names.dm_durable(owner, actor, uid)
    try:
        return await riding_elections(
            f"durable {durable}", lambda: js.consumer_info(names.dm_stream(space), durable)
        )
    except NotFoundError:
        raise Refusal(
            Code.LIFECYCLE_PROOF_FAILED,
            f"lifecycle proof failed for {actor} (uid {uid}): its dm_ durable {durable} is not "
            "present at the broker; refusing to publish presence",
            "resume with the uid the checkpoint recorded, against the broker that holds the "
            "seat's inbox",
        ) from None


async def dm_durable_exists(
    js: JetStreamContext, space: str, owner: str, actor: str, uid: str
) -> bool:
    try:
        await confirm_dm_durable(js, space, owner, actor, uid)
        return True
    except Refusal as exc:
        if exc.code == Code.LIFECYCLE_PROOF_FAILED:
            return False
        raise


async def delete_dm_durable(
    js: JetStreamContext, space: str, owner: str, actor: str, uid: str
) -> None:
    await delete_durable(js, names.dm_stream(space), names.dm_durable(owner, actor, uid))


async def delete_durable(js: JetStreamContext, stream: str, durable: str) -> None:
    """Remove a durable of `stream`; one already gone is no error."""

    async def delete() -> None:
        try:
            await js.delete_consumer(stream, durable)
            log.info("durable.deleted", durable=durable)
        except NotFoundError:
            pass

    await riding_elections(f"delete durable {durable}", delete)


async def ensure_kv(
    js: JetStreamContext, bucket: str, *, ttl: float | None, history: int = 1, replicas: int = 1
) -> KeyValue:
    async def ensure() -> KeyValue:
        try:
            return await js.key_value(bucket)
        except BucketNotFoundError:
            pass
        return await js.create_key_value(
            config=api.KeyValueConfig(
                bucket=bucket,
                history=history,
                ttl=ttl,
                storage=api.StorageType.FILE,
                replicas=replicas,
            )
        )

    return await riding_elections(f"bucket {bucket}", ensure)
