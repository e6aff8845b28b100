"""Records for export tests: contract-valid ``TraceEntry`` dicts whose policy versions a test sets.

A *chain* is a conversation whose every call's prompt is the previous prompt plus its sampled ids
plus a tool result (an exact continuation, as an agent replaying its history verbatim sends it);
``fresh`` starts another conversation (a new row in every format).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from openenv_harness.contract import TraceRecord, loss_mask_for

EOT, TOOL, ASSIST = 5, 4, 3


class Records:
    """Builds one session's records call by call."""

    def __init__(self, session_id: str = "s") -> None:
        self.session_id = session_id
        self.records: list[dict[str, Any]] = []
        self._held: list[int] = []

    def call(self, versions: tuple[int, int] = (0, 0), *, fresh: bool = False, completion: Sequence[int] = (40, 41, EOT),
             status: str = "ok", call_kind: str = "agent", constrained: bool = False,
             weight_versions: list[dict[str, Any]] | None = None, **metadata: Any) -> dict[str, Any]:
        index = len(self.records)
        if fresh or not self._held:
            prompt = [1, 10 + index, EOT, ASSIST]
        else:
            prompt = [*self._held, TOOL, 20 + index, EOT, ASSIST]
        sampled = list(completion) if status == "ok" else []
        trainable = status == "ok" and call_kind == "agent"
        record: dict[str, Any] = {
            "request": {"model": "policy", "messages": [{"role": "user", "content": f"call {index}"}]},
            "response": {"id": f"c{index}", "object": "chat.completion", "created": 0, "model": "policy",
                         "choices": [{"index": 0, "finish_reason": "stop",
                                      "message": {"role": "assistant", "content": "ok"}}]},
            "prompt_token_ids": prompt,
            "completion_token_ids": sampled,
            "per_token_logps": [-0.5] * len(sampled),
            "loss_mask": loss_mask_for(len(prompt), len(sampled), trainable),
            "metadata": {"node_id": f"{self.session_id}/{index}", "session_id": self.session_id, "seq": index,
                         "call_index": index, "call_kind": call_kind, "status": status, "trainable": trainable,
                         "finish_reason": "stop", "policy_version_start": versions[0],
                         "policy_version_end": versions[1], "straddled_sync": versions[0] != versions[1],
                         "logprobs_are_policy": not constrained,
                         **({"weight_versions": weight_versions} if weight_versions is not None else {}),
                         **metadata},
        }
        TraceRecord.model_validate(record)
        self.records.append(record)
        if status == "ok" and call_kind == "agent":
            self._held = [*prompt, *sampled]
        return record
