"""Run by the engine venv's Python with SGLang 0.5.23's sources (then ``SGLANG_CHECK_DEPS``) first on the
path: validates payloads with SGLang's own classes and prints one verdict per payload as JSON.

stdin: ``[{"kind": KIND, "payload": {...}}, ...]``; stdout: ``{"sglang": VERSION, "module": PATH,
"results": [...]}``, each result ``{"kind", "ok", "error", "unknown", "missing"}``: ``unknown`` are keys the
class (or, for replies SGLang builds as plain dicts, its source) does not declare -- its models ignore
extra keys, so a payload with an invented key would otherwise pass --; ``missing`` are keys SGLang's own
serializer would write that the payload lacks.

How it is checked, per kind:
- pydantic models of ``sglang.srt.entrypoints.openai.protocol`` (chat, tokenize, detokenize): validated,
  then a reply is serialized back as SGLang's route does (``model_dump(by_alias=True)``) to find what is
  missing;
- msgspec structs of ``sglang.srt.managers.io_struct`` (pause, continue, weights, parse_function_call,
  separate_reasoning): validated through their pydantic bridge, as FastAPI parses their bodies;
- ``generate_request``: ``GenerateReqInput`` (a dataclass, FastAPI's parse) and SGLang's JSON contract
  gate (``sglang.api.v1.api_types.GenerateRequest``: sampling params with unknown keys are refused);
- ``generate_response`` and a chat choice's ``meta_info``: no class exists; the keys are read at check
  time from the code that builds them (``tokenizer_manager.py``'s ``meta_info`` / ``out_dict`` writes,
  ``schedule_batch.py``'s ``FINISH_*.to_json``, ``weight_versions.py``), and the logprob triples,
  ids and spans are checked for shape.

SGLang 0.5.23 imports torchvision in its vision model configs (``sglang.srt.configs``, pulled in by
``io_struct``); no CPU build of it is installable beside the engine venv's torch (PyPI's is CUDA-linked),
so a placeholder module stands in for it: any use raises, and nothing checked here uses it.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
import warnings
from pathlib import Path
from typing import Any


def _placeholder_torchvision() -> None:
    """The placeholder SGLang's CPU venv carries (``engine/sglang_cpu_torchvision.py``), imported as
    ``torchvision`` unless a loadable one is installed. transformers' own availability check runs first
    (and is cached), so transformers keeps treating torchvision as absent."""
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()
    try:
        import torchvision  # noqa: F401
    except Exception:  # noqa: BLE001 -- absent, or a CUDA build that does not load
        for name in [n for n in sys.modules if n == "torchvision" or n.startswith("torchvision.")]:
            del sys.modules[name]
        path = Path(__file__).resolve().parents[1] / "engine" / "sglang_cpu_torchvision.py"
        spec = importlib.util.spec_from_file_location("torchvision", path, submodule_search_locations=[])
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["torchvision"] = module
        spec.loader.exec_module(module)


_placeholder_torchvision()
warnings.filterwarnings("ignore", message=r"Only .* support")  # SGLang's quantization modules on a CPU

import msgspec  # noqa: E402
from pydantic import BaseModel, TypeAdapter, ValidationError  # noqa: E402

import sglang  # noqa: E402
from sglang.api.v1 import api_types  # noqa: E402
from sglang.srt.entrypoints.openai import protocol  # noqa: E402
from sglang.srt.function_call.core_types import ToolCallItem  # noqa: E402
from sglang.srt.managers import io_struct  # noqa: E402
from sglang.srt.utils.weight_versions import WeightVersionSpan  # noqa: E402

SRT = Path(protocol.__file__).resolve().parents[2]

PYDANTIC = {
    "chat_request": protocol.ChatCompletionRequest,
    "chat_response": protocol.ChatCompletionResponse,
    "tokenize_request": protocol.TokenizeRequest,
    "tokenize_response": protocol.TokenizeResponse,
    "detokenize_request": protocol.DetokenizeRequest,
    "detokenize_response": protocol.DetokenizeResponse,
}
STRUCTS: dict[str, type[msgspec.Struct]] = {
    "parse_function_call_request": io_struct.ParseFunctionCallReq,
    "separate_reasoning_request": io_struct.SeparateReasoningReqInput,
    "pause_generation_request": io_struct.PauseGenerationReqInput,
    "continue_generation_request": io_struct.ContinueGenerationReqInput,
    "update_weights_from_disk_request": io_struct.UpdateWeightFromDiskReqInput,
    "update_weight_version_request": io_struct.UpdateWeightVersionReqInput,
}
#: replies http_server.py builds as dict literals, by route function: read from its source below
ROUTE_REPLIES = {
    "parse_function_call_response": "parse_function_call_request",
    "separate_reasoning_response": "separate_reasoning_request",
    "update_weights_from_disk_response": "update_weights_from_disk",
    "update_weight_version_response": "update_weight_version",
    "pause_generation_response": "pause_generation",
    "continue_generation_response": "continue_generation",
}
#: keys tokenizer_manager.py's ``_handle_batch_output`` always sets on a finished non-streamed generation
#: (its ``meta_info = {...}`` literal, the ``reasoning_tokens``/``completion_tokens``/``cached_tokens``
#: update, ``add_weight_versions_to_meta_info`` -- a finished request always has spans, output_streamer.py
#: -- and ``e2e_latency`` on finish)
ALWAYS_META = ("id", "finish_reason", "prompt_tokens", "weight_version", "num_retractions", "reasoning_tokens",
               "completion_tokens", "cached_tokens", "weight_versions", "e2e_latency")
#: ``convert_logprob_style``'s keys with ``return_logprob`` (top-logprob keys with ``top_logprobs_num > 0``)
LOGPROB_META = ("input_token_logprobs", "output_token_logprobs", "output_token_logprobs_length")


def _dict_keys(node: ast.AST) -> set[str]:
    return {k.value for k in node.keys if isinstance(k, ast.Constant) and isinstance(k.value, str)} \
        if isinstance(node, ast.Dict) else set()


def _written_keys(tree: ast.AST, target: str) -> set[str]:
    """String keys code writes into a dict named ``target``: literals assigned to it, ``target[KEY] =``, and
    ``target.update({...})``."""
    keys: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign):
            for t in node.targets:
                if isinstance(t, ast.Name) and t.id == target:
                    keys |= _dict_keys(node.value)
                if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id == target \
                        and isinstance(t.slice, ast.Constant) and isinstance(t.slice.value, str):
                    keys.add(t.slice.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update" \
                and isinstance(node.func.value, ast.Name) and node.func.value.id == target and node.args:
            keys |= _dict_keys(node.args[0])
    return keys


def _source_tree(relative: str) -> ast.AST:
    return ast.parse((SRT / relative).read_text(encoding="utf-8"))


def _finish_reasons() -> dict[str, set[str]]:
    """``{type: keys}`` of each ``FINISH_*`` class's ``to_json`` in schedule_batch.py."""
    out: dict[str, set[str]] = {}
    for node in ast.walk(_source_tree("managers/schedule_batch.py")):
        if isinstance(node, ast.ClassDef) and node.name.startswith("FINISH"):
            for ret in ast.walk(node):
                if isinstance(ret, ast.Return) and isinstance(ret.value, ast.Dict):
                    literal = dict(zip(ret.value.keys, ret.value.values))
                    kind = next((v.value for k, v in literal.items() if isinstance(k, ast.Constant)
                                 and k.value == "type" and isinstance(v, ast.Constant)), None)
                    if kind is not None:
                        out.setdefault(kind, set()).update(_dict_keys(ret.value))
    return out


