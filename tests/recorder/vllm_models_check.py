"""Run by the engine venv's Python (vLLM's dependencies), with one vLLM release's sources first on the path:
validates payloads with that release's own pydantic models and prints one verdict per payload as JSON.

stdin: ``[{"kind": KIND, "payload": {...}}, ...]``; stdout: ``{"vllm": VERSION, "results": [...]}``, each
result ``{"kind", "ok", "error", "unknown": [keys the release's model does not declare]}``. Unknown keys
matter because vLLM's models accept extra fields silently: a reply with a key the release never sends
would pass validation.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from pydantic import BaseModel, ValidationError

import vllm
from vllm.entrypoints.openai.chat_completion import protocol as chat
from vllm.entrypoints.scale_out.token_in_token_out import protocol as scale_out


def _model(kind: str, payload: dict[str, Any]) -> type[BaseModel]:
    if kind in ("chat_request", "render_request"):
        return chat.ChatCompletionRequest
    if kind in ("chat_response", "derender_response"):
        return chat.ChatCompletionResponse
    if kind in ("render_response", "generate_request"):
        return scale_out.GenerateRequest
    if kind == "generate_response":
        if payload.get("output_mode") == "derender":
            return scale_out.GenerateDerenderResponse
        return scale_out.GenerateTokensResponse
    if kind == "derender_request":
        return scale_out.DerenderChatRequest
    raise ValueError(f"unknown kind {kind!r}")


def _unknown(model: BaseModel, payload: dict[str, Any], where: str = "") -> list[str]:
    """Keys of ``payload`` the validated model (and its list-of-model fields, one level down) does not declare."""
    fields = type(model).model_fields
    out = [f"{where}{k}" for k in payload if k not in fields]
    for name, value in payload.items():
        child = getattr(model, name, None)
        if isinstance(value, list) and isinstance(child, list):
            for i, (v, c) in enumerate(zip(value, child)):
                if isinstance(v, dict) and isinstance(c, BaseModel):
                    out += _unknown(c, v, f"{where}{name}[{i}].")
        elif isinstance(value, dict) and isinstance(child, BaseModel):
            out += _unknown(child, value, f"{where}{name}.")
    return out


def main() -> int:
    results = []
    for item in json.load(sys.stdin):
        kind, payload = item["kind"], item["payload"]
        try:
            model = _model(kind, payload).model_validate(payload)
        except (ValidationError, ValueError) as exc:
            results.append({"kind": kind, "ok": False, "error": str(exc)[:2000], "unknown": []})
            continue
        results.append({"kind": kind, "ok": True, "error": None, "unknown": _unknown(model, payload)})
    json.dump({"vllm": vllm.__version__ if hasattr(vllm, "__version__") else "?", "module": vllm.__file__,
               "results": results}, sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
