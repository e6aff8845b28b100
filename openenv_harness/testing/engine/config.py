"""Configuration of the reference engine (the equivalent of vLLM's server flags)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from openenv_harness.testing.engine.messages import ReasoningContentReplay, ToolArguments
from openenv_harness.testing.engine.policy import Script

#: What ``GET /version`` reports: vLLM's version line this engine mimics, marked as a reference.
ENGINE_VERSION = "0.32.0+reference"

VLLMVersion = Literal["0.32", "0.33", "0.34"]
#: What each vLLM release changed on the wire a recorder sees, read from each release's code: the one-step
#: parse and the refusing pause arrived in 0.33; ``tools: []`` is refused with a 400 until 0.34 treats it as
#: omitted; the chat route reports weight-version spans on request from 0.33 (generate always does).
VERSION_SEMANTICS: dict[str, dict[str, bool]] = {
    "0.32": {"generate_derender": False, "pause_rejects_new": False},
    "0.33": {"generate_derender": True, "pause_rejects_new": True},
    "0.34": {"generate_derender": True, "pause_rejects_new": True},
}

#: The request header a recorder forwards its session id in; scripts and faults are keyed by it.
SESSION_HEADER = "x-openenv-harness-session"


class GenerationConfig(BaseModel):
    """A model's ``generation_config.json``: the sampling defaults vLLM applies to fields a request
    leaves out (its ``--generation-config auto``), and the extra end-of-sequence ids it stops on."""

    model_config = ConfigDict(extra="ignore")

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    max_new_tokens: int | None = Field(None, ge=1, description="vLLM's default max_tokens")
    eos_token_id: int | list[int] | None = None

    @classmethod
    def from_file(cls, path: Path) -> GenerationConfig:
        """Read a ``generation_config.json`` (or the one inside a model folder)."""
        file = path / "generation_config.json" if path.is_dir() else path
        return cls.model_validate(json.loads(file.read_text(encoding="utf-8")))

    def sampling_defaults(self) -> dict[str, Any]:
        """The request fields it fills in, under their request names."""
        names = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                 "frequency_penalty")
        defaults = {name: getattr(self, name) for name in names if getattr(self, name) is not None}
        if self.max_new_tokens is not None:
            defaults["max_tokens"] = self.max_new_tokens
        return defaults


class EngineConfig(BaseModel):
    """Server-wide settings; every field maps to a vLLM flag or to a test-only knob."""

    model_config = ConfigDict(extra="forbid")

    served_model_name: str = Field("reference-model", description="vLLM --served-model-name")
    max_model_len: int = Field(32768, ge=16, description="vLLM --max-model-len")
    tokenizer: Path | None = Field(
        None, description="A model folder or its tokenizer.json (the real Qwen2.5 one, say); None: the built-in BPE. "
        "A folder also supplies its chat template and special tokens, like vLLM --model DIR")
    added_special_tokens: list[str] = Field(
        default_factory=list, description="Special tokens registered on the tokenizer, each one atomic id: a "
        "template family's own control markers over a base BPE (template_tokens.template_special_tokens), so its "
        "template is judged with its own special tokens, not as merged plain text")
    chat_template: Path | None = Field(
        None, description="vLLM --chat-template: any Hugging Face template file (TRL's, say); None: the model "
        "folder's own, else the reference template")
    generation_config: GenerationConfig | None = Field(
        None, description="The model's generation_config.json: defaults for absent sampling fields (off: vLLM's "
        "neutral defaults, as with --generation-config vllm)")
    tool_call_parser: Literal["hermes", "qwen3_xml"] = Field(
        "hermes", description="vLLM --tool-call-parser: hermes JSON in <tool_call>, or Qwen3.5's XML tool calls")
    reasoning_parser: Literal["think"] | None = Field(
        "think", description="vLLM --reasoning-parser: split <think>...</think> off into 'reasoning'; None: none "
        "(the text stays content, as on a vLLM started without one)")
    reasoning_field: Literal["reasoning", "reasoning_content"] = Field(
        "reasoning", description="Where replies carry reasoning: newer vLLM says 'reasoning', older 'reasoning_content'"
    )
    reasoning_content: ReasoningContentReplay = Field(
        "rename", description="A replayed 'reasoning_content' on the chat route: vLLM 0.32 renames it to "
        "'reasoning' (rendered); 'drop' ignores it, as its /tokenize does")
    return_tokens_as_token_ids: bool = Field(False, description="vLLM --return-tokens-as-token-ids")
    logprobs_mode: Literal["raw_logprobs", "processed_logprobs"] = Field(
        "raw_logprobs", description="vLLM --logprobs-mode: raw (the scripted temperature-1 values, whatever the "
        "request's temperature) or processed (the sampled distribution's: scaled by 1 / temperature, which divides "
        "the gap between any two candidates as a real temperature does)")
    tool_arguments: ToolArguments = Field(
        "parsed",
        description="'parsed' is vLLM: string tool arguments are json.loads-ed before templating; 'verbatim' "
        "keeps the agent's string",
    )
    strict_model_name: bool = Field(
        False, description="404 for a model name that is neither served nor a script key (vLLM always checks)"
    )
    default_script: Script = Field(default_factory=Script, description="Script for keys with none registered")
    scripts: dict[str, Script] = Field(default_factory=dict, description="Scripts by key (model name, session "
                                       "header) from the start, as POST /_ref/scripts registers them later")
    decode_delay_s: float = Field(0.0, ge=0, description="Time per sampled token (lets tests straddle a pause)")
    prefill_delay_s: float = Field(0.0, ge=0, description="Time before the first token of each request")
    scale_out: bool = Field(True, description="vLLM --enable-scale-out: render, generate, derender routes")
    generate_route: bool = Field(
        True, description="With scale_out, serve /inference/v1/generate too; off: an engine whose only exact-ids "
        "sampling route is /v1/completions with an id prompt (a router that forwards no generate route, say)")
    generate_derender: bool = Field(
        False, description="vLLM 0.33's one-step parse: render answers a parse_context and generate takes "
        "output_mode='derender' (the parsed chat message in generate's reply); off: vLLM 0.32, whose generate "
        "answers ids only and whose render has no parse_context")
    dev_mode: bool = Field(True, description="Serve /pause, /resume, /is_paused and the weight routes "
                           "(/collective_rpc, /reset_prefix_cache, /update_weight_version, /weight_info) as "
                           "VLLM_SERVER_DEV_MODE=1 does")
    weights_dir: Path | None = Field(None, description="The folder the served weights were loaded from at start "
                                     "(vLLM's model folder): what a reload_weights through /collective_rpc "
                                     "replaces; default: the tokenizer folder, else the served name")
    pause_rejects_new: bool = Field(
        False, description="vLLM 0.33/0.34: while paused in abort or wait mode, new requests get a retryable 503 "
        "('Generation is paused. Please retry after it resumes.') until /resume; off: vLLM 0.32, which holds them")
    max_recorded_requests: int = Field(1000, ge=0, description="Request log size for /_ref/requests (0: off)")
    api_key: str | None = Field(None, description="vLLM --api-key: /v1 routes answer 401 without this bearer key")
    vllm_version: VLLMVersion = Field(
        "0.32", description="The vLLM release whose semantics this engine speaks (VERSION_SEMANTICS): it sets "
        "generate_derender and pause_rejects_new unless they are given, how an empty tools array is answered, and "
        "whether the chat route reports weight-version spans")
    family: Literal["vllm", "sglang"] = Field(
        "vllm", description="Which engine's HTTP server this engine is: vLLM's (the vllm_version release) or "
        "SGLang 0.5.23's routes and shapes (sglang_routes.py), over the same scripts, tokenizer and template")
    version: str = ENGINE_VERSION

    @model_validator(mode="before")
    @classmethod
    def _release_semantics(cls, data: Any) -> Any:
        """Fill the release's behaviours the caller did not set explicitly."""
        if not isinstance(data, dict):
            return data
        release = data.get("vllm_version", "0.32")
        semantics = VERSION_SEMANTICS.get(str(release))
        if semantics is None:
            return data  # the field's own validation names the accepted releases
        filled = {**semantics, **data}
        filled.setdefault("version", f"{release}.0+reference")
        return filled

    @property
    def empty_tools_rejected(self) -> bool:
        """vLLM 0.32 and 0.33 answer ``tools: []`` with a 400; 0.34 treats it as no tools."""
        return self.vllm_version in ("0.32", "0.33")

    @property
    def chat_weight_versions(self) -> bool:
        """From vLLM 0.33 the chat route takes ``return_weight_versions`` and answers spans per choice."""
        return self.vllm_version != "0.32"

    @classmethod
    def for_model(cls, folder: Path, **overrides: Any) -> EngineConfig:
        """The engine as ``vllm serve FOLDER`` would be: its tokenizer, template and generation config."""
        settings: dict[str, Any] = {"tokenizer": folder}
        if (folder / "generation_config.json").is_file():
            settings["generation_config"] = GenerationConfig.from_file(folder)
        return cls(**{**settings, **overrides})