def _route_reply_keys(function: str) -> set[str]:
    """The keys of the dict literals a route function of http_server.py answers with."""
    for node in ast.walk(_source_tree("entrypoints/http_server.py")):
        if isinstance(node, ast.AsyncFunctionDef) and node.name == function:
            keys: set[str] = set()
            for sub in ast.walk(node):
                if isinstance(sub, ast.Assign) and any(isinstance(t, ast.Name) and t.id in ("content", "response_data")
                                                       for t in sub.targets):
                    keys |= _dict_keys(sub.value)
                if isinstance(sub, ast.Subscript) and isinstance(sub.value, ast.Name) \
                        and sub.value.id == "response_data" and isinstance(sub.slice, ast.Constant):
                    keys.add(str(sub.slice.value))
                if isinstance(sub, ast.keyword) and sub.arg == "content":
                    keys |= _dict_keys(sub.value)
                if isinstance(sub, ast.Call) and getattr(sub.func, "id", "") == "ORJSONResponse" and sub.args:
                    keys |= _dict_keys(sub.args[0])
            return keys
    raise ValueError(f"no route function {function} in http_server.py")


TM = _source_tree("managers/tokenizer_manager.py")
WV = _source_tree("utils/weight_versions.py")
META_KEYS = _written_keys(TM, "meta_info") | _written_keys(WV, "meta_info")
OUT_KEYS = _written_keys(TM, "out_dict")
FINISH = _finish_reasons()
SPANS: TypeAdapter[Any] = TypeAdapter(list[WeightVersionSpan])


