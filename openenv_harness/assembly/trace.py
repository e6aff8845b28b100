"""``HarnessTrace``: one training sample built from recorded calls (RFC 006's consumer-side shape).

Why its own model: the recorder never builds samples; trainers do, from records. This is the
boundary object a trainer adapter consumes, so it is pydantic and strict (no silent coercion of
``True`` into a mask value or of a string into an id). Cross-field rules (aligned lengths, real
logprobs under mask 1, token identity with the records) live in ``invariants.py``, where they are
checked on every trace the assembler emits.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from openenv_harness.contract import WeightVersionSpan

Strategy = Literal["split", "realign", "approximate"]
#: why a sample ended: its chain ended, or a replay drift closed it (split).
EndedBy = Literal["chain_end", "replay_drift"]


class Segment(BaseModel):
    """Where one call's sampled ids sit inside ``response_ids``."""

    model_config = ConfigDict(strict=True, frozen=True)

    node_id: str
    offset: int = Field(ge=0, description="Index of the call's first sampled id in response_ids")
    length: int = Field(ge=0, description="Number of sampled ids (the whole completion, unless partial)")
    trainable_tokens: int = Field(ge=0, description="How many of them carry mask 1")
    partial: bool = Field(False, description="Only the exact prefix of a realigned call's sampled ids: the replay "
                          "kept them, the rest of the reply is replaced by its canonical replay (mask 0)")
    logprobs_are_policy: bool = Field(True, description="False when the call ran under a decoding constraint: its "
                                      "logprobs were taken after the engine's mask, not the policy's (its ids are "
                                      "mask 0 unless assembled with non_policy='keep')")
    sampling: dict[str, Any] | None = Field(
        None, description="The call's effective sampling settings (temperature, top_p, top_k, min_p, penalties: "
        "metadata.provenance.sampling_effective), what importance sampling corrected for truncated sampling "
        "(TRL >= 1.17 under top-k / top-p / min-p) needs per token; None where the records do not say")
    policy_version_start: int = Field(0, description="The recorder's policy version when the call started")
    policy_version_end: int = Field(0, description="The policy version when the call ended")
    straddled_sync: bool = Field(False, description="The call was in flight across a weight sync (kept by a "
                                 "keep-mode pause): ids before the sync came from the old weights, after it from "
                                 "the new ones, on a KV cache the old weights built")
    weight_versions: list[WeightVersionSpan] | None = Field(
        None, description="The engine's weight-version spans for this segment's ids, where it reported them (vLLM "
        "0.33+): start/end index the segment's own ids (add offset for positions in response_ids)")


class TraceMetadata(BaseModel):
    """Provenance and fidelity counts of one sample."""

    model_config = ConfigDict(extra="allow")

    session_id: str | None = None
    chain_id: int
    sample_index: int = Field(description="0-based index of this sample within its chain")
    strategy: Strategy
    #: every call this sample is built from, in order (realigned calls included).
    node_ids: list[str]
    #: the sampled spans present in response_ids, in order.
    segments: list[Segment]
    exact: int = Field(0, description="exact transitions inside this sample")
    realigned_node_ids: list[str] = Field(
        default_factory=list, description="calls whose reply was replaced by its canonical replay (mask 0) from the "
        "first differing id on; the exact prefix before it stays trainable (a partial segment)"
    )
    spliced_node_ids: list[str] = Field(
        default_factory=list, description="calls whose drifted reply was spliced anyway (approximate)"
    )
    lost_tokens: int = Field(0, description="trainable sampled ids given up to realignment")
    non_policy_node_ids: list[str] = Field(
        default_factory=list, description="calls in this sample whose logprobs are not the policy's (decoding "
        "constraint); their segments say logprobs_are_policy: false")
    non_policy_tokens: int = Field(0, description="sampled ids in this sample whose logprobs are not the policy's")
    non_policy_trainable_tokens: int = Field(
        0, description="of them, how many carry mask 1 (0 unless assembled with non_policy='keep')")
    trainable_tokens: int = 0
    approximate: bool = Field(False, description="True when a mask-1 token's context differs from what the engine saw")
    ended_by: EndedBy = "chain_end"
    eot_id: int | None = None
    policy_version_start: int = Field(0, description="The oldest policy version a segment of this sample started "
                                      "under (its staleness: the trainer's current version minus this)")
    policy_version_end: int = Field(0, description="The newest policy version a segment of this sample ended under")
    straddled_sync: bool = Field(False, description="A segment of this sample straddled a weight sync")
    straddled_node_ids: list[str] = Field(default_factory=list, description="The calls whose segments straddled one")


class HarnessTrace(BaseModel):
    """One sample: ``prompt_ids`` then ``response_ids``, masked and aligned per token.

    ``loss_mask`` is 1 on agent-generated ids whose logprobs are the policy's, 0 on environment/template
    output and (by default) on ids sampled under a decoding constraint;
    ``response_logprobs`` holds the rollout logprob under mask 1 and 0.0 elsewhere;
    ``reward`` is None until the environment scored the rollout (never 0.0 for "unscored").
    """

    model_config = ConfigDict(strict=True)

    prompt_ids: list[int]
    response_ids: list[int]
    loss_mask: list[int]
    response_logprobs: list[float]
    reward: float | None = None
    metadata: TraceMetadata

    @property
    def input_ids(self) -> list[int]:
        """The whole token sequence the trainer scores."""
        return self.prompt_ids + self.response_ids

    @property
    def trainable_tokens(self) -> int:
        return sum(self.loss_mask)
