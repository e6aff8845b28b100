"""The records we emit: OpenEnv's ``TraceEntry`` shape, and the metadata RFC 006 adds to it.

Why this module exists on its own: every other part of the package (recorder, assembler, trainer
adapters, viewer) agrees on one record, and that record is OpenEnv's, not ours. The recorder emits
plain dicts with exactly OpenEnv's ``TraceEntry`` keys. Everything RFC 006 adds -- the call kind,
provenance, budgets, policy versions, session id, server sequence number, ``node_id`` -- lives under
``metadata``, because ``TrainingTrace.from_entries`` silently drops any other top-level key.

The pydantic models below describe the record for humans and tools (the committed JSON Schema is
generated from them). They are *not* run in the recorder's hot path: the recorder builds dicts and
checks token arrays with C-level operations (see ``recorder/validate.py``).

This module must stay importable without OpenEnv (whose import costs seconds): helpers that need
OpenEnv's own classes import them lazily.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Literal

from pydantic import BaseModel, ConfigDict, Field

#: The top-level keys of OpenEnv's ``openenv.core.harness.TraceEntry`` (rollout.py). Nothing else
#: may appear at the top level of a record we emit.
TRACE_ENTRY_KEYS: tuple[str, ...] = (
    "request",
    "response",
    "prompt_token_ids",
    "completion_token_ids",
    "completion_tokens",
    "per_token_logps",
    "loss_mask",
    "reward",
    "metadata",
)

CallKind = Literal["agent", "aux"]
#: ok: tokens and logprobs passed validation. invalid: the engine answered but its evidence failed
#: validation (kept, never trainable). failed: the engine call failed; no tokens exist.
RecordStatus = Literal["ok", "invalid", "failed"]

SCHEMA_VERSION = 1


class CallError(BaseModel):
    """Why a call produced no trainable tokens, kept verbatim for the rollout report."""

    model_config = ConfigDict(extra="allow")

    kind: str = Field(description="upstream_status | connect | timeout | invalid_reply | budget | fence")
    status: int | None = Field(None, description="HTTP status the agent received")
    upstream_status: int | None = Field(None, description="HTTP status the engine returned, if any")
    message: str = ""
    upstream_body: Any = Field(None, description="The engine's original error body, unmodified")


class Limits(BaseModel):
    """Budget state of the session *after* this call (D13)."""

    model_config = ConfigDict(extra="allow")

    agent_calls: int = 0
    calls: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    tool_calls: int = Field(0, description="Tool calls handed to the agent so far (after any cut)")
    elapsed_s: float = 0.0
    max_agent_calls: int | None = None
    max_prompt_tokens: int | None = None
    max_completion_tokens: int | None = None
    max_total_tokens: int | None = None
    max_wall_clock_s: float | None = None
    max_tool_calls_per_turn: int | None = None
    max_total_tool_calls: int | None = None
    stop: str | None = Field(None, description="The cap that stopped the session, once one was hit")


class ToolLimitCut(BaseModel):
    """A reply whose tool calls a cap cut before the agent saw it (``recorder/session/budget.py``)."""

    model_config = ConfigDict(extra="allow")

    cap: Literal["max_tool_calls_per_turn", "max_total_tool_calls"] = Field(
        description="max_tool_calls_per_turn: the rest dropped, the session went on; max_total_tool_calls: the"
        " rest dropped and the session stopped"
    )
    sampled: int = Field(description="Tool calls the policy sampled (all of them are in completion_token_ids)")
    delivered: int = Field(description="Tool calls the agent received (the record's response holds them)")
    dropped: list[dict[str, Any]] = Field(default_factory=list, description="The dropped tool calls, verbatim")


class Provenance(BaseModel):
    """Where a call's tokens came from (D11)."""

    model_config = ConfigDict(extra="allow")

    model: str | None = None
    sampling: dict[str, Any] = Field(default_factory=dict, description="Sampling fields actually sent upstream")
    engine: str | None = Field(None, description="Upstream kind and URL/name")
    affinity_key: str | None = Field(
        None, description="The session's trajectory routing key, sent upstream as X-Session-ID (a router's "
        "consistent hashing keeps the trajectory on one replica; its log maps the key to the replica)")
    replica: str | None = Field(
        None, description="The engine replica that served the call, when the reply names it (the recorder's "
        "replica_header); None when nothing on the path says")
    engine_version: str | None = None
    harness: str | None = None
    harness_version: str | None = None
    config_hashes: dict[str, str] = Field(default_factory=dict, description="sha256 of the agent's config files")
    template_fingerprint: str | None = None
    template_status: str | None = Field(None, description="verified | mismatch | unverified")
    template_certification: dict[str, Any] | None = Field(
        None, description="certified | failed | uncertified, each property's pass/fail, the failed ones' causes")
    recorder_version: str | None = None
    sampling_from_agent: dict[str, Any] = Field(default_factory=dict, description="Sampling fields the agent sent")
    sampling_pinned: dict[str, Any] = Field(default_factory=dict, description="What the session pinned over them")
    engine_sampling_defaults: dict[str, Any] | Literal["unknown"] = Field(
        "unknown", description="What the engine applies to fields a request leaves out (vLLM: generation_config)")
    sampling_effective: dict[str, Any] = Field(
        default_factory=dict, description="The sampling values in force for the call, where known")
    sampling_unknown: list[str] = Field(
        default_factory=list, description="Fields the engine filled in with defaults nobody stated")
    logprobs_mode: str = Field(
        "unknown", description="What the engine's logprobs are: raw_logprobs (before temperature and truncation) or "
        "processed_logprobs (the distribution sampled from), as measured by the recorder; unknown when neither "
        "measured nor declared")
    logprobs_mode_source: Literal["measured", "configured", "unknown"] = Field(
        "unknown", description="measured: probed on the engine (top-5 gap at two temperatures); configured: declared "
        "by whoever started the recorder")
    sampling_policy: dict[str, Any] | None = Field(
        None, description="The session's training sampling policy (whole vocabulary at a temperature), when pinned")
    sampling_neutralised: dict[str, Any] | None = Field(
        None, description="Narrowing knobs the agent sent that the policy replaced (field -> the agent's value)")
    sampling_policy_differs: dict[str, Any] | None = Field(
        None, description="Where the call's effective sampling differs from the policy (field -> policy and "
        "effective); non-empty makes the call untrainable")
    decoding_constraint: dict[str, Any] | None = Field(
        None, description="tool_choice=required / named, response_format, structured outputs: logprobs are "
        "taken after the engine's mask, so they are not the policy's")


