"""Recorded agent calls, read once from ``TraceEntry`` dicts into checked, packed form.

Why a separate step: every later stage (chain grouping, assembly, invariants) compares token
arrays many times. Reading each record once, rejecting malformed ones with a message that names
the record, and packing its ids into bytes keeps those stages simple and fast.

Selection follows ``contract.is_training_entry``: aux calls, failed calls and invalid calls are
left out, and so is an agent record whose arrays cannot be aligned. An invalid call is thereby
context only: the next call's canonical prompt replays its reply, which lands in that call's
interstitial with mask 0. A selected record marked ``trainable: false`` (or whose own loss mask
zeroes some sampled ids) contributes those ids with mask 0.

Logprobs that are not the policy's (``metadata.logprobs_are_policy: false``: the call ran under a
decoding constraint -- ``tool_choice: "required"``, a named tool, structured outputs -- so the
engine reported logprobs after its mask) are never offered as trainable by default: their ids get
mask 0, like an untrainable record's, since a trainer would take them as the old policy's logprobs
(importance ratios of 1e-6 on a constrained tag token). ``non_policy="keep"`` keeps them trainable
for a trainer that recomputes old logprobs itself; either way every segment says which it is.

Each call also keeps the policy versions its record carries (``contract.call_versions``: start, end,
straddled a weight sync, the engine's weight-version spans), read and checked here once so every
segment built from the call carries them; a malformed version is an ``AssemblyError`` naming the call.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from openenv_harness.assembly.errors import AssemblyError
from openenv_harness.assembly.tokens import pack_ids
from openenv_harness.contract import CallVersions, call_versions, is_training_entry

#: finish reasons that mean the model ended its turn itself (used to auto-detect the end-of-turn id).
NATURAL_STOPS: frozenset[str] = frozenset({"stop", "tool_calls"})
#: what becomes of sampled ids whose recorded logprobs are not the policy's (see the module docstring)
NonPolicy = Literal["mask", "keep"]
NON_POLICY_CHOICES: tuple[str, ...] = ("mask", "keep")


@dataclass(frozen=True, slots=True)
class Call:
    """One usable agent call: canonical prompt ids, sampled ids, logprobs and per-token mask."""

    node_id: str
    session_id: str
    call_index: int
    seq: int
    prompt: list[int]
    completion: list[int]
    logprobs: list[float]
    #: 1 where the sampled id is trainable (the record is trainable and its loss mask says so).
    mask: list[int]
    finish_reason: str | None
    status: str
    #: False when the record's logprobs were taken under a decoding constraint (not the policy's)
    logprobs_are_policy: bool
    prompt_bytes: bytes = field(repr=False)
    completion_bytes: bytes = field(repr=False)
    #: the engine's effective sampling settings (``provenance.sampling_effective``); None where not recorded
    sampling: dict[str, Any] | None = None
    #: the policy versions the call ran under (start, end, straddled a sync, engine weight-version spans)
    versions: CallVersions = CallVersions()

    @property
    def trainable_tokens(self) -> int:
        return sum(self.mask)


@dataclass(frozen=True, slots=True)
class Selection:
    """The calls a session contributes, in call order, and why the other records were left out."""

    session_id: str | None
    calls: list[Call]
    #: reason -> count, for records left out: ``aux``, ``failed``, ``invalid``, ``unusable``.
    excluded: dict[str, int]


def _require_int(value: Any, what: str, node_id: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise AssemblyError(f"{node_id}: metadata.{what} must be an integer, got {value!r}")
    return value


def _finish_reason(entry: Mapping[str, Any], metadata: Mapping[str, Any]) -> str | None:
    finish = metadata.get("finish_reason")
    if finish is None:
        choices = (entry.get("response") or {}).get("choices") or []
        if choices and isinstance(choices[0], Mapping):
            finish = choices[0].get("finish_reason")
    return finish if isinstance(finish, str) else None


def _completion_mask(
    entry: Mapping[str, Any], node_id: str, n_prompt: int, n_completion: int, trainable: bool
) -> list[int]:
    """The record's own mask over its sampled ids, narrowed by its trainable flag.

    The record's ``loss_mask`` spans prompt + completion (OpenEnv's convention); the prompt part
    must be all zeros. Without one, every sampled id follows the record's trainable flag.
    """
    if not trainable:
        return [0] * n_completion
    loss_mask = entry.get("loss_mask")
    if loss_mask is None:
        return [1] * n_completion
    if not isinstance(loss_mask, list) or len(loss_mask) != n_prompt + n_completion:
        got = len(loss_mask) if isinstance(loss_mask, list) else type(loss_mask).__name__
        raise AssemblyError(
            f"{node_id}: loss_mask must have one entry per prompt and completion id "
            f"({n_prompt} + {n_completion}), got {got}"
        )
    if any(v not in (0, 1) or isinstance(v, bool) for v in loss_mask):
        raise AssemblyError(f"{node_id}: loss_mask values must be the integers 0 or 1")
    if any(loss_mask[:n_prompt]):
        raise AssemblyError(f"{node_id}: loss_mask marks a prompt token as trainable")
    return list(loss_mask[n_prompt:])


def _is_real_logprob(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value <= 0.0


def call_from_entry(entry: Mapping[str, Any], *, non_policy: NonPolicy = "mask") -> Call:
    """Read one selected record; raise ``AssemblyError`` naming the record when it is malformed."""
    metadata = entry.get("metadata")
    if not isinstance(metadata, Mapping):
        raise AssemblyError("record has no metadata object")
    node_id = metadata.get("node_id")
    if not isinstance(node_id, str) or not node_id:
        raise AssemblyError("record has no metadata.node_id")
    session_id = metadata.get("session_id")
    if not isinstance(session_id, str) or not session_id:
        raise AssemblyError(f"{node_id}: metadata.session_id must be a non-empty string")
    call_index = _require_int(metadata.get("call_index"), "call_index", node_id)
    seq = _require_int(metadata.get("seq", call_index), "seq", node_id)

    prompt = list(entry["prompt_token_ids"])
    completion = list(entry["completion_token_ids"])
    logprobs = list(entry["per_token_logps"])
    prompt_bytes = pack_ids(prompt, what=f"{node_id}: prompt_token_ids")
    completion_bytes = pack_ids(completion, what=f"{node_id}: completion_token_ids")

    try:
        versions = call_versions(dict(entry))
    except ValueError as exc:
        raise AssemblyError(str(exc)) from None
    status = metadata.get("status", "ok")
    policy = metadata.get("logprobs_are_policy", True) is not False
    trainable = metadata.get("trainable", True) is True and status == "ok" and (policy or non_policy == "keep")
    mask = _completion_mask(entry, node_id, len(prompt), len(completion), trainable)
    for position, (flag, logprob) in enumerate(zip(mask, logprobs, strict=True)):
        if flag and not _is_real_logprob(logprob):
            raise AssemblyError(
                f"{node_id}: trainable sampled id at position {position} has logprob {logprob!r}; "
                "a trainable id needs a finite logprob <= 0"
            )
    return Call(
        node_id=node_id,
        session_id=session_id,
        call_index=call_index,
        seq=seq,
        prompt=prompt,
        completion=completion,
        logprobs=[float(x) if flag else 0.0 for x, flag in zip(logprobs, mask, strict=True)],
        mask=mask,
        finish_reason=_finish_reason(entry, metadata),
        status=status if isinstance(status, str) else "ok",
        logprobs_are_policy=policy,
        prompt_bytes=prompt_bytes,
        completion_bytes=completion_bytes,
        sampling=_effective_sampling(metadata),
        versions=versions,
    )


def _effective_sampling(metadata: Mapping[str, Any]) -> dict[str, Any] | None:
    provenance = metadata.get("provenance")
    effective = provenance.get("sampling_effective") if isinstance(provenance, Mapping) else None
    return dict(effective) if isinstance(effective, Mapping) else None


def _exclusion_reason(entry: Mapping[str, Any]) -> str:
    metadata = entry.get("metadata")
    if not isinstance(metadata, Mapping):
        return "unusable"
    if metadata.get("call_kind", "agent") != "agent":
        return "aux"
    status = metadata.get("status", "ok")
    return status if status in ("failed", "invalid") else "unusable"


def check_non_policy(non_policy: str) -> None:
    if non_policy not in NON_POLICY_CHOICES:
        raise AssemblyError(f"non_policy must be one of {', '.join(NON_POLICY_CHOICES)}, got {non_policy!r}")


def select_calls(entries: Iterable[Mapping[str, Any]], *, non_policy: NonPolicy = "mask") -> Selection:
    """The usable agent calls of one session, ordered by ``(call_index, seq)``.

    Raises ``AssemblyError`` when the records span several sessions or repeat a node id: chains
    are a per-session notion, and a duplicate id would make a trace's provenance ambiguous.
    """
    check_non_policy(non_policy)
    calls: list[Call] = []
    excluded: Counter[str] = Counter()
    for entry in entries:
        if not isinstance(entry, Mapping):
            raise AssemblyError(f"a record must be a dict, got {type(entry).__name__}")
        if is_training_entry(dict(entry)):
            calls.append(call_from_entry(entry, non_policy=non_policy))
        else:
            excluded[_exclusion_reason(entry)] += 1
    sessions = {call.session_id for call in calls}
    if len(sessions) > 1:
        raise AssemblyError(f"records span several sessions {sorted(sessions)}; assemble one session at a time")
    seen: set[str] = set()
    for call in calls:
        if call.node_id in seen:
            raise AssemblyError(f"node_id {call.node_id!r} appears twice")
        seen.add(call.node_id)
    calls.sort(key=lambda call: (call.call_index, call.seq))
    return Selection(session_id=sessions.pop() if sessions else None, calls=calls, excluded=dict(excluded))


def detect_eot(calls: Iterable[Call]) -> int | None:
    """The end-of-turn id: the last sampled id of the first call that stopped naturally.

    A natural stop (``stop`` / ``tool_calls``) means the engine emitted its end-of-turn token as
    the final sampled id. Returns None when no call stopped naturally.
    """
    for call in calls:
        if call.finish_reason in NATURAL_STOPS and call.completion:
            return call.completion[-1]
    return None
