"""What the scale-out routes read back out of a prompt given as ids, without decoding all of it.

Why: sampling from ids (``/inference/v1/generate``, ``/v1/completions``) has no messages to pick a
scripted turn from, so this test double reads the roles back out of the prompt (``<|im_start|>role``
headers, a ``<tool_response>`` user turn counted as a tool turn, whether a tool list was rendered),
and derender needs to know whether the prompt leaves a think block open. Decoding the whole prompt
for that on every call cost ~0.7 ms at 2,700 ids, on each of generate and derender; vLLM's generate
decodes nothing and its derender reads only the prompt's last ids, so the incremental prompt mode
measured on this double paid for work the real engine does not do (``docs/benchmarks.md``).

- Roles: the prompt is cut at its ``<|im_start|>`` ids; each turn (the ids up to the next header)
  is decoded and read once, and the reading memoized by its ids. A continued prompt repeats every
  earlier turn, so only its new turns are decoded. The reading is the same as the whole decode's
  where the decoder is byte-level and ``<|im_start|>`` is one atomic id (the reference tokenizer,
  Qwen's): the decoded text is then the turns' texts joined by the header, and none of the marks
  read (a header, ``<tool_response>``, the tool list's ``\\n<tools>\\n``) can straddle a header.
  Any other tokenizer decodes the whole prompt.
- An open think block: the last ``<think>`` id and whether a ``</think>`` id follows it, read on the
  ids (both are atomic tokens here); otherwise the decoded prompt is searched.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from tokenizers import decoders

from openenv_harness.testing.engine.tokenizer import IM_START, THINK_CLOSE, THINK_OPEN, ReferenceTokenizer

_ROLE_HEADER = re.compile(r"<\|im_start\|>(\w+)\n")
_ROLE = re.compile(r"(\w+)\n")
_TOOLS_MARK = "\n<tools>\n"
_TOOL_RESPONSE = "<tool_response>"
_GENERATION_PROMPT = "assistant\n"
#: a think template's generation prompt opens the think block (Qwen3.5 and later)
_GENERATION_PROMPTS = (_GENERATION_PROMPT, _GENERATION_PROMPT + THINK_OPEN + "\n")
MAX_MEMO_TURNS = 4096


@dataclass(frozen=True)
class _TurnReading:
    """One turn's reading: its role (None without a header), and the marks it holds."""

    role: str | None
    tools_mark: bool
    generation_prompt: bool


def turn_body_from_text(text: str) -> dict[str, Any]:
    """A chat-like view of a decoded prompt, enough for ``choose_turn``: roles and whether tools are on.
    Qwen templates render a tool result as a ``user`` turn holding ``<tool_response>``: a tool turn."""
    roles = ["tool" if m.group(1) == "user" and text.startswith(_TOOL_RESPONSE, m.end()) else m.group(1)
             for m in _ROLE_HEADER.finditer(text)]
    if roles and roles[-1] == "assistant" and text.endswith(tuple(IM_START + p for p in _GENERATION_PROMPTS)):
        roles = roles[:-1]  # the generation prompt
    return {"messages": [{"role": r} for r in roles], "tools": [{}] if _TOOLS_MARK in text else None}


class PromptReader:
    """Reads prompts of one tokenizer; holds the memo of turns already read (one per engine)."""

    def __init__(self, tokenizer: ReferenceTokenizer) -> None:
        self.tokenizer = tokenizer
        byte_level = isinstance(tokenizer.tokenizer.decoder, decoders.ByteLevel)
        self._im_start = tokenizer.atomic_id(IM_START) if byte_level else None
        self._think_open, self._think_close = tokenizer.atomic_id(THINK_OPEN), tokenizer.atomic_id(THINK_CLOSE)
        self._memo: dict[tuple[int, ...], _TurnReading] = {}

    def turn_body(self, ids: list[int]) -> dict[str, Any]:
        """``turn_body_from_text(decode(ids))``, decoding only turns not read before."""
        header = self._im_start
        if header is None:
            return turn_body_from_text(self.tokenizer.decode(ids))
        starts: list[int] = []
        at = -1
        try:
            while True:
                at = ids.index(header, at + 1)
                starts.append(at)
        except ValueError:
            pass
        readings = [self._read(ids[0:starts[0]] if starts else ids, header=False)] if not starts or starts[0] else []
        for n, start in enumerate(starts):
            end = starts[n + 1] if n + 1 < len(starts) else len(ids)
            readings.append(self._read(ids[start + 1:end], header=True))
        roles = [r.role for r in readings if r.role is not None]
        last = readings[-1] if readings else None
        if roles and last is not None and last.generation_prompt:
            roles = roles[:-1]  # the generation prompt
        tools = any(r.tools_mark for r in readings)
        return {"messages": [{"role": r} for r in roles], "tools": [{}] if tools else None}

    def _read(self, turn: list[int], header: bool) -> _TurnReading:
        key = (header, *turn)
        found = self._memo.get(key)
        if found is not None:
            return found
        text = self.tokenizer.decode(turn)
        role = None
        if header:
            match = _ROLE.match(text)
            if match is not None:
                role = match.group(1)
                if role == "user" and text.startswith(_TOOL_RESPONSE, match.end()):
                    role = "tool"
        reading = _TurnReading(role=role, tools_mark=_TOOLS_MARK in text,
                               generation_prompt=header and role == "assistant" and text in _GENERATION_PROMPTS)
        self._memo[key] = reading
        while len(self._memo) > MAX_MEMO_TURNS:  # oldest first (dicts keep insertion order)
            del self._memo[next(iter(self._memo))]
        return reading

    def think_open(self, ids: list[int]) -> bool:
        """Whether the prompt leaves a ``<think>`` block open (the sample then starts in reasoning)."""
        opening, closing = self._think_open, self._think_close
        if opening is None or closing is None:
            prompt = self.tokenizer.decode(ids) if ids else ""
            tail = prompt[prompt.rfind(THINK_OPEN):] if THINK_OPEN in prompt else ""
            return bool(tail) and THINK_CLOSE not in tail
        try:
            last = len(ids) - 1 - ids[::-1].index(opening)
        except ValueError:
            return False
        return closing not in ids[last + 1:]


__all__ = ["PromptReader", "turn_body_from_text"]
