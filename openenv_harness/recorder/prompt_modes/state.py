"""What the incremental mode keeps: per session its chain tips, per call what its commit reuses.

Plain data, imported by the mode that fills it and, for their types, by the call it is part of (``base.ModeCall``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

from openenv_harness.recorder import history_match

MAX_CHECKPOINTS = 8
MAX_MEMO_MESSAGES = 1024


@dataclass
class Checkpoint:
    """One chain tip: the exact ids the engine has seen and said, and the messages they stand for."""

    ids: list[int]
    message_digests: list[str]
    reply: dict[str, Any]
    reply_digest: str
    rendering: str
    ends_turn: bool


@dataclass
class ContinuationCall:
    """What a call in flight worked out that its commit reuses (``ModeCall.continuation``): its
    history's digests and tools digest, and, once it continued, the checkpoint it continued (replaced
    by the call's own once it is recorded: call numbers are given only then) and its prompt."""

    digests: list[str]
    rendering: str
    parent: Checkpoint | None = None
    prompt: list[int] | None = None


@dataclass
class IncrementalState:
    """Per session: recent chain tips (sub-agents interleave) and whether the engine lacks the routes."""

    checkpoints: list[Checkpoint] = field(default_factory=list)
    routes_missing: str | None = None
    #: message (its JSON) -> its canonical digest: a call replays the previous call's messages, so
    #: only the new ones are canonicalized (a pure function's memo; bounded)
    digest_memo: dict[bytes, str] = field(default_factory=dict)

    def digests(self, messages: list[Any]) -> list[str]:
        out = []
        memo = self.digest_memo
        for message in messages:
            key = orjson.dumps(message)
            found = memo.get(key)
            if found is None:
                found = memo[key] = history_match.digest(message)
            out.append(found)
        while len(memo) > 4 * MAX_MEMO_MESSAGES:  # oldest first (dicts keep insertion order)
            del memo[next(iter(memo))]
        return out


#: reasons that are not uncertainty: a strict session still proceeds (a new chain, as in full history)
NEW_CHAIN = frozenset({"chain_start", "history_changed", "aux_call"})


class Fallback(Exception):
    """A continuation that is not certain: the call is sampled from its full history instead (or,
    in a strict session, refused), with ``reason`` recorded."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail
