"""The file half of the record's retained-reference preflight (record 1.2, 2.1).

An inventory may name files a seat depends on: a credential (path and digest) and dependency
files. They stay on the host; the record travels. Wherever an inventory is taken as the truth
about a seat, at the cut's prepare and at the destination's resume, each named file must be a
regular file reached without a symlink, a credential must still be private (0600), and its bytes
must still hash to what the cut recorded. Anything else is a refusal naming the file: a
reference that cannot be proven is an error, never a warning. The rules that need no file
access are `protocol.inventory.reference_rule_errors`.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from connectors.privatefs import UnsafeFile, stream_stable
from protocol.inventory import (
    Agent,
    Reference,
    msg_changed,
    msg_not_private,
    msg_not_regular,
    msg_unavailable,
    references,
)

# A reference is a key or a small config file; a larger one is not what the cut recorded.
REFERENCE_CAP = 1024 * 1024


def reference_error(ref: Reference) -> str | None:
    digest = hashlib.sha256()
    try:
        stream_stable(Path(ref.path), digest.update, cap=REFERENCE_CAP, require_private=ref.private)
    except UnsafeFile as exc:
        if exc.problem == "not-private":
            return msg_not_private(ref.path)
        if exc.problem in ("symlink", "not-regular"):
            return msg_not_regular(ref.path)
        if exc.problem in ("too-large", "grew"):
            return msg_changed(ref)
        return msg_unavailable(ref.path, exc.detail)
    except OSError as exc:
        return msg_unavailable(ref.path, exc.strerror or type(exc).__name__)
    if ref.sha256 is not None and digest.hexdigest() != ref.sha256:
        return msg_changed(ref)
    return None


def reference_errors(agent: Agent) -> list[str]:
    """Every recorded reference of one seat that no longer holds, in recorded order."""
    return [e for ref in references(agent) if (e := reference_error(ref)) is not None]