class EnginePausedWait(BaseModel):
    """How a call waited on an engine that somebody else paused."""

    model_config = ConfigDict(extra="allow")

    retries: int = Field(ge=0, description="Times the call was sent again after the engine refused it as paused")
    waited_s: float = Field(ge=0, description="Seconds from the first refusal to the last answer")
    resumed: bool = Field(description="Whether the engine took the call in the end (false: the refusal outlasted "
                          "the recorder's pause_wait_s and was relayed)")


class RecordMetadata(BaseModel):
    """Everything RFC 006 adds to a ``TraceEntry``; always under ``metadata``."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = SCHEMA_VERSION
    node_id: str = Field(min_length=1, description="Unique per record: '<session_id>/<call_index>'")
    session_id: str
    seq: int = Field(description="Server-wide monotonically increasing sequence number")
    call_index: int = Field(description="0-based index of the call within its session")
    call_kind: CallKind = "agent"
    status: RecordStatus = "ok"
    trainable: bool = True
    invalid_reasons: list[str] = Field(default_factory=list)
    error: CallError | None = None
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    stream: bool = False
    policy_version_start: int = 0
    policy_version_end: int = 0
    straddled_sync: bool = False
    request_digest: str = Field("", description="sha256 of the agent's request body")
    harness_session_id: str | None = Field(
        None, description="The agent's own conversation header (x-session-id; Codex session-id; Claude Code "
        "x-claude-code-session-id)")
    dialect: str = Field("chat", description="The API the agent spoke: chat, responses (Codex) or anthropic (Claude "
                         "Code); 'request' is always the chat body the engine rendered and sampled from")
    received_at: float = 0.0
    upstream_ms: float | None = None
    provenance: Provenance = Field(default_factory=Provenance)
    limits: Limits = Field(default_factory=Limits)
    partial: bool = Field(False, description="The engine aborted the call part-way (finish_reason=abort)")
    logprobs_are_policy: bool = Field(
        True, description="False under a decoding constraint: exclude or correct these logprobs")
    sampling_off_policy: dict[str, Any] | None = Field(
        None, description="Present when the call's effective sampling differs from the session's training sampling "
        "policy (provenance.sampling_policy_differs): the call is recorded but not trainable")
    engine_paused: EnginePausedWait | None = Field(
        None, description="Present when the engine, paused by someone else, refused the call and the recorder sent it "
        "again (vLLM 0.33+ refuses new requests while paused in abort or wait mode)")
    weight_versions: list[dict[str, Any]] | None = Field(
        None, description="Per-token weight versions when the engine reports them (vLLM 0.33)")
    tool_limit: ToolLimitCut | None = Field(None, description="Present when a tool-call cap cut this reply")
    sampled_arguments: list[str | None] | None = Field(
        None, description="Dialect calls (responses, anthropic) only: per tool call of the reply, the argument text "
        "the model sampled, handed to the agent in place of the tool parser's re-serialization (null where it "
        "was not found); a restarted recorder rebuilds its replay memory from it")


class TraceRecord(BaseModel):
    """One recorded call, exactly OpenEnv's ``TraceEntry`` keys (``reward`` is never set by us)."""

    model_config = ConfigDict(extra="forbid")

    request: dict[str, Any] = Field(
        description="The agent's chat body as received (messages, tools, sampling); for an agent speaking another "
        "dialect (metadata.dialect), the chat body it was translated to")
    response: dict[str, Any] = Field(description="The engine's reply in OpenAI chat.completion shape")
    prompt_token_ids: list[int] = Field(description="Engine-canonical prompt ids (after its chat template)")
    completion_token_ids: list[int] = Field(description="Sampled ids, verbatim")
    completion_tokens: list[str] | None = Field(
        None, description="'token_id:N' strings, only when the engine returned no ids"
    )
    per_token_logps: list[float] = Field(description="Rollout logprobs aligned with completion_token_ids")
    loss_mask: list[int] = Field(description="Over prompt+completion: 0 on the prompt, 1 on trainable sampled ids")
    metadata: RecordMetadata