def _triples(value: Any, where: str, errors: list[str]) -> list[int]:
    """``[[logprob, token_id, text_or_null], ...]`` (tuples on the server, lists in JSON): the ids."""
    ids: list[int] = []
    if not isinstance(value, list):
        errors.append(f"{where}: a list of [logprob, id, text] expected")
        return ids
    for i, entry in enumerate(value):
        ok = isinstance(entry, list) and len(entry) == 3 and (entry[0] is None or (
            isinstance(entry[0], (int, float)) and not isinstance(entry[0], bool))) \
            and isinstance(entry[1], int) and not isinstance(entry[1], bool) and (entry[2] is None or isinstance(entry[2], str))
        if not ok:
            errors.append(f"{where}[{i}]: [float, int, str|null] expected, got {entry!r}")
        else:
            ids.append(entry[1])
    return ids


#: the chat route's tool-call reply rewrites the finish reason in place, the dict ``meta_info`` holds too
#: (serving_chat.py ``_process_tool_calls``: ``finish_reason["type"] = "tool_calls"; ["matched"] = None``)
CHAT_FINISH = {"tool_calls": {"type", "matched"}}


def check_meta_info(meta: Any, output_ids: list[int] | None, where: str = "meta_info",
                    chat: bool = False) -> tuple[list[str], list[str], list[str]]:
    """(errors, unknown, missing) of a finished request's ``meta_info``."""
    errors: list[str] = []
    finishes = {**FINISH, **CHAT_FINISH} if chat else FINISH
    if not isinstance(meta, dict):
        return [f"{where}: an object expected"], [], []
    unknown = [f"{where}.{k}" for k in meta if k not in META_KEYS]
    missing = [f"{where}.{k}" for k in ALWAYS_META if k not in meta]
    if "output_token_logprobs" in meta:
        missing += [f"{where}.{k}" for k in LOGPROB_META if k not in meta]
    if not isinstance(meta.get("id"), str):
        errors.append(f"{where}.id: a string expected")
    for key in ("prompt_tokens", "completion_tokens", "cached_tokens", "reasoning_tokens", "num_retractions"):
        if key in meta and (not isinstance(meta[key], int) or isinstance(meta[key], bool)):
            errors.append(f"{where}.{key}: an integer expected")
    if "weight_version" in meta and not isinstance(meta["weight_version"], str):
        errors.append(f"{where}.weight_version: a string expected")
    finish = meta.get("finish_reason")
    if not isinstance(finish, dict) or finish.get("type") not in finishes:
        errors.append(f"{where}.finish_reason: one of {sorted(finishes)} as {{type, ...}} expected, got {finish!r}")
    else:
        unknown += [f"{where}.finish_reason.{k}" for k in finish if k not in finishes[finish["type"]]]
        missing += [f"{where}.finish_reason.{k}" for k in finishes[finish["type"]] if k not in finish]
    spans = meta.get("weight_versions")
    if spans is not None:
        try:
            converted = SPANS.validate_python(spans)  # its pydantic bridge: spans are objects in meta_info
            for i, span in enumerate(spans):
                unknown += [f"{where}.weight_versions[{i}].{k}" for k in span if k not in WeightVersionSpan.__struct_fields__]
            if converted and meta.get("weight_version") != converted[-1].version:
                errors.append(f"{where}.weight_version: the last span's version ({converted[-1].version}) expected")
        except (ValidationError, TypeError) as exc:
            errors.append(f"{where}.weight_versions: {exc}")
    if "output_token_logprobs" in meta:
        ids = _triples(meta["output_token_logprobs"], f"{where}.output_token_logprobs", errors)
        if output_ids is not None and ids != list(output_ids):
            errors.append(f"{where}.output_token_logprobs: its ids {ids[:8]}... are not the output ids {output_ids[:8]}...")
        if meta.get("output_token_logprobs_length") not in (None, len(meta["output_token_logprobs"])):
            errors.append(f"{where}.output_token_logprobs_length: {len(meta['output_token_logprobs'])} expected")
        _triples(meta.get("input_token_logprobs", []), f"{where}.input_token_logprobs", errors)
    if isinstance(meta.get("completion_tokens"), int) and output_ids is not None \
            and meta["completion_tokens"] != len(output_ids):
        errors.append(f"{where}.completion_tokens: {len(output_ids)} (the output ids) expected")
    return errors, unknown, missing


def _unknown(model: BaseModel, payload: dict[str, Any], where: str = "") -> list[str]:
    """Keys of ``payload`` the validated model (and nested models, lists of models) does not declare."""
    fields = type(model).model_fields
    aliases = {f.alias for f in fields.values() if f.alias}
    out = [f"{where}{k}" for k in payload if k not in fields and k not in aliases]
    for name, value in payload.items():
        child = getattr(model, name, None)
        if isinstance(value, list) and isinstance(child, list):
            for i, (v, c) in enumerate(zip(value, child)):
                if isinstance(v, dict) and isinstance(c, BaseModel):
                    out += _unknown(c, v, f"{where}{name}[{i}].")
        elif isinstance(value, dict) and isinstance(child, BaseModel):
            out += _unknown(child, value, f"{where}{name}.")
    return out


