"""The client: OpenEnv's WebSocket ``EnvClient`` for the harness environment.

One client is one episode session on the server. A step runs a whole agent, so the client waits
far longer for a reply than OpenEnv's 60 s default (``message_timeout_s``, 30 min here).

Records are not in observations; ``fetch_records`` reads them from where the observation says,
with the recorder's admin token (the one the server was given as ``OEH_ADMIN_TOKEN``).
"""

from __future__ import annotations

from typing import Any, Literal

import httpx
from openenv.core import EnvClient
from openenv.core.client_types import StepResult

from .models import HarnessObservation, HarnessState, RecordsLocation, RunAgent

#: Seconds to wait for one reply (a step is a whole agent run).
DEFAULT_MESSAGE_TIMEOUT_S = 1800.0


class HarnessEnv(EnvClient[RunAgent, HarnessObservation, HarnessState]):
    """``HarnessEnv(base_url=...)``; async by default, ``.sync()`` for blocking use::

        with HarnessEnv(base_url="http://localhost:8000").sync() as env:
            env.reset(task_id="fix-add", harness="pi")
            result = env.step(RunAgent(timeout_s=300))
            print(result.reward, result.observation.trace.chain_status)
    """

    def __init__(self, base_url: str | None = None, *, message_timeout_s: float = DEFAULT_MESSAGE_TIMEOUT_S,
                 **kwargs: Any) -> None:
        super().__init__(base_url, message_timeout_s=message_timeout_s, **kwargs)

    def _step_payload(self, action: RunAgent) -> dict[str, Any]:
        return action.model_dump(mode="json", exclude_none=True)

    def _parse_result(self, payload: dict[str, Any]) -> StepResult[HarnessObservation]:
        fields = dict(payload.get("observation") or {})
        fields["done"] = bool(payload.get("done", False))
        fields["reward"] = payload.get("reward")
        fields["metadata"] = payload.get("metadata") or fields.get("metadata") or {}
        observation = HarnessObservation.model_validate(fields)
        return StepResult(observation=observation, reward=observation.reward, done=observation.done,
                          metadata=observation.metadata)

    def _parse_state(self, payload: dict[str, Any]) -> HarnessState:
        return HarnessState.model_validate(payload)


def records_url(location: RecordsLocation, env_url: str | None = None, *,
                what: Literal["records", "training_trace"] = "records") -> str:
    """The URL of a rollout's records (or its OpenEnv ``TrainingTrace``): through the environment
    server at ``env_url`` when it serves its own recorder, else the recorder's own URL."""
    path = location.records_path if what == "records" else location.training_trace_path
    if env_url is not None and location.proxy_path:
        prefix = location.proxy_path[: len(location.proxy_path) - len(location.records_path)]
        return _http_url(env_url) + prefix + path
    return location.recorder_url + path


def fetch_records(location: RecordsLocation, admin_token: str, env_url: str | None = None, *,
                  include: str = "all", timeout_s: float = 120.0) -> list[dict[str, Any]]:
    """Every record of the rollout (OpenEnv ``TraceEntry`` dicts); ``include``: all | tokens | training."""
    response = httpx.get(records_url(location, env_url), params={"include": include},
                         headers={"authorization": f"Bearer {admin_token}"}, timeout=timeout_s)
    response.raise_for_status()
    return response.json()


def _http_url(url: str) -> str:
    url = url.rstrip("/")
    if url.startswith("ws://"):
        return "http://" + url[len("ws://"):]
    if url.startswith("wss://"):
        return "https://" + url[len("wss://"):]
    return url
