"""Configuration of the reference engine (the equivalent of vLLM's server flags)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from openenv_harness.testing.engine.policy import Script

#: What ``GET /version`` reports: vLLM's version line this engine mimics, marked as a reference.
ENGINE_VERSION = "0.11.0+reference"

#: The request header a recorder forwards its session id in; scripts and faults are keyed by it.
SESSION_HEADER = "x-openenv-harness-session"


class EngineConfig(BaseModel):
    """Server-wide settings; every field maps to a vLLM flag or to a test-only knob."""

    model_config = ConfigDict(extra="forbid")

    served_model_name: str = Field("reference-model", description="vLLM --served-model-name")
    max_model_len: int = Field(32768, ge=16, description="vLLM --max-model-len")
    reasoning_field: Literal["reasoning", "reasoning_content"] = Field(
        "reasoning", description="Where replies carry reasoning: newer vLLM says 'reasoning', older 'reasoning_content'"
    )
    return_tokens_as_token_ids: bool = Field(False, description="vLLM --return-tokens-as-token-ids")
    tool_arguments: Literal["verbatim", "parsed"] = Field(
        "verbatim",
        description="'parsed' does what vLLM does before templating: json.loads string tool arguments",
    )
    strict_model_name: bool = Field(
        False, description="404 for a model name that is neither served nor a script key (vLLM always checks)"
    )
    default_script: Script = Field(default_factory=Script, description="Script for keys with none registered")
    decode_delay_s: float = Field(0.0, ge=0, description="Time per sampled token (lets tests straddle a pause)")
    prefill_delay_s: float = Field(0.0, ge=0, description="Time before the first token of each request")
    scale_out: bool = Field(True, description="vLLM --enable-scale-out: render, generate, derender routes")
    dev_mode: bool = Field(True, description="Serve /pause, /resume, /is_paused (VLLM_SERVER_DEV_MODE=1)")
    max_recorded_requests: int = Field(1000, ge=0, description="Request log size for /_ref/requests (0: off)")
    api_key: str | None = Field(None, description="vLLM --api-key: /v1 routes answer 401 without this bearer key")
    version: str = ENGINE_VERSION