def record_json_schema() -> dict[str, Any]:
    """The JSON Schema of one record, generated from the models above."""
    schema = TraceRecord.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["$id"] = "https://openenv-harness/schema/trace_record.schema.json"
    schema["title"] = "openenv-harness TraceRecord (OpenEnv TraceEntry + RFC 006 metadata)"
    return schema


SCHEMA_PATH = Path(__file__).parent / "schema" / "trace_record.schema.json"


def render_json_schema() -> str:
    return json.dumps(record_json_schema(), indent=2, sort_keys=True) + "\n"


def loss_mask_for(prompt_len: int, completion_len: int, trainable: bool) -> list[int]:
    """OpenEnv's mask convention: zeros over the prompt, then 1 per sampled id when trainable."""
    return [0] * prompt_len + [1 if trainable else 0] * completion_len


def is_training_entry(entry: dict[str, Any]) -> bool:
    """Whether a record belongs in a training trace: an agent call whose evidence is usable.

    Aux calls are excluded entirely (a masked aux call in the middle still splits TRL's chain), and
    so are failed calls (no tokens) and invalid ones (evidence that failed validation: kept in the
    records with a zero mask, never handed to a trainer).
    """
    md = entry.get("metadata", {})
    if md.get("call_kind", "agent") != "agent":
        return False
    if md.get("status", "ok") != "ok":
        return False
    prompt = entry.get("prompt_token_ids") or []
    completion = entry.get("completion_token_ids")
    logps = entry.get("per_token_logps")
    if not prompt or completion is None or logps is None:
        return False
    return len(completion) == len(logps)


def training_trace_dict(entries: list[dict[str, Any]], non_policy: str = "mask") -> dict[str, Any]:
    """The JSON form of OpenEnv's ``TrainingTrace`` for the selected entries, without importing OpenEnv.

    Served by the recorder (which must not pay OpenEnv's import); consumers validate it with
    OpenEnv's own ``TrainingTrace.model_validate`` (``to_training_trace`` below does).
    """
    return {"schema_version": 1, "turns": [training_turn(e, non_policy) for e in entries if is_training_entry(e)]}


def training_loss_mask(e: dict[str, Any], non_policy: str = "mask") -> list[int]:
    """The loss mask a trainer gets for an entry: the record's own, except that sampled ids whose
    logprobs are not the policy's (``metadata.logprobs_are_policy: false``: a decoding constraint) are
    mask 0 unless ``non_policy="keep"`` -- a trainer would take their post-mask logprobs as the old
    policy's (``assembly/calls.py`` does the same for assembled rows)."""
    if non_policy not in ("mask", "keep"):
        raise ValueError(f"non_policy must be 'mask' or 'keep', not {non_policy!r}")
    if non_policy == "mask" and (e.get("metadata") or {}).get("logprobs_are_policy") is False:
        return [0] * len(e["loss_mask"])
    return e["loss_mask"]


