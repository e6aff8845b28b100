"""What the recorder sent back in a dialect's shape, kept so the agent's replay can be recognised.

Why: a chat agent replays the model's tool arguments as a string and its reasoning as a string,
so a chain can be followed token by token. The Anthropic dialect cannot: ``tool_use.input`` is a
JSON *object* (the sampled text -- spacing, key order, escapes -- is gone once the client parses
it), and a client may send a thinking block back with only its ``signature`` (Responses clients
likewise may keep only ``encrypted_content``). So when a reply leaves, the sampled text is kept
here, keyed by what the client echoes (the tool call id; the signature or encrypted_content we
made up), and when the client's next request replays that turn the dialect adapter puts the
sampled text back -- only if what came back is exactly what we sent, otherwise the agent's own
version is used (it really did change the history).

Bounded per session (entries and bytes, oldest out first) and dropped when the session closes.
After a recorder restart the memory is empty; the next transition then shows whatever the
agent's re-serialization costs (usually ``replay_drift``), never a wrong prompt.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from typing import Any

#: Prefix of the opaque handles (Anthropic ``signature``, Responses ``encrypted_content``) we hand out.
HANDLE_PREFIX = "oeh1."


def reasoning_handle(reply_id: str, text: str) -> str:
    """A stable opaque handle for one reply's reasoning (the same reply always gets the same one)."""
    return HANDLE_PREFIX + hashlib.sha256(f"{reply_id}\x1f{text}".encode()).hexdigest()[:40]


class ReplayMemory:
    """Sampled tool-argument text by tool call id, and sampled reasoning by handle."""

    def __init__(self, max_entries: int = 1024, max_bytes: int = 8 * 1024 * 1024) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._calls: OrderedDict[str, tuple[str, Any]] = OrderedDict()
        self._reasoning: OrderedDict[str, str] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._calls) + len(self._reasoning)

    # -- tool calls ------------------------------------------------------------------------------

    def remember_call(self, call_id: str, sampled: str, sent: Any) -> None:
        """``sampled``: the engine's argument text; ``sent``: what the client got (text or object)."""
        if not call_id:
            return
        old = self._calls.pop(call_id, None)
        if old is not None:
            self._bytes -= len(old[0])
        self._calls[call_id] = (sampled, sent)
        self._bytes += len(sampled)
        self._trim()

    def sampled_arguments(self, call_id: str, replayed: Any) -> str | None:
        """The sampled text for ``call_id`` if the client replayed exactly what it was sent."""
        entry = self._calls.get(call_id) if call_id else None
        if entry is None or entry[1] != replayed:
            return None
        self._calls.move_to_end(call_id)
        return entry[0]

    def sampled(self, call_id: str) -> str | None:
        """The sampled text remembered for ``call_id`` (a retried call's reply is built from it)."""
        entry = self._calls.get(call_id) if call_id else None
        return entry[0] if entry is not None else None

    # -- reasoning -------------------------------------------------------------------------------

    def remember_reasoning(self, handle: str, text: str) -> None:
        old = self._reasoning.pop(handle, None)
        if old is not None:
            self._bytes -= len(old)
        self._reasoning[handle] = text
        self._bytes += len(text)
        self._trim()

    def reasoning(self, handle: Any) -> str | None:
        if not isinstance(handle, str) or handle not in self._reasoning:
            return None
        self._reasoning.move_to_end(handle)
        return self._reasoning[handle]

    def _trim(self) -> None:
        while self._calls and (len(self) > self.max_entries or self._bytes > self.max_bytes):
            _, (sampled, _) = self._calls.popitem(last=False)
            self._bytes -= len(sampled)
        while self._reasoning and (len(self) > self.max_entries or self._bytes > self.max_bytes):
            _, text = self._reasoning.popitem(last=False)
            self._bytes -= len(text)
