"""A generated corpus of engine replies, good and bad, and an oracle that says what each one proves.

Every reply starts as a well-formed vLLM chat reply (canonical prompt ids, sampled ids, their
logprobs, a usage block) and gets zero to two defects: token fields nested elsewhere, duplicated,
spelled with escapes, null, absent, of the wrong type, out of range, NaN, infinite; choices,
logprobs and usage broken; bodies that are not JSON at all. Serialized compact (the recorder's fast
id reader) or spaced (the full parse), so both readers see every kind.

The oracle is written from the rules a trainer needs, independently of ``validate.py``: a reply is
read as JSON parsers read it, and its evidence is trainable only when every id is a JSON integer in
[0, 2**32) at the one place vLLM puts it, every logprob a finite number <= 0, one per sampled id,
and nothing contradicts them. Where it is not, the record must be untrainable; where it is, the
record must carry exactly those ids.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

UINT32 = 1 << 32
_TOKEN_ID = re.compile(r"token_id:(0|[1-9][0-9]*)\Z")


@dataclass
class Case:
    key: str
    kind: str  # the defects, for the counts
    raw: bytes
    session: int


@dataclass
class Verdict:
    """``failed``: not a JSON object (a failed call); ``reject``: must be untrainable; ``accept``:
    must be trainable with exactly these ids; ``either``: doubtful but not wrong (if trainable, exact)."""

    outcome: str
    prompt: list[int] | None = None
    completion: list[int] | None = None
    logprobs: list[float] | None = None
    why: str = ""


# -- the oracle ----------------------------------------------------------------------------------


class _Duplicate(Exception):
    pass


def _pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    names = [k for k, _ in pairs]
    for token_key in ("prompt_token_ids", "token_ids"):
        if names.count(token_key) > 1:
            raise _Duplicate(token_key)
    return dict(pairs)


def _strict_ids(value: Any) -> list[int] | None:
    if not isinstance(value, list):
        return None
    if not all(type(v) is int and 0 <= v < UINT32 for v in value):
        return None
    return value


def judge(raw: bytes) -> Verdict:
    try:
        reply = json.loads(raw, object_pairs_hook=_pairs)
    except _Duplicate as dup:
        return Verdict("reject", why=f"duplicated {dup}")
    except ValueError:
        return Verdict("failed", why="not JSON")
    if not isinstance(reply, dict):
        return Verdict("failed", why="not an object")
    choices = reply.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return Verdict("reject", why="choices")
    choice = choices[0]
    prompt = _strict_ids(reply.get("prompt_token_ids"))
    if not prompt:
        return Verdict("reject", why="prompt ids")
    lp = choice.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if not isinstance(content, list) or not all(isinstance(e, dict) for e in content):
        return Verdict("reject", why="logprobs")
    logprobs = [e.get("logprob") for e in content]
    if not all(type(v) in (int, float) and math.isfinite(v) and v <= 0 for v in logprobs):
        return Verdict("reject", why="logprob values")
    if choice.get("token_ids") is not None:
        completion = _strict_ids(choice["token_ids"])
        if completion is None:
            return Verdict("reject", why="sampled ids")
    else:
        tokens = [e.get("token") for e in content]
        matches = [_TOKEN_ID.match(t) if isinstance(t, str) else None for t in tokens]
        if not all(matches) or not all(int(m.group(1)) < UINT32 for m in matches):  # type: ignore[union-attr]
            return Verdict("reject", why="no sampled ids")
        completion = [int(m.group(1)) for m in matches]  # type: ignore[union-attr]
    if len(completion) != len(logprobs):
        return Verdict("reject", why="ids vs logprobs")
    outcome = "accept"
    usage = reply.get("usage")
    if isinstance(usage, dict):
        for field, n in (("prompt_tokens", len(prompt)), ("completion_tokens", len(completion))):
            v = usage.get(field)
            if type(v) is int and v != n:
                return Verdict("reject", why=f"usage.{field}")
            if isinstance(v, bool):
                outcome = "either"
    return Verdict(outcome, prompt, completion, [float(v) for v in logprobs])


# -- the corpus ----------------------------------------------------------------------------------

_BAD_ID_VALUES: list[Any] = [-1, 1.5, 1.0, True, False, None, "5", [3], UINT32, 2**64, 10**30,
                             float("nan"), float("inf"), -0.0, {"id": 1}]
_GOOD_EDGE_IDS = [0, 1, UINT32 - 1]
_BAD_LOGPROBS: list[Any] = [None, "-0.5", True, False, float("nan"), float("inf"), float("-inf"), 0.5, 5e-324,
                            [-0.1], {"v": -0.1}]
_GOOD_LOGPROBS: list[Any] = [0, -1, -0.0, 0.0, -1e-300]


def _base(rng: random.Random, prompt: list[int]) -> dict[str, Any]:
    n = rng.randint(0, 6) if rng.random() < 0.1 else rng.randint(1, 24)
    completion = [rng.randrange(0, 152_000) for _ in range(n)]
    logprobs = [round(-rng.random() * 5, 6) for _ in completion]
    return {
        "id": f"chatcmpl-{rng.randrange(10**9)}", "object": "chat.completion", "created": 1_700_000_000,
        "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "fine", "tool_calls": []},
                     "logprobs": {"content": [{"token": f"token_id:{t}", "logprob": lp, "bytes": [],
                                               "top_logprobs": []} for t, lp in zip(completion, logprobs)]},
                     "finish_reason": "stop", "stop_reason": None, "token_ids": completion}],
        "usage": {"prompt_tokens": len(prompt), "total_tokens": len(prompt) + n, "completion_tokens": n},
        "prompt_logprobs": None, "prompt_token_ids": list(prompt), "kv_transfer_params": None,
    }


def _choice(reply: dict[str, Any]) -> dict[str, Any]:
    return reply["choices"][0]


# dict-level defects: (name, function(rng, reply) -> None), mutating the reply
def _set_prompt(value: Any) -> Callable[[random.Random, dict], None]:
    def f(rng: random.Random, reply: dict) -> None:
        reply["prompt_token_ids"] = value
    return f


def _bad_prompt_id(value: Any) -> Callable[[random.Random, dict], None]:
    def f(rng: random.Random, reply: dict) -> None:
        ids = reply["prompt_token_ids"]
        ids.insert(rng.randrange(len(ids) + 1), value)
        reply["usage"]["prompt_tokens"] = len(ids)
    return f


def _bad_sampled_id(value: Any) -> Callable[[random.Random, dict], None]:
    def f(rng: random.Random, reply: dict) -> None:
        c = _choice(reply)
        ids = c["token_ids"]
        at = rng.randrange(len(ids) + 1)
        ids.insert(at, value)
        c["logprobs"]["content"].insert(at, {"token": "token_id:7", "logprob": -0.5})
        reply["usage"]["completion_tokens"] = len(ids)
    return f


def _bad_logprob(value: Any) -> Callable[[random.Random, dict], None]:
    def f(rng: random.Random, reply: dict) -> None:
        content = _choice(reply)["logprobs"]["content"]
        if not content:
            _bad_sampled_id(7)(rng, reply)
            content = _choice(reply)["logprobs"]["content"]
        content[rng.randrange(len(content))]["logprob"] = value
    return f


def _nest_prompt(where: str, value: Any) -> Callable[[random.Random, dict], None]:
    def f(rng: random.Random, reply: dict) -> None:
        ids = [rng.randrange(0, 1000) for _ in range(rng.randint(1, 8))]
        target = {"kv": lambda: reply.__setitem__("kv_transfer_params", {"prompt_token_ids": ids}),
                  "choice": lambda: _choice(reply).__setitem__("prompt_token_ids", ids),
                  "message": lambda: _choice(reply)["message"].__setitem__("prompt_token_ids", ids)}[where]
        target()
        if value != "keep":
            if value is None:
                reply["prompt_token_ids"] = None
            else:
                reply.pop("prompt_token_ids")
    return f


def _tokens_only(kind: str) -> Callable[[random.Random, dict], None]:
    def f(rng: random.Random, reply: dict) -> None:
        c = _choice(reply)
        if kind == "null":
            c["token_ids"] = None
        else:
            c.pop("token_ids")
    return f


def _token_string(text: str) -> Callable[[random.Random, dict], None]:
    def f(rng: random.Random, reply: dict) -> None:
        c = _choice(reply)
        c["token_ids"] = None
        if not c["logprobs"]["content"]:
            _bad_sampled_id(7)(rng, reply)
            c["token_ids"] = None
        c["logprobs"]["content"][-1]["token"] = text
    return f


def _mutate(path: str, value: Any) -> Callable[[random.Random, dict], None]:
    def f(rng: random.Random, reply: dict) -> None:
        node: Any = reply
        parts = path.split(".")
        for part in parts[:-1]:
            node = node[int(part)] if part.isdigit() else node[part]
        last: Any = int(parts[-1]) if parts[-1].isdigit() else parts[-1]
        if value == "<delete>":
            node.pop(last, None)
        elif value == "<+1>":
            node[last] = node[last] + 1
        else:
            node[last] = value
    return f


def _extra_sampled_id(rng: random.Random, reply: dict) -> None:
    _choice(reply)["token_ids"].append(5)
    reply["usage"]["completion_tokens"] += 1


def _two_choices(rng: random.Random, reply: dict) -> None:
    reply["choices"].append(json.loads(json.dumps(_choice(reply))))


DICT_DEFECTS: list[tuple[str, Callable[[random.Random, dict], None]]] = [
    ("prompt null", _set_prompt(None)), ("prompt empty", _set_prompt([])), ("prompt string", _set_prompt("1,2,3")),
    ("prompt number", _set_prompt(7)), ("prompt object", _set_prompt({"ids": [1]})), ("prompt true", _set_prompt(True)),
    ("prompt nested list", _set_prompt([[1, 2], [3]])),
    ("prompt absent", _mutate("prompt_token_ids", "<delete>")),
    *[(f"prompt id {v!r}", _bad_prompt_id(v)) for v in _BAD_ID_VALUES],
    *[(f"prompt edge id {v}", _bad_prompt_id(v)) for v in _GOOD_EDGE_IDS],
    *[(f"nested in {w}, top {t}", _nest_prompt(w, t)) for w in ("kv", "choice", "message") for t in (None, "absent", "keep")],
    *[(f"sampled id {v!r}", _bad_sampled_id(v)) for v in _BAD_ID_VALUES],
    *[(f"sampled edge id {v}", _bad_sampled_id(v)) for v in _GOOD_EDGE_IDS],
    ("sampled ids null, token strings", _tokens_only("null")), ("sampled ids absent, token strings", _tokens_only("absent")),
    *[(f"token string {t!r}", _token_string(t)) for t in ("hello", "token_id:", "token_id:-1", "token_id:+7",
                                                          "token_id: 7", "token_id:07", "token_id:7_0", "token_id:0x7",
                                                          "token_id:4294967296", "token_id:\u0667", "token_id:7")],
    ("sampled ids a string", _mutate("choices.0.token_ids", "1 2")), ("sampled ids nested", _mutate("choices.0.token_ids", [[1]])),
    ("one sampled id too many", _extra_sampled_id),
    *[(f"logprob {v!r}", _bad_logprob(v)) for v in _BAD_LOGPROBS],
    *[(f"edge logprob {v!r}", _bad_logprob(v)) for v in _GOOD_LOGPROBS],
    ("logprobs null", _mutate("choices.0.logprobs", None)), ("logprobs content null", _mutate("choices.0.logprobs.content", None)),
    ("logprobs content absent", _mutate("choices.0.logprobs.content", "<delete>")),
    ("logprobs a list", _mutate("choices.0.logprobs", [])),
    ("choices absent", _mutate("choices", "<delete>")), ("choices empty", _mutate("choices", [])),
    ("choices null", _mutate("choices", None)), ("choices an object", _mutate("choices", {"0": {}})),
    ("choice a string", _mutate("choices.0", "x")), ("two choices", _two_choices),
    ("usage.prompt_tokens off by one", _mutate("usage.prompt_tokens", "<+1>")),
    ("usage.completion_tokens off by one", _mutate("usage.completion_tokens", "<+1>")),
    ("usage.prompt_tokens a string", _mutate("usage.prompt_tokens", "5")),
    ("usage.prompt_tokens a float", _mutate("usage.prompt_tokens", 5.0)),
    ("usage.prompt_tokens true", _mutate("usage.prompt_tokens", True)),
    ("usage null", _mutate("usage", None)), ("usage absent", _mutate("usage", "<delete>")),
    ("usage a list", _mutate("usage", [1])),
]


def _encode(reply: Any, spaced: bool) -> bytes:
    if spaced:
        return json.dumps(reply).encode()
    return json.dumps(reply, separators=(",", ":")).encode()


def _ids_text(ids: list[int]) -> bytes:
    return b"[" + b",".join(b"%d" % i for i in ids) + b"]"


# byte-level defects: (name, function(rng, reply, raw) -> raw) on a compact encoding
def _dup_prompt(order: str) -> Callable[[random.Random, dict, bytes], bytes]:
    def f(rng: random.Random, reply: dict, raw: bytes) -> bytes:
        other = {"null": b"null", "ids": _ids_text([rng.randrange(1000) for _ in range(4)])}[order]
        key = b'"prompt_token_ids":'
        at = raw.index(key)
        return raw[:at] + key + other + b"," + raw[at:]  # an earlier duplicate: the last one is the real one
    return f


def _dup_prompt_after(rng: random.Random, reply: dict, raw: bytes) -> bytes:
    return raw[:-1] + b',"prompt_token_ids":null}'  # a later null duplicate overrides the ids


def _dup_sampled(rng: random.Random, reply: dict, raw: bytes) -> bytes:
    key = b'"token_ids":'
    at = raw.index(b'"token_ids":')
    return raw[:at] + key + _ids_text([9] * len(_choice(reply)["token_ids"])) + b"," + raw[at:]


def _escaped_key(rng: random.Random, reply: dict, raw: bytes) -> bytes:
    return raw.replace(b'"prompt_token_ids":', b'"prompt\\u005ftoken_ids":', 1)


def _escaped_key_and_nested(rng: random.Random, reply: dict, raw: bytes) -> bytes:
    raw = raw.replace(b'"prompt_token_ids":' + _ids_text(reply["prompt_token_ids"]), b'"prompt\\u005ftoken_ids":null', 1)
    return raw.replace(b'"kv_transfer_params":null', b'"kv_transfer_params":{"prompt_token_ids":[11,12,13]}')


def _blanks_in_span(rng: random.Random, reply: dict, raw: bytes) -> bytes:
    ids = reply["prompt_token_ids"]
    return raw.replace(_ids_text(ids), b"[ " + b" ,\n".join(b"%d" % i for i in ids) + b" ]", 1)


def _truncate(rng: random.Random, reply: dict, raw: bytes) -> bytes:
    return raw[: rng.randrange(1, len(raw) - 1)]


def _leading_zero(rng: random.Random, reply: dict, raw: bytes) -> bytes:
    return raw.replace(b'"prompt_token_ids":[', b'"prompt_token_ids":[007,', 1)


def _marker_in_content(rng: random.Random, reply: dict, raw: bytes) -> bytes:
    return raw.replace(b'"content":"fine"', b'"content":"says \\"prompt_token_ids\\":[1,2] and oeh:prompt-token-ids-span"')


def _whole(body: bytes) -> Callable[[random.Random, dict, bytes], bytes]:
    return lambda rng, reply, raw: body


BYTE_DEFECTS: list[tuple[str, Callable[[random.Random, dict, bytes], bytes]]] = [
    ("duplicated prompt key (null first)", _dup_prompt("null")), ("duplicated prompt key (other ids first)", _dup_prompt("ids")),
    ("duplicated prompt key (null last)", _dup_prompt_after), ("duplicated sampled key", _dup_sampled),
    ("prompt key escaped", _escaped_key), ("prompt key escaped, ids nested", _escaped_key_and_nested),
    ("blanks in the id list", _blanks_in_span), ("truncated body", _truncate), ("leading zero id", _leading_zero),
    ("key and marker inside a string", _marker_in_content),
    ("body empty", _whole(b"")), ("body a list", _whole(b"[1,2]")), ("body null", _whole(b"null")),
    ("body a string", _whole(b'"ok"')), ("body not JSON", _whole(b"<html>bad gateway</html>")),
]


def generate(seed: int, count: int, sessions: int) -> list[Case]:
    """``count`` replies over ``sessions`` sessions. Each session's prompts often extend its previous
    one (as an agent's do), so the recorder's id reader reuses what it read before; each defect
    kind appears at least once, the rest are drawn at random (a third of them left clean)."""
    rng = random.Random(seed)
    last_prompt: dict[int, list[int]] = {}
    cases: list[Case] = []
    plan: list[list[str]] = [[name] for name, _ in DICT_DEFECTS + BYTE_DEFECTS]
    dict_names = {name for name, _ in DICT_DEFECTS}
    while len(plan) < count:
        pick = rng.random()
        if pick < 0.33:
            plan.append([])
        elif pick < 0.8:
            plan.append([rng.choice(DICT_DEFECTS)[0]])
        else:
            plan.append([rng.choice(DICT_DEFECTS)[0], rng.choice(BYTE_DEFECTS[:10])[0]])
    rng.shuffle(plan)
    defects = dict(DICT_DEFECTS)
    byte_defects = dict(BYTE_DEFECTS)
    for index, names in enumerate(plan):
        session = index % sessions
        previous = last_prompt.get(session)
        if previous is not None and rng.random() < 0.6:
            prompt = previous + [rng.randrange(0, 152_000) for _ in range(rng.randint(1, 40))]
        else:
            prompt = [rng.randrange(0, 152_000) for _ in range(rng.randint(1, 300))]
        last_prompt[session] = prompt
        reply = _base(rng, prompt)
        for name in names:
            if name in dict_names:
                defects[name](rng, reply)
        spaced = not any(n not in dict_names for n in names) and rng.random() < 0.25
        raw = _encode(reply, spaced)
        for name in names:
            if name not in dict_names:
                try:
                    raw = byte_defects[name](rng, reply, raw)
                except (ValueError, TypeError, KeyError, IndexError):  # an earlier defect removed what it works on
                    pass
        kind = " + ".join(names) or "clean"
        if spaced:
            kind += " (spaced)"
        cases.append(Case(key=f"case-{index}", kind=kind, raw=raw, session=session))
    return cases