def training_turn(e: dict[str, Any], non_policy: str = "mask") -> dict[str, Any]:
    """One turn of ``training_trace_dict``, from an entry ``is_training_entry`` accepts (exports stream these)."""
    md = e.get("metadata", {})
    return {
        "node_id": md["node_id"],
        "prompt_token_ids": e["prompt_token_ids"],
        "completion_token_ids": e["completion_token_ids"],
        "per_token_logps": e["per_token_logps"],
        "loss_mask": training_loss_mask(e, non_policy),
        "request": e.get("request", {}),
        "response": e.get("response", {}),
        "metadata": md,
    }


def to_training_trace(entries: list[dict[str, Any]], non_policy: str = "mask") -> Any:
    """Build OpenEnv's own ``TrainingTrace`` from recorded entries (agent calls only, in order).

    Raises ``ValueError`` (from OpenEnv's validators) if a selected entry is malformed: a trainer
    must never receive a capture that would stop it.
    """
    from openenv.core.harness import TrainingTrace  # lazy: importing OpenEnv costs seconds

    return TrainingTrace.from_entries(training_entries(entries, non_policy))


def training_entries(entries: Iterable[dict[str, Any]], non_policy: str = "mask") -> list[dict[str, Any]]:
    """The entries a training trace holds, in order, each with the loss mask a trainer gets."""
    return [{**e, "loss_mask": training_loss_mask(e, non_policy)} for e in entries if is_training_entry(e)]


class WeightVersionSpan(BaseModel):
    """One span of a call's sampled ids and the engine weight version that produced it (vLLM 0.33+
    ``return_weight_versions``): ids ``[start, end)`` of the completion, ``version`` the engine's label
    (``/update_weight_version``), which need not be the recorder's integer policy version."""

    model_config = ConfigDict(strict=True, frozen=True, extra="allow")

    version: int | str
    start: int = Field(ge=0)
    end: int = Field(ge=0)


class CallVersions(BaseModel):
    """The policy versions one call ran under, read from its record (the recorder's fence, D12).

    A record without the fields gets the record schema's defaults (``RecordMetadata``); a call is
    ``straddled_sync`` when its record says so or its start and end versions differ -- a straddle
    wrongly assumed costs one sample, a straddle missed trains mixed-weight tokens as one policy's.
    """

    model_config = ConfigDict(strict=True, frozen=True)

    policy_version_start: int = 0
    policy_version_end: int = 0
    straddled_sync: bool = False
    weight_versions: list[WeightVersionSpan] | None = Field(
        None, description="The engine's per-span weight versions, where it reported them (vLLM 0.33+)")


def call_versions(entry: dict[str, Any]) -> CallVersions:
    """``CallVersions`` of one record; ``ValueError`` naming the record when its fields are malformed
    (a version that is not an integer, a span that is not ``{version, start <= end}``)."""
    md = entry.get("metadata") or {}
    node = md.get("node_id", "?")
    start, end = md.get("policy_version_start", 0), md.get("policy_version_end", 0)
    for what, value in (("policy_version_start", start), ("policy_version_end", end)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{node}: metadata.{what} must be an integer, got {value!r}")
    flag = md.get("straddled_sync", False)
    if not isinstance(flag, bool):
        raise ValueError(f"{node}: metadata.straddled_sync must be a boolean, got {flag!r}")
    raw = md.get("weight_versions")
    spans: list[WeightVersionSpan] | None = None
    if raw is not None:
        try:
            spans = [WeightVersionSpan.model_validate(span) for span in raw]
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{node}: metadata.weight_versions is not a list of {{version, start, end}} "
                             f"spans ({exc})") from None
        bad = next((s for s in spans if s.end < s.start), None)
        if bad is not None:
            raise ValueError(f"{node}: metadata.weight_versions span ends before it starts ({bad.start}, {bad.end})")
    return CallVersions(policy_version_start=start, policy_version_end=end, straddled_sync=flag or start != end,
                        weight_versions=spans)


if __name__ == "__main__":  # python -m openenv_harness.contract  → regenerate the committed schema
    SCHEMA_PATH.parent.mkdir(parents=True, exist_ok=True)
    SCHEMA_PATH.write_text(render_json_schema())
    print(f"wrote {SCHEMA_PATH}")


def records_by_session(lines: Iterable[str], *, source: str = "records") -> dict[str, list[dict[str, Any]]]:
    """TraceEntry JSONL (``GET .../records?format=jsonl``, ``trace export``) grouped by
    ``metadata.session_id``, in file order. A line that is not such a record is a ``ValueError``
    naming ``source`` and the line number; blank lines are skipped."""
    sessions: dict[str, list[dict[str, Any]]] = {}
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            sessions.setdefault(record["metadata"]["session_id"], []).append(record)
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{source}:{number}: not a record with metadata.session_id ({exc})") from None
    return sessions
