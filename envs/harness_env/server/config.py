"""How the environment server runs, read once from environment variables.

A Space (or any container) is configured through its environment, so every setting has an
``OEH_*`` variable. Three deployments share one image:

* **embedded** (nothing set): the recorder and the project's CPU reference engine run inside this
  process; the built-in tasks' scripted solutions drive the real agents. A demo and a smoke test.
* **engine** (``OEH_ENGINE_URL`` + ``OEH_MODEL``): the recorder runs inside this process, in front
  of a real vLLM. The trainer reads records through this server (``/recorder/admin/...``).
* **external recorder** (``OEH_RECORDER_URL`` + ``OEH_ADMIN_TOKEN`` + ``OEH_MODEL``): the trainer
  runs its own recorder; this server only creates sessions there and runs agents against it.
  ``OEH_RECORDER_URL`` may list several recorders, comma-separated (one admin token for all): each
  episode goes to the one with the fewest live sessions and its records are read from there
  (``openenv_harness/rollout/placement.py``). ``OEH_AGENT_RECORDER_URL`` and
  ``OEH_RECORDER_PUBLIC_URL`` then list theirs in the same order.

A wrong combination fails at startup with the variable names in the message, not at the first
episode.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

#: Field name -> environment variable.
ENV_VARS: dict[str, str] = {
    "engine_url": "OEH_ENGINE_URL",
    "model": "OEH_MODEL",
    "recorder_url": "OEH_RECORDER_URL",
    "agent_recorder_url": "OEH_AGENT_RECORDER_URL",
    "recorder_public_url": "OEH_RECORDER_PUBLIC_URL",
    "admin_token": "OEH_ADMIN_TOKEN",
    "harness": "OEH_HARNESS",
    "data_dir": "OEH_DATA_DIR",
    "tasks_file": "OEH_TASKS",
    "max_concurrent_envs": "OEH_MAX_CONCURRENT_ENVS",
    "max_agent_calls": "OEH_MAX_AGENT_CALLS",
    "max_total_tokens": "OEH_MAX_TOTAL_TOKENS",
    "max_wall_clock_s": "OEH_MAX_WALL_CLOCK_S",
    "step_timeout_s": "OEH_STEP_TIMEOUT_S",
    "context_window": "OEH_CONTEXT_WINDOW",
    "max_output_tokens": "OEH_MAX_OUTPUT_TOKENS",
}


class ConfigError(ValueError):
    """The server's environment variables do not describe a deployment that can run."""


