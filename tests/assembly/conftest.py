"""Shared helpers for assembly tests: a contract-valid record factory and a toy chat template.

The toy template mimics a ChatML-style render: each message is ``<role> body <eot> <nl>`` and a
generation prompt ends with ``<assistant>``. Replies sampled with a natural stop end with ``<eot>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from openenv_harness.contract import TraceRecord, loss_mask_for

SYS, USER, ASSIST, TOOL, EOT, NL = 1, 2, 3, 4, 5, 6
ROLE_IDS = {"system": SYS, "user": USER, "assistant": ASSIST, "tool": TOOL}

Message = tuple[str, Sequence[int]]


def render(messages: Sequence[Message], *, generation_prompt: bool = True) -> list[int]:
    """The toy template: canonical prompt ids for a message list."""
    ids: list[int] = []
    for role, body in messages:
        ids += [ROLE_IDS[role], *body, EOT, NL]
    if generation_prompt:
        ids.append(ASSIST)
    return ids


def make_record(
    prompt: Sequence[int],
    completion: Sequence[int],
    *,
    call_index: int,
    session_id: str = "sess",
    logps: Sequence[float] | None = None,
    call_kind: str = "agent",
    status: str = "ok",
    trainable: bool | None = None,
    finish_reason: str | None = "stop",
    seq: int | None = None,
) -> dict[str, Any]:
    """One record in OpenEnv ``TraceEntry`` shape, validated against our contract model."""
    if trainable is None:
        trainable = status == "ok" and call_kind == "agent"
    if logps is None:
        logps = [-0.25 - 0.01 * (i % 7) for i in range(len(completion))]
    record: dict[str, Any] = {
        "request": {"model": "policy", "messages": [{"role": "user", "content": f"call {call_index}"}]},
        "response": {
            "id": f"chatcmpl-{call_index}",
            "object": "chat.completion",
            "created": 0,
            "model": "policy",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": ""}, "finish_reason": finish_reason}],
        },
        "prompt_token_ids": list(prompt),
        "completion_token_ids": list(completion),
        "completion_tokens": None,
        "per_token_logps": list(logps),
        "loss_mask": loss_mask_for(len(prompt), len(completion), trainable),
        "metadata": {
            "node_id": f"{session_id}/{call_index}",
            "session_id": session_id,
            "seq": call_index if seq is None else seq,
            "call_index": call_index,
            "call_kind": call_kind,
            "status": status,
            "trainable": trainable,
            "finish_reason": finish_reason,
        },
    }
    TraceRecord.model_validate(record)
    return record


class Toy:
    """What tests reach through the ``toy`` fixture: token constants, the template, the factory."""

    SYS, USER, ASSIST, TOOL, EOT, NL = SYS, USER, ASSIST, TOOL, EOT, NL
    render = staticmethod(render)
    record = staticmethod(make_record)


@pytest.fixture(scope="session")
def toy() -> type[Toy]:
    return Toy
