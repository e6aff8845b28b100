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
After a recorder restart it is rebuilt from the session's records before the session's first call
is served (``recorder/session/restore.py``): each recorded dialect reply keeps what was handed out -- its
``response`` and the sampled argument text (``metadata.sampled_arguments``) -- so the same entries
come back, within the same bounds. Where a record cannot give them back (a store that cannot be
read, an entry trimmed by the bounds) the next transition shows whatever the agent's
re-serialization costs (usually ``replay_drift``), never a wrong prompt.
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
    """Sampled tool-argument text by tool call id, and sampled reasoning by handle.

    One age order for both kinds: what is trimmed is the least recently remembered or used entry,
    whichever kind it is (so a long session with thinking on every turn keeps its latest tool calls).
    """

    def __init__(self, max_entries: int = 1024, max_bytes: int = 8 * 1024 * 1024) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        #: ``("call", id) -> (sampled, sent)`` and ``("reasoning", handle) -> (text, None)``, oldest first
        self._entries: OrderedDict[tuple[str, str], tuple[str, Any]] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def _put(self, key: tuple[str, str], text: str, sent: Any) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= len(old[0])
        self._entries[key] = (text, sent)
        self._bytes += len(text)
        while self._entries and (len(self._entries) > self.max_entries or self._bytes > self.max_bytes):
            _, (dropped, _) = self._entries.popitem(last=False)
            self._bytes -= len(dropped)

    def absorb(self, older: ReplayMemory) -> None:
        """Take the entries a restart rebuilt from the records (``session/restore.py``) as older than this
        memory's own (a count-tokens call may have used it meanwhile), within the same bounds."""
        mine = list(self._entries.items())
        self.clear()
        for key, (text, sent) in [*older._entries.items(), *mine]:
            self._put(key, text, sent)

    def clear(self) -> None:
        """The session is closed: forget everything (memory follows live sessions)."""
        self._entries.clear()
        self._bytes = 0

    def _get(self, key: tuple[str, str]) -> tuple[str, Any] | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
        return entry

    # -- tool calls ------------------------------------------------------------------------------

    def remember_call(self, call_id: str, sampled: str, sent: Any) -> None:
        """``sampled``: the engine's argument text; ``sent``: what the client got (text or object)."""
        if call_id:
            self._put(("call", call_id), sampled, sent)

    def sampled_arguments(self, call_id: str, replayed: Any) -> str | None:
        """The sampled text for ``call_id`` if the client replayed exactly what it was sent."""
        entry = self._entries.get(("call", call_id)) if call_id else None
        if entry is None or entry[1] != replayed:
            return None
        self._entries.move_to_end(("call", call_id))
        return entry[0]

    def sampled(self, call_id: str) -> str | None:
        """The sampled text remembered for ``call_id`` (a retried call's reply is built from it)."""
        entry = self._entries.get(("call", call_id)) if call_id else None
        return entry[0] if entry is not None else None

    # -- reasoning -------------------------------------------------------------------------------

    def remember_reasoning(self, handle: str, text: str) -> None:
        self._put(("reasoning", handle), text, None)

    def reasoning(self, handle: Any) -> str | None:
        if not isinstance(handle, str):
            return None
        entry = self._get(("reasoning", handle))
        return entry[0] if entry is not None else None