class EnvServerConfig(BaseModel):
    """Settings of one environment server; ``from_environ()`` reads them from ``OEH_*`` variables."""

    model_config = ConfigDict(extra="forbid")

    engine_url: str | None = Field(None, description="A real engine (vLLM root URL); default: the reference engine")
    model: str | None = Field(None, description="The served model name (required with an engine or recorder URL)")
    recorder_url: str | None = Field(None, description="An external recorder (the trainer's) instead of our own; "
                                     "several, comma-separated, to spread episodes over them")
    agent_recorder_url: str | None = Field(None, description="How agents reach the external recorder(s), if "
                                           "different (comma-separated, in the order of recorder_url)")
    recorder_public_url: str | None = Field(None, description="The recorder URL(s) reported in observations "
                                            "(comma-separated, in the order of the recorders)")
    admin_token: str | None = Field(None, min_length=16, description="The recorder's admin token")
    harness: str = Field("pi", min_length=1, description="Default agent CLI: pi | opencode | codex | claude-code")
    data_dir: str | None = Field(None, description="Where our recorder keeps its records (default: a temp dir)")
    tasks_file: str | None = Field(None, description="JSON list (or JSONL) of extra tasks")
    max_concurrent_envs: int = Field(4, ge=1, le=256, description="Concurrent WebSocket episodes")
    max_agent_calls: int | None = Field(30, ge=1, description="Budget: agent calls per rollout")
    max_total_tokens: int | None = Field(None, ge=1, description="Budget: prompt + completion tokens per rollout")
    max_wall_clock_s: float = Field(600.0, gt=0, description="Budget: seconds per rollout (recorder-enforced)")
    step_timeout_s: float | None = Field(None, gt=0, description="Default RunAgent timeout; default budget + 30 s")
    context_window: int = Field(32768, ge=1024)
    max_output_tokens: int = Field(4096, ge=1)

    @model_validator(mode="after")
    def _deployment_is_coherent(self) -> "EnvServerConfig":
        if self.recorder_url and self.engine_url:
            raise ValueError(
                "set either OEH_RECORDER_URL (an external recorder, which has its own engine) "
                "or OEH_ENGINE_URL (a recorder inside this server), not both"
            )
        if self.recorder_url and not self.admin_token:
            raise ValueError("OEH_RECORDER_URL needs OEH_ADMIN_TOKEN (the external recorder's admin token)")
        if (self.recorder_url or self.engine_url) and not self.model:
            raise ValueError("OEH_ENGINE_URL / OEH_RECORDER_URL need OEH_MODEL (the name the engine serves)")
        recorders = len(self.recorder_urls) if self.recorder_url else 1
        for name in ("agent_recorder_url", "recorder_public_url"):
            value = getattr(self, name)
            if value is not None and len(url_list(value, ENV_VARS[name])) != recorders:
                raise ValueError(f"{ENV_VARS[name]} lists {len(url_list(value, ENV_VARS[name]))} URL(s) for "
                                 f"{recorders} recorder(s): give one per recorder, in the same order")
        return self

    @property
    def recorder_urls(self) -> list[str]:
        """The external recorders (``OEH_RECORDER_URL``, comma-separated), in their order."""
        return url_list(self.recorder_url, ENV_VARS["recorder_url"]) if self.recorder_url else []

    @property
    def mode(self) -> str:
        if self.recorder_url:
            return "external-recorder"
        return "engine" if self.engine_url else "embedded"

    @property
    def default_step_timeout_s(self) -> float:
        return self.step_timeout_s if self.step_timeout_s is not None else self.max_wall_clock_s + 30.0

    def budgets(self) -> dict[str, Any]:
        """The recorder budgets every rollout gets unless ``reset(budgets=...)`` overrides them."""
        caps: dict[str, Any] = {"max_wall_clock_s": self.max_wall_clock_s}
        if self.max_agent_calls is not None:
            caps["max_agent_calls"] = self.max_agent_calls
        if self.max_total_tokens is not None:
            caps["max_total_tokens"] = self.max_total_tokens
        return caps

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None, **overrides: Any) -> "EnvServerConfig":
        """Read ``OEH_*`` variables (empty ones count as unset); ``overrides`` win over them."""
        import os

        source = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for field_name, var in ENV_VARS.items():
            raw = source.get(var)
            if raw is not None and raw.strip() != "":
                values[field_name] = raw.strip()
        values.update(overrides)
        try:
            return cls.model_validate(values)
        except ValidationError as exc:
            raise ConfigError(_explain(exc)) from None


def url_list(value: str, var: str) -> list[str]:
    """``value`` split at commas into http(s) URLs without trailing slashes; a clear error otherwise."""
    urls = [part.strip().rstrip("/") for part in value.split(",")]
    for url in urls:
        if not url.startswith(("http://", "https://")) or url in ("http:/", "https:/"):
            raise ValueError(f"{var}: {url!r} is not an http(s) URL (several recorders: comma-separated URLs)")
    if len(set(urls)) != len(urls):
        raise ValueError(f"{var} names the same recorder twice")
    return urls


def _explain(exc: ValidationError) -> str:
    lines = []
    for error in exc.errors():
        loc = error.get("loc") or ()
        name = ENV_VARS.get(str(loc[0]), str(loc[0])) if loc else "configuration"
        lines.append(f"{name}: {error.get('msg', 'invalid')}")
    return "invalid environment server configuration: " + "; ".join(lines)
