"""Channels at the broker: the space's channel stream, a subscriber's frontier in each channel,
a post's publish and a channel's recent history (docs/mesh.md, "Channels").

One stream per space, `CHAN_<space>`, one subject per channel. It keeps at most `history`
posts per channel and none older than `max_age_s`, and discards the oldest: a channel is a
bounded history, never a queue, so a post is never refused because older ones were not read.
A subscribed seat reads a channel through its own durable, `chathist_<owner>-<seat>-<uid>-<ch>`,
keyed by its lifecycle uid as its inbox is, made at its spawn so a stopped seat finds at its
start what was posted meanwhile (within the bound).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable

import structlog
from nats.js import JetStreamContext, api
from nats.js.errors import NotFoundError

from manager.broker import reader
from manager.broker.footprint import (
    delete_durable,
    duplicate_window_s,
    ensure_frontier_durable,
)
from manager.broker.retry import riding_elections
from protocol import meshcall, names
from protocol.codec import encode_json
from protocol.errors import DecodeError

log = structlog.get_logger("cotal.broker")

DEFAULT_HISTORY = 100
DEFAULT_MAX_AGE_S = 7 * 24 * 60 * 60


def chan_duplicate_window_s(horizon_s: int | None, max_age_s: int) -> float:
    """A turn run again posts the same ids, dropped as duplicates within the recency horizon as
    a seat's sends are; never past the channel's own age bound, which the broker requires."""
    return min(duplicate_window_s(horizon_s), float(max_age_s))


def chan_stream_config(
    space: str,
    *,
    history: int,
    max_age_s: int,
    replicas: int = 1,
    horizon_s: int | None = None,
) -> api.StreamConfig:
    return api.StreamConfig(
        name=names.chan_stream(space),
        subjects=[names.chan_stream_subjects(space)],
        retention=api.RetentionPolicy.LIMITS,
        storage=api.StorageType.FILE,
        discard=api.DiscardPolicy.OLD,
        max_msgs_per_subject=history,
        max_age=float(max_age_s),
        duplicate_window=chan_duplicate_window_s(horizon_s, max_age_s),
        num_replicas=replicas,
        # Each seat's post marker (`fence.WriterFence.establish_posts`) must outlive max_age.
        allow_msg_ttl=True,
    )


def _bounds(config: api.StreamConfig) -> tuple[object, ...]:
    return (
        config.discard,
        config.max_msgs_per_subject,
        float(config.max_age or 0.0),
        float(config.duplicate_window or 0.0),
        bool(config.allow_msg_ttl),
    )


async def ensure_chan_stream(
    js: JetStreamContext,
    space: str,
    *,
    history: int,
    max_age_s: int,
    replicas: int = 1,
    horizon_s: int | None = None,
) -> None:
    """Make the stream, or bring an existing one's bounds to this root's `[channels]` in place
    (the posts and the durables are kept). Its duplicate window is widened to this root's
    horizon and never narrowed: managers sharing the broker may hold other horizons."""
    wanted = chan_stream_config(
        space, history=history, max_age_s=max_age_s, replicas=replicas, horizon_s=horizon_s
    )

    async def ensure() -> None:
        try:
            info = await js.stream_info(wanted.name or "")
        except NotFoundError:
            await js.add_stream(wanted)
            log.info("stream.created", stream=wanted.name, history=history, max_age_s=max_age_s)
            return
        if _bounds(info.config) == _bounds(wanted):
            return
        config = info.config
        before = _bounds(config)
        config.discard = wanted.discard
        config.max_msgs_per_subject = wanted.max_msgs_per_subject
        config.max_age = wanted.max_age
        config.allow_msg_ttl = True
        config.duplicate_window = min(
            max(float(config.duplicate_window or 0.0), float(wanted.duplicate_window or 0.0)),
            float(max_age_s),
        )
        if _bounds(config) == before:
            return
        await js.update_stream(config)
        log.info("stream.limits_updated", stream=wanted.name, history=history)

    await riding_elections(f"stream {wanted.name}", ensure)


async def ensure_chathist_durable(
    js: JetStreamContext, space: str, owner: str, actor: str, uid: str, channel: str
) -> api.ConsumerInfo:
    """The seat's frontier in `channel`, made at the activation moment (nothing posted before
    the seat subscribed is its turn), or the one the broker already holds, kept as it is."""
    return await ensure_frontier_durable(
        js,
        names.chan_stream(space),
        names.chathist_durable(owner, actor, uid, channel),
        names.chan_subject(space, channel),
    )


async def delete_chathist_durable(
    js: JetStreamContext, space: str, owner: str, actor: str, uid: str, channel: str
) -> None:
    """The frontier, and the posts it carried here from another broker, which nothing else
    reads."""
    stream = names.chan_stream(space)
    await delete_durable(js, stream, names.chathist_durable(owner, actor, uid, channel))
    carried = names.chan_carried_subject(space, channel, uid)
    with contextlib.suppress(NotFoundError):
        await riding_elections(
            f"carried posts of {actor} in #{channel}",
            lambda: js.purge_stream(stream, subject=carried),
        )


async def publish_post(
    js: JetStreamContext,
    space: str,
    post: meshcall.ChannelPost,
    publish: Callable[[str, bytes, dict[str, str]], Awaitable[int]] | None = None,
) -> int:
    """Store a post; `publish` is the writer fence when the poster is a seat. A publish retried
    after a lost answer is a duplicate, not a second post."""
    subject = names.chan_subject(space, post.channel)
    headers = {"Nats-Msg-Id": post.id, meshcall.SENDER_HEADER: post.sender}
    payload = encode_json(post)
    if publish is not None:
        return await publish(subject, payload, headers)
    ack = await riding_elections(
        f"post to #{post.channel}", lambda: js.publish(subject, payload, headers=headers)
    )
    return int(ack.seq)


async def history(
    js: JetStreamContext, space: str, channel: str, limit: int
) -> list[meshcall.MeshPost]:
    """The channel's `limit` most recent posts, oldest first, read by a reader of our own
    (`reader.read`), so no subscriber's frontier moves."""
    config = api.ConsumerConfig(
        deliver_policy=api.DeliverPolicy.ALL, filter_subject=names.chan_subject(space, channel)
    )
    seen: list[meshcall.MeshPost] = []
    async with contextlib.aclosing(
        reader.read(js, names.chan_stream(space), config, what=f"history of #{channel}")
    ) as messages:
        async for msg in messages:
            try:
                post = meshcall.decode_post(msg.data)
            except DecodeError:
                continue
            seen.append(
                meshcall.MeshPost(
                    seq=int(msg.metadata.sequence.stream),
                    sender=post.sender,
                    text=post.text,
                    sent_at=post.sent_at,
                )
            )
    return seen[-limit:]
