"""What a trainer asks of a session when it creates one: its budgets, its call classification, its
prompt mode, its pinned sampling -- validated at the boundary, persisted with the session, never
changed after."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from openenv_harness.recorder.sampling_policy import policy_values, same_value


class Budgets(BaseModel):
    """Caps enforced before each call is served (D13). ``None`` means no cap."""

    model_config = ConfigDict(extra="forbid")

    max_agent_calls: int | None = Field(None, ge=0)
    max_calls: int | None = Field(None, ge=0, description="All calls, aux included")
    max_prompt_tokens: int | None = Field(None, ge=0, description="Cumulative prompt tokens")
    max_completion_tokens: int | None = Field(None, ge=0, description="Cumulative completion tokens")
    max_total_tokens: int | None = Field(None, ge=0)
    max_wall_clock_s: float | None = Field(None, gt=0)
    max_tool_calls_per_turn: int | None = Field(
        None, ge=0, description="Tool calls one reply may hand the agent; the rest are dropped, the session goes on"
    )
    max_total_tool_calls: int | None = Field(
        None, ge=0, description="Tool calls handed to the agent in all; the reply that would pass it is cut and"
        " stops the session"
    )


class AuxRule(BaseModel):
    """Marks a call as ``aux`` when every given condition holds."""

    model_config = ConfigDict(extra="forbid")

    name: str
    no_tools: bool | None = None
    system_prompt_startswith: str | None = None
    system_prompt_contains: str | None = None
    last_user_message_startswith: str | None = None
    model: str | None = None


class TrainingSampling(BaseModel):
    """A training sampling policy (``recorder/sampling_policy.py``): the whole vocabulary at ``temperature``
    with no penalty or bias, sent on every call whatever the agent asked."""

    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(1.0, gt=0, le=10, description="The policy's temperature; other than 1 it needs an "
                               "engine serving processed logprobs (the session is refused on a raw one)")


class SessionSpec(BaseModel):
    """What a trainer gives when creating a session."""

    model_config = ConfigDict(extra="forbid")

    session_id: str | None = Field(None, description="Requested id; must be unused")
    metadata: dict[str, Any] = Field(default_factory=dict)
    budgets: Budgets = Field(default_factory=Budgets)
    harness: str | None = None
    harness_version: str | None = None
    config_hashes: dict[str, str] = Field(default_factory=dict)
    aux_rules: list[AuxRule] | None = Field(None, description="Override the harness's classification rules")
    trainer_template_fingerprint: str | None = Field(
        None, description="Fingerprint of the chat template the trainer trains with; a mismatch fails creation"
    )
    upstream: str | None = Field(None, description="Named upstream registered with the recorder (white-box)")
    require_exact_template: bool = Field(
        False, description="Refuse the session (409, with the failing property and what to do) unless the served "
        "chat template is certified to keep chains exact")
    prompt_mode: Literal["full_history", "incremental"] = Field(
        "full_history", description="full_history: the agent's messages are rendered in full each call; incremental: "
        "a call that continues its chain is sampled from the exact previous prompt and sampled ids plus the engine's "
        "certified rendering of only the new messages (recorder/prompt_modes/incremental.py)")
    prompt_mode_strict: bool = Field(
        False, description="incremental only: reject (409) a call whose continuation is not certain instead of "
        "falling back to full history; a genuine history change still starts a new chain")
    affinity_key: str | None = Field(
        None, pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$",
        description="The trajectory's routing key, sent upstream as X-Session-ID on every engine call of the "
        "session (vllm-router's consistent_hash keeps them on one replica). None: a fresh random key; siblings "
        "and retried rollouts are sessions of their own and get keys of their own")
    sampling: dict[str, Any] | None = Field(
        None,
        description=(
            "Trainer-pinned sampling fields set on every upstream body (e.g. TRL's training_sampling);"
            " recorded in each record's provenance.sampling"
        ),
    )
    training_sampling: TrainingSampling | None = Field(
        None, description="Pin a training sampling policy: every call is sampled from the whole vocabulary at its "
        "temperature (narrowing knobs the agent sends are neutralised and recorded); a call whose effective sampling "
        "differs from it is recorded with the difference and is not trainable")

    @model_validator(mode="after")
    def _policy_and_pins_agree(self) -> SessionSpec:
        if self.training_sampling is None or not self.sampling:
            return self
        clash = {k: v for k, v in policy_values(self.training_sampling.temperature).items()
                 if k in self.sampling and not same_value(k, self.sampling[k], v)}
        if clash:
            raise ValueError(f"sampling pins {clash} against the training_sampling policy: pin one or the other")
        return self