def _missing(expected: Any, payload: Any, where: str = "") -> list[str]:
    """Keys SGLang's serialization (``expected``) writes that ``payload`` lacks, recursively."""
    out: list[str] = []
    if isinstance(expected, dict) and isinstance(payload, dict):
        for key, value in expected.items():
            if key not in payload:
                out.append(f"{where}{key}")
            elif key != "meta_info":  # a plain dict on the model: checked from the source instead
                out += _missing(value, payload[key], f"{where}{key}.")
    elif isinstance(expected, list) and isinstance(payload, list):
        for i, (e, p) in enumerate(zip(expected, payload)):
            out += _missing(e, p, f"{where[:-1]}[{i}].")
    return out


def _struct_unknown(cls: type[msgspec.Struct], payload: dict[str, Any]) -> list[str]:
    return [k for k in payload if k not in cls.__struct_fields__]


def _check_generate_response(payload: dict[str, Any]) -> tuple[list[str], list[str], list[str]]:
    errors: list[str] = []
    unknown = [k for k in payload if k not in OUT_KEYS]
    missing = [k for k in ("text", "output_ids", "meta_info") if k not in payload]
    if not isinstance(payload.get("text"), str):
        errors.append("text: a string expected")
    ids = payload.get("output_ids")
    if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
        errors.append("output_ids: a list of integers expected")
        ids = None
    e, u, m = check_meta_info(payload.get("meta_info"), ids)
    return errors + e, unknown + u, missing + m


def check(kind: str, payload: Any) -> dict[str, Any]:
    errors: list[str] = []
    unknown: list[str] = []
    missing: list[str] = []
    if not isinstance(payload, dict):
        raise ValueError("a JSON object expected")
    if kind in PYDANTIC:
        model = PYDANTIC[kind].model_validate(payload)
        unknown = _unknown(model, payload)
        if kind.endswith("_response"):
            missing = _missing(model.model_dump(mode="json", by_alias=True), payload)
        if kind == "chat_response":
            for i, choice in enumerate(payload.get("choices") or []):
                if "meta_info" in choice:
                    e, u, m = check_meta_info(choice["meta_info"], choice.get("response_token_ids"),
                                              f"choices[{i}].meta_info", chat=True)
                    errors, unknown, missing = errors + e, unknown + u, missing + m
    elif kind in STRUCTS:
        TypeAdapter(STRUCTS[kind]).validate_python(payload)
        unknown = _struct_unknown(STRUCTS[kind], payload)
    elif kind == "generate_request":
        TypeAdapter(io_struct.GenerateReqInput).validate_python(payload)
        api_types.GenerateRequest.from_json_value(payload)  # SGLang's contract gate (a 400 on the server)
        fields = set(io_struct.GenerateReqInput.__dataclass_fields__)
        unknown = [k for k in payload if k not in fields]
    elif kind == "generate_response":
        errors, unknown, missing = _check_generate_response(payload)
    elif kind in ROUTE_REPLIES:
        keys = _route_reply_keys(ROUTE_REPLIES[kind])
        unknown = [k for k in payload if k not in keys]
        if kind == "parse_function_call_response":
            for i, call in enumerate(payload.get("calls") or []):
                item = ToolCallItem.model_validate(call)
                unknown += _unknown(item, call, f"calls[{i}].")
                missing += [f"calls[{i}].{k}" for k in item.model_dump() if k not in call]
            missing += [k for k in ("normal_text", "calls") if k not in payload]
        elif kind == "update_weights_from_disk_response":
            fields = io_struct.UpdateWeightFromDiskReqOutput.__struct_fields__
            TypeAdapter(io_struct.UpdateWeightFromDiskReqOutput).validate_python(payload)
            missing = [k for k in fields if k not in payload and k not in ("rid", "http_worker_ipc")]
        elif kind == "separate_reasoning_response":
            missing = [k for k in ("reasoning_text", "text") if k not in payload]
            errors += [f"{k}: a string expected" for k in ("reasoning_text", "text") if not isinstance(payload.get(k), str)]
    else:
        raise ValueError(f"unknown kind {kind!r}")
    if errors:
        raise ValueError("; ".join(errors))
    return {"kind": kind, "ok": True, "error": None, "unknown": unknown, "missing": missing}


def main() -> int:
    results = []
    for item in json.load(sys.stdin):
        kind, payload = item["kind"], item["payload"]
        try:
            results.append(check(kind, payload))
        except (ValidationError, ValueError, TypeError, msgspec.ValidationError) as exc:
            results.append({"kind": kind, "ok": False, "error": f"{type(exc).__name__}: {exc}"[:2000],
                            "unknown": [], "missing": []})
    json.dump({"sglang": getattr(sglang, "__version__", "?"), "module": sglang.__file__, "results": results},
              sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
