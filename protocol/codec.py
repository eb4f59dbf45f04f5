"""Strict bounded decoding: size cap first, then a schema that refuses unknown fields."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from protocol.errors import DecodeError

T = TypeVar("T")

_json_encoder = msgspec.json.Encoder(order="sorted")


def decode_json(data: bytes | str, kind: type[T], *, what: str, cap: int) -> T:
    """Decode `data` as `kind`, refusing oversize input before parsing a byte of it."""
    raw = data.encode() if isinstance(data, str) else data
    if len(raw) > cap:
        raise DecodeError(what, f"{len(raw)} bytes exceeds the {cap}-byte cap")
    try:
        return msgspec.json.decode(raw, type=kind, strict=True)
    except msgspec.ValidationError as exc:
        raise DecodeError(what, str(exc)) from None
    except msgspec.DecodeError as exc:
        raise DecodeError(what, f"not valid JSON ({exc})") from None


def convert(obj: Any, kind: type[T], *, what: str) -> T:
    """Validate an already-decoded object (for example a `msgspec.Raw` payload's contents)."""
    try:
        return msgspec.convert(obj, type=kind, strict=True)
    except msgspec.ValidationError as exc:
        raise DecodeError(what, str(exc)) from None


def encode_json(obj: Any) -> bytes:
    """Normalized JSON: keys sorted, no whitespace, so equal records have equal bytes."""
    return _json_encoder.encode(obj)
